"""Cross-replay check (docs/tuning.md#replaying-what-if-the-client-model): a what-if replay of an experiment's log
under the other policy gives what the experiment's own run under that policy gave, on the same arrivals.

The demo's open-loop Exp 1 and Exp 2 at full length (a replay takes well under a second each): the token-pools log
replayed with no admission control against the no-admission run, and the no-admission log replayed under token
pools against the token-pools run. The retries of the second come from the client model, which a log without a
refusal cannot fit (the load generator's is assumed): its jitter draws are not the run's, and one run's refusal
count moves by ~±8 % with them (Exp 2 copilot: 433–506 over the experiment's own retry seeds 1–5), so the refusals
are compared as their mean over four client seeds.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from tokenpools.core.quantiles import percentile
from tokenpools.replay import logio, metrics
from tokenpools.replay.experiments import _config, build
from tokenpools.replay.replayer import ReplayResult, replay

SEEDS = range(4)


def _guaranteed_or_all(result: ReplayResult) -> list[str]:
    names = [e.name for e in result.scenario.entitlements]
    return [n for n in names if n.startswith("guaranteed")] or names


def _p99_ttft_s(result: ReplayResult) -> float:
    value = metrics.p99(metrics.ttfts(result, _guaranteed_or_all(result)))
    assert value is not None
    return value


def _p95_ttft_s(result: ReplayResult) -> float:
    value = percentile(metrics.ttfts(result, _guaranteed_or_all(result)), 0.95)
    assert value is not None
    return value


def _refusals(result: ReplayResult) -> dict[str, int]:
    out: dict[str, int] = {}
    for counts in metrics.decision_counts(result).values():
        for outcome, n in counts.items():
            if outcome != "admitted":
                out[outcome] = out.get(outcome, 0) + n
    return out


def _within(mine: float, theirs: float, fraction: float, slack: float = 0.0) -> bool:
    return abs(mine - theirs) <= max(fraction * abs(theirs), slack)


@pytest.fixture(scope="module", params=["exp1", "exp2"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    name = request.param
    scenario = build(name, ["load.mode=open"])
    own = {policy: replay(scenario, policy) for policy in ("token-pools", "none")}
    root = tmp_path_factory.mktemp(name)
    for policy, result in own.items():
        logio.write_log(result, root / f"log-{policy}")
    pool, ents, _ = _config(None, f"{name}.yaml")
    changes = [(c.t_s, c.slots_per_replica) for c in scenario.capacity_changes]  # the outage: not in a log

    return own, _Replayer(root, pool, ents, scenario.params, changes)


class _Replayer:
    """A log of the experiment's, replayed under a policy (with a client seed), or its recorded decisions."""

    def __init__(self, root: Path, pool, ents, params, changes) -> None:
        self.root, self.args = root, (pool, ents, params, changes)

    def __call__(self, log: str, policy: str, seed: int = 0) -> ReplayResult:
        again, _ = logio.scenario_from_data(logio.read_log(self.root / log), *self.args)
        return replay(replace(again, seed=seed), policy)

    def recorded(self, log: str):
        return logio.scenario_from_data(logio.read_log(self.root / log), *self.args)[1]


def test_a_token_pools_log_replayed_without_admission_gives_the_no_admission_run(runs) -> None:
    own, replayed = runs
    mine, theirs = replayed("log-token-pools", "none"), own["none"]
    admitted = [r.decisions.outcome.count("admitted") for r in (mine, theirs)]
    waiting = [metrics.max_waiting(r) for r in (mine, theirs)]
    p99 = [_p99_ttft_s(r) for r in (mine, theirs)]
    assert _within(*admitted, 0.10), admitted
    assert _within(*waiting, 0.25), waiting
    assert _within(*p99, 0.25), p99


def test_a_no_admission_log_replayed_under_token_pools_gives_the_token_pools_run(runs) -> None:
    own, replayed = runs
    theirs = own["token-pools"]
    mine = [replayed("log-none", "token-pools", seed) for seed in SEEDS]
    p95 = statistics.mean(_p95_ttft_s(r) for r in mine)
    assert _within(p95, _p95_ttft_s(theirs), 0.10), (p95, _p95_ttft_s(theirs))
    expected = _refusals(theirs)
    for outcome in sorted(set(expected) | {o for r in mine for o in _refusals(r)}):
        got = statistics.mean(_refusals(r).get(outcome, 0) for r in mine)
        assert _within(got, expected.get(outcome, 0), 0.15, slack=3), (outcome, got, expected.get(outcome, 0))


def test_a_no_admission_log_replayed_under_token_pools_gives_the_token_pools_runs_p99_ttft(
        runs, request: pytest.FixtureRequest) -> None:
    """Exp 2's P99 is an open question since issue 30: with copilot bursting to 7 of the outage's 8 slots, the P99
    first-token time of all three tenants (the ~10th slowest of ~900) moves between 0.15 and 0.38 s with the client
    jitter seed alone (the run itself, seeds 0-11, mean 0.24 s), and the what-if's mean over its four seeds is
    0.38 s (seeds 0-11: 0.15-0.53 s, mean 0.31 s). The P95 agrees within 3 % (the test above). Strict: it fails when
    the P99 agrees again, so the mark goes with whatever makes it agree."""
    if request.node.callspec.params["runs"] == "exp2":
        request.applymarker(pytest.mark.xfail(strict=True, reason="Exp 2 P99 TTFT of the what-if: issue 30"))
    own, replayed = runs
    theirs = own["token-pools"]
    p99 = statistics.mean(_p99_ttft_s(replayed("log-none", "token-pools", seed)) for seed in SEEDS)
    assert _within(p99, _p99_ttft_s(theirs), 0.25), (p99, _p99_ttft_s(theirs))


def test_a_log_replayed_under_its_own_policy_makes_its_decisions_again_retries_included(runs) -> None:
    own, replayed = runs
    result = replayed("log-token-pools", "token-pools")
    rate, compared = logio.match_rate(result, replayed.recorded("log-token-pools"))
    assert compared == len(own["token-pools"].decisions.t_s)
    assert rate is not None and rate >= 0.995  # (Exp 1: one decision of 775 in the last 0.1 s differs)
