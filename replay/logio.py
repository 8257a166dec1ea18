"""Between replay results and the recorded-log format (``trace``): write a replay as a log, replay a log.

A replay's decisions and completions are written as ``request_decided`` / ``request_completed`` rows, exactly
what the proxy would have produced, and entitlements that join later as ``spec`` rows (state Bound at the join
time), so a replay's output is itself a log ``tokenpools replay`` can read back.

Replaying a log (``read_log`` decodes it once, ``scenario_from_data`` makes a scenario of it for a configuration
and parameters, ``scenario_from_log`` is both): its decisions are grouped into requests (``attempts``: by the
proxy's ``attempt``/``first_request_id`` marks, else by the heuristic there), and each request's first attempt
becomes one arrival at the time it reached the proxy, the decision's time less the ``queued_ms`` it waited in the
proxy's queue (the refusal a wait opened with, a row with ``waits``, is skipped: the final row stands for the
attempt). Its retries are not replayed as arrivals: the replay's own refusals make them, as the log's clients would
have (``clients``, fitted from the log), so a policy that admits a first attempt the live one refused makes no
retry, and a stricter one makes more. The output length is the request's completion's; a request that never
completed live (refused for good) takes its entitlement's median completion (at most its ``max_tokens``; with no
completion of its entitlement, ``max_tokens``): taking the cap, as replays did before, made the Exp-2 token-pools
log replayed without admission carry 30 copilot requests of 176 output tokens instead of ~52, and its backend
queue peak 72 instead of the 47 of the same arrivals' own run. A log without ``queued_ms`` (written before decisions carried it) replays every attempt at
its decision's time, which is exact only for a proxy that did not queue (``policy.queue_slo_fraction=0``).
Entitlements come from the configuration, their membership from the
log's ``spec`` rows when it has some (one interval: the first Bound row to the next that is not; never Bound:
refused as not Bound), else from the configuration's state. The backend simulator stands in for the backends
(``replay.backend=sim``), or the log's own service times do (``replay.backend=recorded``: each admitted request
takes as long as it did live, the backend queue is what the recorded limit updates carried, and each update is put
in force when the live proxy held it, by its decisions' ``limits_version``); a capacity change that
the log cannot carry (the Exp-2 outage) is given on the command line.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import polars as pl

from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.errors import PermanentError
from tokenpools.replay import attempts, clients, trace
from tokenpools.replay.backend.recorded import RecordedService, Recording
from tokenpools.replay.experiments import _bound, replica_model_for
from tokenpools.replay.attempts import RETRY_WINDOW_MS
from tokenpools.replay.clients import ClientModel
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
        "proxy_start_ms": [None] * n, "sequence": [None] * n,  # no identity: the replay sends each once (its ids)
        "limits_version": [None] * n,  # (its limits were put in force at its ticks: nothing for a replay to follow)
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
        "proxy_start_ms": [None] * n, "sequence": [None] * n,  # no identity: the replay sends each once (its ids)
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


class Logged(NamedTuple):
    """One recorded decision, placed in its request (``attempts.group``; attempts renumbered 0, 1, … in order)."""

    request: str  # the request_id of the request's first attempt in the log
    attempt: int
    entitlement: str  # "" for an unknown API key
    arrived_ms: int  # when it reached the proxy: the decision's time less its queued_ms
    decided_ms: int
    outcome: str
    retry_after_ms: int
    prompt_tokens: int
    max_tokens: int

    @property
    def attempt_id(self) -> str:
        """Its id in a replay (and in a replay's log): the request's, then ``/k`` for retry k."""
        return attempt_id(self.request, self.attempt)


def attempt_id(request: str, attempt: int) -> str:
    return request if attempt == 0 else f"{request}/{attempt}"


@dataclass(frozen=True, slots=True)
class LogData:
    """A recorded log, decoded once: everything a replay of it needs whatever the configuration and parameters
    (``scenario_from_data``). Times are ms since epoch; ``first_attempts`` are the requests' first attempts by
    arrival (ties in the log's order), ``attempts`` every decision in the same order. Plain data: picklable."""

    attempts: tuple[Logged, ...]
    first_attempts: tuple[Logged, ...]
    outputs: Mapping[str, int]  # request -> completion tokens of its completed attempt
    typical_outputs: Mapping[str, int]  # entitlement -> median completion tokens of its completed requests
    services: Mapping[str, RecordedService]  # attempt id -> its live service (admitted and completed)
    ticks_ms: tuple[tuple[int, int, int], ...]  # (t_ms, backend waiting, pool slots) of the limit updates
    specs: tuple[tuple[str, int, bool], ...]  # (entitlement, t_ms, Bound?) of the spec rows, in log order
    last_arrival_ms: int  # when the log's last attempt (first or retry) reached the proxy: the load stops there
    clients: ClientModel
    digest: str  # sha256 of the log's files (a part of a split: of the whole log's digest and the part)
    window_ms: int = RETRY_WINDOW_MS  # the window unmarked retries were grouped with
    # (limits_version, t_ms of the first decision that carries it), ascending: when the proxy held each limit
    # update (``held_versions``); empty for a log written before decisions carried the version
    held_ms: tuple[tuple[int, int], ...] = ()


def read_log(root: Path, window_ms: int = RETRY_WINDOW_MS) -> LogData:
    """Decode a log directory: its decisions grouped into requests (``attempts``), its completions, spec rows and
    limit updates, and its clients' model (``clients.fit``). ``window_ms``: the unmarked-retry window."""
    every = trace.read_table(trace.log_dir(root), trace.REQUESTS)
    decided = _final(root, every)
    rows = _attempt_rows(decided)
    links = attempts.group(rows, window_ms)
    logged, recorded_ids = _number(rows, links, decided["outcome"].to_list())
    completed = trace.read_table(root, trace.COMPLETIONS)
    attempt_of = dict(zip(recorded_ids, (a.attempt_id for a in logged)))
    request_of = {a.attempt_id: a.request for a in logged}
    outputs: dict[str, int] = {}
    for rid, tokens in completed.select("request_id", "completion_tokens").iter_rows():
        aid = attempt_of.get(rid)
        if aid is not None:
            outputs[request_of[aid]] = tokens
    services = _services(decided, completed, attempt_of)
    updates = trace.read_table(root, "limit_update").select("t_ms", "backend_waiting", "capacity_concurrency")
    ticks = tuple(sorted({(t, round(w), c) for t, w, c in updates.iter_rows()}))
    specs_df = trace.read_table(root, "spec")
    specs = () if specs_df.is_empty() else tuple(
        (name, t, state in (None, "Bound") and not deleted)
        for name, state, deleted, t in specs_df.filter(pl.col("kind") == "TokenEntitlement").select(
            "name", "state", "deleted", "t_ms").iter_rows())
    return _log_data(logged, outputs, services, ticks, specs, window_ms, _digest(root), held_versions(every))


def held_versions(decided: pl.DataFrame) -> tuple[tuple[int, int], ...]:
    """(limits_version, t_ms of the first decision carrying it) of every version the log's decisions name, in
    version order: a wait's opening refusal counts (the proxy held the version then too). Empty when none does."""
    if "limits_version" not in decided.columns:
        return ()
    held = decided.filter(pl.col("limits_version").is_not_null()).group_by("limits_version").agg(
        pl.col("t_ms").min()).sort("limits_version")
    return tuple((version, t_ms) for version, t_ms in held.select("limits_version", "t_ms").iter_rows())


def check_entitlements(data: LogData, entitlements: Sequence[EntitlementSpec]) -> None:
    """``PermanentError`` (one line) when the log's requests name an entitlement the configuration lacks: their
    requests would be dropped in silence (a replay of another log, or under part of its configuration)."""
    known = {e.name for e in entitlements}
    missing = sorted({a.entitlement for a in data.first_attempts} - known)
    if missing:
        raise PermanentError(
            f"the log's requests name entitlements the configuration lacks: {', '.join(missing)} "
            f"(the configuration has: {', '.join(sorted(known)) or 'none'}); replay it with the config it ran under")


def scenario_from_data(data: LogData, pool: PoolSpec, entitlements: Sequence[EntitlementSpec], params: ReplayParams,
                       capacity_changes: Sequence[tuple[float, int]] = (),
                       name: str = "replay") -> tuple[Scenario, pl.DataFrame]:
    """The scenario a decoded log describes under a configuration and parameters, and its recorded decisions (to
    compare the replay with, ``match_rate``: request_id as the replay names the attempt, entitlement, outcome)."""
    window_ms = params.window_ms
    origin_ms = min(a.arrived_ms for a in data.first_attempts) // window_ms * window_ms
    check_entitlements(data, entitlements)
    known = {e.name for e in entitlements}
    outputs, typical = data.outputs, data.typical_outputs
    arrivals = tuple(
        Arrival((a.arrived_ms - origin_ms) / 1000, a.entitlement, a.request, a.prompt_tokens, a.max_tokens,
                max(1, outputs.get(a.request) or min(a.max_tokens, typical.get(a.entitlement, a.max_tokens))))
        for a in data.first_attempts if a.entitlement in known)
    membership: dict[str, Membership] = {}
    states: dict[str, list[tuple[float, bool]]] = {}
    for ent, t_ms, bound in data.specs:
        states.setdefault(ent, []).append(((t_ms - origin_ms) / 1000, bound))
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
    # the load runs to the end of the control tick of the log's last arrival (a retry due later is pending, as it
    # was when the log ended); waiters and the backend finish after it
    tick_ms = round(params.tick_s * 1000)
    duration = max(1, -(-(data.last_arrival_ms - origin_ms) // tick_ms)) * tick_ms / 1000
    recording = None
    if data.services:
        entitlement_of = {a.attempt_id: a.entitlement for a in data.attempts if a.attempt_id in data.services}
        recording = Recording(data.services, entitlement_of,
                              tuple(((t - origin_ms) / 1000, w, c) for t, w, c in data.ticks_ms),
                              tuple((v - origin_ms, t - origin_ms) for v, t in data.held_ms))
    scenario = Scenario(
        name=name, pool=pool, entitlements=tuple(ents), arrivals=arrivals, duration_s=duration,
        replica_model=replica_model_for(pool), membership=membership,
        capacity_changes=tuple(CapacityChange(t, slots) for t, slots in capacity_changes),
        retry=RetryPolicy(fitted=data.clients), params=params, origin_ms=origin_ms, recording=recording,
    )
    recorded = pl.DataFrame({"request_id": [a.attempt_id for a in data.attempts],
                             "entitlement": [a.entitlement for a in data.attempts],
                             "outcome": [a.outcome for a in data.attempts]},
                            schema={"request_id": pl.String, "entitlement": pl.String, "outcome": pl.String})
    return scenario, recorded


def scenario_from_log(root: Path, pool: PoolSpec, entitlements: Sequence[EntitlementSpec], params: ReplayParams,
                      capacity_changes: Sequence[tuple[float, int]] = (), name: str = "replay") -> tuple[Scenario, pl.DataFrame]:
    """The scenario a recorded log describes, and its decisions (to compare the replay with)."""
    return scenario_from_data(read_log(root), pool, entitlements, params, capacity_changes, name)


def split_log(data: LogData, holdout_fraction: float) -> tuple[LogData, LogData]:
    """(tuning, held out): the requests whose first attempt arrived before the cut, and the rest, the cut leaving
    ``holdout_fraction`` of the requests in the second part. A request stays whole on its side (its retries, its
    service), each part keeps the log's absolute times and every spec row (so each replays on its own: its scenario
    starts at its own first arrival's window, an entitlement Bound before that is a member from its start), the
    limit updates of its own time span, and its own client model, fitted from its own attempts."""
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"`holdout_fraction` must be in (0, 1), got {holdout_fraction}")
    firsts = data.first_attempts
    n_tuning = round(len(firsts) * (1.0 - holdout_fraction))
    if not 0 < n_tuning < len(firsts):
        raise ValueError(f"a log of {len(firsts)} requests cannot be split {1 - holdout_fraction:.0%} / "
                         f"{holdout_fraction:.0%}: one part would be empty")
    cut_ms = firsts[n_tuning].arrived_ms
    tuning = {a.request for a in firsts[:n_tuning]}
    parts = []
    for label, inside in (("tuning", True), ("held-out", False)):
        part = [a for a in data.attempts if (a.request in tuning) == inside]
        ids = {a.attempt_id for a in part}
        ticks = tuple(t for t in data.ticks_ms if (t[0] < cut_ms) == inside)
        digest = hashlib.sha256(f"{data.digest}:{label}:{holdout_fraction!r}".encode()).hexdigest()
        parts.append(_log_data(part, {r: o for r, o in data.outputs.items() if (r in tuning) == inside},
                               {i: s for i, s in data.services.items() if i in ids}, ticks, data.specs,
                               data.window_ms, digest, data.held_ms))
    return parts[0], parts[1]


def attempt_rows(root: Path) -> list[attempts.Attempt]:
    """A log's decisions as ``attempts.group`` takes them, in the log's order (a wait's opening refusal left out)."""
    return _attempt_rows(_decided(root))


def _decided(root: Path) -> pl.DataFrame:
    return _final(root, trace.read_table(root, trace.REQUESTS))


def _final(root: Path, decided: pl.DataFrame) -> pl.DataFrame:
    """The log's decisions (``decided``: its requests table) without the refusals a wait opened with."""
    decided = decided.filter(~pl.col("waits").fill_null(False))  # a wait's opening refusal: its final row follows
    if decided.is_empty():
        raise trace.TraceSchemaError(f"{root}: the log has no {trace.REQUESTS} rows to replay")
    return decided


def _attempt_rows(decided: pl.DataFrame) -> list[attempts.Attempt]:
    return [attempts.Attempt(rid, ent or "", t - (q or 0), t, outcome != "admitted", ra or 0, prompt, max_tokens,
                             attempt, first)
            for rid, ent, t, q, outcome, ra, prompt, max_tokens, attempt, first in decided.select(
                "request_id", "entitlement", "t_ms", "queued_ms", "outcome", "retry_after_ms", "prompt_tokens_est",
                "max_tokens", "attempt", "first_request_id").iter_rows()]


def _number(rows: Sequence[attempts.Attempt], links: Sequence[attempts.Link],
            outcomes: Sequence[str]) -> tuple[list[Logged], list[str]]:
    """The rows as ``Logged`` (attempts numbered 0, 1, … in their request's arrival order, whatever the marks said:
    a request whose first attempt is before the log starts there), by arrival; and each one's recorded id. A
    request named like another's retry (``<other>/<k>``: a log whose request ids carry attempts, without marks) is
    renamed (``/`` → ``~``), so every attempt id a replay makes is its own."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i].arrived_ms, i))
    names = {link.request for link in links}
    renamed: dict[str, str] = {}
    for name in sorted(names):
        head, _, k = name.rpartition("/")
        if head and k.isdigit() and head in names:
            new = name.replace("/", "~")
            while new in names:
                new += "~"
            renamed[name] = new
    if renamed:
        links = [link._replace(request=renamed.get(link.request, link.request)) for link in links]
    seen: dict[str, int] = {}
    logged: list[Logged] = []
    ids: list[str] = []
    for i in order:
        row, link = rows[i], links[i]
        k = seen.get(link.request, 0)
        seen[link.request] = k + 1
        logged.append(Logged(link.request, k, row.entitlement, row.arrived_ms, row.decided_ms, outcomes[i],
                             row.retry_after_ms, row.prompt_tokens, row.max_tokens))
        ids.append(row.request_id)
    return logged, ids


def _log_data(logged: Sequence[Logged], outputs: Mapping[str, int], services: Mapping[str, RecordedService],
              ticks: tuple[tuple[int, int, int], ...], specs: tuple[tuple[str, int, bool], ...], window_ms: int,
              digest: str, held_ms: tuple[tuple[int, int], ...] = ()) -> LogData:
    by_request: dict[str, list[Logged]] = {}
    for a in logged:
        by_request.setdefault(a.request, []).append(a)
    last_arrival_ms = max(a.arrived_ms for a in logged)
    observed = [clients.Observed(r, tries[0].entitlement, tuple((a.arrived_ms, a.decided_ms, a.outcome != "admitted",
                                                                 a.retry_after_ms) for a in tries))
                for r, tries in by_request.items()]
    model = clients.fit(observed, last_arrival_ms, window_ms)
    firsts = tuple(a for a in logged if a.attempt == 0)
    completed: dict[str, list[int]] = {}
    for a in firsts:
        if a.request in outputs:
            completed.setdefault(a.entitlement, []).append(outputs[a.request])
    typical = {ent: statistics.median_low(tokens) for ent, tokens in completed.items()}
    return LogData(tuple(logged), firsts, dict(outputs), typical, dict(services), ticks, specs, last_arrival_ms, model, digest,
                   window_ms, held_ms)


def _digest(root: Path) -> str:
    """sha256 over the log's files: each one's path under ``root`` and its bytes, in path order."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


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


def _services(decided: pl.DataFrame, completed: pl.DataFrame,
              attempt_of: Mapping[str, str]) -> dict[str, RecordedService]:
    """Each completed admitted attempt's service, timed from its admission as the proxy logged both (ms, like the
    windows), by its replay attempt id."""
    admitted = decided.filter(pl.col("outcome") == "admitted").select("request_id", pl.col("t_ms").alias("decided_ms"))
    rows = completed.join(admitted, on="request_id", how="inner").select(
        "request_id", ((pl.col("t_ms") - pl.col("decided_ms")) / 1000).alias("service_s"), "ttft_s",
        "prompt_tokens", "completion_tokens")
    return {attempt_of[rid]: RecordedService(max(0.0, service_s), ttft_s or 0.0, prompt, output)
            for rid, service_s, ttft_s, prompt, output in rows.iter_rows() if rid in attempt_of}


def match_rate(result: ReplayResult, recorded: pl.DataFrame) -> tuple[float | None, int]:
    """Share of recorded decisions the replay made the same way (same outcome for the same request id)."""
    d = result.decisions
    replayed = {rid if a == 0 else f"{rid}/{a}": o for rid, a, o in zip(d.request_id, d.attempt, d.outcome)}
    pairs = [(replayed.get(rid), outcome) for rid, outcome in recorded.select("request_id", "outcome").iter_rows()]
    if not pairs:
        return None, 0
    same = sum(1 for mine, theirs in pairs if mine == theirs)
    return same / len(pairs), len(pairs)
