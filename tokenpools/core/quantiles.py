"""Nearest-rank percentiles: the one definition the replay's report and ``tokenpools calibrate`` both use.

The q-percentile of n values is the ⌈q·n⌉-th smallest (the first for q = 0): the smallest value at or above a
fraction q of the samples, always one of them, never an interpolation. None for no values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def p99(values: Iterable[float]) -> float | None:
    return percentile(values, 0.99)
