"""``tokenpools experiment NAME --mode live``: an experiment mode the product finds through the entry point
``live`` of ``tokenpools.experiment_modes`` (``tokenpools_dev.commands.LIVE``), beside its own ``sim``.

``--time-scale K`` compresses the run (K = 0.2: five times faster; numbers stay in experiment seconds),
``--kubernetes`` runs the local kube-apiserver too (the default stack is ``--no-kubernetes``: the paper's
experiments never scale), ``--proxies N`` the proxy replicas, ``--set load.mode=closed`` sends the experiment's
closed-loop clients instead of its open-loop schedule (docs/load.md#live-experiments), ``--backend vllm`` serves Exp
1 with real vLLM (its CPU build and tiny model) instead of llm-d-inference-sim: the pool and the load are first
rescaled to what ``tokenpools calibrate`` measures on it (``live.calibrated``; docs/vllm.md#exp-1-on-real-vllm).
The options are checked before anything starts: a bad one is one line, exit 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenpools.argtypes import number, positive


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--mode live")
    group.add_argument("--time-scale", type=positive(float), default=1.0, metavar="K",
                       help="run latencies and the schedule × K (0.2 = 5× faster; results in experiment s)")
    group.add_argument("--kubernetes", action="store_true", help="run the local kube-apiserver as well")
    group.add_argument("--proxies", type=number(int, 1, True, "an integer"), default=1, metavar="N",
                       help="proxy replicas (default 1)")
    group.add_argument("--backend", default="sim", metavar="sim|vllm",
                       help="what serves the pool: llm-d-inference-sim (default) or real vLLM (Exp 1, time scale 1; "
                            "the pool and load are rescaled to a calibration of it first)")
    group.add_argument("--max-slots", type=int, default=None, metavar="N",
                       help="--backend vllm: the calibration's largest concurrency, so the most slots the pool gets "
                            "(default: the file's perReplica.concurrency)")


def experiment_live(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tokenpools.errors import ConfigError, ConfigProblem
    from tokenpools_dev.live.rescale import LiveBackend, check_live_options, parse_live_backend

    if args.sweep:  # a grid is the simulation's (one replay per point); a live run plays one setting
        raise ConfigError([ConfigProblem("tokenpools experiment", "--sweep does not apply to --mode live (see "
                                                                  "tokenpools experiment --help for each mode's options)")])
    try:
        backend = parse_live_backend(args.backend)
        check_live_options(backend, args.name, args.time_scale, args.max_slots)
    except ValueError as exc:
        raise ConfigError([ConfigProblem("tokenpools experiment", str(exc))]) from None
    from tokenpools_dev.live import report, runner  # the load generator's HTTP clients: after the cheap checks
    from tokenpools_dev.loadgen.cli import quiet_http_logs
    from tokenpools_dev.loadgen.closed import split_load_mode

    quiet_http_logs()
    import logging

    logging.getLogger("aiokafka").setLevel(logging.WARNING)  # the probes' consumers log every subscription
    console = Console(stderr=True)
    out: Path = args.out or Path("out") / f"{args.name}-live"
    load_mode, overrides = split_load_mode(args.overrides)
    options = runner.LiveOptions(name=args.name, out=out, time_scale=args.time_scale, overrides=overrides,
                                 config=args.config, kubernetes=args.kubernetes, proxies=args.proxies,
                                 load_mode=load_mode, backend=backend)
    try:  # the stack's own checks (e.g. a time scale above 10), before anything starts
        runner.stack_options(options, runner.scenario_for(options))
    except ValueError as exc:
        raise ConfigError([ConfigProblem("tokenpools experiment", str(exc))]) from None
    command = (f"tokenpools experiment {args.name} --mode live --time-scale {args.time_scale:g} --out {out}"
               + (f" --backend {backend}" if backend is not LiveBackend.SIM else "")
               + (f" --max-slots {args.max_slots}" if args.max_slots is not None else "")
               + "".join(f" --set {o}" for o in args.overrides))
    progress = lambda m: console.print(m, highlight=False)  # noqa: E731
    if backend is LiveBackend.VLLM:
        from tokenpools_dev.devstack.stack.backend import BackendKind, scrape_timing
        from tokenpools_dev.live.calibrated import calibrate_and_rescale

        rescaled = calibrate_and_rescale(options, progress, max_slots=args.max_slots)
        options = rescaled.options
        records = runner.run(options, progress=progress)
        stack_options = runner.stack_options(options, runner.scenario_for(options))
        reference_ttft_s, backend_note = rescaled.reference_ttft_s, rescaled.note()
        scrape_s = scrape_timing(BackendKind.VLLM, stack_options.scrape_s)[0]
    else:
        records = runner.run(options, progress=progress)
        stack_options = runner.stack_options(options, runner.scenario_for(options))
        profile = stack_options.sim
        reference_ttft_s = profile.ttft_s * profile.factor_under_load + 2 * profile.itl_s * profile.factor_under_load
        scrape_s, backend_note = stack_options.scrape_s / args.time_scale, ""
    live = report.write(options, records, reference_ttft_s, scrape_s, command, backend_note)
    console.print(f"report: {out / 'report.md'}   results: {out / 'results.json'}", highlight=False)
    key = "guaranteed_p99_ttft_s" if args.name == "exp1" else "p99_ttft_s"
    console.print(f"{load_mode.label}: token pools {key} {live['token_pools'].get(key)}; baseline "
                  f"{live['baseline'].get(key)}", highlight=False)
    return 0
