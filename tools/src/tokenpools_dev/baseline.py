"""Another build of this package for a benchmark's baseline: a git revision installed beside the working one.

``install(root, revision, into)`` archives ``revision`` of the repository at ``root`` (``git archive``) and installs
it, non-editable and without dependencies, under ``into``/site; a benchmark then runs its worker in a fresh process
with that directory first on ``PYTHONPATH`` (before the editable install's finder, which answers only what is left),
so both builds are measured in the same run by the same interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def install(root: Path, revision: str, into: Path) -> Path:
    """``revision`` of the repository at ``root`` installed under ``into``/site; returns that site directory."""
    src, site = into / "src", into / "site"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", revision], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, capture_output=True)
    return site
