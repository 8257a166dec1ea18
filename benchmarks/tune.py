"""``tokenpools tune`` speed: one trial's real-time multiple, and 64 trials serial vs ``--workers 2`` vs a local Ray
cluster (a head and one worker node, one CPU each), with the trials' digests and best point compared.

    .venv/bin/python benchmarks/tune.py [--hours 1] [--rate 100] [--trials 64] [--no-ray] [--json]

The log is ``replay_speed``'s synthetic load (four entitlements over 32 replicas of 16 slots) at ``--rate``
requests/s for ``--hours``, written with ``logio.write_log`` and tuned against the same pool and entitlements as a
configuration file. Every run tunes the same space with the same seed (TPE, one objective and one constraint,
batches of 8, 30 % held out); the ratios are wall-clock times against the serial run measured in the same
invocation, on this machine (``machine`` in the output: its CPU count and load at the start).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SPACE = """\
parameters:
  policy.alpha_debt: {low: 0.5, high: 4.0}
  policy.gamma_debt: {low: 0.3, high: 0.95}
  policy.queue_slo_fraction: {low: 0.0, high: 1.0}
objectives:
  - {outcome: p99_client_ttft_s.interactive, direction: minimize}
constraints:
  - {outcome: refused.interactive, "<=": 1000000}
"""


def config_text(replicas: int) -> str:
    """replay_speed's pool and MIX as a configuration file (per slot: 30 tokens/s, 0.5 GiB KV)."""
    from replay_speed import MIX

    docs = [f"""apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: bench}}
spec:
  model: synthetic
  backendRef: {{apiVersion: apps/v1, kind: Deployment, name: bench}}
  scaling: {{minReplicas: {replicas}, maxReplicas: {replicas}}}
  perReplica: {{tokensPerSecond: 480, kvCacheGiB: 8, concurrency: 16}}
  kvBytesPerToken: 147456
  defaults: {{maxTokens: 128}}
"""]
    for name, cls, slo, _, slots in MIX:
        resources = (f"\n  resources: {{tokensPerSecond: {30 * slots}, kvCacheGiB: {slots / 2:g}, concurrency: {slots}}}"
                     if slots else "")
        docs.append(f"""apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: {name}}}
spec:
  tenantId: {name}
  poolRef: {{name: bench}}
  qos: {{serviceClass: {cls.lower()}, sloTargetMs: {slo:g}}}{resources}
""")
    return "---\n".join(docs)


def _tune(log: Path, config: Path, space: Path, out: Path, trials: int, extra: list[str]) -> tuple[float, dict[str, Any]]:
    cmd = [sys.executable, "-m", "tokenpools", "tune", str(log), "--config", str(config), "--space", str(space),
           "--out", str(out), "--trials", str(trials), "--batch", "8", "--no-progress", "--json", *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, json.loads(done.stdout)


def _ray_cluster(tmp: Path) -> tuple[str, list[str]]:
    ray = str(Path(sys.executable).with_name("ray"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["--num-cpus", "1", "--object-store-memory", str(200 * 2**20), "--disable-usage-stats",
              "--node-ip-address", "127.0.0.1"]
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    subprocess.run([ray, "start", "--head", "--port", str(port), "--temp-dir", temp, "--include-dashboard", "false",
                    *common], check=True, capture_output=True)
    subprocess.run([ray, "start", "--address", f"127.0.0.1:{port}", *common], check=True, capture_output=True)
    return f"127.0.0.1:{port}", [ray, "stop", "--force"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second (default 100)")
    parser.add_argument("--replicas", type=int, default=32)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray cluster run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    from replay_speed import synthetic_scenario

    from tokenpools import accel
    from tokenpools.replay import logio
    from tokenpools.replay.replayer import replay

    machine = {"cpus": os.cpu_count(), "load_1m": os.getloadavg()[0], "platform": platform.platform(),
               "python": platform.python_version(), "build": accel.describe()}
    figures: dict[str, Any] = {"machine": machine, "hours": args.hours, "rate": args.rate, "trials": args.trials}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        log, config, space = tmp / "log", tmp / "config.yaml", tmp / "space.yaml"
        logio.write_log(replay(synthetic_scenario(args.hours, args.rate, args.replicas), "none"), log)
        config.write_text(config_text(args.replicas), encoding="utf-8")
        space.write_text(SPACE, encoding="utf-8")
        runs: dict[str, tuple[float, dict[str, Any]]] = {}
        runs["serial"] = _tune(log, config, space, tmp / "serial", args.trials, ["--workers", "1"])
        runs["workers_2"] = _tune(log, config, space, tmp / "workers", args.trials, ["--workers", "2"])
        if not args.no_ray:
            address, stop = _ray_cluster(tmp)
            try:
                runs["ray"] = _tune(log, config, space, tmp / "ray", args.trials, ["--ray", address])
            finally:
                subprocess.run(stop, capture_output=True)
    serial_s, serial = runs["serial"]
    figures["trial_realtime_multiple_defaults"] = serial["speed"]["current_realtime_multiple"]
    figures["trial_cpu_us_per_request_defaults"] = serial["speed"]["current_cpu_us_per_request"]
    figures["median_trial_realtime_multiple"] = serial["speed"]["median_realtime_multiple"]
    for name, (wall_s, summary) in runs.items():
        figures[name] = {"wall_s": round(wall_s, 2), "speedup_vs_serial": round(serial_s / wall_s, 2),
                         "same_digests": summary["digests"] == serial["digests"],
                         "same_best": summary["best"] == serial["best"]}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
