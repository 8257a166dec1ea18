"""One admission decision as the proxy records it: the fields of its ``request_decided`` event, its decision metrics
and this proxy's fleet counts, named, so a refusal before the body was read says only what it knows."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.proxy.admission.body import ParsedRequest
from tokenpools.proxy.admission.pools import PoolRuntime
from tokenpools.proxy.admission.retries import NOT_LINKED, Linked


@dataclass(frozen=True, slots=True)
class Decided:
    """``runtime``/``name``: the pool and entitlement (None: an unknown key); ``parsed``: the body (None: refused
    before it was read); ``max_tokens``: the client's cap; ``cost``: n_in + the output estimate, reserved if
    admitted; ``queued_ms``: how long the request waited for this decision; ``waits``: a refusal the request waits
    out (an event for the agents' demand, not a decision the metrics count: the queue's metrics do);
    ``would_refuse``: an admission in shadow, the refusal it would have been (counted as admitted); ``linked``:
    which attempt of its client's request it is (a final decision teaches the linker)."""

    runtime: PoolRuntime | None
    name: str | None
    rid: str
    outcome: AdmissionOutcome
    reason: str
    retry_after_s: int
    parsed: ParsedRequest | None = None
    max_tokens: int = 0
    kv_bytes: int = 0
    priority: float = 0.0
    cost: int = 0
    retry_after_ms: int = 0
    queued_ms: int = 0
    waits: bool = False
    would_refuse: AdmissionOutcome | None = None
    linked: Linked = NOT_LINKED
