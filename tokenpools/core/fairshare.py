"""Weighted water-filling and largest-remainder rounding: the two allocation primitives the limit policy uses."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Claim:
    """One party's request in a water-fill: its weight and the most it can take."""

    weight: float
    cap: float


def water_fill(amount: float, claims: Mapping[K, Claim]) -> dict[K, float]:
    """Weighted max-min fair split of ``amount``: each gets amount·w/Σw, never more than its cap; what a capped
    party cannot take is re-split among the others. A higher weight never gets a smaller grant than a lower weight
    with the same or a larger cap. Parties with weight ≤ 0 or cap ≤ 0 get nothing.
    """
    grants = water_fill_values(amount, [c.weight for c in claims.values()], [c.cap for c in claims.values()])
    return dict(zip(claims, grants))


def water_fill_values(amount: float, weights: Sequence[float], caps: Sequence[float]) -> list[float]:
    """``water_fill`` of parties given as aligned weights and caps (what the per-tick policy has at hand: no
    ``Claim`` per party); the grants in the same order."""
    grants = [0.0] * len(weights)
    active = [i for i, (w, c) in enumerate(zip(weights, caps)) if w > 0 and c > 0]
    remaining = max(0.0, amount)
    while active and remaining > 1e-12:
        total_weight = math.fsum([weights[i] for i in active])
        saturated = [i for i in active if caps[i] - grants[i] <= remaining * weights[i] / total_weight]
        if not saturated:
            for i in active:
                grants[i] += remaining * weights[i] / total_weight
            return grants
        for i in saturated:
            remaining -= caps[i] - grants[i]
            grants[i] = caps[i]
        full = set(saturated)
        active = [i for i in active if i not in full]
    return grants


def round_down_fair(values: Mapping[K, float], caps: Mapping[K, int], total: int, order: Sequence[K]) -> dict[K, int]:
    """Integer version of an allocation: floor each value, then hand the units left of ``total`` to the largest
    fractional parts (ties broken by ``order``, earlier first), never above a cap. The sum never exceeds ``total``.
    """
    result = {key: min(caps[key], math.floor(values[key] + 1e-9)) for key in values}
    spare = total - sum(result.values())
    rank = {key: i for i, key in enumerate(order)}
    by_fraction = sorted(values, key=lambda k: (-(values[k] - math.floor(values[k] + 1e-9)), rank.get(k, len(rank))))
    for key in by_fraction:
        if spare <= 0:
            break
        if values[key] - result[key] > 1e-9 and result[key] < caps[key]:
            result[key] += 1
            spare -= 1
    return result
