"""Exp 2 live, compressed 4×, token pools only: the real stack under the paper's outage schedule (16 slots, an
outage to 8, recovery, then reports joins) and the load generator.

What it proves, on real processes: the agents order the elastic tenants' priorities as the paper does (copilot,
the tight-SLO interactive tenant, above reports above synth) and copilot is never refused for low priority — the
tenants below it are the ones squeezed when the outage halves the pool — while copilot keeps being served through
the outage. (No baseline pass: without admission control there are no priorities to order.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenpools_dev.live import report, runner
from tokenpools_dev.live.assemble import ticks_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIME_SCALE = 0.25  # 300 s of experiment in 75 s


def test_compressed_exp2_orders_priorities_and_never_refuses_copilot_for_low_priority(tmp_path: Path) -> None:
    options = runner.LiveOptions(name="exp2", out=tmp_path, time_scale=TIME_SCALE, policies=("token-pools",))
    records = runner.run(options, progress=lambda _: None)
    stack_options = runner.stack_options(options, runner.scenario_for(options))
    live = report.write(options, records, 0.22, stack_options.scrape_s / TIME_SCALE, "test")
    tp = live["token_pools"]
    rec = records["token-pools"]

    outage = next(p for p in runner.scenario_for(options).phases if p.name.startswith("outage"))
    assert rec.failures == 0, tp["client"]
    # the only errors are the requests cut when the outage took half the backends away
    cut = [(c.request_id, round(c.t_s, 2)) for c in rec.load.completions if c.status == "error"]
    assert all(abs(t - outage.start_s) < 2.0 for _, t in cut), cut
    priority = tp["priority"]
    assert priority["copilot"] > priority["reports"] > priority["synth"] > 0, priority
    # reports' join was in force before its traffic (``control.membership_lead_s``): the priority above is of a
    # window that ended before its first request, so none of that request's refusals can be in it
    updates = next(v for k, v in rec.topics.items() if k.endswith("limits"))
    ticks = [t for t in ticks_of(updates, rec.load.origin_s, rec.load.time_scale)[0]
             if t.entitlement == "elastic-reports"]
    first_request = min(a.t_s for a in rec.load.attempts if a.entitlement == "elastic-reports")
    assert ticks and ticks[0].t_s <= first_request, (ticks[:2], first_request)
    assert tp["low_priority_denials"]["copilot"] == 0, tp["low_priority_denials"]
    # not vacuous: the outage squeezed someone, and copilot was served through it
    decided = next(v for k, v in rec.topics.items() if k.endswith("requests"))
    refused = [d for d in decided if d.outcome.value != "admitted" and d.entitlement]
    assert {d.entitlement for d in refused} - {"elastic-copilot"}, "nobody below copilot was refused"
    served = [c for c in rec.load.completions
              if c.entitlement == "elastic-copilot" and outage.start_s <= c.admitted_s < outage.end_s]
    assert len(served) >= 20, len(served)
    assert tp["mean_running_in_outage"]["copilot"] > 0, tp["mean_running_in_outage"]
