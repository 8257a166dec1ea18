"""What a finished request is settled at: the tokens it used, when the backend reported its usage or did not.

The proxy releases every reservation with the request's use (docs/reservations.md#settlement-stays-exact) and
reports it in ``request_completed``. The backend's usage, when it gives one, is the truth. Without it:

- a backend that refused or failed before sending any output did no work: nothing is charged;
- a stream is charged the prompt estimate and the chunks it delivered (about one token per chunk, the count it was
  charged by as it ran);
- a non-stream that ran to its end is charged the prompt estimate and its cap: the most it may have produced, so
  an unreported answer never costs less than it could have;
- any other end (the client left, it was evicted or timed out; a backend that failed mid-stream is a stream) is
  charged the prompt estimate only: its output, if any, never reached the client.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Ending(StrEnum):
    """How a request ended, as far as its charge goes."""

    RAN = "ran"  # the backend answered in full
    BACKEND_FAILED = "backend_failed"  # the backend refused it or failed
    CUT = "cut"  # cut short on our side: the client left, it was evicted, it timed out


class Used(NamedTuple):
    prompt: int
    completion: int


def used_tokens(reported: tuple[int, int] | None, ending: Ending, stream: bool, chunks: int, prompt_est: int,
                max_tokens: int) -> Used:
    """The (prompt, completion) tokens a request is settled at: ``reported`` by the backend (None: it gave no
    usage), else by the rule above from ``chunks`` (the output chunks it streamed), ``prompt_est`` (the proxy's
    estimate of n_in) and ``max_tokens`` (the cap it was admitted with)."""
    if reported is not None:
        return Used(*reported)
    if ending is Ending.BACKEND_FAILED and not chunks:
        return Used(0, 0)  # the backend did no work
    if stream:
        return Used(prompt_est, chunks)
    if ending is Ending.RAN:
        return Used(prompt_est, max_tokens)
    return Used(prompt_est, 0)
