"""The proxy's budgets follower reads the scope from the key (proxy/inputs/budget_follower.py, topics/budget_keys.py):
another pool's entitlement budget is skipped without decoding its value; a tenant budget's part of any pool is kept;
a record under the old key form is decoded to learn its scope."""

from __future__ import annotations

import pytest

from tokenpools.core.budgets import BudgetScope, Period
from tokenpools.proxy.admission.budgets import BudgetBook, RecordResult
from tokenpools.proxy.inputs import budget_follower
from tokenpools.proxy.inputs.budget_follower import BudgetFollower
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.codec import encode
from tokenpools.topics.records import BudgetStatus

WALL_MS = 1_800_000_000_000


def status(pool: str, entitlement: str, scope: BudgetScope) -> BudgetStatus:
    return BudgetStatus(pool=pool, entitlement=entitlement, tenant="acme", budget="daily", scope=scope,
                        period=Period.DAY, time_zone="UTC", period_start_ms=WALL_MS - 1000,
                        period_end_ms=WALL_MS + 1000, allowance=1000, spent={"prompt_tokens": 5, "requests": 1},
                        spent_units=5, version=1, t_ms=WALL_MS, through_ms=WALL_MS)


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    seen: list[bytes] = []
    real = budget_follower.decode

    def counting(model: type, value: bytes) -> object:
        seen.append(value)
        return real(model, value)

    monkeypatch.setattr(budget_follower, "decode", counting)
    return seen


def follower() -> BudgetFollower:
    return BudgetFollower(BudgetBook(), {"pool-a": object()}, ProxyMetrics(), FakeClock(wall_ms=WALL_MS))


def test_another_pools_entitlement_budget_is_skipped_undecoded(decoded: list[bytes]) -> None:
    f = follower()
    other = status("pool-b", "batch", BudgetScope.ENTITLEMENT)
    assert f.handle(encode(other), "budgets", 0, 0, b"pool-b/batch/daily/entitlement") is None
    assert decoded == [] and f.book.published("batch", "daily") is None
    ours = status("pool-a", "gold", BudgetScope.ENTITLEMENT)
    assert f.handle(encode(ours), "budgets", 0, 1, b"pool-a/gold/daily/entitlement") is RecordResult.APPLIED
    assert len(decoded) == 1


def test_a_tenant_part_of_any_pool_is_kept(decoded: list[bytes]) -> None:
    f = follower()
    part = status("pool-b", "batch", BudgetScope.TENANT)
    assert f.handle(encode(part), "budgets", 0, 0, b"pool-b/batch/daily/tenant/acme") is RecordResult.APPLIED
    assert f.book.published("batch", "daily") is not None and len(decoded) == 1


def test_the_old_key_form_is_decoded_to_learn_its_scope(decoded: list[bytes]) -> None:
    f = follower()
    assert f.handle(encode(status("pool-b", "batch", BudgetScope.ENTITLEMENT)), "budgets", 0, 0,
                    b"pool-b/batch/daily") is None
    assert f.handle(encode(status("pool-b", "spot", BudgetScope.TENANT)), "budgets", 0, 1,
                    b"pool-b/spot/daily") is RecordResult.APPLIED
    assert len(decoded) == 2 and f.book.published("batch", "daily") is None
