"""``tokenpools load``: send an experiment's load (or a steady one) through the proxies of a running stack, open or
closed loop (docs/load.md).

Examples::

    tokenpools up --config examples/exp1.yaml --detach
    tokenpools load --experiment exp1 --out out/load-exp1          # targets and time scale from the stack
    tokenpools load --experiment exp1 --closed                     # its clients: 6 + 10 + 6 (c in [30, 60) s)
    tokenpools load --config examples/exp1.yaml --rate spot-b=2 --duration-s 30 --target http://127.0.0.1:8080
    tokenpools load --config examples/exp1.yaml --closed 8 --key spot-b=sk-exp1-spot-b --duration-s 30
    tokenpools load --config examples/exp1.yaml --clients guaranteed-a=4 --clients spot-b=12 --think-s 0.5

Open loop (``--experiment``, ``--rate``): requests go out at their scheduled times whatever happens. Closed loop
(``--closed [N]``, ``--clients NAME=N``, or ``--set load.mode=closed``): N clients per entitlement, each sending
its next request when its previous one ended (answered, evicted or given up after its retries) plus ``--think-s``.
Writes ``attempts.jsonl``, ``completions.jsonl`` and ``summary.json`` (with the mode) to ``--out`` and prints the
mode and a table per entitlement. Times in the files are experiment seconds (wall seconds ÷ the time scale).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenpools.errors import PermanentError
from tokenpools_dev.loadgen.plan import LoadMode

if TYPE_CHECKING:  # the command's arguments are added without importing the load model
    from tokenpools.replay.load import Arrival, ClosedLoad, RetryPolicy


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", choices=["exp1", "exp2"], help="send this experiment's load")
    parser.add_argument("--config", type=Path, help="pool, entitlements and demo keys (default examples/<experiment>.yaml)")
    parser.add_argument("--rate", action="append", default=[], metavar="NAME=REQ_PER_S",
                        help="instead of an experiment: steady Poisson arrivals for an entitlement (repeatable)")
    parser.add_argument("--closed", type=int, nargs="?", const=0, default=None, metavar="N",
                        help="closed loop: N clients per entitlement (those of --experiment, else those named by "
                             "--key), each sending its next request when its previous one ended; with --experiment "
                             "and no N, the experiment's own (exp1: guaranteed-a 6, spot-b 10, guaranteed-c 6 in "
                             "[30, 60) s; exp2: 5 per entitlement, reports from 210 s)")
    parser.add_argument("--clients", action="append", default=[], metavar="NAME=N",
                        help="closed loop: N clients for this entitlement (repeatable; wins over --closed N)")
    parser.add_argument("--think-s", type=float, default=None,
                        help="closed loop: experiment seconds a client waits between a request's end and its next "
                             "(default 0)")
    parser.add_argument("--stagger-s", type=float, default=None,
                        help="closed loop: client i of an entitlement starts i × this after it (default 0)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="without --experiment (default 64)")
    parser.add_argument("--output-tokens", type=int, default=64, help="without --experiment (default 64)")
    parser.add_argument("--duration-s", type=float, default=None,
                        help="without --experiment: experiment seconds (default 30)")
    parser.add_argument("--target", action="append", default=[], metavar="URL",
                        help="proxy base URL (repeatable: round robin); default: the running stack's proxies")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="the stack to load (default: the one the last `tokenpools up` started)")
    parser.add_argument("--time-scale", type=float, default=None, help="default: the running stack's, else 1")
    parser.add_argument("--key", action="append", default=[], metavar="NAME=KEY", help="API key of an entitlement")
    parser.add_argument("--api", choices=["completions", "chat"], default="completions",
                        help="the OpenAI endpoint each request goes to: /v1/completions with a prompt, or "
                             "/v1/chat/completions with one user message (default completions)")
    parser.add_argument("--seed", type=int, default=1,
                        help="draws the arrivals, the request sizes (an --experiment's) and the retries' jitter: "
                             "the same seed sends the same load (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the records (default: none)")


@dataclass(frozen=True, slots=True)
class Plan:
    """What a ``tokenpools load`` run sends: open-loop arrivals or closed-loop clients, with its retry policy."""

    mode: LoadMode
    config: Path
    duration_s: float
    retry: RetryPolicy
    arrivals: tuple[Arrival, ...] = ()
    clients: tuple[ClosedLoad, ...] = ()

    @property
    def entitlements(self) -> list[str]:
        return sorted({a.entitlement for a in self.arrivals} | {c.entitlement for c in self.clients})

    def describe(self) -> str:
        from tokenpools_dev.loadgen.closed import describe

        what = describe(self.clients) if self.mode is LoadMode.CLOSED else f"{len(self.arrivals)} requests"
        return f"{self.mode.label}: {what} over {self.duration_s:g} experiment s"


def _named_counts(items: Sequence[str], flag: str) -> dict[str, int]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            out[name.strip()] = int(value)
        except ValueError:
            raise PermanentError(f"{flag} expects NAME=N, got {item!r}") from None
    return out


def plan_of(args: argparse.Namespace) -> Plan:
    """The run's plan from --experiment, --rate or the closed-loop flags (which model, what to send)."""
    from tokenpools.replay.experiments import build, examples_dir
    from tokenpools.replay.load import ClosedLoad, Lengths, LoadSpec, RetryPolicy, poisson_arrivals
    from tokenpools_dev.loadgen.closed import closed_overrides, experiment_clients, split_load_mode, with_clients
    from tokenpools_dev.loadgen.keys import parse_key_items

    set_mode, overrides = split_load_mode(args.overrides)
    by_name = _named_counts(args.clients, "--clients")
    closed = args.closed is not None or bool(by_name) or set_mode is LoadMode.CLOSED
    if args.experiment and args.rate:
        raise PermanentError("give --experiment or --rate, not both")
    if closed and args.rate:
        raise PermanentError("--rate sends open-loop arrivals, --closed/--clients closed-loop clients: give one")
    if args.closed is not None and args.closed < 0:
        raise PermanentError(f"--closed N needs N >= 1, got {args.closed}")
    if args.experiment:
        config = args.config or examples_dir() / f"{args.experiment}.yaml"
        mode = LoadMode.CLOSED if closed else LoadMode.OPEN
        scenario = build(args.experiment, closed_overrides(mode, [*overrides, f"load.seed={args.seed}"]), config)
        if not closed:
            return Plan(LoadMode.OPEN, config, scenario.duration_s, scenario.retry, arrivals=tuple(scenario.arrivals))
        clients = with_clients(experiment_clients(scenario), args.closed, by_name, args.think_s, args.stagger_s)
        return Plan(LoadMode.CLOSED, config, scenario.duration_s, scenario.retry, clients=clients)
    if args.config is None or not (args.rate or closed):
        raise PermanentError("give --experiment NAME, or --config FILE with --rate NAME=REQ_PER_S or --closed N")
    duration = args.duration_s or 30.0
    prompt, output = Lengths(args.prompt_tokens, args.prompt_tokens), Lengths(args.output_tokens, args.output_tokens)
    if closed:
        names = list(dict.fromkeys([*by_name, *parse_key_items(args.key)]))
        if not names:
            raise PermanentError("name the entitlements of the closed loop: --clients NAME=N, or --closed N with "
                                 "--key NAME=KEY")
        if not args.closed and any(n not in by_name for n in names):
            raise PermanentError("give the number of clients: --closed N, or --clients NAME=N for each entitlement")
        loads = tuple(ClosedLoad(n, args.closed or 0, prompt, output, end_s=duration) for n in names)
        return Plan(LoadMode.CLOSED, args.config, duration, RetryPolicy(),
                    clients=with_clients(loads, args.closed, by_name, args.think_s, args.stagger_s))
    specs = []
    for item in args.rate:
        name, _, rate = item.partition("=")
        try:
            specs.append(LoadSpec(name.strip(), float(rate), prompt, output))
        except ValueError:
            raise PermanentError(f"--rate expects NAME=REQ_PER_S, got {item!r}") from None
    arrivals = tuple(poisson_arrivals(specs, duration, args.seed))
    return Plan(LoadMode.OPEN, args.config, duration, RetryPolicy(), arrivals=arrivals)


def load(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tokenpools.config import load_config
    from tokenpools_dev.devstack.stack.state import read_state

    plan = plan_of(args)
    loaded = load_config(plan.config)
    state = read_state(args.run_dir)
    targets = args.target or (state.urls.get("proxies", []) if state and state.status == "ready" else [])
    if not targets:
        raise PermanentError("no --target and no running stack (`tokenpools up`) to send load to")
    check_targets(targets)
    from tokenpools_dev.loadgen.client import LoadGenerator, LoadOptions  # HTTP clients: after the cheap checks
    from tokenpools_dev.loadgen.keys import keys_for, parse_key_items
    from tokenpools_dev.loadgen.plan import summary_rows

    quiet_http_logs()
    scale = args.time_scale or (state.urls.get("time_scale", 1.0) if state and not args.target else 1.0)
    keys = keys_for(loaded, plan.config.read_text(encoding="utf-8"), parse_key_items(args.key), plan.entitlements)
    model = next(iter(loaded.pools.values())).model
    options = LoadOptions(model=model, keys=keys, time_scale=scale, retry=plan.retry, duration_s=plan.duration_s,
                          seed=args.seed, api=args.api)

    async def go() -> Any:
        generator = LoadGenerator(targets, options)
        try:
            return await generator.run(plan.arrivals, clients=plan.clients)
        finally:
            await generator.close()

    console = Console(stderr=True)
    console.print(f"{plan.describe()} (×{scale:g} wall) to {', '.join(targets)}", highlight=False)
    result = asyncio.run(go())
    rows = summary_rows(result)
    _print(console, rows, plan.mode)
    if args.out is not None:
        write_records(result, args.out, rows, plan.mode)
    return 0


def check_targets(targets: Sequence[str], timeout_s: float = 3.0) -> None:
    """A target that is no http(s) URL, or where nothing accepts a connection, is one line (exit 2) before the
    load starts, instead of a whole run of failed requests."""
    import socket
    from urllib.parse import urlsplit

    for url in targets:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PermanentError(f"--target expects an http(s):// URL such as http://127.0.0.1:8080, got {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            with socket.create_connection((parts.hostname, port), timeout=timeout_s):
                pass
        except ValueError:  # a port out of range
            raise PermanentError(f"--target {url}: not a valid port") from None
        except OSError as exc:
            raise PermanentError(f"--target {url}: nothing answers ({exc.strerror or type(exc).__name__})") from None


def quiet_http_logs() -> None:
    """httpx logs every request at INFO: thousands of lines per run, and CPU the load generator needs."""
    import logging

    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)


def write_records(result: Any, out: Path, rows: list[dict[str, object]], mode: LoadMode = LoadMode.OPEN) -> None:
    """The run's records and summary (with how it sent its load: open loop unless the caller says closed)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "attempts.jsonl", "w") as f:
        f.writelines(json.dumps(asdict(a)) + "\n" for a in result.attempts)
    with open(out / "completions.jsonl", "w") as f:
        f.writelines(json.dumps(asdict(c)) + "\n" for c in result.completions)
    (out / "summary.json").write_text(json.dumps({"mode": mode.value, "time_scale": result.time_scale,
                                                  "entitlements": rows,
                                                  "abandoned": result.abandoned, "pending": result.pending}, indent=2))


COLUMNS = ("entitlement", "attempts", "admitted", "refused", "ok", "evicted", "errors", "abandoned", "p50_ttft_s",
           "p99_ttft_s", "p99_client_ttft_s", "p99_e2e_s", "max_in_flight", "max_open")


def _print(console: Any, rows: list[dict[str, object]], mode: LoadMode) -> None:
    from rich.table import Table

    from tokenpools.replay.results import fmt

    table = Table(title=f"load by entitlement ({mode.label}, experiment seconds; abandoned = given up)",
                  title_justify="left")
    for column in COLUMNS:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*(fmt(row[c]) for c in COLUMNS))
    console.print(table)
