"""argparse types: a bad value is a one-line usage error naming the option, before any work.

``number(int, 1, True, "an integer")`` is the type of an option that takes an integer of at least 1;
``positive(float)`` of one above 0. argparse reports the failure as ``argument --batch-size: must be >= 1, got -1``.
``out_dir`` is the type of an output directory that is made only when the work starts. Standard library only, so a
parser imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path


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


def out_dir(text: str) -> Path:
    """An argparse type for an output directory, checked but not made: a command refused for bad input leaves no
    empty directory behind, and makes it when its work starts. Refused now: a path that is not a directory, one
    under a regular file, one whose nearest existing folder cannot be written."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a directory")
    nearest = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if not nearest.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {nearest} is not a directory")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: {nearest} cannot be written")
    return path
