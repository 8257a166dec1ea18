"""``tokenpools demo``: for now, validate the example configs and print what they mean before any traffic.

When the replayer lands, ``run_demo`` becomes "replay Exp 1 and Exp 2 and write the report to ``out_dir``"; the
command's arguments and the ``run`` entry point stay.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from tokenpools.errors import ConfigError

DEFAULT_OUT = Path("out/demo")


def default_examples_dir() -> Path:
    """The repository's examples/ (the package is installed editable), else ./examples."""
    repo = Path(__file__).resolve().parent.parent / "examples"
    return repo if repo.is_dir() else Path("examples")


def example_files(examples_dir: Path) -> list[Path]:
    """The scenario configs: every *.yaml except the deliberately broken invalid*.yaml."""
    return sorted(p for p in examples_dir.glob("*.yaml") if not p.name.startswith("invalid"))


def run_demo(out_dir: Path, examples_dir: Path | None = None, overrides: Sequence[str] = (),
             now_s: float | None = None) -> int:
    """Print the tables of every example and write ``out_dir/summary.json``; 0 when all are valid, else 2."""
    from tokenpools.config import load_config, load_settings
    from tokenpools.config.render import make_console, render
    from tokenpools.config.summary import summarize, summary_json

    console = make_console()
    now = time.time() if now_s is None else now_s
    files = example_files(examples_dir or default_examples_dir())
    if not files:
        console.print(f"no example configs in {examples_dir or default_examples_dir()}")
        return 2
    summaries: list[dict[str, object]] = []
    status = 0
    for path in files:
        console.rule(str(path))
        try:
            config = load_config(path)
            settings = load_settings(config.settings_values, overrides)
        except ConfigError as exc:
            console.print(str(exc), style="red", highlight=False)
            status = 2
            continue
        pools = summarize(config, settings.policy, now)
        render(console, config, pools, settings.policy)
        summaries.append(summary_json(config, pools))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "summary.json"
    target.write_text(json.dumps(summaries, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    console.print(f"wrote {target}", highlight=False)
    return status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help=f"where to write results (default {DEFAULT_OUT})")
    parser.add_argument("--examples", type=Path, default=None, metavar="DIR",
                        help="directory of example configs (default: the repository's examples/)")


def run(args: argparse.Namespace) -> int:
    return run_demo(args.out, args.examples, args.overrides)
