"""The effective-limits topic (topics.effective): the mapping from a tick's LimitUpdate, specs and samples to one
record per entitlement, the tombstone rule, the declaration, and the exported JSON Schema as a third party uses it.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec
from tokenpools.core.tick import Signals, TickResult
from tokenpools.core.windows import UsageSample
from tokenpools.topics import effective
from tokenpools.topics.codec import decode, decode_any, encode
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.export import schema_files
from tokenpools.topics.limits import build_limit_update
from tokenpools.topics.records import Amount, EffectiveLimit, WindowUsage

END_MS = 1_700_000_002_000
WIDTH_MS = 1000
GOLD = EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 800.0, Capacity(500.0, 2e9, 8.0))
SPOT = EntitlementSpec("spot", "pool-a", ServiceClass.SPOT, 2000.0)


def tick() -> TickResult:
    return TickResult(
        signals={"gold": Signals(burst=0.25, debt=0.5), "spot": Signals(burst=0.0, debt=0.0)},
        priorities={"gold": 3.5, "spot": 0.2},
        limits={"gold": Capacity(500.0, 2e9, 8.0), "spot": Capacity(120.5, 1e9, 3.0)},
        contended=True, desired_replicas=2, lent=Capacity(),
    )


def sample() -> UsageSample:
    return UsageSample(start_ms=END_MS - WIDTH_MS, width_ms=WIDTH_MS, used=Capacity(410.0, 1.5e9, 6.5),
                       demand=Capacity(650.0, 2.5e9, 9.0), admitted=12, refused=3, completed=10, in_flight_at_end=7)


def update(proxies: dict[str, dict[str, float]] | None = None):
    return build_limit_update("pool-a", END_MS, END_MS, tick(), Capacity(1000.0, 4e9, 16.0), 1400.0,
                              proxies or {"p1": {"gold": 3.0}, "p2": {"spot": 1.0}})


def test_one_record_per_entitlement_with_the_fleet_wide_limits_signals_baselines_and_usage() -> None:
    records = effective.effective_limits(update(), [SPOT, GOLD], {"gold": sample(), "spot": None}, WIDTH_MS)
    assert [r.entitlement for r in records] == ["gold", "spot"]
    gold, spot = records
    assert gold == EffectiveLimit(
        pool="pool-a", entitlement="gold", version=END_MS, window_start_ms=END_MS - WIDTH_MS, window_end_ms=END_MS,
        service_class=ServiceClass.GUARANTEED, priority=3.5, debt=0.5, burst=0.25, contended=True,
        limit=Amount(concurrency=8, tokens_per_s=500.0, kv_bytes=2e9),
        baseline=Amount(concurrency=8, tokens_per_s=500.0, kv_bytes=2e9),
        measured=WindowUsage(in_flight_at_end=7, mean_in_flight=6.5, tokens_per_s=410.0, kv_bytes=1.5e9,
                             demand_tokens_per_s=650.0, admitted=12, refused=3, completed=10),
    )
    # a spot entitlement has no baseline, and nothing measured yet is None, not zeros
    assert (spot.service_class, spot.baseline, spot.measured) == (ServiceClass.SPOT, Amount(concurrency=0,
                                                                 tokens_per_s=0.0, kv_bytes=0.0), None)
    assert (spot.limit.concurrency, spot.limit.tokens_per_s) == (3, 120.5)
    assert effective.effective_limit_key(gold.pool, gold.entitlement) == "pool-a/gold"


def test_the_limits_are_the_fleets_whatever_the_split_across_proxies() -> None:
    one = effective.effective_limits(update({"p1": {}}), [GOLD, SPOT], {}, WIDTH_MS)
    three = effective.effective_limits(update({"p1": {"gold": 9.0}, "p2": {}, "p3": {"spot": 2.0}}), [GOLD, SPOT], {},
                               WIDTH_MS)
    assert one == three
    assert sum(s.entitlements["gold"][0] for s in update({"p1": {}, "p2": {}}).proxies) == one[0].limit.concurrency


def test_an_entitlement_without_its_spec_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="spot"):
        effective.effective_limits(update(), [GOLD], {}, WIDTH_MS)
    with pytest.raises(ValueError, match="width_ms"):
        effective.effective_limits(update(), [GOLD, SPOT], {}, 0)


def test_departed_entitlements_are_those_a_reader_may_hold_and_the_pool_no_longer_ticks() -> None:
    assert effective.departed(before={"gold", "spot"}, published={"gold"}, after={"gold"}) == ["spot"]
    # published in an earlier window of the same catch-up, gone by its last one: still tombstoned
    assert effective.departed(before={"gold"}, published={"gold", "silver"}, after={"gold"}) == ["silver"]
    assert effective.departed(before=set(), published=set(), after=set()) == []
    assert effective.departed(before={"gold"}, published={"gold"}, after={"gold", "new"}) == []


def test_the_topic_is_compacted_keyed_per_entitlement_and_carries_only_these_records() -> None:
    spec = topics_for("t.", partitions=3).effective_limits
    assert (spec.name, spec.key, spec.records, spec.partitions, spec.compacted) == (
        "t.effective-limits", "<pool>/<entitlement>", (EffectiveLimit,), 3, True)
    assert spec.config()["cleanup.policy"] == "compact"
    assert spec in topics_for("t.", partitions=3).all()


def test_records_validate_against_the_committed_schema_and_round_trip() -> None:
    committed = Path(effective.__file__).parent / "schemas" / "effective_limit.v1.json"
    assert committed.read_text() == schema_files()["effective_limit.v1.json"]
    schema = json.loads(committed.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for record in effective.effective_limits(update(), [GOLD, SPOT], {"gold": sample()}, WIDTH_MS):
        wire = encode(record)
        validator.validate(json.loads(wire))
        assert decode(EffectiveLimit, wire) == record == decode_any(wire)
    assert set(schema["required"]) >= {"pool", "entitlement", "version", "service_class", "limit", "baseline",
                                       "measured", "window_start_ms", "window_end_ms", "contended"}
    bad = json.loads(encode(effective.effective_limits(update(), [GOLD, SPOT], {}, WIDTH_MS)[0]))
    bad["service_class"] = "platinum"
    assert not validator.is_valid(bad)


def test_the_topics_readme_documents_every_topic() -> None:
    readme = (Path(effective.__file__).parent / "README.md").read_text()
    for topic in topics_for("tokenpools.").all():
        assert f"`{topic.name}`" in readme, f"topics/README.md does not document the {topic.name} topic"
    assert "effective_limit.v1.json" in readme
