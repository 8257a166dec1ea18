"""The fleet model's workload: E entitlements with static fleet-wide limits and open-loop Poisson arrivals.

Each entitlement gets a concurrency limit drawn from ``concurrency_choices`` and a tokens/s limit consistent with
it: what its slots consume when all are busy (slots × mean prompt+output tokens ÷ mean service time, times
``tokens_headroom``). Its requests arrive as a Poisson process at ``load`` of its concurrency in erlangs
(λ_e · mean service = load · L_e). A request's prompt and output lengths are uniform integers; its service time is
prefill plus decode at fixed rates, so the mean service time is known exactly (not estimated from the draws).

Every draw comes from the ``random.Random`` passed in: it draws each entitlement's limit and the seed of that
entitlement's own stream, so an entitlement's arrivals do not depend on how many requests the others drew.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """What to generate. Lengths are inclusive ranges of whole tokens."""

    entitlements: int = 400
    duration_s: float = 180.0
    load: float = 0.6  # offered erlangs as a fraction of each entitlement's concurrency limit
    concurrency_choices: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prompt_tokens_range: tuple[int, int] = (64, 1024)
    output_tokens_range: tuple[int, int] = (16, 496)
    max_tokens: int = 512  # what every request asks for (reserved at admission, the unused part refunded)
    prefill_tokens_per_s: float = 8000.0
    decode_tokens_per_s: float = 64.0
    tokens_headroom: float = 1.0  # tokens/s limit ÷ what the entitlement's slots consume when all are busy

    def __post_init__(self) -> None:
        if self.entitlements < 1:
            raise ValueError(f"`entitlements` must be >= 1, got {self.entitlements}")
        if self.duration_s <= 0:
            raise ValueError(f"`duration_s` must be positive, got {self.duration_s}")
        if self.load <= 0:
            raise ValueError(f"`load` must be positive, got {self.load}")
        if not self.concurrency_choices or min(self.concurrency_choices) < 1:
            raise ValueError(f"`concurrency_choices` must be whole slots >= 1, got {self.concurrency_choices}")
        for name in ("prompt_tokens_range", "output_tokens_range"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"`{name}` needs 0 <= low <= high, got {(low, high)}")
        if self.output_tokens_range[1] > self.max_tokens:
            raise ValueError(f"`output_tokens_range` must stay within `max_tokens`={self.max_tokens}")
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s", "tokens_headroom"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}")

    @property
    def mean_prompt_tokens(self) -> float:
        return sum(self.prompt_tokens_range) / 2

    @property
    def mean_output_tokens(self) -> float:
        return sum(self.output_tokens_range) / 2

    @property
    def mean_service_s(self) -> float:
        return self.mean_prompt_tokens / self.prefill_tokens_per_s + self.mean_output_tokens / self.decode_tokens_per_s

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        return prompt_tokens / self.prefill_tokens_per_s + output_tokens / self.decode_tokens_per_s


@dataclass(frozen=True, slots=True)
class Entitlement:
    """One entitlement's static fleet-wide limits and the rate its requests arrive at."""

    name: str
    concurrency: int
    tokens_per_s: float
    rate_per_s: float


class Request(NamedTuple):
    """One open-loop attempt: it arrives at ``t_s`` whatever happened before, and is dropped if refused."""

    t_s: float
    entitlement: str
    request_id: str
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    service_s: float

    @property
    def cost_tokens(self) -> int:
        """What admission reserves: n_in + max_tokens."""
        return self.prompt_tokens + self.max_tokens

    @property
    def used_tokens(self) -> int:
        """What the request actually used, settled at its completion."""
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Trace:
    """Entitlements (by name) and every request in arrival order (ties by entitlement name)."""

    entitlements: tuple[Entitlement, ...]
    requests: tuple[Request, ...]
    duration_s: float
    max_tokens: int

    def __post_init__(self) -> None:
        names = [e.name for e in self.entitlements]
        if len(set(names)) != len(names):
            raise ValueError("entitlement names must be unique")
        known = set(names)
        if any(r.entitlement not in known for r in self.requests):
            raise ValueError("every request must name a known entitlement")
        if any(b.t_s < a.t_s for a, b in zip(self.requests, self.requests[1:])):
            raise ValueError("requests must be in arrival order")


def generate(config: TraceConfig, rng: random.Random) -> Trace:
    """A trace drawn from ``rng`` alone: the same seed gives the same trace on every machine."""
    width = len(str(config.entitlements - 1))
    mean_service_s = config.mean_service_s
    tokens_per_slot_s = (config.mean_prompt_tokens + config.mean_output_tokens) / mean_service_s
    drawn: list[tuple[Entitlement, int]] = []
    for i in range(config.entitlements):
        slots = rng.choice(config.concurrency_choices)
        entitlement = Entitlement(
            name=f"e{i:0{width}d}",
            concurrency=slots,
            tokens_per_s=slots * tokens_per_slot_s * config.tokens_headroom,
            rate_per_s=config.load * slots / mean_service_s,
        )
        drawn.append((entitlement, rng.getrandbits(64)))
    arrivals: list[tuple[float, str, int, int, float]] = []
    for entitlement, seed in drawn:
        stream = random.Random(seed)
        t_s = stream.expovariate(entitlement.rate_per_s)
        while t_s < config.duration_s:
            prompt = stream.randint(*config.prompt_tokens_range)
            output = stream.randint(*config.output_tokens_range)
            arrivals.append((t_s, entitlement.name, prompt, output, config.service_s(prompt, output)))
            t_s += stream.expovariate(entitlement.rate_per_s)
    arrivals.sort(key=lambda a: (a[0], a[1]))
    id_width = len(str(max(0, len(arrivals) - 1)))
    requests = tuple(
        Request(t_s, name, f"r{i:0{id_width}d}", prompt, config.max_tokens, output, service_s)
        for i, (t_s, name, prompt, output, service_s) in enumerate(arrivals)
    )
    return Trace(tuple(e for e, _ in drawn), requests, config.duration_s, config.max_tokens)
