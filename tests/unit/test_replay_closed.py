"""Closed-loop clients in the replayer: N clients never have more than N requests out, each client's requests follow
one another (the next one sent as the previous one ends), and the run is deterministic."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from tokenpools.errors import ConfigError
from tokenpools.replay.experiments import build
from tokenpools.replay.load import ClosedLoad, Lengths
from tokenpools.replay.replayer import ReplayResult, replay
from tokenpools.replay.scenario import Membership

CASES = [("exp1", "token-pools", ()), ("exp1", "token-pools", ("policy.queue_slo_fraction=0",)),
         ("exp1", "none", ()), ("exp2", "token-pools", ()), ("exp2", "token-pools", ("policy.queue_slo_fraction=0",))]


def _requests(result: ReplayResult) -> dict[str, tuple[float, float]]:
    """request id -> (sent: its first attempt's arrival, ended: its completion, or its last decision if it was
    refused for good; infinity if a retry was still due when the load stopped)."""
    d, c = result.decisions, result.completions
    sent: dict[str, float] = {}
    last: dict[str, float] = {}
    for rid, attempt, t, queued, retry_s in zip(d.request_id, d.attempt, d.t_s, d.queued_s, d.retry_wait_s):
        if attempt == 0:
            sent[rid] = t - queued
        last[rid] = t if retry_s == 0 else float("inf")
    done = dict(zip(c.request_id, c.t_s))
    assert sum(1 for t in last.values() if t == float("inf")) == sum(result.pending.values())
    return {rid: (sent[rid], done.get(rid, last[rid])) for rid in sent}


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "-".join((case[0], case[1], *case[2])))
def run(request: pytest.FixtureRequest) -> tuple[ReplayResult, ReplayResult]:
    name, policy, items = request.param
    scenario = build(name, ["load.mode=closed", "load.compress=0.5", *items])
    return replay(scenario, policy), replay(scenario, policy)


def test_an_entitlement_never_has_more_requests_out_than_clients(run: tuple[ReplayResult, ReplayResult]) -> None:
    result = run[0]
    clients = {load.entitlement: load.clients for load in result.scenario.closed}
    assert not result.scenario.arrivals and sum(clients.values()) > 0
    assert all(n <= clients[e] for _, e, _, _, n in result.samples.by_entitlement)  # admitted, at every sample
    out: dict[str, list[tuple[float, int]]] = defaultdict(list)  # sent .. ended: waiting, retrying or running
    for rid, (sent, ended) in _requests(result).items():
        ent = rid.rsplit("-c", 1)[0]
        out[ent] += [(sent, 1), (ended, -1)]
    for ent, changes in out.items():
        level = peak = 0
        for _, delta in sorted(changes, key=lambda change: (change[0], change[1])):  # (an end before a send)
            level += delta
            peak = max(peak, level)
        assert peak == clients[ent], ent  # every client is busy at some point, and never twice


def test_each_client_sends_its_next_request_as_its_previous_one_ends(run: tuple[ReplayResult, ReplayResult]) -> None:
    result = run[0]
    by_client: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for rid, (sent, ended) in _requests(result).items():
        client, n = rid.rsplit("-", 1)
        by_client[client].append((int(n), sent, ended))
    loads = {load.entitlement: load for load in result.scenario.closed}
    followed = 0
    for client, requests in by_client.items():
        requests.sort()
        assert [n for n, _, _ in requests] == list(range(len(requests)))  # nothing skipped, in order
        load = loads[client.rsplit("-c", 1)[0]]
        index = int(client.rsplit("-c", 1)[1])
        assert requests[0][1] == pytest.approx(load.client_start_s(index))
        for (_, _, ended), (_, sent, _) in zip(requests, requests[1:]):
            assert ended <= sent < ended + 0.001  # think time 0, on the next whole ms
            followed += 1
        # it stops when its next request would be due at the load's end or after the run (or its last never ended)
        assert requests[-1][2] > min(load.end_s, result.scenario.duration_s) - 0.001
    assert followed > 100


def test_a_closed_loop_run_is_deterministic(run: tuple[ReplayResult, ReplayResult]) -> None:
    first, second = run
    assert first.decisions == second.decisions and first.completions == second.completions
    assert first.samples == second.samples and first.queue_outcomes == second.queue_outcomes


def test_a_client_of_an_entitlement_that_is_not_bound_yet_waits_for_its_join() -> None:
    scenario = build("exp1", ["load.mode=closed", "load.compress=0.2"])
    late = ClosedLoad("guaranteed-c", 2, Lengths(64, 64), Lengths(64, 64), start_s=0.0, stagger_s=0.5)
    scenario = replace(scenario, closed=(late,), membership={"guaranteed-c": Membership(3.0, 9.0)})
    result = replay(scenario)
    sent = sorted(sent for sent, _ in _requests(result).values())
    assert sent[:2] == [3.0, 3.0]  # both clients were due before the join (0 s, 0.5 s): they send at it
    assert all(3.0 <= t < 9.0 for t in sent)  # and nothing once it left


def test_load_mode_closed_gives_each_entitlement_its_slots_in_clients_over_the_same_windows() -> None:
    exp1 = build("exp1", ["load.mode=closed"])
    assert {(c.entitlement, c.clients, c.start_s, c.end_s) for c in exp1.closed} == {
        ("guaranteed-a", 6, 0.0, float("inf")), ("spot-b", 10, 0.0, float("inf")), ("guaranteed-c", 6, 30.0, 60.0)}
    assert all(0 < c.stagger_s * c.clients < 5 and c.think_s == 0 for c in exp1.closed)  # spread over ~1 service
    exp2 = build("exp2", ["load.mode=closed", "load.factor=2"])
    assert {(c.entitlement, c.clients, c.start_s) for c in exp2.closed} == {
        ("elastic-copilot", 14, 0.0), ("elastic-synth", 10, 0.0), ("elastic-reports", 10, 210.0)}  # copilot: 7 × 2
    assert not exp1.arrivals and not exp2.arrivals and build("exp1", []).closed == ()
    with pytest.raises(ConfigError, match="load.mode: must be one of open, closed"):
        build("exp1", ["load.mode=sometimes"])
