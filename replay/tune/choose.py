"""Which trial is best: feasibility, Pareto dominance and the documented choice rule. Pure.

- A trial is *feasible* when it completed (every objective a number) and meets every constraint.
- One objective: the best point is the feasible trial best on it (ties: the lowest trial number).
- Several: the *front* is the feasible trials no other feasible trial dominates (at least as good on every
  objective, better on one); the best point is the front's trial best on the first objective, ties broken by the
  next objectives in order, then by the lowest trial number. Put the objective that matters most first.
- No feasible trial: no best point (the report says so; best.yaml is not written).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tokenpools.replay.tune.space import Direction


@dataclass(frozen=True, slots=True)
class Point:
    number: int  # the trial's number (-1: today's settings)
    values: tuple[float, ...]  # one per objective, in the space file's order (NaN: undefined)
    feasible: bool


def _key(values: Sequence[float], directions: Sequence[Direction]) -> tuple[float, ...]:
    """Smaller is better on every coordinate."""
    return tuple(v if d is Direction.MINIMIZE else -v for v, d in zip(values, directions))


def complete(point: Point) -> bool:
    return not any(math.isnan(v) for v in point.values)


def dominates(a: Point, b: Point, directions: Sequence[Direction]) -> bool:
    ka, kb = _key(a.values, directions), _key(b.values, directions)
    return all(x <= y for x, y in zip(ka, kb)) and any(x < y for x, y in zip(ka, kb))


def front(points: Sequence[Point], directions: Sequence[Direction]) -> list[Point]:
    """The feasible points no feasible point dominates, by trial number."""
    feasible = [p for p in points if p.feasible and complete(p)]
    return sorted((p for p in feasible if not any(dominates(q, p, directions) for q in feasible)),
                  key=lambda p: p.number)


def best(points: Sequence[Point], directions: Sequence[Direction]) -> Point | None:
    candidates = front(points, directions)
    if not candidates:
        return None
    return min(candidates, key=lambda p: (*_key(p.values, directions), p.number))


def on_front(point: Point, points: Sequence[Point], directions: Sequence[Direction]) -> bool:
    """Whether no feasible trial dominates ``point`` (today's settings: are they already on the front?)."""
    if not complete(point):
        return False
    return not any(dominates(q, point, directions) for q in points if q.feasible and complete(q))
