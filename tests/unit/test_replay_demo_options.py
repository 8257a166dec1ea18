"""``tokenpools demo``'s options reach ``run_demo`` (the run itself is ``make demo``'s, too long for a unit test)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tokenpools.replay import demo


@pytest.mark.parametrize(("argv", "progress", "sweeps"), [
    ([], True, True),
    (["--no-progress"], False, True),
    (["--no-progress", "--no-sweeps"], False, False),
])
def test_no_progress_and_no_sweeps_reach_the_run(monkeypatch: pytest.MonkeyPatch, argv: list[str], progress: bool,
                                                 sweeps: bool) -> None:
    seen: dict[str, object] = {}

    def run_demo(out_dir: Path, overrides: object = (), sweeps: bool = True, show_progress: bool = True) -> int:
        seen.update(out=out_dir, sweeps=sweeps, progress=show_progress)
        return 0

    monkeypatch.setattr(demo, "run_demo", run_demo)
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert demo.run(parser.parse_args(["--out", "x", *argv])) == 0
    assert seen == {"out": Path("x"), "sweeps": sweeps, "progress": progress}
