"""``benchmarks/chaos.py`` refuses bad input before it starts anything: exit 2, one line on stderr, no traceback, no
run directory written (docs/conventions.md#exit-codes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.component

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"


@pytest.mark.parametrize(("args", "says"), [
    (["--faults", "5"], "--faults must be >= 6"),
    (["--minutes", "0"], "--minutes"),
    (["--time-scale", "2"], "--time-scale"),
    (["--set", "budgets.on_stale=maybe"], "budgets.on_stale"),
    (["--set", "nosuch.x=1"], "nosuch"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out), *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert not out.exists()
