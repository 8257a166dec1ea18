"""Which recorded attempts are one client request: a log's decisions grouped into requests and numbered.

A log holds attempts (one ``request_decided`` row each), and a client that was refused and tried again left a
second attempt of the same request (docs/tuning.md#retries). A what-if replay sends only a request's first attempt
and lets its client model make the retries, so it must know which is which.

- A marked row (``attempt`` present) says it: attempt 0 starts a request under its own ``request_id``, attempt k
  retries the request ``first_request_id``.
- An unmarked row (a client that marks nothing, a proxy older than the fields) is a retry of an earlier refusal
  when one is open with the same shape — same entitlement, same ``prompt_tokens_est`` and ``max_tokens`` — and the
  row reached the proxy between ``early_ms`` before and ``window_ms`` after that refusal's decision time plus its
  ``retry_after_ms`` (a client that honours the estimate comes back just after it). Of several such refusals it
  retries the one it lands closest to; a refusal is retried at most once (its retry, refused, opens the next one).
  Otherwise the row starts a request. The window is a setting (``RETRY_WINDOW_MS``, 1 s), not learnt: how often
  it groups the demo's logs wrongly is in docs/tuning.md#replaying-what-if-the-client-model.

Pure: rows in, one ``Link`` per row out, in the rows' order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

RETRY_WINDOW_MS = 1000  # how long after its estimate an unmarked retry may come
EARLY_MS = 10  # how long before its estimate (clock rounding of a client that honours it)


class Attempt(NamedTuple):
    """One recorded decision, as grouping needs it (times in ms since epoch)."""

    request_id: str
    entitlement: str
    arrived_ms: int  # when it reached the proxy: its decision's time less the time it waited there
    decided_ms: int
    refused: bool
    retry_after_ms: int  # the refusal's estimate; 0: none (admitted, or a refusal not worth retrying)
    prompt_tokens: int
    max_tokens: int
    attempt: int | None  # the proxy's mark (None: unmarked)
    first_request_id: str | None


class Link(NamedTuple):
    """A row's request (the ``request_id`` of the request's first attempt) and its attempt number there."""

    request: str
    attempt: int


def group(rows: Sequence[Attempt], window_ms: int = RETRY_WINDOW_MS, early_ms: int = EARLY_MS,
          max_retries: int | None = None) -> list[Link]:
    """Each row's request and attempt number: by the marks where a row has them, else by the heuristic above;
    ``max_retries``: an unmarked refusal of that attempt number or later is not retried (None: no limit)."""
    if window_ms < 0 or early_ms < 0:
        raise ValueError(f"`window_ms` and `early_ms` must be >= 0, got {window_ms}, {early_ms}")
    links: list[Link | None] = [None] * len(rows)
    # open refusals of unmarked rows, by shape: (expected retry ms, row index); each list in the order they opened
    open_by_shape: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
    order = sorted(range(len(rows)), key=lambda i: (rows[i].arrived_ms, rows[i].decided_ms, i))
    for i in order:
        row = rows[i]
        if row.attempt is not None:
            first = row.request_id if row.attempt == 0 or not row.first_request_id else row.first_request_id
            links[i] = Link(first, row.attempt)
            continue
        shape = (row.entitlement, row.prompt_tokens, row.max_tokens)
        candidates = open_by_shape.get(shape)
        link = Link(row.request_id, 0)
        if candidates:
            # drop refusals whose window has passed; of the rest, the one whose expected retry this lands closest to
            candidates[:] = [c for c in candidates if c[0] + window_ms >= row.arrived_ms]
            best = -1
            for k, (expected_ms, j) in enumerate(candidates):
                lag = row.arrived_ms - expected_ms
                if rows[j].decided_ms <= row.arrived_ms and -early_ms <= lag <= window_ms and (
                        best < 0 or abs(lag) < abs(row.arrived_ms - candidates[best][0])):
                    best = k
            if best >= 0:
                _, j = candidates.pop(best)
                retried = links[j]
                assert retried is not None  # (rows are linked in arrival order, a refusal before its retry)
                link = Link(retried.request, retried.attempt + 1)
        links[i] = link
        if row.refused and (max_retries is None or link.attempt < max_retries):
            open_by_shape.setdefault(shape, []).append((row.decided_ms + row.retry_after_ms, i))
    return [link for link in links if link is not None]


def stripped(rows: Sequence[Attempt]) -> list[Attempt]:
    """The rows as a client that marks nothing would have left them (to measure the heuristic)."""
    return [row._replace(attempt=None, first_request_id=None) for row in rows]


def grouping_errors(truth: Sequence[Link], guess: Sequence[Link]) -> tuple[int, int]:
    """(rows called a first attempt or a retry wrongly, rows linked to another request than their own): a row's
    request is compared through the first attempt it names, so a renamed but identical grouping has no errors."""
    kind = sum(1 for t, g in zip(truth, guess) if (t.attempt == 0) != (g.attempt == 0))
    members_true: dict[str, set[int]] = {}
    members_guess: dict[str, set[int]] = {}
    for i, (t, g) in enumerate(zip(truth, guess)):
        members_true.setdefault(t.request, set()).add(i)
        members_guess.setdefault(g.request, set()).add(i)
    wrong = sum(1 for t, g in zip(truth, guess) if members_true[t.request] != members_guess[g.request])
    return kind, wrong
