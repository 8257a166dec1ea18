"""Helpers and hypothesis strategies shared by the backend simulator's unit tests (test_backend_sim_*.py).

Pure: nothing here starts a service or reads a clock. ``run_sim`` drives a ``BackendSim`` through a list of
timed calls; ``workloads``/``pool_workloads`` draw small pools and call sequences whose times collide with step
boundaries on purpose.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.backend.records import Completed, FirstToken
from tokenpools.replay.backend.simulator import BackendSim

PAPER_TOKENS_PER_S = 240.0
NS = 1_000_000_000
MS = 1_000_000
SETTINGS = {"deadline": None, "database": None}  # pure and fast; no example database written to the repo


def completed(events: list) -> list[Completed]:
    return [e for e in events if type(e) is Completed]


def first_tokens(events: list) -> dict[str, float]:
    return {e.request_id: e.t_s for e in events if type(e) is FirstToken}


def drain(sim: BackendSim) -> list:
    """Advance event by event until nothing is left (exercises next_event_s)."""
    out: list = []
    while (t := sim.next_event_s()) is not None:
        out += sim.advance(t)
    return out


def run_sim(model: ReplicaModel, n_replicas: int, ops: list[tuple], advance_step_ns: int | None,
            first_token_events: bool = True) -> tuple[list, list]:
    """Drive the simulator through ``ops``. With ``advance_step_ns`` it is advanced on that grid between calls
    and drained event by event; without, it is never advanced until one final call far in the future."""
    sim = BackendSim(model, replicas=n_replicas, first_token_events=first_token_events)
    events: list = []
    aborts: list[bool] = []
    clock_ns = 0
    for t, kind, *args in ops:
        while advance_step_ns and clock_ns + advance_step_ns <= t:
            clock_ns += advance_step_ns
            events += sim.advance(clock_ns / NS)
        if kind == "submit":
            sim.submit(args[0], t / NS, args[1], args[2])
        elif kind == "abort":
            aborts.append(sim.abort(args[0], t / NS))
        elif kind == "capacity":
            sim.set_capacity(args[0], t / NS)
        else:
            sim.set_replicas(args[0], t / NS)
    events += drain(sim) if advance_step_ns else sim.advance(1e4)
    return events, aborts




@st.composite
def workloads(draw: st.DrawFn) -> tuple[ReplicaModel, int, list[tuple]]:
    """Small pools and op sequences on a 1-ms grid, with step times in whole ms so boundaries and calls collide."""
    model = ReplicaModel(
        max_num_seqs=draw(st.integers(1, 4)),
        kv_capacity_tokens=draw(st.sampled_from([40, 80, 10_000])),
        prefill_s_per_token=draw(st.sampled_from([0.0, 0.001])),
        decode_step_base_s=draw(st.sampled_from([0.002, 0.005])),
        decode_step_per_seq_s=draw(st.sampled_from([0.0, 0.001])),
        preempt_on_kv_exhaustion=draw(st.booleans()),
    )
    n_replicas = draw(st.integers(1, 3))
    ops: list[tuple] = []
    t = 0
    ids: list[str] = []
    for _ in range(draw(st.integers(1, 25))):
        t += draw(st.integers(0, 12)) * MS
        kind = draw(st.sampled_from(["submit"] * 6 + ["abort", "capacity"]))
        if kind == "submit" or not ids:
            rid = f"r{len(ids)}"
            ids.append(rid)
            prompt = draw(st.integers(0, 20))
            ops.append((t, "submit", rid, prompt, draw(st.integers(1, min(15, 40 - prompt)))))
        elif kind == "abort":
            ops.append((t, "abort", draw(st.sampled_from(ids))))
        else:
            ops.append((t, "capacity", draw(st.integers(1, 4))))
    return model, n_replicas, ops


@st.composite
def pool_workloads(draw: st.DrawFn) -> tuple[ReplicaModel, int, list[tuple]]:
    """``workloads`` plus scaling: replicas start after 0-10 ms, and the pool may be scaled to zero."""
    model, n_replicas, ops = draw(workloads())
    model = ReplicaModel(**{**model_fields(model), "startup_delay_s": draw(st.sampled_from([0.0, 0.004, 0.01]))})
    n_scale = draw(st.integers(0, 4))
    for _ in range(n_scale):
        t = draw(st.sampled_from([op[0] for op in ops]))
        ops.append((t, "replicas", draw(st.integers(0, 3))))
    ops.sort(key=lambda op: op[0])  # stable: scaling calls go after the other calls at the same time
    ops.append((ops[-1][0], "replicas", 2))  # so that everything can finish
    return model, n_replicas, ops


def model_fields(model: ReplicaModel) -> dict:
    return {name: getattr(model, name) for name in ReplicaModel.__dataclass_fields__}
