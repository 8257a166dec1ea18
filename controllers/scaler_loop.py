"""scaler: scale commands (Kafka) → the ``/scale`` subresource of each pool's backend, with a Kubernetes Event per change.

The consumer has no group: the one controller that acts (the Lease's holder, ``leader``) takes every partition of
the scale topic and starts at the first command younger than ``max_age_s`` (``offsets_for_times``), so a restarted
scaler, or a new leader, picks the current intent up at once without replaying old history. Every patch first
checks that this replica still leads (``acting``). Each batch is reduced to the newest command per pool
(intent is a level, not a sequence of deltas). Decisions are ``scaler_policy.decide``; this module only reads the
workload's size, patches it, records the Event, and commits the policy state after the patch succeeded.

Per-command failures (the pool or its workload does not exist, a 403, a kind without ``/scale``) are logged once
per interval and the command is dropped: the next tick re-sends the intent. Broker or API server trouble is
retryable and restarts the loop. Every command handled is counted (``counted``: the controller's metrics) by what
became of it: its decision's outcome, or a ``CommandFailure``. ``--dry-run`` reads and decides, logs what it would
do, and patches nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from tokenpools.controllers.inventory import Inventory
from tokenpools.controllers.kube import EventRecorder, ScaleClient
from tokenpools.controllers.leader import Acting, NotLeading, ensure_acting
from tokenpools.controllers.scaler_policy import CommandFailure, PoolScaleState, ScaleDecision, ScaleOutcome, decide
from tokenpools.controllers.status import rfc3339
from tokenpools.core.scaling import ScalingConfig
from tokenpools.errors import PermanentError, RetryableError, TokenPoolsError
from tokenpools.runtime.backoff import ThrottledLog
from tokenpools.runtime.clock import Clock, SystemClock, wall_s
from tokenpools.topics.codec import DecodeError, decode
from tokenpools.topics.records import ScaleCommand

log = logging.getLogger("tokenpools.controllers.scaler")


Counted = Callable[[str, ScaleOutcome | CommandFailure], None]
"""(pool, what became of its command): the controller's metrics."""


@dataclass(frozen=True, slots=True)
class ScalerOptions:
    config: ScalingConfig
    max_age_s: float  # a command older than this is ignored (controllers.scale_command_max_age_s)
    dry_run: bool


def newest_per_pool(commands: Iterable[ScaleCommand]) -> list[ScaleCommand]:
    newest: dict[str, ScaleCommand] = {}
    for c in commands:
        if c.pool not in newest or c.version > newest[c.pool].version:
            newest[c.pool] = c
    return list(newest.values())


class Scaler:
    """Applies scale commands (no Kafka here; ``ScalerLoop`` feeds it)."""

    def __init__(self, inventory: Inventory, scale: ScaleClient | None, events: EventRecorder | None,
                 options: ScalerOptions, clock: Clock | None = None,
                 throttled: ThrottledLog | None = None, acting: Acting | None = None,
                 counted: Counted | None = None) -> None:
        self.inventory, self.scale, self.events, self.options = inventory, scale, events, options
        self.counted: Counted = counted or (lambda pool, outcome: None)
        self.acting = acting  # None: no leader election (one replica)
        self.clock = clock or SystemClock()
        self.throttled = throttled or ThrottledLog(log, clock=self.clock)
        self.states: dict[str, PoolScaleState] = {}
        self.decisions: list[ScaleDecision] = []  # the most recent ones, for tests and debugging
        self.replicas: dict[str, int] = {}  # without Kubernetes (--no-kubernetes): the size we would have set

    async def handle(self, command: ScaleCommand) -> ScaleDecision | None:
        entry = self.inventory.get(command.pool)
        if entry is None:
            self.throttled.warning(f"unknown/{command.pool}", "scale command for unknown pool %s ignored", command.pool)
            self.counted(command.pool, CommandFailure.UNKNOWN_POOL)
            return None
        try:
            observed = (await self.scale.get_replicas(entry.target) if self.scale is not None
                        else self.replicas.get(command.pool, command.current_replicas))
            now_s = wall_s(self.clock)
            state, decision = decide(self.states.get(command.pool, PoolScaleState()), command, entry.spec, observed,
                                     entry.floor_replicas, now_s, self.options.config, self.options.max_age_s)
            if decision.outcome.changes:
                await self._apply(entry.target, decision, now_s)
        except PermanentError as exc:
            self.throttled.warning(f"failed/{command.pool}", "pool %s: scale command dropped: %s", command.pool, exc)
            self.counted(command.pool, CommandFailure.FAILED)
            return None
        except NotLeading:
            raise  # not a failure: this replica stopped leading and its loops are being cancelled
        except RetryableError:
            self.counted(command.pool, CommandFailure.FAILED)
            raise
        self.counted(command.pool, decision.outcome)
        self.states[command.pool] = state
        self.decisions = (self.decisions + [decision])[-100:]
        if decision.outcome.changes:
            log.info("%s%s", "[dry-run] would scale " if self.options.dry_run else "", decision.describe())
        else:
            log.debug("%s", decision.describe())
        return decision

    async def _apply(self, target: Any, decision: ScaleDecision, now_s: float) -> None:
        if self.options.dry_run or self.scale is None:
            self.replicas[decision.pool] = decision.replicas
            return
        ensure_acting(self.acting, f"scaling {target} to {decision.replicas}")
        await self.scale.set_replicas(target, decision.replicas)
        if self.events is not None:
            verb = "ScaledUp" if decision.outcome is ScaleOutcome.SCALED_UP else "ScaledDown"
            message = (f"tokenpools pool {decision.pool}: {decision.current} → {decision.replicas} replicas "
                       f"(wanted {decision.wanted}, protected floor {decision.floor}): {decision.reason}")
            try:
                await self.events.record(target.involved_object(), verb, message, rfc3339(now_s))
            except TokenPoolsError as exc:  # the scale change stands; a missing Event must not undo or repeat it
                self.throttled.warning("event", "scaled %s but could not record the Event: %s", target, exc)


class ScalerLoop:
    def __init__(self, scaler: Scaler, consumer_factory: Callable[[], AIOKafkaConsumer], topic: str,
                 throttled: ThrottledLog | None = None) -> None:
        self.scaler, self._factory, self.topic = scaler, consumer_factory, topic
        self.throttled = throttled or ThrottledLog(log, clock=scaler.clock)
        self.invalid = 0
        self.ready = False  # positioned on every partition (tests wait for this before producing)

    async def _position(self, consumer: AIOKafkaConsumer) -> None:
        partitions = consumer.partitions_for_topic(self.topic)
        if not partitions:  # aiokafka's consumer.topics() does not refresh the client's own view
            await consumer._client.force_metadata_update()  # noqa: SLF001
            partitions = consumer.partitions_for_topic(self.topic)
        if not partitions:
            raise RetryableError(f"topic {self.topic} has no partitions (not created yet?)", 2.0)
        assignment = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        consumer.assign(assignment)
        since_ms = self.scaler.clock.wall_ms() - int(self.scaler.options.max_age_s * 1000)
        offsets = await consumer.offsets_for_times({tp: since_ms for tp in assignment})
        for tp in assignment:
            found = offsets.get(tp)
            if found is None:
                await consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, found.offset)
        for tp in assignment:
            await consumer.position(tp)
        self.ready = True

    def _decode(self, message: Any) -> ScaleCommand | None:
        if message.value is None:
            return None
        try:
            return decode(ScaleCommand, message.value)
        except DecodeError as exc:
            self.invalid += 1
            self.throttled.warning("invalid", "scale: undecodable record at %s[%d]@%d: %s",
                                   message.topic, message.partition, message.offset, exc)
            return None

    async def run(self) -> None:
        await self.scaler.inventory.ready.wait()
        consumer = self._factory()
        try:
            try:
                await consumer.start()
                await self._position(consumer)
            except KafkaError as exc:
                raise RetryableError(f"scale consumer: {type(exc).__name__}: {exc}", 1.0) from None
            while True:
                try:
                    batches = await consumer.getmany(timeout_ms=1000, max_records=500)
                except KafkaError as exc:
                    raise RetryableError(f"scale consumer: {type(exc).__name__}: {exc}", 1.0) from None
                commands = [c for msgs in batches.values() for m in msgs if (c := self._decode(m)) is not None]
                for command in newest_per_pool(commands):
                    await self.scaler.handle(command)
        finally:
            self.ready = False
            await consumer.stop()
