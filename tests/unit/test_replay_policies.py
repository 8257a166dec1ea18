"""Every registered policy against the invariants, on both experiments (docs/conventions.md#registered-policies)."""

from __future__ import annotations

import pytest

from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.replay.baseline import POLICIES
from tokenpools.replay.experiments import build
from tokenpools.replay.replayer import replay

OUTCOMES = {o.value for o in AdmissionOutcome}


@pytest.fixture(scope="module", params=["exp1", "exp2"])
def scenario(request: pytest.FixtureRequest):
    return build(request.param, ["load.compress=0.3"])


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_registered_policy_invariants(policy: str, scenario) -> None:
    result = replay(scenario, policy)
    d = result.decisions
    assert set(d.outcome) <= OUTCOMES
    assert list(d.t_s) == sorted(d.t_s)  # decided in event-time order
    admitted = d.outcome.count("admitted")
    assert admitted == len(result.completions.t_s)  # every admitted request finished (the backend drains)
    assert all(0 <= ttft <= e2e for ttft, e2e in zip(result.completions.ttft_s, result.completions.e2e_s))
    assert all(n >= 0 for *_, n in result.samples.by_entitlement)
    assert all(running <= slots for _, running, _, slots in result.samples.pool)
    first_attempts = sum(1 for a in d.attempt if a == 0)
    assert first_attempts == len(scenario.arrivals)
    if policy == "none":
        assert admitted == len(d.outcome) and not result.entitlement_ticks
    assert replay(scenario, policy).decisions == d


def test_unknown_policy_is_refused_with_the_registered_names(scenario) -> None:
    with pytest.raises(ValueError, match="registered"):
        replay(scenario, "nope")
