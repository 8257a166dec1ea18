"""The pure parts of the live fleet run: its config, its schedule and balancer, and how a run is judged."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tokenpools.config import load_config
from tokenpools.replay.load import Arrival
from tokenpools_dev.fleet_live import figures as fig
from tokenpools_dev.fleet_live import scenario as sc
from tokenpools_dev.loadgen.keys import keys_for
from tokenpools_dev.loadgen.plan import Attempt, Completion, LoadResult


def test_the_config_loads_and_the_load_generator_finds_every_key(tmp_path: Path) -> None:
    scenario = sc.FleetScenario()
    path = tmp_path / "fleet.yaml"
    path.write_text(sc.config_text(scenario))
    loaded = load_config(path)
    pool = loaded.pools["fleet"]
    assert pool.per_replica.concurrency == 64 and len(loaded.entitlements) == 20
    assert sum(e.baseline.concurrency for e in loaded.entitlements.values()) == 40  # 40 of 64 promised
    assert all(e.service_class.value == "guaranteed" for e in loaded.entitlements.values())
    assert keys_for(loaded, path.read_text(), None, scenario.names) == sc.keys(scenario)
    # tokens/s never binds on one proxy: a tenant at 60 % of its slots uses well under its rate
    e = loaded.entitlements["fleet-00"]
    used = sc.rate_per_s(scenario) * (scenario.prompt_tokens + scenario.output_tokens)
    assert used < 0.6 * e.baseline.tokens_per_s


def test_each_entitlement_is_offered_its_share_of_its_slots() -> None:
    scenario = sc.FleetScenario(duration_s=2000, warmup_s=0)
    arrivals = sc.schedule(scenario)
    per = Counter(a.entitlement for a in arrivals)
    assert set(per) == set(scenario.names)
    erlangs = sc.rate_per_s(scenario) * sc.expected_service_s(scenario)
    assert erlangs == pytest.approx(0.6 * 2)
    for n in per.values():  # Poisson counts: within 4 standard deviations of the mean
        mean = sc.rate_per_s(scenario) * scenario.duration_s
        assert abs(n - mean) <= 4 * mean**0.5


def test_the_schedule_and_the_balancer_are_functions_of_the_seed() -> None:
    scenario = sc.FleetScenario()
    arrivals = sc.schedule(scenario)
    assert arrivals == sc.schedule(sc.FleetScenario())
    assert arrivals != sc.schedule(sc.FleetScenario(seed=2))
    assert set(sc.routes(arrivals, 1, 1).values()) == {0}
    four = sc.routes(arrivals, 4, 1)
    assert four == sc.routes(arrivals, 4, 1) and four != sc.routes(arrivals, 4, 2)
    spread = Counter(four.values())
    assert sorted(spread) == [0, 1, 2, 3] and min(spread.values()) >= 0.2 * len(arrivals)
    measured = sc.measured(arrivals, scenario)
    assert measured and all(a.t_s >= scenario.warmup_s for a in measured.values())
    assert len(measured) < len(arrivals)


@pytest.mark.parametrize("kwargs", [{"entitlements": 40, "slots": 2}, {"load": 0}, {"warmup_s": 90},
                                    {"output_tokens": 0}])
def test_scenarios_that_cannot_run_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        sc.FleetScenario(**kwargs)  # type: ignore[arg-type]


def _load(outcomes: list[tuple[str, str, str]]) -> LoadResult:
    """(request id, outcome, target) first attempts; admitted ones complete 1 s later."""
    result = LoadResult()
    for i, (rid, outcome, target) in enumerate(outcomes):
        result.attempts.append(Attempt(float(i), "e", rid, 0, outcome, "", 1, 200, 32, 32, target))
        if outcome == "admitted":
            result.completions.append(Completion(rid, "e", 0, float(i), float(i), i + 1.0, 32, 32, 0.1, 1.0))
    return result


def test_a_run_counts_its_measured_first_attempts_by_outcome_and_proxy() -> None:
    arrivals = {f"r{i}": Arrival(float(i), "e", f"r{i}", 32, 32, 32) for i in range(6)}
    load = _load([("r0", "admitted", "http://a/"), ("r1", "concurrency", "http://b"),
                  ("r2", "token_budget", "http://a"), ("r3", "error", "http://b"), ("r4", "admitted", "http://b"),
                  ("warm", "concurrency", "http://a")])
    f = fig.figures_of(load, arrivals, 2, ["http://a", "http://b"], entitlements=1, window_s=4.0)
    assert (f.scheduled, f.requests, f.admitted, f.refused, f.errors, f.unsent, f.ok) == (6, 4, 2, 2, 1, 1, 2)
    assert dict(f.refused_by) == {"concurrency": 1, "token_budget": 1}
    assert f.by_proxy == (2, 3) and f.refused_fraction == 0.5 and f.mean_in_flight == pytest.approx(0.5)


def test_overshoot_counts_slots_above_the_limit_and_their_duration() -> None:
    spans = {"a": [(0.0, 4.0), (1.0, 3.0), (2.0, 5.0)], "b": [(0.0, 1.0), (1.0, 2.0)]}  # b hands its slot over
    assert fig.overshoot(spans, 2) == (1, 1.0)  # a holds 3 from 2 s to 3 s
    assert fig.overshoot(spans, 1) == (2, 1.0 + 2.0 + 1.0)  # a: 1 over in [1, 2) and [3, 4), 2 over in [2, 3)
    assert fig.overshoot(spans, 3) == (0, 0.0)


def test_the_counts_age_is_read_from_the_proxies_histograms() -> None:
    exposition = "\n".join([
        "# HELP tokenpools_proxy_counts_age_seconds age", "# TYPE tokenpools_proxy_counts_age_seconds histogram",
        'tokenpools_proxy_counts_age_seconds_bucket{pool="p",le="0.1"} 2.0',
        'tokenpools_proxy_counts_age_seconds_bucket{pool="p",le="0.2"} 9.0',
        'tokenpools_proxy_counts_age_seconds_bucket{pool="p",le="+Inf"} 10.0',
        'tokenpools_proxy_counts_age_seconds_count{pool="p"} 10.0',
        'tokenpools_proxy_counts_age_seconds_sum{pool="p"} 1.5', ""])
    buckets = fig.counts_age_buckets([exposition, exposition])
    assert buckets == {0.1: 4.0, 0.2: 18.0, float("inf"): 20.0}
    assert (fig.histogram_quantile(buckets, 0.1), fig.histogram_quantile(buckets, 0.5)) == (0.1, 0.2)
    assert fig.histogram_quantile(buckets, 0.99) == float("inf") and fig.histogram_quantile({}, 0.5) is None


def _figures(proxies: int, requests: int, refused: int) -> fig.RunFigures:
    return fig.RunFigures(proxies, requests, requests, requests - refused, {"concurrency": refused} if refused else {})


def test_the_fleet_holds_within_1_5x_plus_a_few_requests() -> None:
    one = _figures(1, 1000, 100)
    assert fig.holds(one, _figures(4, 1000, 155))  # 1.5 × 100 + 5
    assert not fig.holds(one, _figures(4, 1000, 156))
    assert fig.ratio(one, _figures(4, 1000, 150)) == pytest.approx(1.5)
    # a single proxy that refused nothing: the allowance, not 1.5 × 0, decides; the ratio is undefined
    zero = _figures(1, 1000, 0)
    assert fig.holds(zero, _figures(4, 1000, 5)) and not fig.holds(zero, _figures(4, 1000, 6))
    assert fig.ratio(zero, _figures(4, 1000, 6)) is None
    # the rate is applied to the fleet run's own requests
    assert fig.allowed_refusals(one, _figures(4, 500, 0)) == pytest.approx(1.5 * 0.1 * 500 + 5)
