"""The ``perReplica`` block a calibration proposes, and the YAML snippet that carries it (pure).

- ``tokensPerSecond``: the chosen step's *total* tokens/s (prompt + completion: the unit of the pool's capacity,
  ``tokenpools.config.documents``), floored to 4 significant digits: never above what was measured.
- ``concurrency``: the chosen step's concurrency.
- ``kvCacheGiB``: ``kv.kv_cache_gib``'s figure, floored the same way; left out, with the note saying why, when it is
  not derivable. The snippet then needs it filled in before a pool validates (``kvCacheGiB`` is required).

The snippet is the block at the top level, with comments; pasted under a TokenPool's ``spec`` (indented) it replaces
the pool's ``perReplica``. The pool's ``kvBytesPerToken`` or ``kvGeometry`` stays the pool's own.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

import yaml

from tokenpools.calibrate.stats import StepStats

SIGNIFICANT_DIGITS = 4
COMMENT_COLUMNS = 100  # a comment line is wrapped at this width


def floor_significant(value: float, digits: int = SIGNIFICANT_DIGITS) -> float | int:
    """``value`` (> 0) floored to ``digits`` significant digits: an int from 10**(digits-1) up, else a float."""
    if not value > 0:
        raise ValueError(f"value must be > 0, got {value}")
    exponent = math.floor(math.log10(value)) - (digits - 1)
    if exponent >= 0:
        return math.floor(value / 10**exponent + 1e-9) * 10**exponent
    floored = math.floor(value * 10**-exponent + 1e-9)
    return round(floored / 10**-exponent, -exponent)


def per_replica(chosen: StepStats, kv_cache_gib: float | None) -> dict[str, float | int]:
    """The block's fields, in the order a TokenPool lists them (without ``kvCacheGiB`` when it is None)."""
    block: dict[str, float | int] = {"tokensPerSecond": floor_significant(chosen.total_tokens_per_s)}
    if kv_cache_gib is not None:
        block["kvCacheGiB"] = floor_significant(kv_cache_gib)
    block["concurrency"] = chosen.concurrency
    return block


def snippet(block: dict[str, float | int], header: Sequence[str], kv_note: str) -> str:
    """The YAML text: ``header`` as comment lines, the block, and the KV note inside it when KV is missing."""
    lines = _comment(*header, "paste under a TokenPool's spec (it replaces perReplica):")
    lines += yaml.safe_dump({"perReplica": block}, sort_keys=False, default_flow_style=False).splitlines()
    if "kvCacheGiB" not in block:
        lines += _comment(f"kvCacheGiB: FILL IN; {kv_note}", indent="  ")
    return "\n".join(lines) + "\n"


def _comment(*paragraphs: str, indent: str = "") -> list[str]:
    return [line for text in paragraphs
            for line in textwrap.wrap(text, COMMENT_COLUMNS, initial_indent=indent + "# ",
                                      subsequent_indent=indent + "#   ", break_on_hyphens=False)]
