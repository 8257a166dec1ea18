"""Four proxies behind a random balancer refuse about as often as one proxy, on the same schedule (issue #13).

The real stack, as ``tokenpools up --no-kubernetes --proxies N`` starts it, twice: once with one proxy, once with
four (``tokenpools_dev.fleet_live``, the runs of ``benchmarks/fleet_live.py --quick``). 20 guaranteed entitlements
of 2 slots on a 64-slot pool, each offered 60 % of its slots as Poisson arrivals, every request sent to a proxy a
seeded random balancer picks, no retries; compressed 2×, 100 s of experiment measured per run after a 20 s warm-up
(about 1,700 requests each; ~2.5 minutes in all on 2 cores).

What it asserts:
- neither run is vacuous: every measured request was sent and answered with an admission outcome, the single proxy
  admitted most of them and refused them for ``concurrency`` (it is an exact enforcer of 2 slots: its loss is the
  Erlang loss of 2 servers at 1.2 erlangs, ~20-25 %), the admitted ones streamed to the end, and with four proxies
  every proxy received its quarter of the requests;
- the fleet holds: refused(4) ≤ 1.5 × the single proxy's refusal rate × the four-proxy run's requests + 5 requests
  (``fleet_live.figures.holds``). The 5 requests are an absolute allowance for a single-proxy rate of 0 (then
  1.5 × 0 would make one refusal a failure): below the noise of the single-proxy count itself, far below a fleet
  that shuts tenants out.

Both runs turn the admission queue off (``policy.queue_slo_fraction=0``): this compares how replicas divide a limit
with one exact enforcer, refusal for refusal, and a request that waits out a moment's refusal would hide exactly
the refusals compared (with waiting on, measured: 1.3 % refused with one proxy, 4.9 % with four; docs/queueing.md).

Expected to fail while each proxy enforces a fixed share of each limit (a 2-slot limit split four ways leaves
replicas with 0): measured 23 % refused with one proxy, 81 % with four.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenpools_dev.fleet_live import figures as fig
from tokenpools_dev.fleet_live import runner
from tokenpools_dev.fleet_live import scenario as sc

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, runner.FleetRun]:
    q = runner.QUICK
    scenario = sc.FleetScenario(duration_s=q["duration_s"], warmup_s=q["warmup_s"])
    options = runner.RunOptions(out=tmp_path_factory.mktemp("fleet-live"), proxies=(1, 4), time_scale=q["time_scale"],
                                overrides=("policy.queue_slo_fraction=0",))
    return {r.figures.proxies: r for r in runner.run(scenario, options, progress=lambda _: None)}


def test_both_runs_sent_and_served_the_schedule(runs: dict[int, runner.FleetRun]) -> None:
    for p, run in runs.items():
        f = run.figures
        context = (p, f.summary(), run.run_dir)
        assert run.client_failures == 0 and f.unsent == 0 and f.errors == 0, context
        assert f.requests == f.scheduled >= 1000, context
        assert f.ok >= 0.98 * f.admitted, context  # what was admitted was served
        assert not set(f.refused_by) & {"unknown_key", "not_bound"}, context  # every key known, every tenant bound
    one = runs[1].figures
    assert one.admitted >= 0.6 * one.requests, one.summary()  # an exact enforcer's loss, not a broken stack
    assert one.refused_by.get("concurrency", 0) >= 0.95 * one.refused, one.summary()  # and of its 2 slots
    assert one.mean_in_flight >= 0.7, one.summary()  # the load reached its 2 slots (~0.9 of 1.2 offered)
    four = runs[4].figures
    assert len(four.by_proxy) == 4 and min(four.by_proxy) >= 0.2 * four.requests, four.summary()


def test_four_proxies_refuse_within_1_5x_of_one(runs: dict[int, runner.FleetRun]) -> None:
    one, four = runs[1].figures, runs[4].figures
    assert fig.holds(one, four), (
        f"4 proxies refused {four.refused} of {four.requests} ({100 * four.refused_fraction:.1f} %, "
        f"by {dict(four.refused_by)}); allowed {fig.allowed_refusals(one, four):.0f}: 1 proxy refused "
        f"{one.refused} of {one.requests} ({100 * one.refused_fraction:.1f} %), ratio {fig.ratio(one, four)}")
