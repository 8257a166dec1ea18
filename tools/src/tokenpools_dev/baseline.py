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


# Modules that moved into sub-packages by concept after some baselines were cut: new name → the old flat one. A
# worker run against such a baseline calls ``alias_moved`` first, so that the benchmark's imports (today's names)
# find the baseline's modules.
_MOVED_INTO: dict[str, dict[str, tuple[str, ...]]] = {
    "tokenpools.streams": {
        "table": ("pool_state", "batch", "state", "pool_table", "params"),
        "budgets": ("ledger", "ledger_shell", "tenant_alerts"),
        "counts": ("fleet_counts", "counts_shell", "hold_back"),
        "sharding": ("shard_windows", "summaries"),
        "event_time": ("progress", "watermarks"),
    },
    "tokenpools.proxy": {
        "http": ("server", "connection", "messages", "http_limits"),
        "backends": ("upstream", "forward"),
        "access": ("auth", "tenancy", "persistent"),
        "admission": ("handlers", "decided", "body", "estimate", "pools", "waiting", "retries", "ratelimit",
                      "own_ledger", "budgets", "responses"),
        "outbox": ("events", "producer", "spool", "packing", "watermarks", "watermark_sender", "heartbeat"),
        "inputs": ("limits_consumer", "budget_follower", "live_specs", "spec_sources"),
        "observability": ("metrics", "genai_metrics", "histogram", "read_api", "limits_view"),
    },
}


def alias_moved() -> list[str]:
    """In a baseline built before the sub-packages (its flat module is found), make each moved module importable
    under its new name (a sub-package is a plain module holding the old modules); returns the new names aliased. A
    build that has the sub-packages is left alone."""
    import importlib
    import importlib.util
    import types

    aliased = []
    for component, packages in _MOVED_INTO.items():
        for package, modules in packages.items():
            name = f"{component}.{package}"
            if importlib.util.find_spec(f"{component}.{modules[0]}") is None:
                continue  # not a flat build (the editable install would answer the sub-package from this tree)
            holder = sys.modules[name] = types.ModuleType(name, f"{name}, aliased to the baseline's flat modules")
            holder.__path__ = []
            setattr(importlib.import_module(component), package, holder)
            for module in modules:
                try:
                    old = importlib.import_module(f"{component}.{module}")
                except ImportError:
                    continue  # not in this baseline either
                sys.modules[f"{name}.{module}"] = old
                setattr(holder, module, old)
                aliased.append(f"{name}.{module}")
    return aliased


def run_worker(command: list[str], env: dict[str, str], cwd: str) -> str:
    """A benchmark's worker process (this build's or a baseline's); its stdout. A worker that fails ends the
    benchmark with its own last error line, not a bare exit status."""
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        path = env.get("PYTHONPATH", "").split(":")[0]
        raise SystemExit(f"the worker (PYTHONPATH {path}) failed with exit {done.returncode}: "
                         f"{lines[-1] if lines else 'no output'}")
    return done.stdout
