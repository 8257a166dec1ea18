"""``tokenpools calibrate URL --model NAME``: the command's arguments, its run, and the files it writes.

Exit codes: 0 a step met the target (a ``perReplica`` is proposed); 1 none did, or the backend failed the warm-up;
2 bad input (a non-positive number, an URL that is not one or cannot be reached, a model the backend does not
serve), one line each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from tokenpools.calibrate.plan import DEFAULT_ROUNDS, make_plan
from tokenpools.calibrate.result import Calibration

EXIT_OK, EXIT_NONE_CHOSEN = 0, 1
FILES = ("calibration.yaml", "calibration.json", "calibration.png")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="one backend replica's base URL, e.g. http://127.0.0.1:8000 "
                                                   "(not a load balancer: the figures are per replica)")
    parser.add_argument("--model", required=True, metavar="NAME", help="the model to ask for (as /v1/models lists it)")
    parser.add_argument("--max-concurrency", type=int, default=16, metavar="N",
                        help="the last step's concurrency; steps are 1, 2, 4, … below it, then N (default 16)")
    parser.add_argument("--prompt-tokens", type=int, default=256, metavar="P",
                        help="prompt tokens per request, approximately (default 256)")
    parser.add_argument("--output-tokens", type=int, default=128, metavar="O",
                        help="max_tokens per request, with ignore_eos where the backend accepts it (default 128)")
    parser.add_argument("--ttft-p99-target-ms", type=float, default=1000.0, metavar="T",
                        help="the chosen concurrency is the largest whose P99 TTFT is at most T (default 1000)")
    per_step = parser.add_mutually_exclusive_group()
    per_step.add_argument("--rounds", type=int, default=None, metavar="K",
                          help=f"requests per client per step: c × K requests at concurrency c (default "
                               f"{DEFAULT_ROUNDS})")
    per_step.add_argument("--seconds-per-step", type=float, default=None, metavar="S",
                          help="instead of --rounds: each step sends requests for S seconds")
    parser.add_argument("--request-timeout-s", type=float, default=120.0, metavar="S",
                        help="a request not ended after S seconds fails its step (default 120)")
    parser.add_argument("--kv-bytes-per-token", type=int, default=None, metavar="C",
                        help="the pool's bytes of KV cache per token (its kvBytesPerToken): converts the KV blocks "
                             "vLLM reports into kvCacheGiB")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write DIR/calibration.yaml (the perReplica snippet; removed when no step met the "
                             "target), calibration.json and calibration.png")
    parser.add_argument("--json", action="store_true", help="print the JSON document instead of the table")


def run(args: argparse.Namespace) -> int:
    from tokenpools.calibrate.probe import calibrate
    from tokenpools.runtime.clock import SystemClock

    plan = make_plan(args.url, args.model, max_concurrency=args.max_concurrency, prompt_tokens=args.prompt_tokens,
                     output_tokens=args.output_tokens, ttft_p99_target_ms=args.ttft_p99_target_ms,
                     rounds=args.rounds, step_s=args.seconds_per_step, request_timeout_s=args.request_timeout_s,
                     kv_bytes_per_token=args.kv_bytes_per_token)
    calibration = asyncio.run(calibrate(plan, SystemClock()))
    if args.json:
        print(json.dumps(calibration.document(), indent=2))
    else:
        from rich.console import Console

        from tokenpools.calibrate.view import report

        Console(width=None if sys.stdout.isatty() else 160).print(report(calibration))
    if args.out is not None:
        write(calibration, args.out)
    return EXIT_OK if calibration.chosen() is not None else EXIT_NONE_CHOSEN


def write(calibration: Calibration, out: Path) -> list[Path]:
    """The three files (the YAML only when a step met the target: an older one would read as this run's)."""
    from tokenpools.calibrate.plot import write_png

    out.mkdir(parents=True, exist_ok=True)
    yaml_path, json_path, png_path = (out / name for name in FILES)
    written = []
    text = calibration.snippet()
    if text is None:
        yaml_path.unlink(missing_ok=True)
    else:
        yaml_path.write_text(text)
        written.append(yaml_path)
    json_path.write_text(json.dumps(calibration.document(), indent=2) + "\n")
    written += [json_path, write_png(calibration, png_path)]
    return written
