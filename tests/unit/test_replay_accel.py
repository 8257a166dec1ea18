"""The optional mypyc accelerator (``tokenpools.replay.accel``): never stale, and identical to pure Python.

With nothing compiled (a fresh clone before ``scripts/build-accel.sh``) the comparison is skipped and the rest of
the suite tests the pure modules; once built, the suite tests the compiled ones and this file checks that they are
built from the current sources and replay exactly like the pure-Python modules.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tokenpools.replay import accel

# One process per build: a short Exp-1 replay under both policies plus a simulator workload with KV preemption,
# capacity changes and scaling, reduced to one digest of every event, decision and completion.
_PROBE = textwrap.dedent(
    """
    import hashlib, sys
    from tokenpools.replay import accel
    if sys.argv[1] == "pure":
        accel.use_pure_python()
    from tokenpools.replay.backend_sim import BackendSim, ReplicaModel
    from tokenpools.replay.experiments import build
    from tokenpools.replay.replayer import replay
    h = hashlib.sha256()
    scenario = build("exp1", ["load.compress=0.3"])
    for policy in ("token-pools", "none"):
        r = replay(scenario, policy)
        for table in (r.decisions, r.completions):
            for name in type(table).__dataclass_fields__:
                h.update(repr(getattr(table, name)).encode())
        h.update(repr((r.samples.pool, r.entitlement_ticks, r.pool_ticks, r.preempted, r.end_s)).encode())
    sim = BackendSim(ReplicaModel(max_num_seqs=4, kv_capacity_tokens=600, startup_delay_s=2.0), replicas=2)
    events = []
    for i in range(400):
        t = i * 0.05
        sim.submit(f"r{i}", t, 20 + i % 90, 1 + i * 7 % 60, f"tag{i % 3}")
        if i % 37 == 0:
            sim.abort(f"r{i - 5}", t)
        if i == 100:
            sim.set_capacity(2, t)
        if i == 200:
            sim.set_capacity(4, t)
            sim.set_replicas(3, t)
        if i == 300:
            sim.set_replicas(1, t)
        events += sim.advance(t)
        if i % 50 == 0:
            events.append(sim.snapshot(t))
    while (nxt := sim.next_event_s()) is not None:
        events += sim.advance(nxt)
    h.update(repr(events).encode())
    print(sorted(accel.compiled()), h.hexdigest())
    """
)


def _run(build: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", _PROBE, build], capture_output=True, text=True, check=True)
    compiled, _, digest = out.stdout.strip().rpartition(" ")
    return compiled, digest


def test_no_compiled_module_is_older_than_its_source() -> None:
    assert accel.stale() == [], f"rebuild the accelerator (scripts/build-accel.sh): {accel.describe()}"


def test_compiled_modules_replay_exactly_like_the_pure_python_ones() -> None:
    names = accel.compiled()
    if not names:
        pytest.skip("nothing compiled (scripts/build-accel.sh): the suite runs the pure-Python modules")
    assert names == list(accel.MODULES), "a partial build: every module of the group is compiled, or none"
    compiled, compiled_digest = _run("compiled")
    pure, pure_digest = _run("pure")
    assert compiled == repr(sorted(accel.MODULES))
    assert pure == "[]"  # use_pure_python() did load the sources
    assert compiled_digest == pure_digest


def test_use_pure_python_must_come_before_the_imports() -> None:
    import tokenpools.replay.backend_sim  # noqa: F401

    with pytest.raises(RuntimeError, match="must come before"):
        accel.use_pure_python()


def test_describe_names_the_build_in_use() -> None:
    line = accel.describe()
    if accel.compiled():
        assert line.startswith(f"accelerator: mypyc, {len(accel.MODULES)} of {len(accel.MODULES)} modules compiled")
    else:
        assert line.startswith("accelerator: none (pure Python")
