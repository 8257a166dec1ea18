"""The three inference-native dimensions: token throughput, KV bytes, concurrency (docs/semantics.md#dimensions)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import isfinite


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: float) -> int:
    """Per-token KV size c = 2·L·H_kv·d_h·b (the 2 is keys plus values).

    Qwen3-8B (36 layers, 8 KV heads, head dim 128) in bf16 gives 147,456 bytes per token.
    """
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if value <= 0:
            raise ValueError(f"`{name}` must be positive, got {value}")
    if bytes_per_element <= 0:
        raise ValueError(f"`bytes_per_element` must be positive, got {bytes_per_element}")
    return int(2 * layers * kv_heads * head_dim * bytes_per_element)


def max_concurrency_for_kv(kv_budget_bytes: float, context_tokens: int, kv_bytes_per_token_: int) -> int:
    """r_max = ⌊χ_gpu / (S·c)⌋: how many sequences of context S fit in a KV budget."""
    if context_tokens <= 0 or kv_bytes_per_token_ <= 0:
        raise ValueError("context_tokens and kv_bytes_per_token must be positive")
    return math.floor(kv_budget_bytes / (context_tokens * kv_bytes_per_token_))


@dataclass(frozen=True, slots=True)
class Capacity:
    """An amount in all three dimensions. Used for capacities, baselines, limits, demand and usage alike."""

    tokens_per_s: float = 0.0
    kv_bytes: float = 0.0
    concurrency: float = 0.0

    def __post_init__(self) -> None:
        t, k, c = self.tokens_per_s, self.kv_bytes, self.concurrency  # (one test per value: built by the thousand)
        if not (isfinite(t) and isfinite(k) and isfinite(c) and t >= 0 and k >= 0 and c >= 0):
            for name, value in (("tokens_per_s", t), ("kv_bytes", k), ("concurrency", c)):
                if not isfinite(value) or value < 0:
                    raise ValueError(f"`{name}` must be a finite number >= 0, got {value}")

    def __add__(self, other: Capacity) -> Capacity:
        return Capacity(
            self.tokens_per_s + other.tokens_per_s,
            self.kv_bytes + other.kv_bytes,
            self.concurrency + other.concurrency,
        )

    def scaled(self, factor: float) -> Capacity:
        return Capacity(self.tokens_per_s * factor, self.kv_bytes * factor, self.concurrency * factor)

    def fits_in(self, other: Capacity, tolerance: float = 1e-9) -> bool:
        """True when every dimension of self is at most the same dimension of other."""
        return all(a <= b * (1 + tolerance) + tolerance for a, b in zip(self.as_tuple(), other.as_tuple()))

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.tokens_per_s, self.kv_bytes, self.concurrency)

    @staticmethod
    def from_tuple(values: tuple[float, float, float] | list[float]) -> Capacity:
        return Capacity(float(values[0]), float(values[1]), float(values[2]))

    @staticmethod
    def total(items: list[Capacity] | tuple[Capacity, ...]) -> Capacity:
        """The sum, in order (one ``Capacity`` built at the end, not one per addition)."""
        tokens = kv = slots = 0.0
        for item in items:
            tokens, kv, slots = tokens + item.tokens_per_s, kv + item.kv_bytes, slots + item.concurrency
        return Capacity(tokens, kv, slots)


DIMENSIONS: tuple[str, str, str] = ("tokens_per_s", "kv_bytes", "concurrency")
