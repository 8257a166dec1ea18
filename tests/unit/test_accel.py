"""The optional mypyc accelerator (``tokenpools.accel``): never stale, and identical to pure Python.

With nothing compiled (a fresh clone before ``scripts/build-accel.sh``) the comparison is skipped and the rest of
the suite tests the pure modules; once built, the suite tests the compiled ones and this file checks that they are
built from the current sources and replay exactly like the pure-Python modules.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tokenpools import accel

# One process per build: a short Exp-1 replay under both policies, a simulator workload with KV preemption,
# capacity changes and scaling, and an admission workload that reaches every outcome (evictions included), reduced
# to one digest of every event, decision and completion.
_PROBE = textwrap.dedent(
    """
    import hashlib, sys
    from tokenpools import accel
    if sys.argv[1] == "pure":
        accel.use_pure_python()
    from tokenpools.replay.backend.model import ReplicaModel
    from tokenpools.replay.backend.simulator import BackendSim
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
    import random
    from tokenpools.core.admission import AdmissionController, EntitlementLimits
    from tokenpools.core.capacity import Capacity
    from tokenpools.core.classes import ServiceClass
    from tokenpools.core.spec import EntitlementSpec
    rng = random.Random(11)
    ctl = AdmissionController(pool_concurrency=12, kv_bytes_per_token=1000, default_max_tokens=64,
                              token_bucket_window_s=2.0)
    classes = list(ServiceClass)
    for k, cls in enumerate(classes):
        base = Capacity(200.0, 1e6, 4.0) if cls.has_baseline else Capacity()
        spec = EntitlementSpec(f"e{k}", "p", cls, 100.0 * (k + 1), base, expires_at_s=20.0 if k == 0 else None)
        ctl.upsert_entitlement(spec, EntitlementLimits(3 + k, 150.0 + 40 * k, 4e5, 1000.0 / (k + 1)), 0.0)
    live, trail = [], []
    for i in range(3000):
        now = i * 0.01
        if live and rng.random() < 0.45:
            ticket = live.pop(rng.randrange(len(live)))
            trail.append(ctl.release(ticket, rng.randrange(0, ticket.reserved_tokens + 20), now))
        ent = None if i % 97 == 0 else f"e{rng.randrange(len(classes))}"
        d = ctl.admit(ent, f"q{i}", rng.randrange(1, 120), rng.choice([None, 8, 32, 200]), now)
        trail.append(d)
        if d.ticket is not None:
            live.append(d.ticket)
        for victim in d.evict:
            live.remove(victim)
            trail.append(("evicted", victim, ctl.release(victim, 1, now)))
        if i % 250 == 0:
            k = rng.randrange(len(classes))
            ctl.set_limits(f"e{k}", EntitlementLimits(rng.randrange(1, 8), 100.0 + i, 3e5, rng.random() * 500), now)
            ctl.set_pool(rng.randrange(6, 14), rng.randrange(0, 3))
    trail.append(sorted((d.outcome.value for d in trail if hasattr(d, "outcome"))))
    h.update(repr(trail).encode())
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
    import tokenpools.replay.backend.simulator  # noqa: F401

    with pytest.raises(RuntimeError, match="must come before"):
        accel.use_pure_python()


def test_describe_names_the_build_in_use() -> None:
    line = accel.describe()
    if accel.compiled():
        assert line.startswith(f"accelerator: mypyc, {len(accel.MODULES)} of {len(accel.MODULES)} modules compiled")
    else:
        assert line.startswith("accelerator: none (pure Python")
