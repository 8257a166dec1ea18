"""The pure parts of the local stack, the load generator and the live runner (no processes, no network)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokenpools.config import hash_api_key, load_config, load_config_documents
from tokenpools.proxy.admission.estimate import text_tokens
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.replay import metrics, results
from tokenpools.replay.experiments import build, examples_dir
from tokenpools_dev import builders
from tokenpools_dev.devstack import kube_objects
from tokenpools_dev.devstack.service import add_connection_close, pick
from tokenpools_dev.devstack.stack.config import SimProfile, derive_documents, pool_layouts, scaled_settings
from tokenpools_dev.devstack.stack.state import ComponentState, StackState, pid_runs, pids_running, status_of
from tokenpools_dev.live import runner
from tokenpools.topics.records import RequestDecided
from tokenpools_dev.live.assemble import queue_estimate, to_replay_result
from tokenpools_dev.live.control import membership_lead_s, timeline
from tokenpools_dev.loadgen.keys import comment_keys, keys_for
from tokenpools_dev.loadgen.plan import Attempt, Completion, LoadResult, max_overlap, outcome_of, prompt_text

EXP1 = examples_dir() / "exp1.yaml"


def test_derived_config_scales_rates_and_times_and_points_at_the_service() -> None:
    loaded = load_config(EXP1)
    docs = derive_documents(loaded.raw_documents, time_scale=0.25, endpoints={"qwen3-8b": ["http://127.0.0.1:9"]},
                            settings={"streams": {"tick_s": 1.25}})
    derived = load_config_documents(docs)
    pool, original = derived.pools["qwen3-8b"], loaded.pools["qwen3-8b"]
    assert derived.endpoints["qwen3-8b"] == ("http://127.0.0.1:9",)
    assert pool.per_replica.tokens_per_s == pytest.approx(original.per_replica.tokens_per_s / 0.25)
    assert pool.per_replica.concurrency == original.per_replica.concurrency  # slots are not time
    assert pool.token_bucket_window_s == pytest.approx(original.token_bucket_window_s * 0.25)  # same depth in tokens
    a, a0 = derived.entitlements["guaranteed-a"], loaded.entitlements["guaranteed-a"]
    assert a.baseline.tokens_per_s == pytest.approx(a0.baseline.tokens_per_s / 0.25)
    assert a.slo_ms == pytest.approx(a0.slo_ms * 0.25)
    assert derived.entitlement_by_key_hash == loaded.entitlement_by_key_hash  # clients keep their keys
    assert derived.settings_values == {"streams": {"tick_s": 1.25}}


def test_split_runs_a_replica_as_smaller_simulators() -> None:
    loaded = load_config(examples_dir() / "exp2.yaml")
    layout = pool_layouts(loaded, {"qwen3-8b": 2})["qwen3-8b"]
    assert (layout.replicas, layout.min_replicas, layout.max_replicas, layout.slots) == (2, 2, 2, 8)
    docs = derive_documents(loaded.raw_documents, time_scale=1.0, endpoints={}, split={"qwen3-8b": 2})
    pool = load_config_documents(docs).pools["qwen3-8b"]
    assert pool.capacity() == loaded.pools["qwen3-8b"].capacity()  # 2 × 8 slots is the same pool
    with pytest.raises(ValueError, match="cannot split"):
        pool_layouts(loaded, {"qwen3-8b": 3})


def test_scaled_settings_scale_every_time_setting_including_defaults(tmp_path: Path) -> None:
    values = scaled_settings({"scaling": {"cooldown_s": 30}}, 0.2, kafka_bootstrap="127.0.0.1:1",
                             prometheus_url="http://127.0.0.1:2", spool_dir=tmp_path)
    assert values["streams"]["tick_s"] == pytest.approx(1.0)  # default 5 s
    assert values["scaling"]["cooldown_s"] == pytest.approx(6.0)  # the file's 30 s
    assert values["kafka"]["bootstrap_servers"] == "127.0.0.1:1" and values["proxy"]["spool_dir"] == str(tmp_path)


@pytest.mark.parametrize("spare", [1, 2, 5])
def test_spare_sequences_keep_the_simulators_latency_curve(spare: int) -> None:
    p, slots = SimProfile(), 4
    factor = p.factor_for(slots, spare)
    for n in range(1, slots + 1):  # the simulator's load factor: 1 + (f − 1)(n − 1)/(max − 1)
        assert 1 + (factor - 1) * (n - 1) / (slots + spare - 1) == pytest.approx(
            1 + (p.factor_under_load - 1) * (n - 1) / (slots - 1))


def test_service_closes_after_one_response_and_balances_by_open_connections() -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n"
    out = add_connection_close(head)
    assert out.endswith(b"Connection: close\r\n\r\n") and b"keep-alive" not in out and out.startswith(b"POST /v1/")
    members = ["a:1", "b:2", "c:3"]
    assert pick(members, {"a:1": 2, "b:2": 1, "c:3": 1}, 0) == "b:2"
    assert pick(members, {"a:1": 2, "b:2": 1, "c:3": 1}, 1) == "c:3"
    assert pick([], {}, 0) is None


def test_prompts_are_as_long_for_the_proxy_as_for_the_simulator() -> None:
    for n in (1, 16, 64, 88):
        assert text_tokens(prompt_text(n)) == n == len(prompt_text(n).split())


def test_outcomes_a_client_can_tell() -> None:
    assert outcome_of(200, None) == "admitted"
    assert outcome_of(429, "low_priority") == "low_priority"
    assert outcome_of(403, "not_bound") == "not_bound"
    assert outcome_of(502, "backend_unavailable") == "error"


def test_max_overlap_closes_before_it_opens() -> None:
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1
    assert max_overlap([(0, 3), (1, 2), (1.5, 4)]) == 3
    assert max_overlap([]) == 0


def test_keys_come_from_the_examples_comments_only_if_their_digest_matches() -> None:
    text = EXP1.read_text()
    assert comment_keys(text)["spot-b"] == "sk-exp1-spot-b"
    assert keys_for(load_config(EXP1), text)["guaranteed-c"] == "sk-exp1-guaranteed-c"
    forged = text.replace("#   spot-b:       sk-exp1-spot-b", "#   spot-b: sk-wrong")
    with pytest.raises(Exception, match="no API key for spot-b"):
        keys_for(load_config(EXP1), forged)
    assert hash_api_key(keys_for(load_config(EXP1), forged, {"spot-b": "x"})["spot-b"]) == hash_api_key("x")


def test_timelines_of_the_papers_experiments() -> None:
    # a join's record goes out one agents' window and its grace (the settings' 5 s + 2 s) before the tenant's first
    # request, so the agents tick it Bound and idle once before its traffic; a leave's when its load stops
    lead = membership_lead_s(tick_s=5.0, grace_s=2.0)
    assert lead == 7.0
    exp1 = timeline(build("exp1"), slots_per_sim=16, sims_per_replica=1, join_lead_s=lead)
    assert [(e.t_s, e.name, e.value) for e in exp1] == [(0.0, "guaranteed-c", "Pending"), (23.0, "guaranteed-c", None),
                                                        (60.0, "guaranteed-c", "Pending")]
    exp2 = timeline(build("exp2"), slots_per_sim=8, sims_per_replica=2, join_lead_s=lead)
    assert [(e.t_s, e.kind, e.value) for e in exp2] == [(0.0, "membership", "Pending"), (30.0, "replicas", 1),
                                                        (120.0, "replicas", 2), (203.0, "membership", None)]
    # no lead: the join's own instant; a lead reaching back to the start: a member from the start (never Pending)
    unled = timeline(build("exp2"), slots_per_sim=8, sims_per_replica=2, join_lead_s=0.0)
    assert [(e.t_s, e.value) for e in unled if e.kind == "membership"] == [(0.0, "Pending"), (210.0, None)]
    early = timeline(build("exp2"), slots_per_sim=8, sims_per_replica=2, join_lead_s=210.0)
    assert [e.kind for e in early] == ["replicas", "replicas"]
    with pytest.raises(ValueError, match="join_lead_s"):
        timeline(build("exp2"), slots_per_sim=8, sims_per_replica=2, join_lead_s=-1.0)


def test_the_live_run_leads_joins_by_its_own_agents_window_and_grace(tmp_path: Path) -> None:
    streams = runner.streams_settings(load_config(EXP1), ())
    assert runner.join_lead_s(streams) == membership_lead_s(streams.tick_s, streams.grace_s) == 7.0
    overridden = runner.streams_settings(load_config(EXP1), ("streams.tick_s=2", "streams.grace_s=0.5", "load.seed=3"))
    assert runner.join_lead_s(overridden) == 2.5
    # the stack starts the agents with guaranteed-c Pending: it joins after the lead, not from the start
    options = runner.LiveOptions(name="exp1", out=tmp_path)
    assert runner.stack_options(options, runner.scenario_for(options)).initial_states == {"guaranteed-c": "Pending"}


def test_queue_estimate_needs_the_backends_own_queue() -> None:
    times, waiting = [0.0, 1.0, 2.0, 3.0], [0, 0, 5, 0]
    assert queue_estimate(3.0, 1.5, 0.2, times, waiting, 1.0) == pytest.approx(2.8)  # a queue was seen
    assert queue_estimate(3.0, 1.5, 0.2, times, [0, 0, 0, 0], 1.0) == 0.0  # slow, but no queue: not queueing
    assert queue_estimate(None, 1.5, 0.2, times, waiting, 1.0) == 0.0


def test_a_live_pass_goes_through_the_simulations_summaries() -> None:
    scenario = build("exp1")
    load = LoadResult(time_scale=0.5, end_s=90.0)
    for i, (ent, t) in enumerate([("guaranteed-a", 1.0), ("spot-b", 31.0), ("spot-b", 32.0), ("guaranteed-c", 35.0)]):
        outcome = "low_priority" if i == 2 else "admitted"
        load.attempts.append(Attempt(t, ent, f"r{i}", 0, outcome, "", 1 if i == 2 else 0, 200, 64, 64))
        if outcome == "admitted":
            load.completions.append(Completion(f"r{i}", ent, 0, t, t, t + 4.4, 64, 64, 0.3, 4.4))
    pool = [(float(t), 3, 0, 16) for t in range(90)]
    result = to_replay_result(scenario, "token-pools", load, pool)
    summary = results.summarize("exp1", {"token-pools": result})["token_pools"]
    assert summary["successes"] == {"guaranteed-a": 1, "spot-b": 1, "guaranteed-c": 1}
    assert summary["spot_throttle_rate"] == 0.5 and summary["guaranteed_p99_ttft_s"] == 0.3


def _proxy_decision(rid: str, t_ms: int, outcome: AdmissionOutcome, queued_ms: int = 0,
                    waits: bool = False) -> RequestDecided:
    return builders.decided(rid, t_ms, pool="p", entitlement="spot-b", proxy_id="x", outcome=outcome,
                            prompt_tokens_est=10, max_tokens=20, cost_tokens=30, kv_bytes=30, queued_ms=queued_ms,
                            waits=waits)


def test_a_live_pass_counts_waits_at_the_proxy_as_first_refusals_from_the_proxys_own_decisions() -> None:
    """A client sees a wait at the proxy only as a slow answer: the proxy's decisions say where each wait began and
    with which refusal, so one that ends admitted still counts once, and one that ends refused is not counted
    twice."""
    scenario = build("exp1")
    load = LoadResult(time_scale=0.5, end_s=90.0, origin_s=1000.0)
    low = AdmissionOutcome.REFUSED_LOW_PRIORITY
    attempts = [(31.0, "admitted", "p1"), (32.0, low.value, "p2"), (33.0, low.value, "p3"), (34.0, "admitted", "p4")]
    for i, (t, outcome, proxy_rid) in enumerate(attempts):
        load.attempts.append(Attempt(t, "spot-b", f"r{i}", 0, outcome, "", 0, 200, 64, 64, proxy_request_id=proxy_rid))
    decided = [  # experiment s = (wall s - 1000) / 0.5
        _proxy_decision("p1", 1_015_500, low, waits=True), _proxy_decision("p1", 1_015_700, AdmissionOutcome.ADMITTED, 200),
        _proxy_decision("p2", 1_016_000, low, waits=True), _proxy_decision("p2", 1_016_400, low, 400),
        _proxy_decision("p3", 1_016_500, low),  # refused at once
        _proxy_decision("p4", 1_017_000, AdmissionOutcome.ADMITTED),
    ]
    result = to_replay_result(scenario, "token-pools", load, [(float(t), 3, 0, 16) for t in range(90)],
                              decided=decided)
    assert result.decisions.queued_s == [0.4, 0.8, 0.0, 0.0]  # wall ms / 1000 / time_scale
    assert result.wait_starts == [(31.0, "spot-b", low.value), (32.0, "spot-b", low.value)]
    assert metrics.first_refusals(result) == {"spot-b": {low.value: 3}}  # two waits (counted at their start), one at once
    assert metrics.refusals(result)["spot-b"] == {low.value: 2}  # the decisions as they ended
    # without the proxy's decisions nothing is known of waits: every refusal counts at once
    blind = to_replay_result(scenario, "token-pools", load, [(float(t), 3, 0, 16) for t in range(90)])
    assert metrics.first_refusals(blind) == {"spot-b": {low.value: 2}}


def test_state_file_round_trip_and_pid_check() -> None:
    state = StackState("/tmp/x", os.getpid(), "ready", 1.0, "c.yaml",
                       (ComponentState("proxy-0", "proxy", 1, "http://h:1", "/l", "running", "tokenpools"),), {"a": 1})
    assert StackState.from_json(state.to_json()) == state
    assert pid_runs(os.getpid(), "python") and not pid_runs(os.getpid(), "no-such-command-xyz")
    assert not pid_runs(None, "") and not pid_runs(2**22 + 12345, "")
    assert [status_of(True), status_of(False), status_of(False, 3)] == ["running", "stopped", "exited 3"]
    argv = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")  # this test's process
    assert os.getpid() in pids_running(Path(argv[0].decode()).name, argv[-1].decode())
    assert pids_running("no-such-binary-xyz", "") == []


def test_the_stack_applies_the_checkouts_crds() -> None:
    """The dev package finds deploy/base/crds from its own place in the checkout (a wheel has none: minimal CRDs)."""
    assert kube_objects.CRD_DIR == Path(__file__).resolve().parents[2] / "deploy" / "base" / "crds"
    names = {d["metadata"]["name"] for d in kube_objects.crd_documents()}
    assert names == {"tokenpools.tokenpools.io", "tokenentitlements.tokenpools.io"}
