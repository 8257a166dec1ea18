"""What the examples mean before traffic: binding, ℓ̄*, static priorities (the paper's numbers) and fail-static limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenpools.config import load_config, load_config_text, load_settings
from tokenpools.config.summary import effective_bindings, summarize, summary_json
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GIB = 2**30
NOW_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _summary(file: str, overrides: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    config = load_config(EXAMPLES / file)
    (pool,) = summarize(config, load_settings(config.settings_values, overrides).policy, NOW_S)
    return pool, {r.spec.name: r for r in pool.rows}


def test_exp2_priorities_are_the_papers() -> None:
    pool, rows = _summary("exp2.yaml")
    assert pool.mean_slo_ms == 15_250.0  # mean(500, 30000): reports is not Bound yet
    assert round(rows["elastic-copilot"].priority, 1) == 93.8
    assert round(rows["elastic-synth"].priority, 1) == 20.3
    assert round(rows["elastic-reports"].priority, 1) == 60.4  # ≈ 60 once it joins, with ℓ̄* frozen
    assert rows["elastic-reports"].binding.state is EntitlementState.PENDING
    assert rows["elastic-reports"].static_limit is None


def test_overrides_reach_the_priorities() -> None:
    _, rows = _summary("exp2.yaml", ("policy.alpha_slo=0",))
    assert rows["elastic-copilot"].priority == rows["elastic-synth"].priority == 100.0


def test_exp1_guaranteed_keep_their_baselines_and_spot_gets_the_rest() -> None:
    pool, rows = _summary("exp1.yaml")
    assert pool.capacity == pool.max_capacity == Capacity(480.0, 8.0 * GIB, 16.0)
    assert all(r.binding.state is EntitlementState.BOUND for r in rows.values())
    assert pool.bound_baselines == Capacity(360.0, 6.0 * GIB, 12.0)
    for name in ("guaranteed-a", "guaranteed-c"):
        assert rows[name].static_limit == Capacity(180.0, 3.0 * GIB, 6.0)
    spot = rows["spot-b"].static_limit
    assert spot is not None and spot.concurrency == 4.0 and spot.tokens_per_s == pytest.approx(120.0)
    assert rows["guaranteed-a"].priority > 100 * rows["spot-b"].priority  # class dominates


def test_autoscale_pool_starts_under_provisioned() -> None:
    pool, rows = _summary("autoscale.yaml")
    assert pool.capacity.concurrency == 16.0 and pool.max_capacity.concurrency == 64.0
    assert pool.bound_baselines.concurrency == 20.0  # needs 2 replicas: the scaler's job
    assert rows["guaranteed-prod"].static_limit == Capacity(240.0, 4.0 * GIB, 8.0)  # protected is never shrunk
    assert rows["elastic-team"].static_limit.concurrency == 8.0  # type: ignore[union-attr]
    assert rows["elastic-team"].api_keys == 2


EXTRA = """---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {name: guaranteed-d}
spec:
  tenantId: tenant-d
  poolRef: {name: qwen3-8b}
  qos: {serviceClass: guaranteed, sloTargetMs: 1200}
  resources: {tokensPerSecond: 30, kvCacheGiB: 0.5, concurrency: 5}
"""


def test_expired_degraded_and_forced_states() -> None:
    text = (EXAMPLES / "exp1.yaml").read_text()
    text = text.replace("  tenantId: tenant-c\n", "  tenantId: tenant-c\n  expiresAt: 2025-06-01T00:00:00Z\n")
    text += EXTRA + EXTRA.replace("guaranteed-d", "guaranteed-e").replace("concurrency: 5", "concurrency: 4")
    config = load_config_text(text)
    bindings = effective_bindings(config.pools["qwen3-8b"], config.entitlements_of("qwen3-8b"), NOW_S)
    assert bindings["guaranteed-c"].state is EntitlementState.EXPIRED  # its 6 slots are free again
    assert bindings["guaranteed-d"].state is EntitlementState.BOUND  # 6 + 5 of 16
    assert bindings["guaranteed-e"].state is EntitlementState.BOUND  # 6 + 5 + 4 of 16
    # without the expiry c holds its slots: d (6 + 6 + 5 > 16) does not fit, the smaller e (6 + 6 + 4) still does
    config = load_config_text(text.replace("  expiresAt: 2025-06-01T00:00:00Z\n", ""))
    bindings = effective_bindings(config.pools["qwen3-8b"], config.entitlements_of("qwen3-8b"), NOW_S)
    assert [bindings[n].state for n in ("guaranteed-c", "guaranteed-d", "guaranteed-e")] == [
        EntitlementState.BOUND, EntitlementState.DEGRADED, EntitlementState.BOUND]
    assert "does not fit" in bindings["guaranteed-d"].reason
    # a state forced in the config is kept and holds nothing
    config = load_config_text(text.replace("  expiresAt: 2025-06-01T00:00:00Z\n", "  state: Pending\n"))
    bindings = effective_bindings(config.pools["qwen3-8b"], config.entitlements_of("qwen3-8b"), NOW_S)
    assert bindings["guaranteed-c"].state is EntitlementState.PENDING
    assert bindings["guaranteed-c"].reason == "state set in the config"
    assert bindings["guaranteed-d"].state is bindings["guaranteed-e"].state is EntitlementState.BOUND


def test_summary_json_is_plain_data() -> None:
    config = load_config(EXAMPLES / "exp2.yaml")
    data = summary_json(config, summarize(config, load_settings().policy, NOW_S))
    pool = data["pools"][0]  # type: ignore[index]
    assert pool["mean_slo_ms"] == 15_250.0
    assert [e["state"] for e in pool["entitlements"]] == ["Bound", "Bound", "Pending"]
