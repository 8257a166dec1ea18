"""``round(x)`` of a non-negative float, in arithmetic a compiled caller runs natively.

The replayer turns event times into whole ms (its windows) and ns (the backend simulator) several times a
request. Compiled by mypyc (``tokenpools.accel``), the builtin ``round`` is a call into the interpreter each time,
with the float boxed; ``round_half_even`` is the same function in native arithmetic: the nearest int, ties to the
even one, exactly as ``round`` (a property test compares the two). For ``x`` >= 0, ``x - floor(x)`` is exact (for
``x`` >= 1 the two are within a factor of 2 of each other, Sterbenz's lemma; below 1 it is ``x`` itself), so the
tie test sees the true fraction.
"""

from __future__ import annotations

import math


def round_half_even(x: float) -> int:
    """``round(x)`` for a finite ``x`` >= 0 (time since the scenario's start, in any unit)."""
    whole = math.floor(x)
    fraction = x - whole
    if fraction > 0.5 or (fraction == 0.5 and whole % 2 == 1):
        return whole + 1
    return whole
