"""A live experiment on real vLLM: the ``--backend`` choice, and Exp 1's pool and load rescaled to what one replica
measured (pure: text, documents and numbers in, decisions out; ``live.calibrated`` starts vLLM and measures it).

examples/exp1.yaml describes the paper's replica: 16 slots of a Qwen3-8B moving 480 prompt + completion tokens/s.
The tiny model on this machine's CPU is another replica altogether, so its figures come from ``tokenpools
calibrate`` run against it: the largest concurrency C whose P99 TTFT stays within the guaranteed tenants' SLO,
the tokens/s there, and how long a request held a slot there (Little's law: C × the step's time ÷ its answered
requests). The rescaled file keeps Exp 1's shape in slots, each tenant the same share of the pool:

- the pool's ``perReplica``: the measured ``tokensPerSecond`` and ``concurrency`` C (its ``kvCacheGiB`` is the
  pool's own: KV never binds in Exp 1);
- each entitlement's ``resources``: concurrency = its share of the file's slots × C, rounded (6 of 16 → 3 of 8),
  at least 1; tokens/s = those slots × the measured tokens/s per slot (the file's own derivation: 6 × 30); KV the
  same share of the pool's;
- the load: ``load.service_s`` = the measured service time, so each tenant sends its slots' worth of requests at
  the backend's pace (``replay.experiments.exp1_slots``: guaranteed-a and -c their baselines, spot-b the rest).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tokenpools.calibrate.block import floor_significant
from tokenpools.calibrate.stats import StepStats


class LiveBackend(StrEnum):
    """What serves a live experiment's pool: llm-d-inference-sim (the paper's latencies) or real vLLM."""

    SIM = "sim"
    VLLM = "vllm"


VLLM_EXPERIMENTS = ("exp1",)
"""Experiments ``--backend vllm`` runs: Exp 2's outage kills one of two simulators that make one replica
(``runner.sims_per_replica``), which a single vLLM cannot do."""

MIN_SLOTS = 2
"""The fewest slots a rescaled Exp 1 pool may have: below, guaranteed-a and -c (at least one slot each) no longer fit
beside each other, and the overload phase is no overload."""


def parse_live_backend(text: str) -> LiveBackend:
    """``sim`` or ``vllm``; ValueError of one line for anything else (a URL included: a live run starts the backend
    it measures and restarts nothing it does not own)."""
    value = text.strip()
    try:
        return LiveBackend(value)
    except ValueError:
        pass
    if value.startswith(("http://", "https://")):
        raise ValueError(f"--backend {value}: --mode live starts the backend it measures (sim or vllm); to put the "
                         "stack in front of a running server use `tokenpools up --backend URL`")
    raise ValueError(f"--backend takes sim or vllm, got {text!r}")


def check_live_options(backend: LiveBackend, name: str, time_scale: float, max_slots: int | None = None) -> None:
    """What ``--backend vllm`` rules out, ValueError of one line: another experiment than Exp 1, a time scale; and
    ``--max-slots``, which only a calibration reads, below ``MIN_SLOTS`` or without one."""
    if backend is LiveBackend.SIM:
        if max_slots is not None:
            raise ValueError("--max-slots caps what a calibration gives the pool: it goes with --backend vllm")
        return
    if max_slots is not None and max_slots < MIN_SLOTS:
        raise ValueError(f"--max-slots must be at least {MIN_SLOTS} (guaranteed-a and -c one slot each), got "
                         f"{max_slots}")
    if name not in VLLM_EXPERIMENTS:
        raise ValueError(f"--backend vllm runs {', '.join(VLLM_EXPERIMENTS)} only: {name}'s outage kills part of a "
                         "simulated replica")
    if time_scale != 1:
        raise ValueError(f"--time-scale scales the simulator's latencies and the control loop with them; real vLLM "
                         f"runs at its own pace, so leave it at 1 (got {time_scale:g}): Exp 1 then takes ~6 min")


@dataclass(frozen=True, slots=True)
class MeasuredReplica:
    """One replica as a calibration measured it at its chosen concurrency."""

    concurrency: int
    tokens_per_s: float  # prompt + completion tokens/s at that concurrency (the perReplica unit)
    service_s: float  # the mean time a request held a slot there, seconds

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"`concurrency` must be >= 1, got {self.concurrency}")
        for name in ("tokens_per_s", "service_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)}")

    @staticmethod
    def from_step(step: StepStats) -> MeasuredReplica:
        """From a calibration's chosen step: c clients kept c requests in flight for ``elapsed_s``, so each answered
        request held its slot c × elapsed ÷ answered on average."""
        if step.answered < 1 or step.elapsed_s <= 0:
            raise ValueError(f"concurrency {step.concurrency}: no answered request to measure a service time from")
        return MeasuredReplica(step.concurrency, step.total_tokens_per_s,
                               step.concurrency * step.elapsed_s / step.answered)

    @property
    def tokens_per_slot_s(self) -> float:
        return self.tokens_per_s / self.concurrency


def guaranteed_slo_ms(documents: Sequence[Mapping[str, Any]]) -> float:
    """The tightest ``sloTargetMs`` of the guaranteed entitlements: the calibration's P99 TTFT target, so the slots
    the pool is given keep the protected tenants within their SLO on an unloaded replica."""
    slos = [float(d["spec"]["qos"]["sloTargetMs"]) for d in documents if d.get("kind") == "TokenEntitlement"
            and (d.get("spec") or {}).get("qos", {}).get("serviceClass") == "guaranteed"
            and "sloTargetMs" in d["spec"]["qos"]]
    if not slos:
        raise ValueError("no guaranteed entitlement with an sloTargetMs: nothing to calibrate the pool against")
    return min(slos)


def rescaled_slots(slots: int, file_slots: int, concurrency: int) -> int:
    """An entitlement's slots of ``file_slots`` rescaled to a pool of ``concurrency``: the same share, rounded, >= 1."""
    if file_slots < 1:
        raise ValueError(f"the file's pool must have slots, got {file_slots}")
    return max(1, round(slots * concurrency / file_slots))


def rescale_documents(documents: Sequence[Mapping[str, Any]], measured: MeasuredReplica) -> list[dict[str, Any]]:
    """The config's documents with its one pool and that pool's entitlements rescaled (see the module doc)."""
    out = [copy.deepcopy(dict(d)) for d in documents]
    pools = [d for d in out if d.get("kind") == "TokenPool"]
    if len(pools) != 1:
        raise ValueError(f"a live run on vLLM rescales one pool, the file has {len(pools)}")
    pool = pools[0]
    name, per_replica = pool["metadata"]["name"], pool["spec"]["perReplica"]
    file_slots, kv_gib = int(per_replica["concurrency"]), float(per_replica["kvCacheGiB"])
    c = measured.concurrency
    if c < MIN_SLOTS:
        raise ValueError(f"the backend kept P99 TTFT within target at {c} slot only; Exp 1 needs at least "
                         f"{MIN_SLOTS} (guaranteed-a and -c one each)")
    per_replica["tokensPerSecond"] = floor_significant(measured.tokens_per_s)
    per_replica["concurrency"] = c
    guaranteed = 0
    for doc in out:
        spec = doc.get("spec") or {}
        if doc.get("kind") != "TokenEntitlement" or (spec.get("poolRef") or {}).get("name") != name:
            continue
        for key in ("resources", "burstCeiling"):
            block = spec.get(key)
            if not block or "concurrency" not in block:
                continue
            n = rescaled_slots(int(block["concurrency"]), file_slots, c)
            block["concurrency"] = n
            block["tokensPerSecond"] = floor_significant(n * measured.tokens_per_slot_s)
            if "kvCacheGiB" in block:
                block["kvCacheGiB"] = floor_significant(kv_gib * n / c)
            if key == "resources" and (spec.get("qos") or {}).get("serviceClass") == "guaranteed":
                guaranteed += n
    if guaranteed > c:
        raise ValueError(f"the guaranteed baselines rescaled to {guaranteed} slots do not fit the {c} measured")
    return out
