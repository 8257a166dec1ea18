"""``tokenpools up`` and ``tokenpools down`` (rows of ``tokenpools.cli.COMMANDS``).

``up`` starts the stack (``devstack.stack.lifecycle``), prints the status table and serves until SIGINT/SIGTERM (or
``tokenpools down``), then stops everything in reverse order. ``--detach`` runs that same foreground process in the
background and returns once it is ready, printing each vLLM replica's progress from the state file meanwhile.
``down`` finds the stack through its state file.

Options are validated before anything starts (``--backend``, and what it rules out, exit 2 with one line), and so is
the backend itself (vLLM installed, a ``--backend URL`` serving every pool's model), before ``--detach`` forks.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tokenpools.argtypes import positive

DEFAULT_RUN_DIR = Path(".run/stack")


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, type=Path, metavar="FILE", help="TokenPool/TokenEntitlement YAML")
    parser.add_argument("--no-kubernetes", action="store_true",
                        help="no kube-apiserver: the controller serves the file and the scaler only logs")
    parser.add_argument("--proxies", type=int, default=1, metavar="N", help="proxy replicas (default 1)")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR, help=f"logs, state, data (default {DEFAULT_RUN_DIR})")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="K",
                        help="multiply every latency and control-loop time by K (< 1 compresses; default 1)")
    parser.add_argument("--split", action="append", default=[], metavar="POOL=N",
                        help="run each replica of POOL as N smaller simulators (lets a replica fail alone)")
    parser.add_argument("--backend", default="sim", metavar="sim|vllm|URL",
                        help="what serves the pools: sim (llm-d-inference-sim per replica, default), vllm (real vLLM "
                             "per replica, after scripts/install-vllm.sh; about a minute to start) or the http(s) URL of a "
                             "running OpenAI-compatible server (nothing started; the proxies point at it)")
    parser.add_argument("--no-agents", action="store_true", help="do not run the stream agents")
    parser.add_argument("--agents-workers", type=int, default=1, metavar="N",
                        help="agents processes in one consumer group, each with its share of the partitions (default 1)")
    parser.add_argument("--no-controller", action="store_true", help="do not run the controller")
    parser.add_argument("--ready-timeout-s", type=positive(float), default=120.0,
                        help="per component (default 120; a vLLM replica gets at least 600)")
    parser.add_argument("--detach", action="store_true", help="run in the background; return when ready")


def add_down_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="the stack's run dir (default: the one the last `tokenpools up` started)")
    parser.add_argument("--timeout-s", type=positive(float), default=60.0, help="wait this long for a clean stop (default 60)")


def _split(items: list[str]) -> dict[str, int]:
    from tokenpools.errors import PermanentError

    out = {}
    for item in items:
        pool, sep, n = item.partition("=")
        if not sep or not n.strip().isdigit():
            raise PermanentError(f"--split expects POOL=N such as qwen3-8b=2, got {item!r}")
        out[pool.strip()] = int(n)
    return out


def stack_options(args: argparse.Namespace) -> Any:
    """The validated options; a ``ConfigError`` of one line (exit 2) names what is wrong."""
    from tokenpools.errors import ConfigError, ConfigProblem
    from tokenpools_dev.devstack.stack.backend import parse_backend
    from tokenpools_dev.devstack.stack.config import StackOptions

    try:
        return StackOptions(config=args.config, run_dir=args.run_dir, proxies=args.proxies,
                            kubernetes=not args.no_kubernetes, agents=not args.no_agents,
                            agents_workers=args.agents_workers,
                            controller=not args.no_controller, time_scale=args.time_scale, split=_split(args.split),
                            overrides=tuple(getattr(args, "overrides", []) or ()),
                            ready_timeout_s=args.ready_timeout_s, backend=parse_backend(args.backend))
    except ValueError as exc:
        raise ConfigError([ConfigProblem("tokenpools up", str(exc))]) from None


def status_table(state: Any) -> Any:
    from rich.table import Table

    table = Table(title=f"tokenpools stack: {state.status} ({state.run_dir})", title_justify="left")
    for column in ("component", "pid", "address", "status", "log"):
        table.add_column(column, overflow="fold")
    for c in state.components:
        colour = "green" if c.status in ("running", "ready") else ("yellow" if c.status in ("down", "starting")
                                                                   else "red")
        table.add_row(c.name, str(c.pid or "—"), c.address, f"[{colour}]{c.status}[/]", c.log)
    return table


def _stack(options: Any, **kwargs: Any) -> Any:
    """The ``Stack``; what its config rules out (a ``--split`` of a pool it lacks, or into parts its slots do not
    divide into) is a ``ConfigError`` of one line (exit 2), before anything starts."""
    from tokenpools.errors import ConfigError, ConfigProblem
    from tokenpools_dev.devstack.stack.lifecycle import Stack

    try:
        return Stack(options, **kwargs)
    except ValueError as exc:
        raise ConfigError([ConfigProblem("tokenpools up", str(exc))]) from None


def up(args: argparse.Namespace) -> int:
    options = stack_options(args)
    if args.detach:
        _stack(options).check_backend()  # here, so that a failure is one line on this terminal, not in up.log
        return _detach(args, options)
    import logging

    from rich.console import Console

    logging.getLogger("aiokafka").setLevel(logging.WARNING)  # the readiness probes' consumers are chatty

    from tokenpools_dev.devstack.stack.state import read_state

    console = Console(stderr=True)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if not stop.is_set() and stack.status == "ready":
            stop.set()
        else:  # still starting: unwind start(), which stops what it started
            raise KeyboardInterrupt

    stack = _stack(options, publish_pointer=True)
    stack.check_backend()
    previous = [signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)]
    try:
        started = time.monotonic()
        stack.start()
        console.print(status_table(read_state(stack.run_dir)))
        console.print(f"ready in {time.monotonic() - started:.1f} s; proxies {', '.join(stack.proxy_urls) or 'none'}; "
                      f"backend {stack.backend}; config {stack.config_path}. Stop with Ctrl-C or `tokenpools down`.",
                      highlight=False)
        while not stop.wait(1.0):
            dead = [c.name for c in stack.components() if c.status.startswith("exited")]
            if dead:
                console.print(f"[red]component(s) exited: {', '.join(dead)}; stopping[/]")
                break
    finally:
        for s, handler in zip((signal.SIGINT, signal.SIGTERM), previous):
            signal.signal(s, handler)
        stack.stop()
        console.print(f"stack stopped ({stack.run_dir})", highlight=False)
    return 0


def _detach(args: argparse.Namespace, options: Any) -> int:
    from rich.console import Console

    from tokenpools_dev.devstack.stack.state import Progress, pid_runs, read_state

    argv = [a for a in sys.argv[1:] if a != "--detach"]
    run_dir: Path = args.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    with open(run_dir / "logs" / "up.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tokenpools", *argv], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    console = Console(stderr=True)
    started = time.monotonic()
    deadline = started + 2 * options.ready_timeout_s + options.replica_ready_timeout_s
    progress = Progress()
    while time.monotonic() < deadline:
        state = read_state(run_dir)
        if state is not None and state.pid == proc.pid:
            progress, lines = progress.after(state, time.monotonic() - started)
            for line in lines:
                console.print(line, highlight=False)
        if state is not None and state.pid == proc.pid and state.status in ("ready", "failed", "stopped"):
            console.print(status_table(state))
            if state.status == "ready":
                console.print(f"running in the background (pid {proc.pid}); stop with `tokenpools down`", highlight=False)
                return 0
            console.print(f"[red]stack failed[/]: {state.message}\nsee {run_dir / 'logs' / 'up.log'}")
            return 2  # exit codes: the stack could not start here (1 is a finding)
        if proc.poll() is not None or not pid_runs(proc.pid, ""):
            console.print(f"[red]`tokenpools up` exited with {proc.returncode}[/]; see {run_dir / 'logs' / 'up.log'}")
            return 2  # exit codes: the stack could not start here (1 is a finding)
        time.sleep(0.5)
    console.print("[red]the stack did not become ready in time[/]; stopping it")
    proc.terminate()
    return 2


def down(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tokenpools_dev.devstack.stack.state import read_state, stop_recorded

    from tokenpools.errors import PermanentError

    if args.run_dir is not None and args.run_dir.exists() and not args.run_dir.is_dir():
        raise PermanentError(f"--run-dir {args.run_dir}: not a directory (a stack's run dir holds its stack.json)")
    console = Console(stderr=True)
    state = read_state(args.run_dir)
    if state is None:  # nothing running there: down is idempotent
        console.print(f"no stack state found{f' in {args.run_dir}' if args.run_dir else ''}: nothing to stop")
        return 0
    leftovers = stop_recorded(state, args.timeout_s)
    after = read_state(Path(state.run_dir))
    if leftovers:
        console.print(f"stopped components the stack left running: {', '.join(leftovers)}")
    console.print(f"stack in {state.run_dir}: {after.status if after else 'stopped'}", highlight=False)
    return 0
