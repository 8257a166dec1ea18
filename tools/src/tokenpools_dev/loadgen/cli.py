"""``tokenpools load``: send an experiment's schedule (or a steady rate) through the proxies of a running stack.

Examples::

    tokenpools up --config examples/exp1.yaml --detach
    tokenpools load --experiment exp1 --out out/load-exp1          # targets and time scale from the stack
    tokenpools load --config examples/exp1.yaml --rate spot-b=2 --duration-s 30 --target http://127.0.0.1:8080

Writes ``attempts.jsonl``, ``completions.jsonl`` and ``summary.json`` to ``--out`` and prints a table per
entitlement. Times in the files are experiment seconds (wall seconds ÷ the time scale).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tokenpools.errors import PermanentError


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", choices=["exp1", "exp2"], help="send this experiment's schedule")
    parser.add_argument("--config", type=Path, help="pool, entitlements and demo keys (default examples/<experiment>.yaml)")
    parser.add_argument("--rate", action="append", default=[], metavar="NAME=REQ_PER_S",
                        help="instead of an experiment: steady Poisson arrivals for an entitlement (repeatable)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="with --rate (default 64)")
    parser.add_argument("--output-tokens", type=int, default=64, help="with --rate (default 64)")
    parser.add_argument("--duration-s", type=float, default=None, help="with --rate: experiment seconds (default 30)")
    parser.add_argument("--target", action="append", default=[], metavar="URL",
                        help="proxy base URL (repeatable: round robin); default: the running stack's proxies")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="the stack to load (default: the one the last `tokenpools up` started)")
    parser.add_argument("--time-scale", type=float, default=None, help="default: the running stack's, else 1")
    parser.add_argument("--key", action="append", default=[], metavar="NAME=KEY", help="API key of an entitlement")
    parser.add_argument("--api", choices=["completions", "chat"], default="completions")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="directory for the records (default: none)")


def _schedule(args: argparse.Namespace) -> tuple[Any, Path, float]:
    """(arrivals, config path, duration) from --experiment or --rate."""
    from tokenpools.replay.experiments import build, examples_dir
    from tokenpools.replay.load import Lengths, LoadSpec, poisson_arrivals

    if args.experiment and args.rate:
        raise PermanentError("give --experiment or --rate, not both")
    if args.experiment:
        config = args.config or examples_dir() / f"{args.experiment}.yaml"
        scenario = build(args.experiment, [*args.overrides, f"load.seed={args.seed}"], config)
        return scenario, config, scenario.duration_s
    if not args.rate or args.config is None:
        raise PermanentError("give --experiment NAME, or --config FILE with --rate NAME=REQ_PER_S")
    duration = args.duration_s or 30.0
    specs = []
    for item in args.rate:
        name, _, rate = item.partition("=")
        try:
            specs.append(LoadSpec(name.strip(), float(rate), Lengths(args.prompt_tokens, args.prompt_tokens),
                                  Lengths(args.output_tokens, args.output_tokens)))
        except ValueError:
            raise PermanentError(f"--rate expects NAME=REQ_PER_S, got {item!r}") from None
    return poisson_arrivals(specs, duration, args.seed), args.config, duration


def load(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tokenpools.config import load_config
    from tokenpools.replay.load import RetryPolicy
    from tokenpools_dev.devstack.stack.state import read_state
    from tokenpools_dev.loadgen.client import LoadGenerator, LoadOptions
    from tokenpools_dev.loadgen.keys import keys_for, parse_key_items
    from tokenpools_dev.loadgen.plan import summary_rows

    quiet_http_logs()
    schedule, config_path, duration = _schedule(args)
    arrivals = getattr(schedule, "arrivals", schedule)
    retry = getattr(schedule, "retry", RetryPolicy())
    loaded = load_config(config_path)
    state = read_state(args.run_dir)
    targets = args.target or (state.urls.get("proxies", []) if state and state.status == "ready" else [])
    if not targets:
        raise PermanentError("no --target and no running stack (`tokenpools up`) to send load to")
    scale = args.time_scale or (state.urls.get("time_scale", 1.0) if state and not args.target else 1.0)
    names = sorted({a.entitlement for a in arrivals})
    keys = keys_for(loaded, config_path.read_text(encoding="utf-8"), parse_key_items(args.key), names)
    model = next(iter(loaded.pools.values())).model
    options = LoadOptions(model=model, keys=keys, time_scale=scale, retry=retry, duration_s=duration, seed=args.seed,
                          api=args.api)

    async def go() -> Any:
        generator = LoadGenerator(targets, options)
        try:
            return await generator.run(arrivals)
        finally:
            await generator.close()

    console = Console(stderr=True)
    console.print(f"sending {len(arrivals)} requests over {duration:g} experiment s (×{scale:g} wall) to "
                  f"{', '.join(targets)}", highlight=False)
    result = asyncio.run(go())
    rows = summary_rows(result)
    _print(console, rows)
    if args.out is not None:
        write_records(result, args.out, rows)
    return 0


def quiet_http_logs() -> None:
    """httpx logs every request at INFO: thousands of lines per run, and CPU the load generator needs."""
    import logging

    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)


def write_records(result: Any, out: Path, rows: list[dict[str, object]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "attempts.jsonl", "w") as f:
        f.writelines(json.dumps(asdict(a)) + "\n" for a in result.attempts)
    with open(out / "completions.jsonl", "w") as f:
        f.writelines(json.dumps(asdict(c)) + "\n" for c in result.completions)
    (out / "summary.json").write_text(json.dumps({"time_scale": result.time_scale, "entitlements": rows,
                                                  "abandoned": result.abandoned, "pending": result.pending}, indent=2))


def _print(console: Any, rows: list[dict[str, object]]) -> None:
    from rich.table import Table

    from tokenpools.replay.results import fmt

    table = Table(title="load by entitlement (experiment seconds)", title_justify="left")
    for column in ("entitlement", "attempts", "admitted", "refused", "ok", "evicted", "errors", "abandoned",
                   "p50_ttft_s", "p99_ttft_s", "p99_e2e_s", "max_in_flight"):
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*(fmt(v) for v in row.values()))
    console.print(table)
