"""The fleet model: deterministic, the split at one proxy is the exact enforcer, and hand-made traces give the
refusals, false refusals, overshoot and update timing worked out by hand."""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

import tokenpools.replay.fleet as fleet_package
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.replay.fleet.model import FleetConfig, run
from tokenpools.replay.fleet.policies import FleetView, Grants, Observation
from tokenpools.replay.fleet.trace import Entitlement, Request, Trace, TraceConfig, generate
from tokenpools.topics.codec import decode
from tokenpools.topics.records import LimitUpdate, Record

A = AdmissionOutcome.ADMITTED
C = AdmissionOutcome.REFUSED_CONCURRENCY


def small_trace(seed: int, load: float = 0.6, headroom: float = 1.0) -> Trace:
    config = TraceConfig(entitlements=20, duration_s=40.0, load=load, tokens_headroom=headroom)
    return generate(config, random.Random(seed))


def hand_trace(limits: dict[str, int], requests: list[tuple[float, str, float]], duration_s: float) -> Trace:
    """Entitlements with ample tokens/s; requests as (arrival s, entitlement, service s), 10 + 10 tokens each."""
    entitlements = tuple(Entitlement(name, slots, 1e6, 0.0) for name, slots in limits.items())
    return Trace(entitlements, tuple(Request(t, name, f"r{i}", 10, 10, 5, service_s)
                                     for i, (t, name, service_s) in enumerate(requests)), duration_s, 10)


def test_the_same_trace_and_seed_give_the_same_run_twice() -> None:
    trace = small_trace(1)
    config = FleetConfig(proxies=5, policy="shares", balancer="random")
    first, second = run(trace, config, random.Random(9)), run(trace, config, random.Random(9))
    assert first == second
    assert first.decisions != run(trace, config, random.Random(10)).decisions  # the seed drives the balancer


def test_the_split_at_one_proxy_decides_exactly_as_the_exact_enforcer() -> None:
    """One proxy's share is the whole limit every tick (fraction 0.1 + 0.9 = 1.0 exactly), so no update changes a
    limit, the one controller runs the reference's arithmetic, and every decision is the same."""
    trace = small_trace(2, load=0.9, headroom=0.5)  # busy enough that both concurrency and tokens refuse
    split = run(trace, FleetConfig(proxies=1, policy="shares"), random.Random(0))
    exact = run(trace, FleetConfig(proxies=1, policy="exact"), random.Random(0))
    assert split.decisions == exact.decisions
    assert split.figures.refused == exact.figures.refused
    assert {C, AdmissionOutcome.REFUSED_TOKEN_BUDGET} <= set(exact.figures.refused)
    assert split.figures.false_refusals == 0 and split.figures.ticks == 39


def test_the_exact_enforcer_never_refuses_falsely_and_no_design_here_overshoots() -> None:
    trace = small_trace(3, load=0.9)
    exact = run(trace, FleetConfig(proxies=4, policy="exact"), random.Random(0)).figures
    assert exact.refusals > 0 and exact.false_refusals == 0
    assert exact.overshoot_max_slots == 0
    for balancer in ("random", "key_affinity"):
        split = run(trace, FleetConfig(proxies=4, policy="shares", balancer=balancer), random.Random(0)).figures
        assert split.overshoot_max_slots == 0  # hold-back: a moving split never puts more than the limit in flight
        assert split.refusals > exact.refusals and split.false_refusals > 0


def test_a_proxy_full_while_the_fleet_has_room_refuses_falsely() -> None:
    """L = 2 split 1/1 over two proxies in turn. r0 holds p0; r1 (p1) ends at 0.3; r2 reaches the full p0 while the
    fleet has 1 of 2 in flight: a false refusal. r4 reaches p0 when r0 and r3 fill the fleet: a true one."""
    trace = hand_trace({"e": 2}, [(0.1, "e", 5.0), (0.2, "e", 0.1), (0.4, "e", 5.0), (0.5, "e", 5.0),
                                  (0.6, "e", 5.0)], duration_s=0.9)
    split = run(trace, FleetConfig(proxies=2, policy="shares", balancer="round_robin"), random.Random(0))
    assert split.decisions == (A, A, C, A, C)
    assert (split.figures.refusals, split.figures.false_refusals) == (2, 1)
    exact = run(trace, FleetConfig(proxies=2, policy="exact"), random.Random(0))
    assert exact.decisions == (A, A, A, C, C)
    assert (exact.figures.refusals, exact.figures.false_refusals) == (2, 0)


def test_a_grant_takes_effect_after_the_propagation_delay_and_growth_waits_a_tick() -> None:
    """L = 4 over two proxies, every request to one (key affinity), all long. Start 2/2: the third request is
    refused. Tick 1 targets 3/1 but the other proxy still holds its granted 2, so the busy one stays at 2 (request
    at 1.5 refused); tick 2 grants 3, in force at 2.1: refused at 2.05, admitted at 2.15."""
    trace = hand_trace({"e": 4}, [(t, "e", 100.0) for t in (0.1, 0.2, 0.3, 1.5, 2.05, 2.15)], duration_s=3.0)
    split = run(trace, FleetConfig(proxies=2, policy="shares", balancer="key_affinity"), random.Random(0))
    assert split.decisions == (A, A, C, C, C, A)
    assert split.figures.false_refusals == 3
    later = run(trace, FleetConfig(proxies=2, policy="shares", balancer="key_affinity", propagation_delay_s=0.2),
                random.Random(0))
    assert later.decisions == (A, A, C, C, C, C)


@dataclass(frozen=True)
class Whole:
    """A design that does not split: every proxy enforces the whole fleet limit (overshoot up to P × L)."""

    name: str = "whole"
    central: bool = False

    def initial(self, fleet: FleetView) -> Grants:
        return Grants({p: {n: (lim.concurrency, lim.tokens_per_s, lim.kv_bytes) for n, lim in fleet.limits.items()}
                       for p in fleet.proxies}, {p: int(fleet.pool.concurrency) for p in fleet.proxies})

    def decide(self, fleet: FleetView, seen: Observation, previous: Grants) -> Grants:
        return previous

    def wire(self, fleet: FleetView, grants: Grants, t_ms: int) -> Record | None:
        return None


def test_overshoot_is_measured_fleet_wide() -> None:
    """L = 1 enforced whole at two proxies in turn: r0 at p0 over [0, 2), r1 at p1 over [1, 3): two in flight over
    [1, 2), one slot over the limit for 1 s of the 4 s run."""
    trace = hand_trace({"e": 1}, [(0.0, "e", 2.0), (1.0, "e", 2.0)], duration_s=4.0)
    whole = run(trace, FleetConfig(proxies=2, policy="whole", balancer="round_robin"), random.Random(0),
                policies={"whole": Whole()})
    assert whole.decisions == (A, A)
    assert whole.figures.overshoot_max_slots == 1
    assert whole.figures.overshoot_fraction == pytest.approx(1.0 / 4.0)
    assert whole.figures.ticks == 3 and whole.figures.update_bytes_mean == 0.0


def test_every_proxy_reads_the_whole_pools_update_each_tick() -> None:
    trace = small_trace(4)
    split = run(trace, FleetConfig(proxies=3, policy="shares"), random.Random(0))
    assert split.last_update is not None
    update = decode(LimitUpdate, split.last_update)
    assert [p.proxy_id for p in update.proxies] == ["p0", "p1", "p2"]
    assert all(len(p.entitlements) == len(trace.entitlements) for p in update.proxies)
    assert update.version == update.t_ms == 39_000
    assert split.figures.update_bytes_max >= len(split.last_update) > 0 and split.figures.ticks == 39
    exact = run(trace, FleetConfig(proxies=3, policy="exact"), random.Random(0))
    assert (exact.last_update, exact.figures.ticks, exact.figures.update_bytes_mean) == (None, 0, 0.0)
    unmeasured = run(trace, FleetConfig(proxies=3, policy="shares", measure_updates=False), random.Random(0))
    assert unmeasured.decisions == split.decisions  # counting the bytes changes nothing else
    assert (unmeasured.last_update, unmeasured.figures.update_bytes_mean) == (None, 0.0)


@pytest.mark.parametrize("bad, field", [
    ({"proxies": 0}, "proxies"),
    ({"balancer": "nearest"}, "balancer"),
    ({"tick_s": 0.0}, "tick_s"),
    ({"propagation_delay_s": -0.1}, "propagation_delay_s"),
    ({"token_bucket_window_s": 0.0}, "token_bucket_window_s"),
])
def test_a_bad_config_is_refused_with_its_field(bad: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        FleetConfig(**{"proxies": 2, "policy": "shares", **bad})
    with pytest.raises(ValueError, match="policy"):
        run(small_trace(0), FleetConfig(proxies=2, policy="nothing"), random.Random(0))


def test_the_model_imports_no_component() -> None:
    """Components are independent: the model calls the core (and reads the topic contract), never the agents, the
    proxy or the controllers, whose code may change under it."""
    forbidden = ("tokenpools.streams", "tokenpools.proxy", "tokenpools.controllers", "tokenpools_dev")
    for path in Path(fleet_package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.startswith(forbidden)], f"{path.name} imports {names}"
