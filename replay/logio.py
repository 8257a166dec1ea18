"""Between replay results and the recorded-log format (``trace``): write a replay as a log, replay a log.

A replay's decisions and completions are written as ``request_decided`` / ``request_completed`` rows, exactly
what the proxy would have produced, and entitlements that join later as ``spec`` rows (state Bound at the join
time), so a replay's output is itself a log ``tokenpools replay`` can read back.

Replaying a log: every recorded decision becomes one attempt at the time its request reached the proxy, the
decision's time less the ``queued_ms`` it waited in the proxy's queue (the refusal a wait opened with, a row with
``waits``, is skipped: the final row stands for the request; retries are already in the log as their own
decisions, so the client model makes none), with the output length from its completion (or ``max_tokens`` when it
was refused live). A log without ``queued_ms`` (written before decisions carried it) replays every attempt at its
decision's time, which is exact only for a proxy that did not queue (``policy.queue_slo_fraction=0``). Entitlements come from the configuration, their membership from the
log's ``spec`` rows when it has some (one interval: the first Bound row to the next that is not; never Bound:
refused as not Bound), else from the configuration's state. The backend simulator stands in for the backends
(``replay.backend=sim``), or the log's own service times do (``replay.backend=recorded``: each admitted request
takes as long as it did live, the backend queue is what the recorded limit updates carried); a capacity change that
the log cannot carry (the Exp-2 outage) is given on the command line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.replay import trace
from tokenpools.replay.backend.recorded import RecordedService, Recording
from tokenpools.replay.experiments import _bound, replica_model_for
from tokenpools.replay.load import Arrival, RetryPolicy
from tokenpools.replay.replayer import ReplayResult
from tokenpools.replay.scenario import CapacityChange, Membership, ReplayParams, Scenario

PROXY_ID = "replay"


def _ms(origin_ms: int, t_s: float) -> int:
    return origin_ms + round(t_s * 1000)


def decided_frame(result: ReplayResult, origin_ms: int | None = None) -> pl.DataFrame:
    origin_ms = result.scenario.origin_ms if origin_ms is None else origin_ms
    d = result.decisions
    pool = result.scenario.pool
    ids = [rid if a == 0 else f"{rid}/{a}" for rid, a in zip(d.request_id, d.attempt)]
    costs = list(d.cost_tokens)  # n_in + the output estimate (what was reserved, or would have been)
    caps = [p + m for p, m in zip(d.prompt_tokens, d.max_tokens)]  # KV is sized by the cap
    n = len(ids)
    # how long each waited in the proxy's queue (a live pass assembled by the dev tools may have no waits to give;
    # a frame keeps only the columns its table has: none before the decision record carried queued_ms)
    queued_ms = [round(q * 1000) for q in d.queued_s] if d.queued_s else [0] * n
    return trace.frame(trace.REQUESTS, {
        "schema_version": [1] * n, "request_id": ids, "pool": [pool.name] * n, "entitlement": list(d.entitlement),
        "proxy_id": [PROXY_ID] * n, "t_ms": [_ms(origin_ms, t) for t in d.t_s], "outcome": list(d.outcome),
        "reason": list(d.reason), "retry_after_s": list(d.retry_after_s),
        "retry_after_ms": list(d.retry_after_ms), "queued_ms": queued_ms, "waits": [False] * n,  # final rows only
        "prompt_tokens_est": list(d.prompt_tokens),
        "max_tokens": list(d.max_tokens), "cost_tokens": costs,
        "kv_bytes": [c * pool.kv_bytes_per_token if o == "admitted" else 0 for c, o in zip(caps, d.outcome)],
        "priority": list(d.priority), "stream": [False] * n,
        "would_refuse": [w or None for w in d.would_refuse] if d.would_refuse else [None] * n,  # docs/shadow.md
        # the replay knows every attempt's request exactly (its client model made the retries)
        "attempt": list(d.attempt), "first_request_id": [None if a == 0 else rid for rid, a in zip(d.request_id, d.attempt)],
        "retry_link": [None] * n,
        "kafka_partition": [-1] * n, "kafka_offset": list(range(n)),
    })


def completed_frame(result: ReplayResult, origin_ms: int | None = None) -> pl.DataFrame:
    origin_ms = result.scenario.origin_ms if origin_ms is None else origin_ms
    c = result.completions
    pool = result.scenario.pool
    max_tokens, cost = {}, {}
    d = result.decisions
    for rid, a, o, mt, ct in zip(d.request_id, d.attempt, d.outcome, d.max_tokens, d.cost_tokens):
        if o == "admitted":
            max_tokens[(rid, a)] = mt
            cost[(rid, a)] = ct
    ids = [rid if a == 0 else f"{rid}/{a}" for rid, a in zip(c.request_id, c.attempt)]
    keys = list(zip(c.request_id, c.attempt))
    reserved = [cost[k] for k in keys]  # n_in + the output estimate
    caps = [p + max_tokens[k] for p, k in zip(c.prompt_tokens, keys)]  # KV is sized by the cap
    n = len(ids)
    return trace.frame(trace.COMPLETIONS, {
        "schema_version": [1] * n, "request_id": ids, "pool": [pool.name] * n, "entitlement": list(c.entitlement),
        "proxy_id": [PROXY_ID] * n, "t_ms": [_ms(origin_ms, t) for t in c.t_s],
        "admitted_t_ms": [_ms(origin_ms, t) for t in c.admitted_s], "status": ["ok"] * n,
        "prompt_tokens": list(c.prompt_tokens), "completion_tokens": list(c.completion_tokens),
        "cached_prompt_tokens": [0] * n, "reserved_tokens": reserved, "kv_bytes": [k * pool.kv_bytes_per_token for k in caps],
        "ttft_s": list(c.ttft_s), "e2e_s": list(c.e2e_s), "backend": ["sim"] * n, "http_status": [200] * n,
        "kafka_partition": [-1] * n, "kafka_offset": list(range(n)),
    })


def spec_frame(result: ReplayResult, origin_ms: int | None = None) -> pl.DataFrame:
    """One row per membership change: Bound at the join, deleted at the leave (if it left)."""
    origin_ms = result.scenario.origin_ms if origin_ms is None else origin_ms
    rows = []
    for e in result.scenario.entitlements:
        member = result.scenario.member(e.name)
        changes = [(member.join_s, False)] + ([] if member.leave_s is None else [(member.leave_s, True)])
        for t_s, left in changes:
            rows.append({"schema_version": 1, "kind": "TokenEntitlement", "name": e.name, "pool": e.pool,
                         "generation": 1, "spec": "{}", "state": None if left else "Bound",
                         "reason": "replay membership", "deleted": left, "t_ms": _ms(origin_ms, t_s)})
    for i, row in enumerate(rows):
        row.update({"kafka_partition": -1, "kafka_offset": i})
    return trace.frame("spec", rows)


def write_log(result: ReplayResult, root: Path, origin_ms: int | None = None) -> list[Path]:
    """The replay as a log directory (hour-partitioned Parquet, the recorder's layout)."""
    paths = []
    for table, df in ((trace.REQUESTS, decided_frame(result, origin_ms)),
                      (trace.COMPLETIONS, completed_frame(result, origin_ms)),
                      ("spec", spec_frame(result, origin_ms))):
        paths += trace.write_partitioned(root, table, df, partition=-1, first_offset=0)
    return paths


@dataclass(frozen=True, slots=True)
class LogData:
    """A recorded log decoded once: the tables a replay reads, and a digest of the files they came from.

    Frozen and picklable (polars frames pickle), so a worker process or a Ray task can take it whole.
    """

    root: str
    decided: pl.DataFrame  # final rows only (a wait's opening refusal dropped), by arrival order of the log
    completed: pl.DataFrame
    specs: pl.DataFrame
    limit_updates: pl.DataFrame
    digest: str  # sha256 of the tables' files (path and bytes): the same log, the same digest


def read_log(root: Path) -> LogData:
    """Decode a log directory's tables once (schema-checked)."""
    decided = trace.read_table(root, trace.REQUESTS)
    if "waits" in decided.columns:  # a wait's opening refusal: the request's final row follows, with its queued_ms
        decided = decided.filter(~pl.col("waits").fill_null(False))
    if decided.is_empty():
        raise trace.TraceSchemaError(f"{root}: the log has no {trace.REQUESTS} rows to replay")
    tables = (trace.REQUESTS, trace.COMPLETIONS, "spec", "limit_update")
    h = hashlib.sha256()
    for table in tables:
        for path in trace.table_files(root, table):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return LogData(str(root), decided, trace.read_table(root, trace.COMPLETIONS), trace.read_table(root, "spec"),
                   trace.read_table(root, "limit_update"), h.hexdigest())


def split_log(data: LogData, holdout_fraction: float) -> tuple[LogData, LogData]:
    """(the first part, the last ``holdout_fraction`` of it), split in time: at the arrival-time quantile
    1 - ``holdout_fraction`` of the decisions. Each part keeps the completions of its own decisions, the spec rows
    (membership is read relative to each part's start) and the limit updates of its time span."""
    if not 0 < holdout_fraction < 1:
        raise ValueError(f"`holdout_fraction` must be in (0, 1), got {holdout_fraction}")
    decided = data.decided.with_columns(_arrived_ms(data.decided).alias("__arrived_ms"))
    arrived = decided["__arrived_ms"].sort()
    cut_ms = int(arrived[min(len(arrived) - 1, int(len(arrived) * (1 - holdout_fraction)))])
    parts = []
    for name, keep in (("tuning", pl.col("__arrived_ms") < cut_ms), ("held-out", pl.col("__arrived_ms") >= cut_ms)):
        rows = decided.filter(keep).drop("__arrived_ms")
        if rows.is_empty():
            raise trace.TraceSchemaError(f"{data.root}: too few decisions to hold {holdout_fraction:g} of them out")
        ids = rows["request_id"].implode()
        in_span = pl.col("t_ms") < cut_ms if name == "tuning" else pl.col("t_ms") >= cut_ms
        parts.append(LogData(data.root, rows, data.completed.filter(pl.col("request_id").is_in(ids)), data.specs,
                             data.limit_updates.filter(in_span),
                             hashlib.sha256(f"{data.digest}|{name}|{holdout_fraction!r}".encode()).hexdigest()))
    return parts[0], parts[1]


def _arrived_ms(decided: pl.DataFrame) -> pl.Expr:
    """When each decision's request reached the proxy: its time less the ``queued_ms`` it waited."""
    return pl.col("t_ms") - pl.col("queued_ms") if "queued_ms" in decided.columns else pl.col("t_ms")


def scenario_from_log(root: Path, pool: PoolSpec, entitlements: Sequence[EntitlementSpec], params: ReplayParams,
                      capacity_changes: Sequence[tuple[float, int]] = (), name: str = "replay") -> tuple[Scenario, pl.DataFrame]:
    """The scenario a recorded log describes, and its decisions (to compare the replay with)."""
    return scenario_from_data(read_log(root), pool, entitlements, params, capacity_changes, name)


def scenario_from_data(data: LogData, pool: PoolSpec, entitlements: Sequence[EntitlementSpec], params: ReplayParams,
                       capacity_changes: Sequence[tuple[float, int]] = (), name: str = "replay") -> tuple[Scenario, pl.DataFrame]:
    """``scenario_from_log`` of a log already decoded."""
    decided, completed, specs = data.decided, data.completed, data.specs
    window_ms = params.window_ms
    queued = decided["queued_ms"].to_list() if "queued_ms" in decided.columns else [0] * len(decided)
    arrived_ms = [t - q for t, q in zip(decided["t_ms"].to_list(), queued)]  # when each reached the proxy
    origin_ms = min(arrived_ms) // window_ms * window_ms
    outputs = dict(zip(completed["request_id"].to_list(), completed["completion_tokens"].to_list()))
    known = {e.name for e in entitlements}
    columns = [decided[c].to_list() for c in ("entitlement", "request_id", "prompt_tokens_est", "max_tokens")]
    arrivals = [
        Arrival((t - origin_ms) / 1000, ent, rid, prompt, max_tokens, max(1, outputs.get(rid, max_tokens)))
        for t, ent, rid, prompt, max_tokens in zip(arrived_ms, *columns)
        if ent in known
    ]
    arrivals.sort(key=lambda a: a.t_s)  # by arrival (stable: decisions of one instant keep the log's order)
    membership: dict[str, Membership] = {}
    states = _spec_states(specs, origin_ms)
    ents = []
    for e in entitlements:
        rows = states.get(e.name)
        if rows:
            member = _membership(rows)
            if member is None:  # never Bound in the log: its requests were refused as not Bound
                e = replace(e, state=EntitlementState.PENDING)
            else:
                membership[e.name] = member
                e = _bound(e)
        ents.append(e)
    duration = (int(decided["t_ms"].max()) - origin_ms) / 1000 + params.tick_s
    recording = _recording(data.limit_updates, decided, completed, origin_ms)
    scenario = Scenario(
        name=name, pool=pool, entitlements=tuple(ents), arrivals=tuple(arrivals), duration_s=duration,
        replica_model=replica_model_for(pool), membership=membership,
        capacity_changes=tuple(CapacityChange(t, slots) for t, slots in capacity_changes),
        retry=RetryPolicy(max_retries=0), params=params, origin_ms=origin_ms, recording=recording,
    )
    return scenario, decided


def _spec_states(specs: pl.DataFrame, origin_ms: int) -> dict[str, list[tuple[float, bool]]]:
    """Per entitlement, in log order: (t_s, Bound?) from its spec rows. A row without a state is bound by capacity
    admission (taken as Bound: a replay does not rerun binding); a deleted one is not Bound."""
    if specs.is_empty():
        return {}
    rows = specs.filter(pl.col("kind") == "TokenEntitlement").select("name", "state", "deleted", "t_ms")
    states: dict[str, list[tuple[float, bool]]] = {}
    for name, state, deleted, t in rows.iter_rows():
        states.setdefault(name, []).append(((t - origin_ms) / 1000, state in (None, "Bound") and not deleted))
    return states


def _membership(states: Sequence[tuple[float, bool]]) -> Membership | None:
    """When the log's spec rows make an entitlement Bound, and when they end it (None: never Bound). Before its
    first row an entitlement is a member only if that row finds it Bound before the log starts. One interval: the
    first Bound to the first non-Bound after it."""
    join_s: float | None = None
    for t_s, bound in states:
        if join_s is None and bound:
            join_s = max(0.0, t_s)
        elif join_s is not None and not bound:
            return Membership(join_s, max(join_s, t_s))
    return Membership(join_s) if join_s is not None else None


def _recording(limit_updates: pl.DataFrame, decided: pl.DataFrame, completed: pl.DataFrame,
               origin_ms: int) -> Recording | None:
    """Each completed request's service, timed from its admission as the proxy logged both (ms, like the windows);
    None when the log has no completion of an admitted request."""
    admitted = decided.filter(pl.col("outcome") == "admitted").select("request_id", pl.col("t_ms").alias("decided_ms"))
    rows = completed.join(admitted, on="request_id", how="inner").select(
        "request_id", "entitlement", ((pl.col("t_ms") - pl.col("decided_ms")) / 1000).alias("service_s"), "ttft_s",
        "prompt_tokens", "completion_tokens")
    services = {rid: RecordedService(max(0.0, service_s), ttft_s or 0.0, prompt, output)
                for rid, _, service_s, ttft_s, prompt, output in rows.iter_rows()}
    if not services:
        return None
    entitlement_of = dict(zip(rows["request_id"].to_list(), rows["entitlement"].to_list()))
    updates = limit_updates.select("t_ms", "backend_waiting", "capacity_concurrency")
    ticks = sorted({((t - origin_ms) / 1000, round(w), c) for t, w, c in updates.iter_rows()})
    return Recording(services, entitlement_of, tuple(ticks))


def match_rate(result: ReplayResult, recorded: pl.DataFrame) -> tuple[float | None, int]:
    """Share of recorded decisions the replay made the same way (same outcome for the same request id)."""
    d = result.decisions
    replayed = {rid if a == 0 else f"{rid}/{a}": o for rid, a, o in zip(d.request_id, d.attempt, d.outcome)}
    pairs = [(replayed.get(rid), outcome) for rid, outcome in recorded.select("request_id", "outcome").iter_rows()]
    if not pairs:
        return None, 0
    same = sum(1 for mine, theirs in pairs if mine == theirs)
    return same / len(pairs), len(pairs)
