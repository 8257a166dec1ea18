"""What one replay run is: the pool and entitlements, who is there when, the load, the backend, the parameters.

A ``Scenario`` is plain frozen data, built either from a recorded log (``logio.read_log`` then
``logio.scenario_from_data``) or by an experiment (``experiments``); the replayer turns it into decisions and
metrics and never looks at a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from tokenpools.core.limits import LimitConfig
from tokenpools.core.priority import PolicyConstants
from tokenpools.core.reservation import ReservationConfig
from tokenpools.core.scaling import ScalingConfig
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.waiting import QueueConfig
from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.backend.recorded import Recording
from tokenpools.replay.load import Arrival, ClosedLoad, RetryPolicy

from tokenpools.errors import PermanentError

if TYPE_CHECKING:
    from tokenpools.config import Settings


class ReplayUsageError(PermanentError, ValueError):
    """A bad replay/sweep/load option (a ValueError for callers, a clean one-line error for the CLI)."""


MeanSlo = Literal["recompute", "frozen"]
EPOCH_MS = 1_772_150_400_000  # 2026-02-27T00:00:00Z: event time 0 of a generated scenario, in epoch ms


@dataclass(frozen=True, slots=True)
class ReplayParams:
    """The control plane's parameters, as the stream agents and proxies would have them.

    ``mean_slo``: "recompute" recomputes ℓ̄* whenever the set of Bound entitlements changes; "frozen" keeps the
    value of the first control tick (what the paper's Exp-2 numbers imply, docs/paper.md#worked-numbers).
    ``window_s`` is the usage-window width (None: one window per tick); ``grace_s`` how long after a window's end
    the tick that closes it runs (ticks at k·``tick_s`` + ``grace_s``) and the proxy gets its limits. The live
    agents close a window once every proxy's watermark has passed its end, about 0.1 s after it (``streams.grace_s``
    is only their fallback for a silent proxy), so ``from_settings`` uses 0: a replay has no late events and no
    silent proxy. (Replaying a live Exp 2 log with grace 0.1 / 0 / 0.3 / 1 s made 97.7 / 97.5 / 94.3 / 90.8 % of the
    live decisions the same way; with the fallback's 2 s, one window late, 85 %.)
    ``backend_waiting``: "tick" gives the proxy the backend's waiting queue as seen at each tick (the limit update
    carries it, docs/semantics.md#contention); "off" leaves contention to in-flight ≥ capacity alone (a what-if).
    ``backend``: "sim" serves requests with the backend simulator; "recorded" with a recorded log's own service
    times (``backend.recorded``; only a scenario read from a log has them).
    ``reservation``: the proxy's output estimate (``policy.reservation_*``), fed with the completions in event time.
    ``queue`` and ``max_waiters``: the proxy's admission queue (``policy.queue_*``, docs/queueing.md) and the waiters
    it may hold (``proxy.max_waiters``); ``queue.slo_fraction`` 0 refuses at once, as before the queue (an entitlement
    with its own ``queue_timeout_ms`` still waits), and ``max_waiters`` 0 refuses everything at once.
    """

    tick_s: float = 5.0
    window_s: float | None = None
    grace_s: float = 0.0
    constants: PolicyConstants = field(default_factory=PolicyConstants)
    limit_config: LimitConfig = field(default_factory=LimitConfig)
    reservation: ReservationConfig = field(default_factory=ReservationConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    max_waiters: int = 1024
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    mean_slo: MeanSlo = "recompute"
    retry_after_s: int = 1
    sample_s: float = 0.5
    backend_waiting: Literal["tick", "off"] = "tick"
    backend: Literal["sim", "recorded"] = "sim"
    budget_retry_after_max_s: int = 3600  # the longest retry hint a budget_exhausted refusal gives

    def __post_init__(self) -> None:
        if self.tick_s <= 0:
            raise ValueError(f"`tick_s` must be positive, got {self.tick_s}")
        if self.window_s is not None and self.window_s <= 0:
            raise ValueError(f"`window_s` must be positive, got {self.window_s}")
        if self.grace_s < 0:
            raise ValueError(f"`grace_s` must be >= 0, got {self.grace_s}")
        if self.mean_slo not in ("recompute", "frozen"):
            raise ValueError(f"`mean_slo` must be 'recompute' or 'frozen', got {self.mean_slo!r}")
        if self.retry_after_s < 1:
            raise ValueError(f"`retry_after_s` must be >= 1, got {self.retry_after_s}")
        if self.backend_waiting not in ("tick", "off"):
            raise ValueError(f"`backend_waiting` must be 'tick' or 'off', got {self.backend_waiting!r}")
        if self.backend not in ("sim", "recorded"):
            raise ValueError(f"`backend` must be 'sim' or 'recorded', got {self.backend!r}")
        if self.sample_s <= 0:
            raise ValueError(f"`sample_s` must be positive, got {self.sample_s}")
        if self.budget_retry_after_max_s < 1:
            raise ValueError(f"`budget_retry_after_max_s` must be >= 1, got {self.budget_retry_after_max_s}")
        if self.max_waiters < 0:
            raise ValueError(f"`max_waiters` must be >= 0, got {self.max_waiters}")

    @property
    def window_ms(self) -> int:
        return round((self.window_s if self.window_s is not None else self.tick_s) * 1000)

    @staticmethod
    def from_settings(settings: Settings, sample_s: float = 0.5) -> ReplayParams:
        """The parameters the live processes would run with: the same Settings, the same defaults."""
        return ReplayParams(
            tick_s=settings.streams.tick_s,
            grace_s=0.0,  # the agents close on watermarks, not at end + streams.grace_s (see the class doc)
            constants=settings.policy.to_constants(),
            limit_config=settings.policy.to_limit_config(),
            reservation=settings.policy.to_reservation_config(),
            queue=settings.policy.to_queue_config(),
            max_waiters=settings.proxy.max_waiters,
            scaling=settings.scaling.to_config(),
            mean_slo=settings.policy.mean_slo,
            retry_after_s=settings.proxy.retry_after_s,
            sample_s=sample_s,
            budget_retry_after_max_s=settings.budgets.retry_after_max_s,
        )


@dataclass(frozen=True, slots=True)
class Membership:
    """An entitlement is Bound from ``join_s`` until ``leave_s`` (None: to the end). Its load stops when it leaves."""

    join_s: float = 0.0
    leave_s: float | None = None


@dataclass(frozen=True, slots=True)
class CapacityChange:
    """At ``t_s`` every replica gets ``slots_per_replica`` sequence slots (the Exp-2 outage: 16 -> 8 -> 16)."""

    t_s: float
    slots_per_replica: int


@dataclass(frozen=True, slots=True)
class Phase:
    """A named interval of the run, for per-phase metrics and plot shading."""

    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class Scenario:
    """``arrivals``: the open-loop load (first attempts at fixed times); ``closed``: closed-loop clients, each
    sending its next request once its previous one has ended (either may be empty; the replayer runs both)."""

    name: str
    pool: PoolSpec
    entitlements: tuple[EntitlementSpec, ...]
    arrivals: tuple[Arrival, ...]
    duration_s: float
    replica_model: ReplicaModel = field(default_factory=ReplicaModel)
    membership: dict[str, Membership] = field(default_factory=dict)
    capacity_changes: tuple[CapacityChange, ...] = ()
    phases: tuple[Phase, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    params: ReplayParams = field(default_factory=ReplayParams)
    origin_ms: int = 0
    seed: int = 0
    recording: Recording | None = None  # a recorded log's service times (``replay.backend=recorded``)
    closed: tuple[ClosedLoad, ...] = ()

    def __post_init__(self) -> None:
        names = [e.name for e in self.entitlements]
        if len(set(names)) != len(names):
            raise ValueError(f"scenario {self.name}: entitlement names must be unique, got {names}")
        unknown = sorted(set(self.membership) - set(names))
        if unknown:
            raise ValueError(f"scenario {self.name}: membership names unknown entitlements {unknown}")
        strangers = sorted({load.entitlement for load in self.closed} - set(names))
        if strangers:
            raise ValueError(f"scenario {self.name}: closed-loop clients of unknown entitlements {strangers}")
        if self.duration_s <= 0:
            raise ValueError(f"scenario {self.name}: `duration_s` must be positive, got {self.duration_s}")
        if self.origin_ms % self.params.window_ms:
            raise ValueError(f"scenario {self.name}: `origin_ms` must be a multiple of the window ({self.params.window_ms} ms)")

    def member(self, name: str) -> Membership:
        return self.membership.get(name, Membership())

    def with_params(self, params: ReplayParams) -> Scenario:
        return replace(self, params=params)
