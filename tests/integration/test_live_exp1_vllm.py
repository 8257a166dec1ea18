"""Exp 1 live on real vLLM (``experiment exp1 --mode live --backend vllm``), shortened: one vLLM calibrated, Exp 1's
pool and load rescaled to it, then the stack with its own vLLM of the rescaled slots, token pools against no
admission control.

What it checks is the path, and the direction of the result on the real engine: the calibration's files and the
rescaled config are written and are what the stack ran (its vLLM has the measured slots), every request was sent and
none failed inside the client, the proxy never had more guaranteed-a requests in flight than its limit, and the
guaranteed tenants' P99 TTFT with token pools is below the baseline's. Absolute figures are not asserted: the tiny
model shares 2 cores with the whole stack and the load generator (docs/vllm.md#exp-1-on-real-vllm has the measured
ones). Phases last 0.3 of theirs (``COMPRESS``: 9 s, 27 s a pass), calibration steps 3 s and the pool has at most 4
slots. A pass costs more than its load: the baseline's backlog in vLLM drains after it (measured 67–92 s), and a
pass settles 10 s before and waits 20 s for Prometheus after. 0.3 is about as short as the shape allows: c's
overload phase is still two of the agents' 5-s ticks, and its join is published 7 s (a tick and a grace) before
its traffic, at 2 s into the pass (at 0.25: 0.5 s; within 7 s of the start c would be a member from the start,
``live.control.timeline``, and the overload would not be a join).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_fixtures import installed

from tokenpools.config import load_config
from tokenpools_dev.live import report, runner
from tokenpools_dev.live.calibrated import calibrate_and_rescale
from tokenpools_dev.live.rescale import LiveBackend

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMPRESS = 0.3
MAX_SLOTS = 4  # the calibration's steps 1, 2, 4: ~10 s; and fewer requests/s for the stack to carry on 2 cores


def test_exp1_on_vllm_rescaled_to_its_calibration_protects_guaranteed(tmp_path: Path) -> None:
    installed()  # skipped, with the command to run, without the install
    lines: list[str] = []
    options = runner.LiveOptions(name="exp1", out=tmp_path, backend=LiveBackend.VLLM,
                                 overrides=(f"load.compress={COMPRESS}",))
    rescaled = calibrate_and_rescale(options, progress=lines.append, max_slots=MAX_SLOTS, step_s=3.0)
    measured = rescaled.measured
    assert (tmp_path / "calibration" / "calibration.json").is_file(), lines
    assert rescaled.options.config == tmp_path / "exp1-vllm.yaml"
    assert f"load.service_s={measured.service_s:.4f}" in rescaled.options.overrides
    records = runner.run(rescaled.options, progress=lines.append)
    live = report.write(rescaled.options, records, rescaled.reference_ttft_s, 10.0, "test", rescaled.note())
    tp, base = live["token_pools"], live["baseline"]
    context = {"measured": measured, "token pools": tp["client"], "baseline": base["client"], "log": lines}

    # the stack ran the rescaled pool: its vLLM had the measured slots, the proxies the rescaled limits
    derived = load_config(tmp_path / "stack" / "config.yaml")
    assert derived.pools["qwen3-8b"].per_replica.concurrency == measured.concurrency
    log = next((tmp_path / "stack" / "logs").glob("vllm-qwen3-8b-*.log")).read_text(errors="replace")
    assert f"'max_num_seqs': {measured.concurrency}}}" in log or f"'max_num_seqs': {measured.concurrency}," in log
    # the client worked
    assert tp["client"]["failures"] == base["client"]["failures"] == 0, context
    # token pools held guaranteed-a to its slots, and its P99 TTFT (and guaranteed-c's) below the baseline's
    a = tp["proxies"]["guaranteed-a"]
    assert a["max_admitted_in_flight"] <= (a["limit"] or measured.concurrency), a
    assert tp["guaranteed_p99_ttft_s"] < base["guaranteed_p99_ttft_s"], context
    assert "real vLLM" in (tmp_path / "report.md").read_text()
