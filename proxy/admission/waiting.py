"""The asyncio shell of the pools' admission queues (docs/queueing.md): a future per waiter, one timer per pool.

``core.waiting.AdmissionQueue`` decides who waits and who is admitted when; this shell only turns its answers into
awakenings, with the clock's now:

- ``wait`` parks a request's handler on a future until the queue resolves its waiter, and gives the final decision.
  A handler cancelled while it waits (its client went away) withdraws its waiter and re-raises;
- ``wake`` drains a pool's queue, resolves the futures of the waiters it settled, and re-arms the pool's one timer
  (``loop.call_at``) at the queue's ``next_wake_s``: a deadline, or the moment a waiting token budget refills.
  The proxy calls it after every release and every change of the limits it applies; the timer calls it otherwise.
  There is no polling loop.

Every waiter's wait is observed once, when it ends, in ``ProxyMetrics.wait_time`` (pool, ``WaitOutcome``).
"""

from __future__ import annotations

import asyncio

from tokenpools.core.admission import Decision
from tokenpools.core.waiting import Waiter
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.proxy.admission.pools import PoolRuntime
from tokenpools.runtime.clock import Clock


class Waits:
    """The waiters of one proxy, over all its pools. Lives on the event loop; not thread-safe."""

    def __init__(self, clock: Clock, metrics: ProxyMetrics) -> None:
        self._clock = clock
        self._metrics = metrics
        self._futures: dict[Waiter, asyncio.Future[Decision]] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}  # pool → (wake_s, its handle)

    async def wait(self, runtime: PoolRuntime, waiter: Waiter) -> Decision:
        """The final decision of ``waiter`` (just returned by ``runtime.queue.admit``), once the queue resolves it.

        Cancelled, the waiter leaves its line and the cancellation goes on. A waiter the queue admitted a moment
        before the cancellation cannot be withdrawn: ``waiter.outcome`` says so, and its ticket is the caller's."""
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._futures[waiter] = future
        self._arm(runtime)  # its deadline may come before the pool's next wake
        try:
            return await future
        except asyncio.CancelledError:
            if runtime.queue.withdraw(waiter, self._clock.now_s()):
                self._observe(runtime, waiter)
                self.wake(runtime)  # the line behind it may pass now; the timer may be due later
            raise
        finally:
            self._futures.pop(waiter, None)

    def wake(self, runtime: PoolRuntime) -> None:
        """Drain ``runtime``'s queue now: admit who passes, time out who is due, then re-arm the pool's timer."""
        queue = runtime.queue
        if not len(queue) and runtime.pool.name not in self._timers:
            return  # nobody waits: nothing to drain, no timer to move (the path of every release)
        for waiter in queue.drain(self._clock.now_s()):
            self._observe(runtime, waiter)
            future = self._futures.pop(waiter, None)
            if future is not None and not future.done():
                future.set_result(waiter.decision)
        self._arm(runtime)

    def close(self) -> None:
        """Cancel the timers (the proxy is stopping; the handlers still waiting are cancelled by the server)."""
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def _arm(self, runtime: PoolRuntime) -> None:
        """One timer per pool, at the queue's next wake; none when nobody waits."""
        name = runtime.pool.name
        wake_s = runtime.queue.next_wake_s()
        armed = self._timers.get(name)
        if armed is not None:
            if armed[0] == wake_s:
                return
            armed[1].cancel()
            del self._timers[name]
        if wake_s is None:
            return
        loop = asyncio.get_running_loop()
        delay_s = max(0.0, wake_s - self._clock.now_s())
        self._timers[name] = (wake_s, loop.call_at(loop.time() + delay_s, self._on_timer, runtime))

    def _on_timer(self, runtime: PoolRuntime) -> None:
        self._timers.pop(runtime.pool.name, None)
        self.wake(runtime)

    def _observe(self, runtime: PoolRuntime, waiter: Waiter) -> None:
        assert waiter.outcome is not None  # (resolved by the queue)
        self._metrics.wait_time[(runtime.pool.name, waiter.outcome.value)].observe(waiter.waited_s)
