"""The paper's experiments, direction by direction (full-length runs: each replays in well under a second).

The paper's proxy refused at once, so its directions are checked with the admission queue off
(``policy.queue_slo_fraction=0``); what the queue changes, and what it must not, is checked with it on.
"""

from __future__ import annotations

import random

import pytest

from tokenpools.replay import results
from tokenpools.replay.backend.records import Completed
from tokenpools.replay.backend.simulator import BackendSim
from tokenpools.replay.experiments import EXP2_LENGTHS, build
from tokenpools.replay.policy import TokenPoolsPolicy
from tokenpools.replay.replayer import replay


NO_QUEUE = "policy.queue_slo_fraction=0"


def _summary(name: str, *items: str) -> dict:
    scenario = build(name, list(items))
    return results.summarize(name, {p: replay(scenario, p) for p in ("token-pools", "none")})


@pytest.fixture(scope="module")
def exp1() -> dict:
    return _summary("exp1", NO_QUEUE)


@pytest.fixture(scope="module")
def exp2() -> dict:
    return _summary("exp2", NO_QUEUE)


def test_exp1_guaranteed_latency_is_protected_and_the_baseline_queue_grows(exp1: dict) -> None:
    tp, base = exp1["token_pools"], exp1["baseline"]
    assert tp["guaranteed_p99_ttft_s"] * 4 < base["guaranteed_p99_ttft_s"]
    assert base["guaranteed_p99_ttft_s"] > 10
    assert tp["max_waiting"] <= 6 and base["max_waiting"] > 30
    overload = "+ c: overload (22 of 16)"
    assert base["max_waiting_by_phase"][overload] > 3 * base["max_waiting_by_phase"]["a + b (16 of 16 slots)"] / 2


def test_exp1_spot_is_throttled_in_overload_and_recovers_after(exp1: dict) -> None:
    tp = exp1["token_pools"]
    running = list(tp["spot_mean_running_by_phase"].values())
    assert tp["spot_throttle_rate"] > 0.5
    assert tp["spot_throttle_rate_after_overload"] < tp["spot_throttle_rate"] / 2
    assert running[1] < running[0] and running[1] < running[2]
    assert exp1["baseline"]["spot_throttle_rate"] == 0.0


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_exp1_decisions_do_not_depend_on_debt_credit(mode: str) -> None:
    """policy.debt_credit (docs/semantics.md#burst-and-debt) changes what a guaranteed tenant's debt records when it is
    served above its target (0, not a credit), and so its priority; guaranteed limits are their baselines and a
    guaranteed priority is far above spot's either way, so no decision of Exp 1 moves: the same outcomes at the same
    times, the same completions, the same samples."""
    off, on = (replay(build("exp1", [f"load.mode={mode}", f"policy.debt_credit={c}"])) for c in ("false", "true"))
    assert off.decisions.outcome == on.decisions.outcome and off.decisions.t_s == on.decisions.t_s
    assert off.completions == on.completions and off.samples == on.samples
    assert min(t.debt for t in off.entitlement_ticks) >= 0 > min(t.debt for t in on.entitlement_ticks)  # it did differ


def test_exp2_priorities_are_the_papers(exp2: dict) -> None:
    assert exp2["token_pools"]["priority"] == {"copilot": 93.8462, "synth": 20.2658, "reports": 60.396}


def test_exp2_synth_absorbs_the_outage_and_copilot_keeps_its_slo(exp2: dict) -> None:
    tp, base = exp2["token_pools"], exp2["baseline"]
    outage = tp["decisions_by_phase"]["outage (8 slots)"]
    refused = {e: sum(v for k, v in c.items() if k != "admitted") for e, c in outage.items()}
    # the paper's direction: copilot is never refused for priority, synth absorbs the outage's refusals (ours are
    # mostly the per-tick limit squeezing synth, i.e. concurrency and token budget, not the contention check)
    assert tp["low_priority_denials"]["copilot"] == 0
    assert refused["elastic-synth"] > refused["elastic-copilot"]
    assert tp["p99_ttft_s"]["copilot"] < 0.5 < base["p99_ttft_s"]["copilot"]
    assert tp["mean_running_in_outage"]["copilot"] >= tp["mean_running_in_outage"]["synth"]
    assert refused["elastic-synth"] > 0 and tp["max_waiting"] < base["max_waiting"]


def test_exp2_debt_builds_in_the_outage_and_decays_after_recovery(exp2: dict) -> None:
    tp = exp2["token_pools"]
    assert tp["peak_debt"]["synth"] > 0.2 and tp["peak_debt"]["synth"] > tp["peak_debt"]["copilot"]
    assert 30 <= tp["peak_debt_t_s"]["synth"] <= 140
    assert tp["debt_decay_s"] is not None and tp["debt_decay_s"] <= 60


def test_exp2_without_the_tick_waiting_signal_copilot_is_never_refused_for_priority() -> None:
    tp = _summary("exp2", NO_QUEUE, "replay.backend_waiting=off")["token_pools"]
    assert tp["low_priority_denials"]["copilot"] == 0


@pytest.mark.parametrize("name", ["exp1", "exp2"])
def test_with_the_queue_protection_holds_and_nobody_waits_past_its_timeout(name: str) -> None:
    """With the queue on (the default): TTFT from admission stays the protected one (far below the baseline's),
    the backend queue stays short, requests do wait (and refuse less for a slot than without the queue), and no
    wait outlasts its entitlement's timeout (policy.queue_slo_fraction × SLO, at most queue_max_timeout_ms)."""
    scenario = build(name, [])
    runs = {p: replay(scenario, p) for p in ("token-pools", "none")}
    summary = results.summarize(name, runs)
    tp, base = summary["token_pools"], summary["baseline"]
    assert all(tp["p99_ttft_s"][e] * 4 < base["p99_ttft_s"][e] for e in tp["p99_ttft_s"])
    assert tp["max_waiting"] <= 6 < base["max_waiting"]
    d = runs["token-pools"].decisions
    timeout_s = {e.name: scenario.params.queue.timeout_ms(e) / 1000 for e in scenario.entitlements}
    assert sum(q > 0 for q in d.queued_s) > 100
    # (+ 2 ns: the replay wakes the queue on its clock of whole ns, never before the moment it named)
    assert all(q <= timeout_s[e] + 2e-9 for e, q in zip(d.entitlement, d.queued_s))
    waited = sum(sum(c.get(k, 0) for k in ("admitted", "timed_out", "withdrawn")) for c in tp["queue_outcomes"].values())
    assert waited == sum(q > 0 for q in d.queued_s)
    without = _summary(name, NO_QUEUE)["token_pools"]
    slot_refusals = {s: sum(c.get("concurrency", 0) + c.get("low_priority", 0) for c in s_["decisions"].values())
                     for s, s_ in (("on", tp), ("off", without))}
    assert slot_refusals["on"] < slot_refusals["off"]
    if name == "exp2":
        assert tp["low_priority_denials"]["copilot"] == 0 and tp["p99_ttft_s"]["copilot"] < 0.5


RESULT_KEYS = (
    "exp1.token_pools.guaranteed_p99_ttft_s", "exp1.token_pools.max_waiting", "exp1.token_pools.spot_throttle_rate",
    "exp1.baseline.guaranteed_p99_ttft_s", "exp1.baseline.max_waiting",
    *(f"exp2.token_pools.{k}.{e}" for k in ("priority", "low_priority_denials", "peak_debt")
      for e in ("copilot", "synth", "reports")),
    "exp2.token_pools.debt_decay_s",
)


def test_results_json_has_the_keys_the_issue_names(exp1: dict, exp2: dict) -> None:
    both = {"exp1": exp1, "exp2": exp2}
    missing = [key for key in RESULT_KEYS if results.lookup(both, key) is None]
    assert not missing
    assert all(results.lookup(both, key) is not None for key in results.PAPER if not key.startswith("exp2.baseline"))


@pytest.mark.slow
def test_an_experiment_writes_its_report_results_figures_and_log(tmp_path) -> None:
    import json

    from tokenpools.replay import runner

    runner.run(["exp1"], tmp_path, ["load.compress=0.3"], command="test", sweeps={})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert {"report.md", "results.json", "exp1_queue_depth.png", "exp1_latency.png", "exp1_slot_share.png",
            "exp1_closed_loop_latency.png"} <= set(names)
    assert (tmp_path / "exp1" / "log-token-pools" / "request_decided").is_dir()
    assert (tmp_path / "exp1" / "closed-loop" / "log-none" / "request_decided").is_dir()
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data) == {"open_loop", "closed_loop", "targets"}
    assert data["targets"]["exp1_guaranteed_p99_client_ttft_s"] == {
        mode: data[mode]["exp1"]["token_pools"]["guaranteed_p99_client_ttft_s"] for mode in ("open_loop", "closed_loop")}
    text = (tmp_path / "report.md").read_text()
    assert "## Where ours differ from the paper, and why" in text and "| exp1 | max backend waiting queue |" in text
    # every table with numbers of a run names the load model of each number in its header
    for table in (block for block in text.split("\n\n") if block.startswith("| ")):
        header = table.splitlines()[0]
        assert "question" in header or ("open loop" in header and "closed loop" in header) or "loop:" in header, header


@pytest.mark.slow
def test_one_load_model_runs_alone_when_it_is_named(tmp_path) -> None:
    from tokenpools.replay import runner

    out = runner.run(["exp2"], tmp_path, ["load.compress=0.2", "load.mode=closed"], command="test", sweeps={})
    assert set(out) == {"closed_loop", "targets"} and runner.modes_of(["load.mode=open"]) == ("open",)
    assert "token pools, closed loop" in (tmp_path / "report.md").read_text()


def _served_tokens_per_s(scenario, slots: int, warm_s: float = 60.0, span_s: float = 300.0) -> float:
    """Prompt + completion tokens/s the scenario's simulated replica moves at ``slots`` (set as the scenario sets
    them), kept full with Exp 2's lengths: every completion is replaced at once by a fresh request."""
    import random

    from tokenpools.replay.backend.records import Completed
    from tokenpools.replay.backend.simulator import BackendSim
    from tokenpools.replay.experiments import EXP2_LENGTHS

    sim = BackendSim(scenario.replica_model, replicas=scenario.pool.replicas)
    sim.set_capacity(slots, 0.0)
    rng = random.Random(1)
    sent = 0

    def send(t_s: float) -> None:
        nonlocal sent
        prompt, output = EXP2_LENGTHS.draw(rng)
        sim.submit(f"r{sent}", t_s, prompt, output)
        sent += 1

    for _ in range(slots * scenario.pool.replicas):
        send(0.0)
    tokens = 0
    while (t := sim.next_event_s()) is not None and t <= warm_s + span_s:
        for event in sim.advance(t):
            if type(event) is Completed:
                if event.t_s >= warm_s:
                    tokens += event.prompt_tokens + event.completion_tokens
                send(event.t_s)
    return tokens / span_s


@pytest.mark.parametrize("phase", ["normal", "outage"])
def test_exp2_control_plane_capacity_is_what_the_simulated_backend_serves(phase: str) -> None:
    """The control plane's Λ_p in each Exp 2 capacity phase equals what the simulated backend moves there, so the
    outage the simulator plays and the capacity the policy believes cannot drift apart (they did: 8 slots on the
    same hardware moved ~324 tokens/s while Λ_p said 240). Tolerance 5 %: the configuration's 30 tokens/s per slot
    is the model's 29.1 at full load rounded (3.2 % above it, in every phase alike)."""
    scenario = build("exp2")
    model = scenario.replica_model
    slots = {"normal": model.max_num_seqs, "outage": scenario.capacity_changes[0].slots_per_replica}[phase]
    assert [c.slots_per_replica for c in scenario.capacity_changes] == [model.max_num_seqs // 2, model.max_num_seqs]
    policy = TokenPoolsPolicy(scenario.pool, scenario.params)
    policy.set_capacity(slots, model.max_num_seqs, 0)
    believed = policy.capacity()
    served = _served_tokens_per_s(scenario, slots)
    assert served == pytest.approx(believed.tokens_per_s, rel=0.05)
    assert int(believed.concurrency) == slots * scenario.pool.replicas
    # KV: the simulator keeps it whole (Batching.resize), the control plane halves χ; neither binds, as the most
    # the running sequences can hold (every slot at the longest request) fits the smaller of the two
    most_bytes = slots * (EXP2_LENGTHS.total.high + 1) * scenario.pool.kv_bytes_per_token
    assert most_bytes <= min(believed.kv_bytes, model.kv_capacity_tokens * scenario.pool.kv_bytes_per_token)


def test_exp2_closed_loop_the_outage_has_the_papers_shape() -> None:
    """Issue 30, the paper's load model (closed loop, copilot given 7 clients: Fig. 5 shows it at up to 7): in the
    outage the sampled in flight of copilot is 5-7 and of synth 2-3 (10th to 90th percentile); copilot is never
    refused for priority, synth takes the low-priority refusals (counting those that then waited in the proxy's
    queue); debt peaks synth > copilot > reports and is back below 0.05 within 50 s of recovery. Copilot ÷ synth
    successes in the outage is 1.71, short of the paper's shape (≥ 1.8): docs/semantics.md#elastic-shares says why."""
    result = replay(build("exp2", ["load.mode=closed"]), "token-pools")
    s = results.summarize("exp2", {"token-pools": result})["token_pools"]
    in_flight: dict[str, list[int]] = {}
    for t, ent, _, _, n in result.samples.by_entitlement:
        if 30.0 <= t < 120.0:
            in_flight.setdefault(ent, []).append(n)
    for name, (low, high) in {"elastic-copilot": (5, 7), "elastic-synth": (2, 3)}.items():
        values = sorted(in_flight[name])
        assert low <= values[len(values) // 10] and values[9 * len(values) // 10] <= high, name
    refusals = s["low_priority_refusals"]
    assert refusals["copilot"] == 0 and refusals["synth"] > refusals["reports"]
    debt = s["peak_debt"]
    assert debt["synth"] > debt["copilot"] > debt["reports"]
    assert s["debt_decay_s"] is not None and s["debt_decay_s"] <= 50.0
    outage = s["successes_in_outage"]
    assert outage["copilot"] / outage["synth"] >= 1.7
