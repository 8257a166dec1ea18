"""Exp 1 live, compressed 4×: the real stack (Kafka, llm-d-inference-sim behind the pool's Service, Prometheus,
agents, controller, proxy) and the load generator, token pools against no admission control.

What it proves is the direction of the paper's result, on real processes: with token pools the guaranteed
tenants' P99 TTFT stays bounded and far below the baseline's, the backend queue stays (nearly) empty while the
baseline's grows, spot is refused while guaranteed-c overloads the pool and gets its slots back once c leaves.

Why the assertions are relative (measured against the baseline of the same run) and why there are two TTFTs:
compressed 4×, every wall-clock stall of the client counts four times in experiment seconds. On a loaded 2-core
machine the load generator's event loop fires late by up to ~0.2 s wall (its ``loop_lag_p99_ms``), which alone
moves the client's guaranteed P99 from ~0.4 s to ~2.7 s, while the same requests' TTFT measured at the proxy (the
backend's own latency, queueing included) stays at ~0.35 s. So the client's P99 is asserted bounded and far below
the baseline's (whose ~15 s is queueing, not stalls), and the proxy's P99 tightly: it is what admission control
controls. Absolute numbers are in the report and the README.

It runs with the admission queue off (``policy.queue_slo_fraction=0``), the paper's proxy: its last assertion is
that the pass's own log, replayed, makes the live decisions, and with waiting on a decision also depends on the
order of a release and a queue's wake within the same millisecond, which the replay of a compressed, loaded run
reproduces less often (measured 0.82 and 0.92 against 0.97 without waiting). The queue is exercised live by the
Exp 2, autoscale and stack tests, and its order and wakes exactly by tests/component/test_proxy_queue.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tokenpools_dev.live import report, runner
from tokenpools_dev.live.assemble import ticks_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIME_SCALE = 0.25  # 90 s of experiment per pass in 22.5 s


def test_compressed_exp1_protects_guaranteed_and_throttles_spot(tmp_path: Path) -> None:
    options = runner.LiveOptions(name="exp1", out=tmp_path, time_scale=TIME_SCALE,
                                 overrides=("policy.queue_slo_fraction=0",))
    records = runner.run(options, progress=lambda _: None)
    stack_options = runner.stack_options(options, runner.scenario_for(options))
    live = report.write(options, records, 0.22, stack_options.scrape_s / TIME_SCALE, "test")
    tp, base = live["token_pools"], live["baseline"]
    overload, after = "+ c: overload (22 of 16)", "c gone (16 of 16)"
    context = {"client": tp["client"], "baseline client": base["client"]}

    # the client itself worked: every request was sent, none failed inside the load generator
    assert tp["client"]["failures"] == base["client"]["failures"] == 0
    assert tp["client"]["errors"] == base["client"]["errors"] == 0
    # baseline: the backend's own queue grows (paper 34) and guaranteed latency with it (paper 19+ s)
    assert base["max_waiting"] >= 20, base["backend"]
    assert base["guaranteed_p99_ttft_s"] > 8.0
    # token pools, at the client: guaranteed P99 TTFT bounded and far below the baseline's of this very run
    assert tp["guaranteed_p99_ttft_s"] < min(8.0, base["guaranteed_p99_ttft_s"] / 2.5), context
    # ... and at the proxy, where client stalls do not count: the backend answers guaranteed without queueing
    at_proxy = guaranteed_p99_ttft_at_proxy_s(records["token-pools"])
    assert at_proxy < min(1.5, base["guaranteed_p99_ttft_s"] / 10), (at_proxy, context)
    assert tp["max_waiting"] <= 6 < base["max_waiting"]
    # spot: refused during the overload (paper 47 %), back to its slots when guaranteed-c leaves
    assert tp["spot_throttle_rate"] >= 0.3
    running = tp["spot_mean_running_by_phase"]
    assert running[after] >= 1.5 * running[overload], running
    # guaranteed-c's join was in force before its traffic (``control.membership_lead_s``): its first tick is of a
    # window that ended before its first request
    c_ticks = [t for t in runs_ticks(records) if t.entitlement == "guaranteed-c"]
    c_first = min(a.t_s for a in records["token-pools"].load.attempts if a.entitlement == "guaranteed-c")
    assert c_ticks and c_ticks[0].t_s <= c_first, (c_ticks[:2], c_first)
    ticks = [t for t in runs_ticks(records) if t.entitlement == "spot-b"]
    # a tick stamped just before 60 s may already be computed without c (membership is read when the agents tick,
    # one grace period after the window ends): "during" stops a tick and a grace before c leaves
    during = [t.limit_concurrency for t in ticks if 35 <= t.t_s < 55]
    later = [t.limit_concurrency for t in ticks if 70 <= t.t_s < 90]
    assert during and later and max(during) <= 6 and min(later) >= 8, (during, later)
    # the pass's own recorded log, replayed with its recorded service times, makes the live proxy's decisions
    # (measured compressed 4x: 0.974 on a quiet machine, 0.936 with one core busy; 0.999 at full length: what
    # differs is the order of a completion and an admission within the same few ms, made more frequent by
    # compression and load; a limit update reaching the proxy later than its window's end, which cost a log 0.075
    # (0.902, and 0.977 with every update 0.4 s late), is replayed when the proxy held it, by the decisions'
    # limits_version; agents lagging whole windows on a loaded machine tick a late window with the membership they
    # know then, which no replay reproduces: 0.74 measured so, the spot-b assertion above failing with it). Broken,
    # it is far lower: with the simulator as the backend 0.75, with membership read from joins only 0.73
    match = tp["replay_match"]
    assert match["proxies"] == 1 and match["decisions"] >= 300, match
    assert match["recorded"] >= 0.85, match
    assert (tmp_path / "log" / "request_decided").is_dir() and (tmp_path / "log" / "spec").is_dir()
    # outputs: the simulation's keys and figures
    assert (tmp_path / "results.json").is_file() and (tmp_path / "exp1_queue_depth.png").is_file()
    assert "| guaranteed P99 TTFT (s) |" in (tmp_path / "report.md").read_text()


def guaranteed_p99_ttft_at_proxy_s(rec: runner.PassRecord) -> float:
    """P99 over the guaranteed requests of the TTFT the proxies recorded (forward → first chunk), experiment s."""
    completed = next(v for k, v in rec.topics.items() if k.endswith("completions"))
    ttfts = sorted(c.ttft_s / rec.load.time_scale for c in completed
                   if c.entitlement.startswith("guaranteed") and c.ttft_s is not None)
    assert len(ttfts) >= 50, f"only {len(ttfts)} guaranteed completions recorded at the proxy"
    return ttfts[math.ceil(0.99 * len(ttfts)) - 1]


def runs_ticks(records: dict[str, runner.PassRecord]) -> list[Any]:
    rec = records["token-pools"]
    updates = next(v for k, v in rec.topics.items() if k.endswith("limits"))
    return ticks_of(updates, rec.load.origin_s, rec.load.time_scale)[0]
