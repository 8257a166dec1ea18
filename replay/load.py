"""Load: open-loop Poisson arrivals or closed-loop clients per entitlement, token lengths, the client retry model.

Why open loop (issue #6): with closed-loop clients (N users each waiting for their answer) the backend queue of the
no-admission baseline can never exceed the excess clients, yet the paper reports a queue of 34. Open-loop arrivals
keep coming whatever the system does, which is what a flood of batch traffic looks like.

Rates come from slots: an entitlement with r slots sends r ÷ (mean service time of one request on a full replica)
requests per second, i.e. exactly enough to keep its r slots busy (utilisation 1 at its own share).

Closed loop (``ClosedLoad``) is the other model: N clients per entitlement, each sending its next request as soon
as its previous one has ended (answered, given up after its retries, or evicted). The load then follows the
system: a client never has two requests at once, so an entitlement never has more than N in flight.

Every draw comes from a ``random.Random`` seeded with ``"<seed>:<entitlement>"`` (string seeds are hashed with
SHA-512 by CPython, independent of PYTHONHASHSEED), so one entitlement's arrivals do not change when another
entitlement is added, and the same seed gives the same load on every machine.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from tokenpools.replay.backend.model import ReplicaModel, decode_step_s

if TYPE_CHECKING:
    from tokenpools.replay.clients import ClientModel


class Arrival(NamedTuple):
    """One attempt the replayer will present to admission (a first try or, later, a retry)."""

    t_s: float
    entitlement: str
    request_id: str
    prompt_tokens: int
    max_tokens: int | None
    output_tokens: int
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class Lengths:
    """A token-length distribution: ``low == high`` is a fixed length, else uniform integers in [low, high]."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"token lengths need 1 <= low <= high, got low={self.low}, high={self.high}")

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def draw(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)


@dataclass(frozen=True, slots=True)
class SplitLengths:
    """A request's total n_in + n_out drawn from ``total`` and split in half (prompt = total // 2, output = the rest).

    ``prompt`` and ``output`` expose the means the rate derivation needs.
    """

    total: Lengths

    @property
    def prompt(self) -> Lengths:
        return Lengths(self.total.low // 2, self.total.high // 2)

    @property
    def output(self) -> Lengths:
        return Lengths(self.total.low - self.total.low // 2, self.total.high - self.total.high // 2)

    def draw(self, rng: random.Random) -> tuple[int, int]:
        n = self.total.draw(rng)
        return n // 2, n - n // 2


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Open-loop traffic of one entitlement between ``start_s`` and ``end_s``.

    ``max_tokens`` is what the client asks for; ``None`` means the client sends none, so the pool's default
    applies (admission check 2) and the unused part of the reservation is refunded at completion.
    """

    entitlement: str
    rate_per_s: float
    prompt: Lengths
    output: Lengths
    split: SplitLengths | None = None  # when set, (prompt, output) are drawn together from it instead
    start_s: float = 0.0
    end_s: float = float("inf")
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.rate_per_s < 0:
            raise ValueError(f"`rate_per_s` of {self.entitlement} must be >= 0, got {self.rate_per_s}")
        if self.end_s < self.start_s:
            raise ValueError(f"load of {self.entitlement}: `end_s` ({self.end_s}) is before `start_s` ({self.start_s})")
        if self.max_tokens is not None and self.max_tokens < self.output.high:
            raise ValueError(f"load of {self.entitlement}: `max_tokens` {self.max_tokens} < longest output {self.output.high}")


@dataclass(frozen=True, slots=True)
class ClosedLoad:
    """Closed-loop traffic of one entitlement: ``clients`` clients, client i starting at ``start_s + i × stagger_s``
    and sending its next request ``think_s`` after its previous one ended, until ``end_s`` (a request is only sent
    before ``end_s``). Lengths and ``max_tokens`` as in ``LoadSpec``; each client's requests are ``closed_requests``.
    """

    entitlement: str
    clients: int
    prompt: Lengths
    output: Lengths
    split: SplitLengths | None = None
    start_s: float = 0.0
    end_s: float = float("inf")
    max_tokens: int | None = None
    think_s: float = 0.0
    stagger_s: float = 0.0

    def __post_init__(self) -> None:
        if self.clients < 0:
            raise ValueError(f"`clients` of {self.entitlement} must be >= 0, got {self.clients}")
        if self.end_s < self.start_s:
            raise ValueError(f"load of {self.entitlement}: `end_s` ({self.end_s}) is before `start_s` ({self.start_s})")
        if self.think_s < 0 or self.stagger_s < 0:
            raise ValueError(f"load of {self.entitlement}: `think_s` and `stagger_s` must be >= 0")
        if self.max_tokens is not None and self.max_tokens < self.output.high:
            raise ValueError(f"load of {self.entitlement}: `max_tokens` {self.max_tokens} < longest output {self.output.high}")

    def client_start_s(self, client: int) -> float:
        return self.start_s + client * self.stagger_s


def closed_requests(load: ClosedLoad, seed: int, client: int) -> Iterator[tuple[str, int, int]]:
    """Client ``client``'s requests in the order it sends them: (request_id, prompt_tokens, output_tokens). Each
    client draws from its own ``Random("<seed>:<entitlement>:<client>")``, so what it sends does not depend on when
    its answers come back: the same seed gives the same requests, whatever the system under test does."""
    rng = random.Random(f"{seed}:{load.entitlement}:{client}")
    for n in itertools.count():
        if load.split is not None:
            prompt, output = load.split.draw(rng)
        else:
            prompt, output = load.prompt.draw(rng), load.output.draw(rng)
        yield f"{load.entitlement}-c{client:03d}-{n:06d}", prompt, output


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """What a refused client does: wait the refusal's retry-after-ms (else Retry-After), + a uniform jitter in
    [0, jitter_s), at most ``max_retries`` times, then give up. Refusals without one (401/403) are never retried.

    ``fitted``: a log replay's client model (``clients.ClientModel``, fitted from the log), which then decides
    instead of the two numbers; None (the experiments' generated load): the rule above."""

    max_retries: int = 5
    jitter_s: float = 0.1
    fitted: ClientModel | None = None

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.jitter_s < 0:
            raise ValueError(f"`max_retries` and `jitter_s` must be >= 0, got {self.max_retries}, {self.jitter_s}")


def service_time_s(model: ReplicaModel, prompt_tokens: float, output_tokens: float) -> float:
    """Mean time one request holds a slot on a replica kept full: its decode steps at full batch plus the prefill
    of every request admitted in the same cycle (see ``backend.model.full_load_tokens_per_s``)."""
    batch = model.max_num_seqs
    return output_tokens * decode_step_s(model, batch) + batch * prompt_tokens * model.prefill_s_per_token


def rate_for_slots(slots: float, model: ReplicaModel, prompt: Lengths, output: Lengths) -> float:
    """Requests/s that keep ``slots`` sequences busy: slots ÷ mean service time at full load."""
    return slots / service_time_s(model, prompt.mean, output.mean)


def tokens_per_slot_s(model: ReplicaModel, prompt: Lengths, output: Lengths) -> float:
    """Prompt + completion tokens/s one slot serves at full load (the unit of λ in the configuration)."""
    return (prompt.mean + output.mean) / service_time_s(model, prompt.mean, output.mean)


def poisson_arrivals(specs: Iterable[LoadSpec], duration_s: float, seed: int) -> list[Arrival]:
    """All first attempts of all entitlements in ``[start_s, min(end_s, duration_s))``, sorted by time then id."""
    arrivals: list[Arrival] = []
    for spec in specs:
        rng = random.Random(f"{seed}:{spec.entitlement}")
        end = min(spec.end_s, duration_s)
        if spec.rate_per_s <= 0:
            continue
        t = spec.start_s
        n = 0
        while True:
            t += rng.expovariate(spec.rate_per_s)
            if t >= end:
                break
            if spec.split is not None:
                prompt, output = spec.split.draw(rng)
            else:
                prompt = spec.prompt.draw(rng)
                output = spec.output.draw(rng)
            arrivals.append(Arrival(round(t, 3), spec.entitlement, f"{spec.entitlement}-{n:06d}", prompt, spec.max_tokens, output))
            n += 1
    arrivals.sort(key=lambda a: (a.t_s, a.request_id))
    return arrivals
