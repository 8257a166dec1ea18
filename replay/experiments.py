"""The paper's experiments (docs/paper.md#experiments) as replay scenarios over ``examples/exp1.yaml``/``exp2.yaml``.

The pool and the entitlements come from the same example files the live stack uses; the parameters from the same
``Settings`` (``--set`` applies). What the files do not say — the load and the timeline — is chosen here and listed
in ``CHOICES``, which the report prints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from tokenpools.core.classes import EntitlementState
from tokenpools.core.enforcement import Enforcement
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.errors import ConfigError, ConfigProblem, override_problem
from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.budget_options import split_budget_items, with_budgets
from tokenpools.replay.load import (
    Arrival,
    ClosedLoad,
    Lengths,
    LoadSpec,
    RetryPolicy,
    SplitLengths,
    poisson_arrivals,
    rate_for_slots,
    service_time_s,
)
from tokenpools.replay.scenario import (
    EPOCH_MS,
    CapacityChange,
    Membership,
    Phase,
    ReplayParams,
    ReplayUsageError,
    Scenario,
)

EXP2_LENGTHS = SplitLengths(Lengths(32, 176))
COPILOT_CLIENTS = {"elastic-copilot": 7}
"""Closed loop: copilot's clients. The paper's Fig. 5 shows copilot at up to 7 in flight against its 5-slot
baseline; a closed-loop tenant never holds more than it has clients, so it had at least 7 asking (an inference from
the figure; the paper does not say how many). Every other entitlement has as many clients as slots."""
REPLAY_KEYS: dict[str, Callable[[str], object]] = {"backend_waiting": str, "backend": str, "grace_s": float,
                                                   "sample_s": float}
MODES = ("open", "closed")
ONE_EXPERIMENTS_LOAD: dict[str, str] = {"c_always": "exp1"}
"""``load.*`` options that one experiment alone reads (every other one is read by both): the other refuses them,
as a setting that cannot apply (docs/conventions.md#exit-codes), and ``demo`` gives them to that one alone."""
_Options = TypeVar("_Options", "LoadOptions", "ReplayParams")  # what one group of ``--set`` items is applied to

CHOICES: tuple[tuple[str, str], ...] = (
    ("Pool and entitlements", "examples/exp1.yaml and exp2.yaml, as the live stack uses them: Λ_p = 480 prompt + "
     "completion tokens/s, 8 GiB KV, 16 slots per replica; λ_e = 30 tokens/s per slot (6 slots: 180; 5 slots: 150)"),
    ("Backend", "one simulated vLLM replica (replay/backend/model.py): 16 slots, decode step 30 ms + 2.3 ms per "
     "running sequence, prefill 0.125 ms per prompt token, KV = the pool's 8 GiB; 232.6 output tokens/s at full "
     "load for 64/64 (the configuration assumes 240)"),
    ("Arrivals (open loop, `load.mode=open`)", "Poisson per entitlement at r_e ÷ (mean service time at full load): "
     "64/64 takes 4.40 s, so 6 slots = 1.36 req/s, 10 slots = 2.27 req/s; Exp 2 (mean 52/52) takes 3.58 s, so 5 "
     "slots = 1.40 req/s; each entitlement's arrivals are seeded on their own (seed 1)"),
    ("Clients (closed loop, `load.mode=closed`)", "N clients per entitlement, N = its slots (Exp 1: guaranteed-a 6, "
     "spot-b 10, guaranteed-c 6 in [30 s, 60 s); Exp 2: synth 5 and reports 5 from 210 s, and copilot 7, an inference "
     "from Fig. 5, which shows it at up to 7 in flight on a 5-slot baseline), same lengths "
     "and windows; a client sends its next request as soon as its previous one ended (answered, evicted, or given "
     "up after its retries: no think time), so an entitlement never has more than N requests out; client i starts "
     "i × (mean service time ÷ N) after its load does (Exp 1: 0.73 s apart for 6 clients), so they do not all start "
     "in the same ms; each client's requests are seeded on their own; a client whose entitlement is not Bound waits "
     "until it is. The demo runs both models; every table names the one next to its numbers"),
    ("Retries", "a refused client waits the refusal's retry-after-ms (the proxy's estimate of when its check "
     "passes, docs/semantics.md#retry-after) plus a uniform 0–0.1 s jitter and retries, at most 5 times, then gives "
     "up; every attempt is an admission decision; 401/403 are not retried"),
    ("Admission queue", "the proxy's (docs/queueing.md) with the Settings defaults: a request refused for a slot or "
     "its token budget waits for its check up to 0.5 × its SLO, at most 10 s (guaranteed-a/c 600 ms, spot-b 10 s; "
     "copilot 250 ms, synth 10 s, reports 2.5 s), unless the estimate of its slot (k × S ÷ n) or refill comes later: then "
     "it is refused at once with that estimate; 64 waiters per entitlement, 1024 at the proxy; it is admitted at "
     "the release (or refill) that lets it pass, or refused at its deadline and retries as any refusal. "
     "`--set policy.queue_slo_fraction=0` refuses at once, as the paper's proxy did"),
    ("max_tokens", "clients send none, so the pool default (64 in Exp 1, 176 in Exp 2) caps the output; a request "
     "reserves n_in + a high quantile of its entitlement's recent completions under that cap (policy.reservation_*: "
     "by default the 0.95 quantile of the last 256, the cap until 20 have completed; quantile 1 reserves the cap) and "
     "settles exactly at completion (docs/reservations.md)"),
    ("Exp 1 timeline", "90 s; guaranteed-c is Bound, and sends load, only in [30 s, 60 s) (it joins with fail-static "
     "limits and leaves at 60 s, like reports joins Exp 2). Bound throughout instead (`--set load.c_always=1`), its "
     "idle baseline would stay reserved and unlent until it first sends (the core assumes an entitlement with no "
     "measurement wants its baseline), so spot would hold 4 slots, not the paper's 10, before 30 s"),
    ("Exp 2 timeline", "300 s; reports (Pending in the file) is Bound at 210 s; ℓ̄* is frozen at the first "
     "tick = mean(500, 30000) = 15,250 ms (policy.mean_slo = frozen)"),
    ("Exp 2 outage", "a GPU node fails: at 30 s the replica keeps half its hardware, its slots go 16 → 8 "
     "(sequences above 8 are preempted back to its queue) and its compute halves with them, so each sequence "
     "decodes at the pace it had with 16 running (8 move 231 prompt + completion tokens/s, half the 463 of 16; "
     "replay/backend/batching.py `resize`); back to 16 at 120 s. The control plane's Λ_p halves in all three "
     "dimensions at the same instant, which is then what the backend serves (a unit test holds the two within 5 %; "
     "the simulated KV stays whole, and neither KV binds: 8 sequences hold ≤ 1,416 tokens, the halved χ 29,127). "
     "The live Exp 2 makes the same event: two simulators of 8 slots, one killed. Not vLLM restarted with 8 slots on "
     "the same GPU: a smaller batch steps faster (48 ms instead of 67), 8 would move ~322 tokens/s, and Λ_p would "
     "have to come from a step-time curve the control plane does not have (docs/paper.md#the-exp-2-outage)"),
    ("Exp 2 lengths", "the total n_in + n_out is a uniform integer in [32, 176], split in half (prompt = output ≈ 52 "
     "on average). The paper's Table 2 counts 1,141 successful requests in 300 s on a pool of ≤ 240 output "
     "tokens/s, i.e. ≤ 63 output tokens per request, so 32–176 cannot be the output length alone (mean 104)"),
    ("Control loop", "the Settings defaults: tick 5 s, usage windows = tick, γ_d = γ_b = 0.7; a window's tick runs "
     "at its end (the live agents close it once every proxy's watermark has passed its end, ~0.1 s later; their "
     "2-s grace is only the fallback for a silent proxy); the proxy learns the backend's waiting queue from the "
     "tick (the limit update carries it)"),
    ("TTFT", "per admitted request, from its admission to its first token (what vLLM and the paper measure); the "
     "client's view, which adds the time spent refused and retrying, is reported beside it"),
)


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """The load knobs a sweep may turn (``load.*`` keys; everything else is a Settings key)."""

    seed: int = 1
    max_retries: int = 5
    jitter_s: float = 0.1
    factor: float = 1.0  # scales every arrival rate
    compress: float = 1.0  # < 1 shortens every phase (fast tests), keeping the shape
    c_always: int = 0  # Exp 1: 1 = guaranteed-c is Bound for the whole run (it still sends only in [30 s, 60 s))
    mode: str = "open"  # "open": Poisson arrivals; "closed": N clients per entitlement (``factor`` scales N)
    service_s: float = 0.0  # a request's mean service time at full load, measured on a real backend; 0: the model's

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ReplayUsageError(f"`mode` must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not (self.service_s >= 0 and math.isfinite(self.service_s)):
            raise ReplayUsageError(f"`service_s` must be a number of seconds >= 0, got {self.service_s!r}")
        # an experiment of no load, or of no time, would report its tables of nothing with exit 0
        for name in ("factor", "compress"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ReplayUsageError(f"`{name}` must be a number > 0, got {value!r}")
        if self.max_retries < 0:
            raise ReplayUsageError(f"`max_retries` must be >= 0, got {self.max_retries!r}")
        if not (self.jitter_s >= 0 and math.isfinite(self.jitter_s)):
            raise ReplayUsageError(f"`jitter_s` must be a number of seconds >= 0, got {self.jitter_s!r}")
        if self.c_always not in (0, 1):
            raise ReplayUsageError(f"`c_always` must be 0 or 1, got {self.c_always!r}")

    @staticmethod
    def parse(items: Sequence[str]) -> LoadOptions:
        """The options ``load.*`` items set, in order (a later item for a key wins). Raises ConfigError naming each
        bad item's key, as ``--set`` problems are named (``override_problem``)."""
        whole = ("seed", "max_retries", "c_always")
        kinds: dict[str, tuple[Callable[[str], object], str]] = {
            name: (str, "") if name == "mode" else (int, "a whole number") if name in whole else (float, "a number")
            for name in LoadOptions.__dataclass_fields__}
        return _apply_items(LoadOptions(), items, "load", kinds)

    @property
    def label(self) -> str:
        """"open loop" or "closed loop", as the report names the load model next to its numbers."""
        return f"{self.mode} loop"


def split_overrides(items: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """(Settings overrides, ``load.*`` items, ``replay.*`` items) from ``--set``/``--sweep`` items."""
    load = [i for i in items if i.strip().startswith("load.")]
    rep = [i for i in items if i.strip().startswith("replay.")]
    return [i for i in items if i not in load and i not in rep], load, rep


def apply_replay_items(params: ReplayParams, items: Sequence[str]) -> ReplayParams:
    """``replay.backend_waiting=off``, ``replay.sample_s=1``: the replayer's own modelling knobs, in order. Raises
    ConfigError naming each bad item's key, as ``--set`` problems are named (``override_problem``)."""
    return _apply_items(params, items, "replay", {name: (kind, "a number") for name, kind in REPLAY_KEYS.items()})


def _apply_items(start: _Options, items: Sequence[str], group: str,
                 kinds: Mapping[str, tuple[Callable[[str], object], str]]) -> _Options:
    """``start`` with each ``group.name=value`` item applied in order (a later item for a key wins), each value
    converted by its name's kind (a converter, and what a value must be when it fails). Raises ConfigError naming
    every bad item's key, as ``--set`` problems are named (``override_problem``)."""
    problems: list[ConfigProblem] = []
    for item in items:
        key, _, value = (part.strip() for part in item.partition("="))
        name = key.removeprefix(f"{group}.")
        if name not in kinds:
            known = ", ".join(f"{group}.{k}" for k in kinds)
            problems.append(override_problem(key, f"unknown {group} option {name!r} (known: {known})"))
            continue
        convert, must_be = kinds[name]
        try:
            typed: Any = convert(value)
        except ValueError:
            problems.append(override_problem(key, f"must be {must_be}, got {value!r}"))
            continue
        try:
            start = replace(start, **{name: typed})
        except ValueError as exc:
            problems.append(override_problem(key, _reason(exc, name)))
    if problems:
        raise ConfigError(problems)
    return start


def _reason(exc: ValueError, name: str) -> str:
    """What a dataclass's check says of a value, without the field it names first (the problem names the key)."""
    return str(exc).removeprefix(f"`{name}` ")


def replica_model_for(pool: PoolSpec) -> ReplicaModel:
    """The default calibration with the pool's slots and KV (so the simulator and the configuration agree)."""
    return ReplicaModel(max_num_seqs=int(pool.per_replica.concurrency),
                        kv_capacity_tokens=int(pool.per_replica.kv_bytes // pool.kv_bytes_per_token))


def replica_model_at(model: ReplicaModel, service_s: float, prompt_tokens: float, output_tokens: float) -> ReplicaModel:
    """``model`` with every step time (prefill per token, decode base and per sequence) × one factor, so that a
    request of this shape holds a slot ``service_s`` on average at full load: the simulated replica runs at a real
    backend's measured pace (``load.service_s``), its slots and its batching shape unchanged."""
    if service_s <= 0:
        raise ValueError(f"`service_s` must be > 0, got {service_s}")
    factor = service_s / service_time_s(model, prompt_tokens, output_tokens)
    return replace(model, prefill_s_per_token=model.prefill_s_per_token * factor,
                   decode_step_base_s=model.decode_step_base_s * factor,
                   decode_step_per_seq_s=model.decode_step_per_seq_s * factor)


def exp1_slots(pool: PoolSpec, ents: Sequence[EntitlementSpec]) -> dict[str, int]:
    """The slots' worth each Exp 1 tenant sends: each guaranteed tenant its baseline, spot-b the rest of the pool
    once guaranteed-a's are taken (examples/exp1.yaml: 6, 10 and 6 of 16); a pool rescaled to another backend
    (``tokenpools_dev.live.rescale``) keeps the shape."""
    by_name = {e.name: e for e in ents}
    a, c = (int(by_name[n].baseline.concurrency) for n in ("guaranteed-a", "guaranteed-c"))
    return {"guaranteed-a": a, "spot-b": int(pool.per_replica.concurrency) - a, "guaranteed-c": c}


def _bound(spec: EntitlementSpec) -> EntitlementSpec:
    return spec if spec.state is EntitlementState.BOUND else replace(spec, state=EntitlementState.BOUND)


def examples_dir() -> Path:
    """The example configurations' folder, ``examples/`` of the checkout or ``tokenpools/examples`` of a wheel
    (package data of ``tokenpools.examples``), wherever the installed package finds it."""
    import tokenpools.examples

    return Path(tokenpools.examples.__file__).parent


def _config(path: Path | None, default: str, needs: Sequence[str] = ()) -> tuple[PoolSpec, list[EntitlementSpec], dict]:
    """The first pool of ``path`` (default: the example ``default``), its entitlements, which must include ``needs``
    (the ones the experiment's schedule names), and its settings."""
    from tokenpools.config import load_config

    source = path or examples_dir() / default
    config = load_config(source)
    pool = next(iter(config.pools.values()))
    ents = config.entitlements_of(pool.name)
    missing = [name for name in needs if name not in {e.name for e in ents}]
    if missing:
        raise ReplayUsageError(f"{source}: the experiment's schedule names entitlements pool {pool.name} lacks: "
                               f"{', '.join(missing)} (it has: {', '.join(e.name for e in ents) or 'none'}); "
                               f"is it the config of another experiment?")
    return pool, ents, config.settings_values


def exp1(params: ReplayParams, load: LoadOptions = LoadOptions(), config: Path | None = None) -> Scenario:
    """Cross-class protection: guaranteed-a 6 slots, spot-b 10, guaranteed-c 6 from 30 s to 60 s; 64/64; 90 s."""
    pool, ents, _ = _config(config, "exp1.yaml", needs=["guaranteed-a", "spot-b", "guaranteed-c"])
    lengths = Lengths(64, 64)
    model = replica_model_for(pool)
    if load.service_s:
        model = replica_model_at(model, load.service_s, lengths.mean, lengths.mean)
    k = load.compress
    slots = exp1_slots(pool, ents)
    n, ab = int(pool.per_replica.concurrency), slots["guaranteed-a"] + slots["spot-b"]
    window = {"guaranteed-c": (30.0 * k, 60.0 * k)}
    duration = 90.0 * k
    loads = [
        LoadSpec(e.name, load.factor * rate_for_slots(slots[e.name], model, lengths, lengths), lengths, lengths,
                 start_s=window.get(e.name, (0.0, 0.0))[0], end_s=window.get(e.name, (0.0, float("inf")))[1])
        for e in ents if e.name in slots
    ]
    membership = {} if load.c_always else {"guaranteed-c": Membership(30.0 * k, 60.0 * k)}
    arrivals, closed = _load(loads, slots, service_time_s(model, lengths.mean, lengths.mean), duration, load)
    return Scenario(
        name="exp1", pool=pool, entitlements=tuple(_bound(e) for e in ents),
        arrivals=arrivals, closed=closed, duration_s=duration, replica_model=model,
        membership=membership,
        phases=(Phase(f"a + b ({ab} of {n} slots)", 0.0, 30.0 * k),
                Phase(f"+ c: overload ({ab + slots['guaranteed-c']} of {n})", 30.0 * k, 60.0 * k),
                Phase(f"c gone ({ab} of {n})", 60.0 * k, duration)),
        retry=RetryPolicy(load.max_retries, load.jitter_s), params=params, origin_ms=EPOCH_MS, seed=load.seed,
    )


def exp2(params: ReplayParams, load: LoadOptions = LoadOptions(), config: Path | None = None) -> Scenario:
    """SLO-aware fair share: three elastic 5-slot entitlements, outage to 8 slots in [30 s, 120 s), reports at 210 s."""
    pool, ents, _ = _config(config, "exp2.yaml", needs=["elastic-reports"])
    split = EXP2_LENGTHS
    model = replica_model_for(pool)
    if load.service_s:
        model = replica_model_at(model, load.service_s, split.prompt.mean, split.output.mean)
    k = load.compress
    join = {"elastic-reports": 210.0 * k}
    duration = 300.0 * k
    slots = int(pool.per_replica.concurrency)
    loads = [
        LoadSpec(e.name, load.factor * rate_for_slots(e.baseline.concurrency, model, split.prompt, split.output),
                 split.prompt, split.output, split, start_s=join.get(e.name, 0.0))
        for e in ents
    ]
    clients = {e.name: int(e.baseline.concurrency) for e in ents} | COPILOT_CLIENTS
    service_s = service_time_s(model, split.prompt.mean, split.output.mean)
    arrivals, closed = _load(loads, clients, service_s, duration, load)
    return Scenario(
        name="exp2", pool=pool, entitlements=tuple(_bound(e) for e in ents),
        arrivals=arrivals, closed=closed, duration_s=duration, replica_model=model,
        membership={name: Membership(t) for name, t in join.items()},
        capacity_changes=(CapacityChange(30.0 * k, slots // 2), CapacityChange(120.0 * k, slots)),
        phases=(Phase("normal (16 slots)", 0.0, 30.0 * k), Phase("outage (8 slots)", 30.0 * k, 120.0 * k),
                Phase("recovered (16 slots)", 120.0 * k, 210.0 * k), Phase("+ reports (15 of 16)", 210.0 * k, duration)),
        retry=RetryPolicy(load.max_retries, load.jitter_s), params=params, origin_ms=EPOCH_MS, seed=load.seed,
    )


def _load(loads: Sequence[LoadSpec], slots: Mapping[str, int], service_s: float, duration_s: float,
          load: LoadOptions) -> tuple[tuple[Arrival, ...], tuple[ClosedLoad, ...]]:
    """The experiment's load in ``load.mode``: its open-loop arrivals, or as many closed-loop clients per entitlement
    as it has slots (× ``load.factor``), with its lengths and window, staggered over one mean service time."""
    if load.mode == "open":
        return tuple(poisson_arrivals(loads, duration_s, load.seed)), ()
    closed = []
    for spec in loads:
        n = max(1, round(load.factor * slots[spec.entitlement])) if slots[spec.entitlement] > 0 else 0
        closed.append(ClosedLoad(spec.entitlement, n, spec.prompt, spec.output, spec.split, start_s=spec.start_s,
                                 end_s=spec.end_s, max_tokens=spec.max_tokens,
                                 stagger_s=round(service_s / n, 3) if n else 0.0))
    return (), tuple(closed)


EXPERIMENTS: dict[str, Callable[..., Scenario]] = {"exp1": exp1, "exp2": exp2}


def build(name: str, overrides: Sequence[str] = (), config: Path | None = None, sample_s: float = 0.5) -> Scenario:
    """An experiment with ``--set`` items applied (Settings keys and ``load.*`` keys)."""
    try:
        factory = EXPERIMENTS[name]
    except KeyError:
        raise ReplayUsageError(f"unknown experiment {name!r}; known: {sorted(EXPERIMENTS)}") from None
    _, _, file_settings = _config(config, f"{name}.yaml")
    budgets, overrides = split_budget_items(overrides)  # replay.budget=...: what-if budgets (docs/budgets.md#replay)
    shadow = [i for i in overrides if i.strip().startswith(SHADOW_KEY + "=")]
    params, load_items = params_from(file_settings, [i for i in overrides if i not in shadow], sample_s)
    foreign = [i for i in load_items if _sole_reader(i) not in (None, name)]
    if foreign:  # a setting that cannot apply is refused, not ignored
        raise ConfigError(override_problem(i.partition("=")[0].strip(), f"only {_sole_reader(i)} reads it; {name} "
                                           f"would ignore it") for i in foreign)
    scenario = with_shadow(factory(params, LoadOptions.parse(load_items), config), shadow)
    return replace(scenario, entitlements=with_budgets(scenario.entitlements, budgets)) if budgets else scenario


def own_items(name: str, items: Sequence[str]) -> list[str]:
    """``items`` without the ``load.*`` options another experiment alone reads: what ``demo``, which passes its
    ``--set`` items to both experiments, gives ``name`` (``load.c_always=1`` changes Exp 1, and Exp 2 runs as it is)."""
    return [i for i in items if _sole_reader(i) in (None, name)]


def _sole_reader(item: str) -> str | None:
    """The experiment that alone reads a ``load.*`` item; None when both do, or for any other item."""
    key = item.partition("=")[0].strip()
    return ONE_EXPERIMENTS_LOAD.get(key.removeprefix("load.")) if key.startswith("load.") else None


SHADOW_KEY = "replay.shadow"


def with_shadow(scenario: Scenario, items: Sequence[str]) -> Scenario:
    """``replay.shadow=a,b`` puts entitlements a and b in shadow (docs/shadow.md), ``replay.shadow=*`` the pool (its
    entitlements without a mode of their own): what the specs' ``enforcement`` field does, for one run."""
    names = {n.strip() for item in items for n in item.partition("=")[2].split(",") if n.strip()}
    if not names:
        return scenario
    pool = replace(scenario.pool, enforcement=Enforcement.SHADOW) if "*" in names else scenario.pool
    unknown = sorted(names - {"*"} - {e.name for e in scenario.entitlements})
    if unknown:
        raise ConfigError([override_problem(SHADOW_KEY, f"unknown entitlements {unknown}")])
    entitlements = tuple(replace(e, enforcement=Enforcement.SHADOW) if e.name in names else e
                         for e in scenario.entitlements)
    return replace(scenario, pool=pool, entitlements=entitlements)


def params_from(settings_values: Mapping[str, Any], items: Sequence[str],
                sample_s: float = 0.5) -> tuple[ReplayParams, list[str]]:
    """The replay's parameters from a configuration's settings and ``--set`` items (Settings keys and
    ``replay.*``), as the live processes would run with them; also the ``load.*`` items, which are the caller's."""
    from tokenpools.config import load_settings

    settings_items, load_items, replay_items = split_overrides(items)
    settings = load_settings(settings_values, settings_items)
    return apply_replay_items(ReplayParams.from_settings(settings, sample_s), replay_items), load_items


def recorded_params(settings_values: Mapping[str, Any], items: Sequence[str]) -> ReplayParams:
    """``params_from`` for replaying a recorded log, whose load is recorded: a ``load.*`` item is refused, named."""
    params, load_items = params_from(settings_values, items)
    if load_items:
        raise ConfigError(override_problem(item.partition("=")[0].strip(), "does not apply to a recorded log (its "
                                           "load is recorded)") for item in load_items)
    return params


def mean_service_s(name: str) -> float:
    """The mean service time at full load the experiment's rates are derived from (for the report)."""
    if name == "exp1":
        return service_time_s(ReplicaModel(), 64, 64)
    return service_time_s(ReplicaModel(), EXP2_LENGTHS.prompt.mean, EXP2_LENGTHS.output.mean)
