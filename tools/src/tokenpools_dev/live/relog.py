"""A live pass as a recorded log, and how closely a replay of that log makes the live proxy's decisions.

``write_log`` writes what the pass's topics received (the proxy's request and completion events, the agents' limit
updates and scale commands, the membership changes on the specs topic) in ``tokenpools record``'s layout, in wall
time, exactly as the recorder would have. ``replay_match`` replays it with ``tokenpools replay``'s own path
(``replay.logio``) against the configuration the stack ran (``RUN_DIR/config-proxy.yaml``: every time constant and
rate already × the time scale) and reports the share of live decisions the replay made the same way:

- ``recorded``: the log's own service times stand in for the backend (``replay.backend=recorded``) and each limit
  update is put in force when the live proxy held it (its decisions' ``limits_version``), so the only difference
  left is the order of things within the same few ms — this checks that the replayer runs the proxy's and the
  agents' decisions;
- ``sim``: the backend simulator serves (the what-if mode): its latencies are not llm-d-inference-sim's, in-flight
  counts drift and concurrency decisions with them. Only at time scale 1 (the simulator is calibrated in
  experiment seconds).

With several proxies the live decisions were split across independent admission states that one replay does not
model, so the figures are for one proxy (``proxies`` says how many there were).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenpools.replay import logio, trace
from tokenpools.replay.replayer import replay
from tokenpools.replay.results import r4
from tokenpools_dev.live.runner import PassRecord

TABLES = ("requests", "completions", "limits", "scale", "specs")  # topic suffixes written to the log


def write_log(rec: PassRecord, root: Path) -> list[Path]:
    """The pass's topics as a log directory (one Parquet table per record type, partitioned by hour)."""
    rows: dict[str, list[dict[str, object]]] = {}
    for topic, records in sorted(rec.topics.items()):
        if not topic.endswith(TABLES):
            continue
        for offset, record in enumerate(records):
            rows.setdefault(record.record_type, []).append(trace.record_row(record, -1, offset))
    paths: list[Path] = []
    for table, table_rows in sorted(rows.items()):
        paths += trace.write_partitioned(root, table, trace.frame(table, table_rows), partition=-1, first_offset=-1)
    return paths


def replay_match(root: Path, config_path: Path, overrides: Sequence[str], time_scale: float) -> dict[str, Any]:
    """Match rates of the replayed log against its recorded decisions (see the module doc)."""
    from tokenpools.config import load_config
    from tokenpools.replay.experiments import apply_replay_items, params_from
    from tokenpools.replay.log_replay import pool_of

    config = load_config(config_path)
    params, _ = params_from(config.settings_values, overrides)  # (load.* items describe the load: recorded here)
    pool, entitlements = pool_of(config)
    decided = trace.read_table(root, trace.REQUESTS)
    out: dict[str, Any] = {"decisions": decided.height, "proxies": decided["proxy_id"].n_unique()}
    for backend in ("recorded", "sim"):
        if backend == "sim" and time_scale != 1:
            out[backend] = None
            continue
        scenario, recorded = logio.scenario_from_log(root, pool, entitlements,
                                                     apply_replay_items(params, [f"replay.backend={backend}"]))
        rate, _ = logio.match_rate(replay(scenario, "token-pools"), recorded)
        out[backend] = r4(rate)
    return out
