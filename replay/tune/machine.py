"""The machine a trial's replay was timed on: a real-time multiple means little without it (docs/tuning.md#outputs).

Read where the trial runs, in the worker process or on the Ray node, so each trial names its own: its host, CPU
model and logical CPUs, Python, the accelerator build that replayed it (``tokenpools.accel``), and the 1-minute
load average when it ended (on a shared machine the same replay takes longer under load). A thin shell over the
platform; nothing happens at import time.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from tokenpools import accel


def describe() -> str:
    """E.g. ``polyglot: AMD EPYC 7B13, 2 CPUs, Python 3.11.7, mypyc 10/10 modules``."""
    compiled = len(accel.compiled())
    build = f"mypyc {compiled}/{len(accel.MODULES)} modules" if compiled else "pure Python"
    return (f"{platform.node() or 'unknown host'}: {_cpu_model()}, {os.cpu_count() or '?'} CPUs, "
            f"Python {platform.python_version()}, {build}")


def load_1m() -> float | None:
    """The 1-minute load average now; None where the platform keeps none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
