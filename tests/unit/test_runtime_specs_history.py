"""Membership at a past instant (runtime.specs history, streams PoolView.entitlements_at): the agents tick a window
they close late with the entitlements the spec records had left at its end, not those known when they tick."""

from __future__ import annotations

from tokenpools.config import load_config_text
from tokenpools.core.classes import EntitlementState
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.views import pool_view
from tokenpools.topics.records import SpecRecord
from tokenpools_dev import builders
from tokenpools_dev.streams import scripted

POOL = scripted.POOL
LOADED = load_config_text(scripted.CONFIG_YAML)


def _record(name: str, t_ms: int, deleted: bool = False, state: str | None = None) -> SpecRecord:
    spec = {"tenantId": "t", "poolRef": {"name": POOL}, "qos": {"serviceClass": "spot", "sloTargetMs": 1000}}
    return builders.spec_record("TokenEntitlement", name, spec, pool=POOL, t_ms=t_ms, deleted=deleted, state=state)


def _names(entitlements: tuple) -> list[str]:  # type: ignore[type-arg]
    return [e.name for e in entitlements]


def test_a_window_before_a_join_or_a_leave_sees_the_membership_at_its_end() -> None:
    catalogue = Catalogue.from_loaded(LOADED, history_ms=600_000)
    start = _names(catalogue.entitlements_of(POOL))
    assert catalogue.apply(_record("late", 50_000)) is None
    assert catalogue.apply(_record("late", 60_000, state=EntitlementState.PENDING.value)) is None
    view = pool_view(catalogue, POOL)
    assert view is not None
    assert _names(view.entitlements_at(45_000)) == start  # before its record: not yet a member
    assert _names(view.entitlements_at(55_000)) == [*start, "late"]
    [late] = [e for e in view.entitlements_at(55_000) if e.name == "late"]
    assert late.state is EntitlementState.BOUND
    [held] = [e for e in view.entitlements_at(65_000) if e.name == "late"]
    assert held.state is EntitlementState.PENDING  # the status at 60 s, as today's view says
    assert view.entitlements_at(65_000) == catalogue.entitlements_of(POOL)
    assert catalogue.apply(_record("late", 70_000, deleted=True)) is None
    assert _names(pool_view(catalogue, POOL).entitlements_at(65_000)) == [*start, "late"]  # type: ignore[union-attr]
    assert _names(pool_view(catalogue, POOL).entitlements_at(75_000)) == start  # type: ignore[union-attr]


def test_without_a_history_the_view_is_todays_and_an_old_history_is_forgotten() -> None:
    plain = Catalogue.from_loaded(LOADED)
    assert plain.apply(_record("late", 50_000)) is None
    view = pool_view(plain, POOL)
    assert view is not None and view.history == () and view.entitlements_at(0) == plain.entitlements_of(POOL)
    kept = Catalogue.from_loaded(LOADED, history_ms=10_000)
    for i in range(5):
        assert kept.apply(_record(f"e{i}", 100_000 + i * 10_000)) is None
    history = kept.history_of(POOL)
    assert [t for t, _ in history] == [130_000, 140_000]  # the state at the cut (130 s) and what came after
    assert _names(pool_view(kept, POOL).entitlements_at(0))[-1] == "e3"  # type: ignore[union-attr]
