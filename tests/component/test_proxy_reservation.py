"""The proxy reserves n_in + its output estimate, learned from completions (docs/reservations.md), records that as
the decision's cost, charges a stream past its reservation as its chunks arrive and settles exactly at the end."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import aiohttp
import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.reservation import ReservationConfig
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import build_app
from tokenpools.proxy.admission.estimate import chat_prompt_tokens
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.codec import encode
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 1e9, 8), kv_bytes_per_token=1000, default_max_tokens=32)
GOLD = EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 2e8, 2))
MESSAGES = [{"role": "user", "content": "hi"}]


async def test_reservation_follows_completions_and_a_stream_is_charged_as_it_goes(tmp_path: Path) -> None:
    backend, hub, clock = FakeBackend(), ProducerHub(), FakeClock()  # the clock stands still: no refill
    async with running(backend.app()) as backend_url:
        config = dataclasses.replace(proxy_config({"pool-a": (backend_url,)}, [POOL], [GOLD], {"gold": "sk-gold"}),
                                     reservation=ReservationConfig(0.5, window_completions=4, min_completions=2))
        app = build_app(config, offline_options(tmp_path), producer_factory=hub.factory, clock=clock)
        async with running(app) as url, aiohttp.ClientSession() as session:
            proxy = app.proxy
            assert proxy.limits is not None and proxy.events is not None
            proxy.limits.handle(encode(limit_update("pool-a", 1, clock.wall_ms(), {"gold": (4, 5000.0, 1e8, 500.0)}, 4)))
            ctl = proxy.pools["pool-a"].controller
            headers = {"Authorization": "Bearer sk-gold"}
            body = {"model": "fake-model", "messages": MESSAGES}
            n_in = chat_prompt_tokens(MESSAGES)

            backend.chunks = 3
            for _ in range(2):  # two completions of 3 tokens: the estimate for max_tokens 32 becomes 3
                async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 200
            assert ctl.output_reservation("gold", 32) == 3

            level0 = ctl.bucket_tokens_of("gold", clock.now_s())
            backend.chunks, backend.chunk_delay_s = 20, 0.03
            seen = 0
            async with session.post(url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers) as r:
                assert r.status == 200
                buffer = b""
                async for data in r.content.iter_any():
                    buffer += data
                    seen = buffer.count(b'"delta"')
                    if seen >= 12:
                        break
                # the proxy has read at least `seen` chunks: all past the 3 reserved were charged already
                assert ctl.bucket_tokens_of("gold", clock.now_s()) <= level0 - n_in - seen
                await r.read()
            for _ in range(200):
                if not proxy.events.queue_depth and not proxy.events.in_flight and ctl.in_flight_of("gold") == 0:
                    break
                await asyncio.sleep(0.01)
            # settled with the backend's usage: exactly the tokens used, whatever was reserved and charged
            assert ctl.bucket_tokens_of("gold", clock.now_s()) == level0 - (backend.prompt_tokens + 20)

    decided = hub.of("requests")
    assert [(d["max_tokens"], d["cost_tokens"]) for d in decided] == [(32, n_in + 32), (32, n_in + 32), (32, n_in + 3)]
    completed = hub.of("completions")
    assert completed[-1]["reserved_tokens"] == n_in + 3 and completed[-1]["completion_tokens"] == 20
