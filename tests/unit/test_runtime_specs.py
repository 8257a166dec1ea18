"""The follower of the specs topic (runtime.specs): any component's view of the pools and entitlements in force,
without Kafka."""

from __future__ import annotations

from tokenpools.config import load_config_text
from tokenpools.core.classes import EntitlementState
from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.runtime.specs import Catalogue, SpecOutcome, follow
from tokenpools.topics.codec import encode
from tokenpools.topics.records import DeadLetterReason, SpecRecord
from tokenpools_dev import builders
from tokenpools_dev.streams import scripted

POOL = scripted.POOL
LOADED = load_config_text(scripted.CONFIG_YAML)
TOPIC = "t.specs"


def spec_record(name: str, **changes: object) -> SpecRecord:
    spec = {"tenantId": "t", "poolRef": {"name": POOL}, "qos": {"serviceClass": "spot", "sloTargetMs": 1000}}
    return builders.spec_record("TokenEntitlement", name, {**spec, **changes}, pool=POOL, t_ms=0)


def names(catalogue: Catalogue) -> list[str]:
    return [e.name for e in catalogue.entitlements_of(POOL)]


def test_catalogue_applies_specs_and_refuses_invalid_sets() -> None:
    catalogue = Catalogue.from_loaded(LOADED)
    assert catalogue.pools == (POOL,) and catalogue.pool(POOL) == LOADED.pools[POOL] and catalogue.version == 0
    assert catalogue.apply(spec_record("extra")) is None
    assert names(catalogue) == ["copilot", "batch", "extra"] and catalogue.version == 1
    problem = catalogue.apply(spec_record("broken", poolRef={"name": "nowhere"}))
    assert problem is not None and "nowhere" in problem
    assert "broken" not in names(catalogue) and catalogue.version == 1  # the whole set refused, the last good kept
    assert catalogue.apply(spec_record("extra").model_copy(update={"deleted": True})) is None
    assert names(catalogue) == ["copilot", "batch"]
    held = spec_record("batch").model_copy(update={"state": "Pending"})
    assert catalogue.apply(held) is None
    assert catalogue.entitlements_of(POOL)[1].state is EntitlementState.PENDING
    assert catalogue.apply(spec_record("batch").model_copy(update={"state": "Bound"})) is None
    assert catalogue.entitlements_of(POOL)[1].state is EntitlementState.BOUND  # Bound again: admission decides
    assert catalogue.pool("nowhere") is None and catalogue.entitlements_of("nowhere") == ()


def test_a_pool_may_arrive_on_the_topic_and_leave_again() -> None:
    catalogue = Catalogue.from_loaded(LOADED)
    pool = {"model": "m", "backendRef": {"name": "b"}, "scaling": {"minReplicas": 1, "maxReplicas": 1},
            "perReplica": {"tokensPerSecond": 100, "kvCacheGiB": 1, "concurrency": 4}, "kvBytesPerToken": 1024}
    record = builders.spec_record("TokenPool", "pool-b", pool, t_ms=0)
    assert catalogue.apply(record) is None
    assert catalogue.pools == (POOL, "pool-b") and catalogue.entitlements_of("pool-b") == ()
    gone = catalogue.apply(builders.spec_record("TokenPool", POOL, deleted=True, t_ms=0))
    assert gone is not None, "a pool its entitlements still name cannot leave"
    assert catalogue.apply(record.model_copy(update={"deleted": True})) is None
    assert catalogue.pools == (POOL,)


def test_a_pool_leaving_keeps_the_status_of_an_entitlement_of_the_same_name() -> None:
    catalogue = Catalogue.from_loaded(LOADED)
    pool = {"model": "m", "backendRef": {"name": "b"}, "perReplica": {"tokensPerSecond": 100, "kvCacheGiB": 1,
                                                                      "concurrency": 4}, "kvBytesPerToken": 1024}
    namesake = builders.spec_record("TokenPool", "batch", pool, t_ms=0)
    assert catalogue.apply(spec_record("batch").model_copy(update={"state": "Pending"})) is None
    assert catalogue.apply(namesake) is None and catalogue.apply(namesake.model_copy(update={"deleted": True})) is None
    assert catalogue.entitlements_of(POOL)[1].state is EntitlementState.PENDING


async def test_follow_applies_records_and_tombstones_and_dead_letters_the_rest() -> None:
    catalogue, sent = Catalogue.from_loaded(LOADED), scripted.Sent()
    dead = DeadLetters("t.dead-letters", "follower-test", FakeClock(), send=sent)
    key = b"TokenEntitlement/extra"
    assert await follow(catalogue, dead, TOPIC, 0, 0, key, encode(spec_record("extra"))) is SpecOutcome.APPLIED
    assert "extra" in names(catalogue)
    assert await follow(catalogue, dead, TOPIC, 0, 1, key, None) is SpecOutcome.APPLIED  # a tombstone
    assert "extra" not in names(catalogue)
    orphan = encode(spec_record("orphan", poolRef={"name": "gone"}))
    assert await follow(catalogue, dead, TOPIC, 0, 2, b"TokenEntitlement/orphan", orphan) is SpecOutcome.REFUSED
    assert await follow(catalogue, dead, TOPIC, 1, 3, b"x", b"{") is SpecOutcome.UNDECODABLE
    assert await follow(catalogue, dead, TOPIC, 1, 4, b"Unknown/x", None) is SpecOutcome.IGNORED
    assert names(catalogue) == ["copilot", "batch"]
    letters = sent.of("t.dead-letters")
    assert [(d.source_topic, d.partition, d.offset, d.reason, d.consumer) for d in letters] == [
        (TOPIC, 0, 2, DeadLetterReason.INVALID, "follower-test"), (TOPIC, 1, 3, DeadLetterReason.MALFORMED,
                                                                   "follower-test")]
    assert letters[0].detail.startswith("spec refused, previous specs kept:") and "gone" in letters[0].detail
    assert [(topic, key) for topic, key, _ in sent.records] == [("t.dead-letters", TOPIC.encode())] * 2
