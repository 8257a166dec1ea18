"""Leader election's pure decision (controllers/lease.py): each outcome, and the safety property over random runs.

The property test runs two or three candidates against a simulated API server (compare-and-swap on the
resourceVersion, like the real one) in real time: each candidate has its own clock (offset and rate), messages are
delayed, answers are lost while their writes still land (or land late), candidates pause (SIGSTOP), crash, restart
and hand over. At no instant do two believe they lead, and a takeover of an expired lease starts at least the
margin (duration - renew deadline, less the clocks' drift) after the previous leader stopped.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenpools.controllers.lease import (
    Candidate,
    Decision,
    LeaseOutcome,
    LeaseRecord,
    LeaseTiming,
    WriteResult,
    decide,
    lapse,
    observe,
    release,
    written,
)

TIMING = LeaseTiming(duration_s=15, renew_deadline_s=10.0, retry_period_s=2.0)
WALL = 1_800_000_000.0


def held_by(holder: str | None, transitions: int = 0) -> LeaseRecord:
    return LeaseRecord(holder, 15, WALL - 100, WALL - 1, transitions)


# ---- each outcome ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [(15, 10.0, 10.0), (10, 10.0, 2.0), (15, 10.0, 0.0), (15, 16.0, 2.0)])
def test_timing_needs_retry_below_deadline_below_duration(bad: tuple[int, float, float]) -> None:
    with pytest.raises(ValueError):
        LeaseTiming(*bad)
    assert TIMING.margin_s == 5.0


def test_no_lease_is_acquired_by_creating_one() -> None:
    c = observe(Candidate("a", TIMING), None, "", now_s=100.0)
    c, d = decide(c, 100.0, WALL)
    assert d.outcome is LeaseOutcome.ACQUIRED
    assert d.write == LeaseRecord("a", 15, WALL, WALL, 0)
    c, outcome = written(c, d, WriteResult.WRITTEN, "7", sent_s=100.5, now_s=100.7)
    assert outcome is LeaseOutcome.ACQUIRED
    assert c.leading_until_s == 110.5, "the deadline runs from when the write was SENT"
    assert c.leading(110.4) and not c.leading(110.5)
    assert c.seen is not None and c.seen.version == "7"


def test_a_released_lease_is_taken_at_once_and_counts_a_transition() -> None:
    c = observe(Candidate("b", TIMING), held_by(None, transitions=3), "9", now_s=100.0)
    _, d = decide(c, 100.0, WALL)
    assert d.outcome is LeaseOutcome.ACQUIRED and d.write is not None
    assert (d.write.holder, d.write.transitions, d.write.acquire_wall_s) == ("b", 4, WALL)


def test_our_own_lease_is_renewed_keeping_its_acquire_time() -> None:
    c = observe(Candidate("a", TIMING, leading_until_s=105.0), held_by("a", 2), "9", now_s=100.0)
    _, d = decide(c, 100.0, WALL)
    assert d.outcome is LeaseOutcome.RENEWED and d.write is not None
    assert (d.write.acquire_wall_s, d.write.renew_wall_s, d.write.transitions) == (WALL - 100, WALL, 2)
    assert d.next_s == 102.0


def test_another_holder_is_waited_for_its_duration_from_when_we_first_saw_its_version() -> None:
    c = observe(Candidate("b", TIMING), held_by("a"), "9", now_s=100.0)
    c, d = decide(c, 100.0, WALL)
    assert (d.outcome, d.write, d.next_s) == (LeaseOutcome.HELD_BY_OTHER, None, 102.0)
    c = observe(c, held_by("a"), "9", now_s=114.0)  # the same version: still timed from 100
    c, d = decide(c, 114.0, WALL)
    assert d.outcome is LeaseOutcome.HELD_BY_OTHER and d.next_s == 115.0, "wakes up exactly at expiry"
    c = observe(c, held_by("a"), "9", now_s=115.0)
    c, d = decide(c, 115.0, WALL)
    assert d.outcome is LeaseOutcome.EXPIRED_TAKEOVER and d.write is not None
    assert (d.write.holder, d.write.transitions) == ("b", 1)


def test_a_renewal_restarts_the_wait_and_renew_time_is_not_trusted() -> None:
    c = observe(Candidate("b", TIMING), held_by("a"), "9", now_s=100.0)
    renewed_long_ago = dataclasses.replace(held_by("a"), renew_wall_s=WALL - 3600)  # a skewed clock wrote this
    c = observe(c, renewed_long_ago, "10", now_s=110.0)
    c, d = decide(c, 120.0, WALL)
    assert d.outcome is LeaseOutcome.HELD_BY_OTHER, "expiry is timed from our sight of version 10, not its renewTime"
    c, d = decide(c, 125.0, WALL)
    assert d.outcome is LeaseOutcome.EXPIRED_TAKEOVER


def test_a_leader_that_reads_another_holder_lost() -> None:
    c = observe(Candidate("a", TIMING, leading_until_s=108.0), held_by("b", 1), "12", now_s=100.0)
    c, d = decide(c, 100.0, WALL)
    assert (d.outcome, d.write) == (LeaseOutcome.LOST, None)
    assert not c.leading(100.0)


def test_a_conflict_loses_a_leader_and_a_failed_write_changes_nothing() -> None:
    c = observe(Candidate("a", TIMING, leading_until_s=108.0), held_by("a"), "9", now_s=100.0)
    c, d = decide(c, 100.0, WALL)
    failed, outcome = written(c, d, WriteResult.FAILED, "", sent_s=100.0, now_s=101.0)
    assert outcome is None and failed.leading_until_s == 108.0, "a timeout extends nothing: the deadline still runs"
    lost, outcome = written(c, d, WriteResult.CONFLICT, "", sent_s=100.0, now_s=101.0)
    assert outcome is LeaseOutcome.LOST and not lost.leading(101.0)
    standby = Candidate("b", TIMING, seen=c.seen)
    _, outcome = written(standby, dataclasses.replace(d, outcome=LeaseOutcome.EXPIRED_TAKEOVER),
                         WriteResult.CONFLICT, "", sent_s=100.0, now_s=101.0)
    assert outcome is LeaseOutcome.HELD_BY_OTHER


def test_a_leader_past_its_deadline_lapses_and_may_renew_again() -> None:
    c = observe(Candidate("a", TIMING, leading_until_s=108.0), held_by("a"), "9", now_s=100.0)
    assert lapse(c, 107.9) is c
    c = lapse(c, 108.0)
    assert c.leading_until_s is None
    c, d = decide(c, 108.0, WALL)
    assert d.outcome is LeaseOutcome.RENEWED, "still ours on the server: the compare-and-swap makes it safe to go on"


def test_release_frees_only_our_own_lease() -> None:
    ours = observe(Candidate("a", TIMING), held_by("a", 4), "9", now_s=100.0)
    d = release(ours, WALL)
    assert d is not None and d.outcome is LeaseOutcome.RELEASED and d.write is not None
    assert (d.write.holder, d.write.transitions) == (None, 4)
    c, outcome = written(ours, d, WriteResult.WRITTEN, "10", sent_s=100.0, now_s=100.1)
    assert outcome is LeaseOutcome.RELEASED and c.leading_until_s is None
    assert release(observe(Candidate("a", TIMING), held_by("b"), "9", 100.0), WALL) is None
    assert release(Candidate("a", TIMING), WALL) is None


def test_decide_needs_a_read_first() -> None:
    with pytest.raises(ValueError):
        decide(Candidate("a", TIMING), 0.0, WALL)
    with pytest.raises(ValueError):
        written(Candidate("a", TIMING), Decision(LeaseOutcome.HELD_BY_OTHER, None, 0.0), WriteResult.WRITTEN, "1", 0, 0)


# ---- the safety property over random interleavings ---------------------------------------------------------

@dataclass
class Server:
    """The API server's compare-and-swap on one object: create fails if it exists, update if the version moved."""

    record: LeaseRecord | None = None
    version: int = 0

    def read(self) -> tuple[LeaseRecord | None, str]:
        return self.record, str(self.version) if self.record is not None else ""

    def write(self, record: LeaseRecord, expected: str) -> tuple[WriteResult, str]:
        current = str(self.version) if self.record is not None else ""
        if expected != current:
            return WriteResult.CONFLICT, ""
        self.record, self.version = record, self.version + 1
        return WriteResult.WRITTEN, str(self.version)


@dataclass
class Node:
    name: str
    offset_s: float
    rate: float  # local seconds per real second
    candidate: Candidate
    epoch: int = 0  # bumped by a crash: messages of a former life are dropped
    paused_until: float = 0.0
    dead: bool = False
    stopping: bool = False
    intervals: list[tuple[float, float, LeaseOutcome]] = field(default_factory=list)  # (start, end, how it began)
    open: list[float | LeaseOutcome] | None = None  # [start, tentative end, how it began]

    def local(self, t: float) -> float:
        return self.offset_s + self.rate * t

    def real(self, local_s: float) -> float:
        return (local_s - self.offset_s) / self.rate

    def track(self, t: float, cause: LeaseOutcome | None) -> None:
        """Keep the real-time intervals in which this node believed it led, after a change at real time ``t``."""
        if self.open is not None and self.open[1] <= t:  # lapsed by the clock before this change
            self.close(float(self.open[1]))  # type: ignore[arg-type]
        until = self.candidate.leading_until_s
        leading = not self.dead and not self.stopping and self.candidate.leading(self.local(t))
        if self.open is not None:
            if leading:
                self.open[1] = self.real(until)  # type: ignore[arg-type]
            else:
                self.close(t)
        elif leading:
            self.open = [t, self.real(until), cause or LeaseOutcome.RENEWED]  # type: ignore[arg-type]

    def close(self, t: float) -> None:
        assert self.open is not None
        start, _, how = self.open
        self.intervals.append((float(start), t, how))  # type: ignore[arg-type]
        self.open = None


class Simulation:
    FAULTS = ("pause", "crash", "restart", "stop")

    def __init__(self, rng: random.Random, timing: LeaseTiming, nodes: list[Node], max_delay_s: float,
                 loss: float) -> None:
        self.rng, self.timing, self.nodes, self.max_delay_s, self.loss = rng, timing, nodes, max_delay_s, loss
        self.server = Server()
        self.queue: list[tuple[float, int, str, Node, int, tuple[object, ...]]] = []
        self.seq = itertools.count()

    def at(self, t: float, what: str, node: Node, *payload: object) -> None:
        heapq.heappush(self.queue, (t, next(self.seq), what, node, node.epoch, payload))

    def delay(self) -> float:
        return self.rng.uniform(0.0, self.max_delay_s)

    def run(self, until_s: float) -> None:
        while self.queue and self.queue[0][0] < until_s:
            t, _, what, node, epoch, payload = heapq.heappop(self.queue)
            if what in ("apply_read", "apply_write"):  # the server's side: applied whatever became of the sender
                self.apply(t, what, node, epoch, payload)
                continue
            if epoch != node.epoch and what not in self.FAULTS:
                continue  # an answer to a former life of a crashed (or stopping) node
            if node.dead and what != "restart":
                continue
            if t < node.paused_until and what != "restart":
                self.at(node.paused_until, what, node, *payload)  # it runs again where it stopped
                continue
            getattr(self, what)(t, node, *payload)
        for node in self.nodes:
            node.track(until_s, None)
            if node.open is not None:
                node.close(min(until_s, float(node.open[1])))  # type: ignore[arg-type]

    # node side: one attempt is read, decide, maybe write
    def wake(self, t: float, node: Node) -> None:
        node.candidate = lapse(node.candidate, node.local(t))
        node.track(t, None)
        self.send(t, "apply_read", node)

    def send(self, t: float, what: str, node: Node, *payload: object) -> None:
        """A request: applied after a delay, answered after another; or lost — the sender times out while the
        request may still land, even long after (a delayed write the sender has given up on)."""
        if self.rng.random() < self.loss:
            self.at(t + self.delay(), "on_failed", node, *payload)
            if self.rng.random() < 0.7:
                self.at(t + self.delay() * self.rng.uniform(0, 40), what, node, *payload, False)
        else:
            self.at(t + self.delay(), what, node, *payload, True)

    def apply(self, t: float, what: str, node: Node, epoch: int, payload: tuple[object, ...]) -> None:
        *request, answered = payload
        if what == "apply_read":
            record, version = self.server.read()
            answer: tuple[object, ...] = ("on_read", record, version)
        else:
            record, expected, sent_s, decision = request
            result, version = self.server.write(record, expected)  # type: ignore[arg-type]
            answer = ("on_written", decision, result, version, sent_s)
        if answered:
            heapq.heappush(self.queue, (t + self.delay(), next(self.seq), answer[0], node, epoch, answer[1:]))

    def on_failed(self, t: float, node: Node, *request: object) -> None:
        if request:  # a write: nothing learnt, the deadline runs on
            _, _, sent_s, decision = request
            self.on_written(t, node, decision, WriteResult.FAILED, "", sent_s)  # type: ignore[arg-type]
        elif not node.stopping:
            self.at(node.real(node.local(t) + self.timing.retry_period_s), "wake", node)

    def on_read(self, t: float, node: Node, record: LeaseRecord | None, version: str) -> None:
        now = node.local(t)
        node.candidate = observe(lapse(node.candidate, now), record, version, now)
        if node.stopping:
            decision = release(node.candidate, now)
            if decision is not None and decision.write is not None:
                self.send(t, "apply_write", node, decision.write, version, now, decision)
            return
        node.candidate, decision = decide(node.candidate, now, now)
        node.track(t, decision.outcome)
        if decision.write is None:
            self.at(node.real(max(now, decision.next_s)), "wake", node)
        else:
            self.send(t, "apply_write", node, decision.write, version, now, decision)

    def on_written(self, t: float, node: Node, decision: Decision, result: WriteResult, version: str,
                   sent_s: float) -> None:
        now = node.local(t)
        node.candidate, outcome = written(lapse(node.candidate, now), decision, result, version, sent_s, now)
        node.track(t, outcome)
        if not node.stopping:
            self.at(node.real(now + self.timing.retry_period_s), "wake", node)

    # faults
    def pause(self, t: float, node: Node, seconds: float) -> None:
        node.paused_until = max(node.paused_until, t + seconds)

    def crash(self, t: float, node: Node) -> None:
        node.track(t, None)
        node.dead = True
        node.track(t, None)
        node.epoch += 1

    def restart(self, t: float, node: Node) -> None:
        node.dead, node.stopping, node.paused_until = False, False, 0.0
        node.epoch += 1
        node.candidate = Candidate(node.name, self.timing)  # a new process: it remembers nothing
        self.at(t, "wake", node)

    def stop(self, t: float, node: Node) -> None:
        """Graceful shutdown: stop acting first, then read and release."""
        node.stopping = True
        node.track(t, None)
        node.epoch += 1  # forget the attempt in flight
        self.send(t, "apply_read", node)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    duration = draw(st.integers(2, 20))
    deadline = draw(st.floats(0.3, 0.9)) * duration
    retry = draw(st.floats(0.05, 0.45)) * deadline
    drift = draw(st.sampled_from([0.0, 0.001, 0.01, 0.03]))
    return {"timing": LeaseTiming(duration, deadline, retry), "drift": drift,
            "nodes": draw(st.integers(2, 3)), "max_delay_s": draw(st.floats(0.0, 0.6)) * retry,
            "loss": draw(st.sampled_from([0.0, 0.05, 0.3])), "seed": draw(st.integers(0, 2**32 - 1)),
            "faults": draw(st.lists(st.tuples(st.sampled_from(["pause", "crash", "stop"]), st.integers(0, 2),
                                              st.floats(0.0, 1.0), st.floats(0.0, 3.0)), max_size=6))}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_no_two_candidates_ever_believe_they_lead_and_takeovers_keep_the_margin(s: dict[str, object]) -> None:
    timing: LeaseTiming = s["timing"]  # type: ignore[assignment]
    drift: float = s["drift"]  # type: ignore[assignment]
    rng = random.Random(s["seed"])  # type: ignore[arg-type]
    nodes = [Node(f"n{i}", rng.uniform(-1e4, 1e4), rng.uniform(1 - drift, 1 + drift), Candidate(f"n{i}", timing))
             for i in range(s["nodes"])]  # type: ignore[call-overload]
    if timing.duration_s / (1 + drift) <= timing.renew_deadline_s / (1 - drift):
        return  # a margin the drift eats up: settings the operator must not choose
    horizon = 12 * timing.duration_s
    sim = Simulation(rng, timing, nodes, s["max_delay_s"], s["loss"])  # type: ignore[arg-type]
    for node in nodes:
        sim.at(rng.uniform(0, timing.retry_period_s), "wake", node)
    for kind, which, when, length in s["faults"]:  # type: ignore[attr-defined]
        node = nodes[which % len(nodes)]
        t = when * horizon
        if kind == "pause":
            sim.at(t, "pause", node, length * timing.duration_s)
        elif kind == "crash":
            sim.at(t, "crash", node)
            sim.at(t + length * timing.duration_s, "restart", node)
        else:
            sim.at(t, "stop", node)
    sim.run(horizon)

    margin = timing.duration_s / (1 + drift) - timing.renew_deadline_s / (1 - drift)
    spans = sorted((start, end, how, node.name) for node in nodes for start, end, how in node.intervals)
    for (s1, e1, _, n1), (s2, e2, how2, n2) in itertools.combinations(spans, 2):
        if n1 == n2:
            continue
        assert e1 <= s2, f"{n1} led [{s1:.3f}, {e1:.3f}) and {n2} led [{s2:.3f}, {e2:.3f}) at once"
        if how2 is LeaseOutcome.EXPIRED_TAKEOVER:
            assert s2 - e1 >= margin - 1e-6, f"{n2} took over {s2 - e1:.3f}s after {n1} stopped, margin {margin:.3f}"


def test_the_simulation_elects_someone_takes_over_a_crash_and_hands_over_on_release() -> None:
    """The property above holds trivially if nobody ever leads: this run pins that the simulation elects."""
    rng = random.Random(7)
    nodes = [Node("n0", 0.0, 1.0, Candidate("n0", TIMING)), Node("n1", 50.0, 1.0, Candidate("n1", TIMING))]
    sim = Simulation(rng, TIMING, nodes, max_delay_s=0.05, loss=0.0)
    sim.at(0.0, "wake", nodes[0])
    sim.at(1.0, "wake", nodes[1])
    sim.at(30.0, "crash", nodes[0])
    sim.at(100.0, "stop", nodes[1])
    sim.run(140.0)
    (first,) = nodes[0].intervals
    assert first[0] < 0.2 and first[1] == 30.0 and first[2] is LeaseOutcome.ACQUIRED
    (second,) = nodes[1].intervals
    assert second[2] is LeaseOutcome.EXPIRED_TAKEOVER
    # n0 last renewed at ~28 s, n1 saw it by ~30 s and took over one duration later, within one retry period
    assert 28 + TIMING.duration_s <= second[0] <= 30 + TIMING.duration_s + TIMING.retry_period_s
    assert second[1] == 100.0
    assert sim.server.record is not None and sim.server.record.holder is None, "released on stop"
    restarted = Node("n0", 0.0, 1.0, Candidate("n0", TIMING))
    sim2 = Simulation(rng, TIMING, [restarted], 0.05, 0.0)
    sim2.server = sim.server
    sim2.at(101.0, "wake", restarted)
    sim2.run(110.0)
    assert restarted.intervals[0][0] < 101.2 and restarted.intervals[0][2] is LeaseOutcome.ACQUIRED, \
        "a released lease is taken at once"
