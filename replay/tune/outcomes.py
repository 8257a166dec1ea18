"""What a tuning run can ask of a replay: named outcomes, computed from a ``ReplayResult`` as one flat mapping.

An outcome's name is ``<kind>.<group>``: a kind of ``OutcomeKind`` and a group of entitlements, which is ``pool``
(every entitlement), a service class (``dedicated``, ``guaranteed``, ``elastic``, ``spot``, ``preemptible``:
its entitlements pooled) or an entitlement's name. A class name wins over an entitlement of the same name.

Definitions (nearest-rank P99, as ``replay.metrics``):

- ``p99_client_ttft_s``: per completed request, from its *first* attempt's arrival at the proxy (the decision's
  time less its ``queued_s``) to its first token, so refusals, retry waits and the proxy's queue all count.
  Attempts are one request when the replay's decisions give them one ``request_id`` (the client model's
  retries, in a log replay too: it sends first attempts and its fitted clients retry).
- ``p99_ttft_s``: per completed request, from its admission to its first token (the backend's TTFT).
- ``goodput_tokens_per_s``: output tokens of completed requests whose client TTFT met their entitlement's SLO
  (``sloTargetMs``), per second of the replayed duration. A late answer is not good put: it is in
  ``throughput_tokens_per_s``, which counts every completed request's output tokens.
- ``given_up``: requests that ended refused (``ReplayResult.abandoned``: refused after their last retry).
- ``refused`` / ``admitted``: decisions (every attempt) refused / admitted.
- ``max_waiting``: the largest backend waiting queue the group's admitted requests made (exact, not sampled).

A P99 of no samples is NaN (an objective on it fails the trial; a constraint on it is not met).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from tokenpools.core.classes import ServiceClass
from tokenpools.replay.metrics import p99
from tokenpools.replay.replayer import ReplayResult

POOL = "pool"


class OutcomeKind(StrEnum):
    """The outcomes a space file may name (before the ``.group``)."""

    P99_CLIENT_TTFT_S = "p99_client_ttft_s"
    P99_TTFT_S = "p99_ttft_s"
    GOODPUT_TOKENS_PER_S = "goodput_tokens_per_s"
    THROUGHPUT_TOKENS_PER_S = "throughput_tokens_per_s"
    GIVEN_UP = "given_up"
    REFUSED = "refused"
    ADMITTED = "admitted"
    MAX_WAITING = "max_waiting"


def groups(entitlements: Iterable[str]) -> dict[str, tuple[str, ...] | None]:
    """Every group an outcome may name → its entitlements (None: a service class, resolved per scenario)."""
    out: dict[str, tuple[str, ...] | None] = {POOL: None}
    out.update({cls.value: None for cls in ServiceClass})
    for name in entitlements:
        out.setdefault(name, (name,))
    return out


def outcome_names(entitlements: Iterable[str]) -> list[str]:
    """Every outcome name a configuration with these entitlements offers."""
    return [f"{kind.value}.{group}" for kind in OutcomeKind for group in groups(entitlements)]


def split_name(name: str) -> tuple[OutcomeKind, str] | None:
    """(kind, group) of ``kind.group``; None when the kind is unknown."""
    kind, sep, group = name.partition(".")
    if not sep or kind not in OutcomeKind.__members__.values():
        return None
    return OutcomeKind(kind), group


def outcomes(result: ReplayResult) -> dict[str, float]:
    """Every outcome of one replay, in a fixed order (kind, then pool, classes, entitlements in scenario order)."""
    scenario = result.scenario
    members: dict[str, tuple[str, ...]] = {POOL: tuple(e.name for e in scenario.entitlements)}
    for cls in ServiceClass:
        members[cls.value] = tuple(e.name for e in scenario.entitlements if e.service_class is cls)
    for e in scenario.entitlements:
        members.setdefault(e.name, (e.name,))
    slo_s = {e.name: e.slo_ms / 1000 for e in scenario.entitlements}
    per_request = _per_request(result, slo_s)
    decided = _decision_counts(result)
    duration_s = scenario.duration_s
    out: dict[str, float] = {}
    for kind in OutcomeKind:
        for group, names in members.items():
            out[f"{kind.value}.{group}"] = _value(kind, set(names), per_request, decided, result, duration_s)
    return out


# (entitlement, client ttft, ttft, output tokens, within slo) per completed request
_Request = tuple[str, float, float, int, bool]


def _per_request(result: ReplayResult, slo_s: Mapping[str, float]) -> list[_Request]:
    d, c = result.decisions, result.completions
    queued = d.queued_s or [0.0] * len(d.t_s)
    first: dict[str, float] = {}
    for rid, t, q in zip(d.request_id, d.t_s, queued):
        arrived = t - q
        if arrived < first.get(rid, math.inf):
            first[rid] = arrived
    rows: list[_Request] = []
    for rid, ent, admitted, ttft, tokens in zip(c.request_id, c.entitlement, c.admitted_s, c.ttft_s,
                                                c.completion_tokens):
        client = admitted + ttft - first.get(rid, admitted)
        rows.append((ent, client, ttft, tokens, client <= slo_s.get(ent, math.inf)))
    return rows


def _decision_counts(result: ReplayResult) -> dict[str, tuple[int, int]]:
    """entitlement → (admitted, refused) decisions."""
    counts: dict[str, list[int]] = {}
    for ent, outcome in zip(result.decisions.entitlement, result.decisions.outcome):
        row = counts.setdefault(ent, [0, 0])
        row[0 if outcome == "admitted" else 1] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


def _value(kind: OutcomeKind, names: set[str], requests: Sequence[_Request], decided: Mapping[str, tuple[int, int]],
           result: ReplayResult, duration_s: float) -> float:
    mine = [r for r in requests if r[0] in names]
    if kind is OutcomeKind.P99_CLIENT_TTFT_S:
        return _nan_if_none(p99(r[1] for r in mine))
    if kind is OutcomeKind.P99_TTFT_S:
        return _nan_if_none(p99(r[2] for r in mine))
    if kind is OutcomeKind.GOODPUT_TOKENS_PER_S:
        return sum(r[3] for r in mine if r[4]) / duration_s
    if kind is OutcomeKind.THROUGHPUT_TOKENS_PER_S:
        return sum(r[3] for r in mine) / duration_s
    if kind is OutcomeKind.GIVEN_UP:
        return float(sum(v for k, v in result.abandoned.items() if k in names))
    if kind is OutcomeKind.REFUSED:
        return float(sum(v[1] for k, v in decided.items() if k in names))
    if kind is OutcomeKind.ADMITTED:
        return float(sum(v[0] for k, v in decided.items() if k in names))
    return float(_max_waiting(result, names))


def _max_waiting(result: ReplayResult, names: set[str]) -> int:
    """The largest overlap of the group's backend waits (``metrics.waiting_profile``, restricted to the group)."""
    c = result.completions
    changes: list[tuple[float, int]] = []
    for ent, admitted, queue in zip(c.entitlement, c.admitted_s, c.queue_s):
        if queue > 0 and ent in names:
            changes.append((admitted, 1))
            changes.append((admitted + queue, -1))
    changes.sort(key=lambda x: (x[0], x[1]))
    level = best = 0
    for _, delta in changes:
        level += delta
        best = max(best, level)
    return best


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)
