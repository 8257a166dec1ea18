"""Loop plumbing without services: supervisor (restart by error class), spec publishing order, the file source."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from tokenpools.controllers.entitlements_loop import FileSource, Reconciler
from tokenpools.controllers.inventory import Inventory
from tokenpools.controllers.publisher import MemoryPublisher
from tokenpools.controllers.reconcile import evaluate
from tokenpools.controllers.specs import SpecPublisher
from tokenpools.controllers.supervisor import LoopState, LoopStatus, run_loops, supervise
from tokenpools.errors import PermanentError, RetryableError
from tokenpools.runtime.backoff import Backoff, ThrottledLog
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.records import SpecRecord
from tokenpools_dev import builders

FAST = Backoff(initial_s=0.001, max_s=0.01, jitter=0.0)
ROOT = Path(__file__).resolve().parents[2]


async def test_retryable_errors_restart_a_loop_and_permanent_ones_stop_only_it() -> None:
    runs = {"flaky": 0, "broken": 0, "bug": 0}

    async def flaky() -> None:
        runs["flaky"] += 1
        if runs["flaky"] < 3:
            raise RetryableError("broker away", delay_s=0.0)

    async def broken() -> None:
        runs["broken"] += 1
        raise PermanentError("bad config")

    async def bug() -> None:
        runs["bug"] += 1
        if runs["bug"] < 2:
            raise KeyError("oops")

    statuses = await asyncio.wait_for(run_loops({"flaky": flaky, "broken": broken, "bug": bug}, FAST), 5)
    assert runs == {"flaky": 3, "broken": 1, "bug": 2}
    assert statuses["flaky"].state is LoopState.STOPPED and statuses["flaky"].restarts == 2
    assert statuses["broken"].state is LoopState.FAILED and statuses["broken"].last_error == "bad config"
    assert statuses["bug"].errors == {"KeyError": 1}


async def test_a_loop_keeps_being_restarted_while_the_others_run() -> None:
    status = LoopStatus("x")
    ticks = []

    async def always_failing() -> None:
        raise RetryableError("down", 0.0)

    async def healthy() -> None:
        for _ in range(20):
            ticks.append(1)
            await asyncio.sleep(0.001)

    failing = asyncio.create_task(supervise("x", always_failing, status, FAST, ThrottledLog(logging.getLogger("t"))))
    await healthy()
    assert status.restarts > 3 and status.state in (LoopState.BACKING_OFF, LoopState.RUNNING)
    failing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await failing
    assert len(ticks) == 20


# ---- specs topic ---------------------------------------------------------------------------------------------

def _objects(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] in ("TokenPool", "TokenEntitlement")]


async def test_specs_are_published_pool_first_once_and_withdrawn_with_a_tombstone() -> None:
    pub = MemoryPublisher()
    specs = SpecPublisher(pub, "t.specs", clock=FakeClock(wall_ms=1_800_000_000_000))
    objects = _objects(ROOT / "examples/exp1.yaml")
    assert await specs.sync(evaluate(list(reversed(objects)), 1_800_000_000.0)) == 4
    keys = [k for _, k, _ in pub.records]
    assert keys[0] == "TokenPool/qwen3-8b" and set(keys[1:]) == {
        "TokenEntitlement/guaranteed-a", "TokenEntitlement/spot-b", "TokenEntitlement/guaranteed-c"}
    record = pub.records[1][2]
    assert isinstance(record, SpecRecord) and record.pool == "qwen3-8b" and record.state == "Bound"
    assert await specs.sync(evaluate(objects, 1_800_000_001.0)) == 0  # nothing changed: nothing sent
    pub.records.clear()
    assert await specs.sync(evaluate([o for o in objects if o["kind"] == "TokenEntitlement"], 1_800_000_002.0)) == 8
    kinds = [(k.split("/")[0], r is None, getattr(r, "deleted", None)) for _, k, r in pub.records]
    assert kinds[-2:] == [("TokenPool", False, True), ("TokenPool", True, None)], "entitlements leave before their pool"
    assert all(kind == "TokenEntitlement" for kind, *_ in kinds[:6])


async def test_a_republished_pool_is_followed_by_its_entitlements_so_compaction_keeps_them_after_it() -> None:
    """A reader of the compacted topic sees each key's last record only: a pool changed after its entitlements must
    not end up after them, or a proxy starting from settings only would refuse them (no such pool yet)."""
    pub = MemoryPublisher()
    specs = SpecPublisher(pub, "t.specs", clock=FakeClock(wall_ms=1_800_000_000_000))
    objects = _objects(ROOT / "examples/exp1.yaml")
    await specs.sync(evaluate(objects, 1_800_000_000.0))
    changed = [dict(o, spec={**o["spec"], "defaults": {"maxTokens": 32}}) if o["kind"] == "TokenPool" else o
               for o in objects]
    pub.records.clear()
    assert await specs.sync(evaluate(changed, 1_800_000_001.0)) == 4
    keys = [k for _, k, _ in pub.records]
    assert keys[0] == "TokenPool/qwen3-8b" and sorted(keys[1:]) == [
        "TokenEntitlement/guaranteed-a", "TokenEntitlement/guaranteed-c", "TokenEntitlement/spot-b"]
    compacted: dict[str, int] = {k: i for i, k in enumerate(keys)}  # the last offset of each key
    assert all(compacted[k] > compacted["TokenPool/qwen3-8b"] for k in compacted if k.startswith("TokenEntitlement/"))
    pub.records.clear()
    changed[1] = dict(changed[1], spec={**changed[1]["spec"], "qos": {**changed[1]["spec"]["qos"], "sloTargetMs": 900}})
    assert await specs.sync(evaluate(changed, 1_800_000_002.0)) == 1  # an entitlement alone: its pool stays put


# ---- --no-kubernetes: the config file -------------------------------------------------------------------------

async def test_file_source_reloads_on_change_and_keeps_the_last_good_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    text = (ROOT / "examples/exp1.yaml").read_text()
    config.write_text(text)
    pub, inventory = MemoryPublisher(), Inventory()
    clock = FakeClock(wall_ms=1_800_000_000_000)
    reconciler = Reconciler(inventory, SpecPublisher(pub, "t.specs", clock), "default", clock=clock)
    source = FileSource(config, reconciler, poll_s=0.01, resync_s=5)
    task = asyncio.create_task(source.run())
    try:
        await asyncio.wait_for(inventory.ready.wait(), 5)
        assert reconciler.states == {"guaranteed-a": "Bound", "spot-b": "Bound", "guaranteed-c": "Bound"}
        assert inventory.pools["qwen3-8b"].floor_replicas == 1
        # 6 + 6 + 11 > 16 slots: the newest guaranteed baseline no longer fits
        c_key = "  apiKeys:\n    - sha256: f60c"
        config.write_text(text.replace("concurrency: 6}\n" + c_key, "concurrency: 11}\n" + c_key))
        await _until(lambda: reconciler.states.get("guaranteed-c") == "Degraded")
        config.write_text(text.replace("sloTargetMs: 1200", "sloTargetMs: -1"))  # invalid: refused whole
        await _until(lambda: source.refused == 1)
        assert reconciler.states["guaranteed-c"] == "Degraded" and source.loads == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


# ---- error classification (what a retry would do) --------------------------------------------------------------

def test_kubernetes_errors_are_classified_by_what_a_retry_would_do() -> None:
    import aiohttp
    from kubernetes_asyncio.client.exceptions import ApiException

    from tokenpools.controllers.kube import AUTH_RETRY_S, api_message, classify

    def api(status: int, body: str = "", headers: dict[str, str] | None = None) -> ApiException:
        exc = ApiException(status=status, reason="r")
        exc.body, exc.headers = body, headers  # type: ignore[assignment]  # as a response would set them
        return exc

    throttled = classify(api(429, headers={"Retry-After": "7"}), "scaling")
    assert isinstance(throttled, RetryableError) and throttled.delay_s == 7.0
    assert isinstance(classify(api(503), "x"), RetryableError)
    forbidden = classify(api(403, '{"message": "deployments.apps is forbidden"}'), "scaling d")
    assert isinstance(forbidden, RetryableError) and forbidden.delay_s == AUTH_RETRY_S
    assert str(forbidden) == "scaling d: 403 deployments.apps is forbidden"
    assert isinstance(classify(api(422), "x"), PermanentError) and isinstance(classify(api(404), "x"), PermanentError)
    assert isinstance(classify(aiohttp.ClientConnectionError("refused"), "x"), RetryableError)
    assert isinstance(classify(TimeoutError(), "x"), RetryableError)
    assert api_message(api(500, "not json")) == "500 r"


def test_prometheus_errors_are_classified(monkeypatch: pytest.MonkeyPatch) -> None:
    import requests
    from prometheus_api_client import PrometheusApiClientException

    from tokenpools.controllers.metrics_loop import PrometheusQuerier

    q = PrometheusQuerier("http://127.0.0.1:9")
    try:
        for raised, expected in ((PrometheusApiClientException("HTTP Status Code 400 (b'parse error')"), PermanentError),
                                 (PrometheusApiClientException("HTTP Status Code 503 (b'')"), RetryableError),
                                 (requests.ConnectionError("refused"), RetryableError)):
            def fail(*_: Any, exc: Exception = raised, **__: Any) -> Any:
                raise exc
            monkeypatch.setattr(q._pc, "custom_query", fail)
            with pytest.raises(expected):
                q._query("up", 0.0)
    finally:
        q.close()


async def test_a_replica_that_no_longer_leads_publishes_nothing() -> None:
    from tokenpools.controllers.leader import NotLeading, ensure_acting
    from tokenpools.controllers.publisher import LeaderPublisher

    leading = [True]
    memory = MemoryPublisher()
    gated = LeaderPublisher(memory, lambda: leading[0])
    record = builders.spec_record("TokenPool", "p", generation=1, reason="x")
    await gated.publish("specs", "TokenPool/p", record)
    leading[0] = False
    with pytest.raises(NotLeading) as info:
        await gated.publish("specs", "TokenPool/p", record)
    assert isinstance(info.value, RetryableError) and "publishing to specs" in str(info.value)
    assert memory.records == [("specs", "TokenPool/p", record)]
    ensure_acting(None, "anything")  # no leader election: always acting
