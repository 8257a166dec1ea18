"""argparse types for numeric options: a bad value is a one-line usage error naming the option, before any work.

``number(int, 1, True, "an integer")`` is the type of an option that takes an integer of at least 1;
``positive(float)`` of one above 0. argparse reports the failure as ``argument --batch-size: must be >= 1, got -1``.
Standard library only, so a parser imports nothing heavy.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def number(kind: Callable[[str], float], low: float, inclusive: bool, what: str) -> Callable[[str], float]:
    """An argparse type: ``kind`` of the text, at least ``low`` (above it unless ``inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (value >= low if inclusive else value > low):  # NaN fails both
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {low:g}, got {text}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type for a number above 0 (``kind``: int or float)."""
    return number(kind, 0, False, "an integer" if kind is int else "a number")
