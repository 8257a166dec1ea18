"""The request path: key → tenant → body → entitlement (by model) → admission → backend → settlement → events.

Order (docs/semantics.md#admission, docs/tenancy.md): the key is resolved to its tenant (401 if it names none), and a
tenant none of whose entitlements is Bound is refused (403) before the body is read; then the body is parsed, its
``model`` picks the tenant's entitlement (404 ``model_not_found`` if the tenant has none for it: other tenants'
models are never named), which must be Bound (403), n_in is estimated and ``max_tokens`` defaulted; then the
entitlement's budgets are checked (docs/budgets.md#enforcement; ``budgets.py``: a budget refusal never waits, an
admission holds its budget reservation until settlement); then the pool's admission queue runs the core's checks and
reserves in one synchronous call, or, for a refusal that may pass soon, holds the request until its final decision
(docs/queueing.md; ``waiting.py``). Admitted or refused, on arrival or after a wait, the request then goes one
way: admitted, to the backend; refused, a 429. Nothing here awaits Kafka: events are handed to
``EventPipeline.emit``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping

import orjson

from tokenpools.core.admission import Decision, Ticket
from tokenpools.core.budgets import Usage
from tokenpools.core.classes import EntitlementState
from tokenpools.core.engine_priority import engine_priority
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.settlement import Ending, used_tokens
from tokenpools.core.waiting import Waiter
from tokenpools.proxy.admission.body import BadRequest, Kind, ParsedRequest, parse
from tokenpools.proxy.admission.budgets import BudgetBook, BudgetRefusal, StaleRule
from tokenpools.proxy.admission.decided import Decided
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.backends.forward import REFUSED_BY, Flight, Result, Upstream
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.proxy.admission.ratelimit import ratelimit_headers
from tokenpools.proxy.admission.pools import PoolRuntime
from tokenpools.proxy.admission.retries import NOT_LINKED, Linked, RetryLinker, body_digest
from tokenpools.proxy.admission.responses import (
    UNKNOWN_KEY,
    budget_refusal,
    error_response,
    refusal,
    specs_not_loaded,
    unknown_key,
)
from tokenpools.proxy.http.messages import BodyTooLarge, Request, Response, StreamResponse
from tokenpools.proxy.access.tenancy import RuntimeOf, Tenancy, Tenant
from tokenpools.proxy.admission.waiting import Waits
from tokenpools.runtime.clock import Clock
from tokenpools.topics.declarations import Topics
from tokenpools.topics.records import CompletionStatus, RequestCompleted, RequestDecided

log = logging.getLogger(__name__)

WOULD_REFUSE = "X-TokenPools-Would-Refuse"  # on an admission in shadow: the refusal's code (docs/shadow.md)


class Handlers:
    def __init__(self, *, proxy_id: str, tenancy: Tenancy, pools: dict[str, PoolRuntime], upstream: Upstream,
                 events: EventPipeline, topics: Topics, metrics: ProxyMetrics, clock: Clock, max_body_bytes: int,
                 waits: Waits, budgets: BudgetBook, budget_retry_cap_ms: int, retries: RetryLinker,
                 budget_stale: StaleRule = StaleRule()) -> None:
        self.proxy_id = proxy_id
        self.pools = pools
        self.tenancy = tenancy
        self.runtime_of: Mapping[str, PoolRuntime] = {}
        self.use(tenancy, pools)
        self.specs_loaded = True  # False while the specs topic is not read to its end (spec_sources.SpecsFollower)
        self.upstream = upstream
        self.events = events
        self.topics = topics
        self.metrics = metrics
        self.clock = clock
        self.max_body_bytes = max_body_bytes
        self.waits = waits
        self.budgets = budgets  # the budget accounts (shared with the budgets topic's follower)
        self.budget_retry_cap_ms = budget_retry_cap_ms  # budgets.retry_after_max_s, in ms
        self.budget_stale = budget_stale  # budgets.on_stale and stale_after_s (docs/budgets.md#stale-views)
        self.retries = retries  # which attempt of a client's request each one is (docs/tuning.md#retries)
        self.flights: dict[str, Flight] = {}
        self._started_ms = clock.wall_ms()
        self._prefix = f"{proxy_id}-{self._started_ms:x}-"
        self._seq = 0
        self._completed: dict[tuple[str, str], int] = {}  # (pool, entitlement) → completions sent (core.resends)
        self._decisions: dict[tuple[str, str], int] = {}  # (pool, entitlement) → decisions sent (core.resends)

    async def chat(self, request: Request) -> Response | StreamResponse:
        return await self._handle(request, Kind.CHAT)

    async def completions(self, request: Request) -> Response | StreamResponse:
        return await self._handle(request, Kind.COMPLETION)

    async def embeddings(self, request: Request) -> Response | StreamResponse:
        return await self._handle(request, Kind.EMBEDDING)

    async def responses(self, request: Request) -> Response | StreamResponse:
        return await self._handle(request, Kind.RESPONSES)

    def use(self, tenancy: Tenancy, pools: dict[str, PoolRuntime]) -> None:
        """Put a new view in force (``live_specs``): one assignment each, no await between them."""
        self.runtime_of = RuntimeOf(tenancy.entitlements, pools)  # a snapshot of the runtimes, not per entitlement
        self.tenancy = tenancy

    async def models(self, request: Request) -> Response | StreamResponse:
        """The caller's models only (OpenAI's list shape), one per pool its key reaches."""
        tenant = self.tenancy.lookup(request.headers.get("authorization"))
        if tenant is None:
            return unknown_key() if self.specs_loaded else self._not_loaded(None)
        data = [{"id": model, "object": "model", "created": 0, "owned_by": "tokenpools"} for model in tenant.models]
        return Response(200, orjson.dumps({"object": "list", "data": data}), content_type="application/json")

    # ---- the admission path ---------------------------------------------------------------------------------
    async def _handle(self, request: Request, kind: Kind) -> Response | StreamResponse:
        t0 = self.clock.now_s()
        self._seq += 1
        rid = f"{self._prefix}{self._seq:x}"
        authorization = request.headers.get("authorization")
        tenancy = self.tenancy
        tenant = tenancy.lookup(authorization)
        if tenant is None:
            if not self.specs_loaded:
                return self._not_loaded(rid)
            return self._refuse(None, None, rid, AdmissionOutcome.REFUSED_UNKNOWN_KEY, UNKNOWN_KEY, 0)
        refused = self._not_bound(tenant, tenant.entitlements, rid, t0, request.headers, None)
        if refused is not None:  # nothing of this key is Bound: no need to read the body
            return refused
        checked = len(tenant.entitlements) == 1  # its one entitlement is Bound: checked above
        try:
            parsed, digest = await self._parse(request, kind)
            if self.tenancy is not tenancy:  # the specs changed while the body came: decide under the new ones
                checked = False
                tenancy = self.tenancy
                tenant = tenancy.lookup(authorization)
                if tenant is None:
                    return self._refuse(None, None, rid, AdmissionOutcome.REFUSED_UNKNOWN_KEY, UNKNOWN_KEY, 0)
            name = tenant.by_model.get(parsed.model)
            if name is None:
                raise BadRequest(f"model {parsed.model!r} is not served for this API key (its models: "
                                 f"{', '.join(repr(m) for m in tenant.models)})", "model_not_found", "model", 404)
        except BadRequest as exc:
            self.metrics.bad_requests[exc.code] += 1
            return error_response(exc.status, exc.message, "invalid_request_error", exc.code, exc.param,
                                  {"X-Request-Id": rid})
        refused = None if checked else self._not_bound(tenant, (name,), rid, t0, request.headers, digest)
        if refused is not None:
            return refused
        linked = self.retries.attempt(request.headers, tenant.digest, digest, rid, self.clock.now_s())
        runtime = self.runtime_of[name]
        pool = runtime.pool
        per_sequence = parsed.max_tokens if parsed.max_tokens is not None else pool.default_max_tokens
        cap = per_sequence * parsed.n
        spec = runtime.entitlements[name]
        if spec.budgets:  # before the rate checks and any wait: a budget refusal never waits
            reservation = Usage(prompt=parsed.prompt_tokens_est,
                                completion=runtime.controller.output_reservation(name, cap))
            refused_by = self.budgets.check(name, spec.budgets, reservation, self.clock.wall_ms(),
                                            self.budget_retry_cap_ms, spec.tenant)
            if refused_by is not None:
                return self._refuse_budget(runtime, name, rid, parsed, cap, refused_by, linked)
            stale = self.budget_stale
            unavailable = self.budgets.unavailable(name, spec.budgets, self.clock.wall_ms(), stale.stale_after_ms,
                                                   stale.on_stale)
            if unavailable is not None:  # its own spending waited too long for the agents' record: refuse, not guess
                return self._refuse(runtime, name, rid, AdmissionOutcome.BUDGET_UNAVAILABLE,
                                    f"budget {unavailable.name} of entitlement {name} cannot be checked: its spending "
                                    f"here has waited over {stale.stale_after_ms / 1000:g} s for the agents' record",
                                    stale.retry_after_s, linked)
            self.budgets.reserve(name, rid, reservation)  # held through a wait; released on refusal or at settlement
        now = self.clock.now_s()
        first = runtime.queue.admit(name, rid, parsed.prompt_tokens_est, cap, now)
        self.metrics.decision_time.observe(self.clock.now_s() - now)
        queued_ms = 0
        if isinstance(first, Waiter):
            # the wait starts: its refusal is demand the agents must see now, not when the wait ends
            self._decide(runtime, name, rid, parsed, cap, first.decision, 0, linked, waits=True)
            try:
                decision = await self.waits.wait(runtime, first)
            except asyncio.CancelledError:
                self._left_waiting(runtime, name, rid, parsed, cap, first, t0, linked)
                raise
            queued_ms = _ms(first.waited_s)
        else:
            decision = first
        self._decide(runtime, name, rid, parsed, cap, decision, queued_ms, linked)
        limits = (ratelimit_headers(runtime.controller, name, self.clock.now_s())
                  if name in runtime.entitlements else None)  # (removed while it waited: nothing to show)
        ticket = decision.ticket
        if ticket is None:
            self.budgets.release(name, rid)
            response = refusal(decision.outcome, decision.reason, decision.retry_after_s, rid, decision.retry_after_ms,
                               limits)
            response.headers[REFUSED_BY] = "proxy"
            return response
        self._evict(pool.name, decision)
        flight = Flight(ticket, asyncio.current_task())
        if parsed.stream:  # charge a stream as it runs past its reservation (docs/reservations.md)
            flight.watch(ticket.reserved_tokens - parsed.prompt_tokens_est,
                         lambda chunks: self._charge(runtime, name, ticket, parsed.prompt_tokens_est + chunks))
        self.flights[rid] = flight
        res = Result(backend=self.upstream.pick(pool.name), headers=limits or {})
        if decision.would_refuse is not None:  # shadow: the tenant sees what enforce will do (docs/shadow.md)
            res.headers[WOULD_REFUSE] = decision.would_refuse.value
        spec = runtime.entitlements.get(name)  # None: removed while it waited (live specs)
        engine = (engine_priority(spec.service_class, ticket.priority, runtime.constants.class_weights)
                  if pool.engine_priority and spec is not None else None)  # off: a client's `priority` is removed
        try:
            return await self.upstream.call(request, res, kind.path, parsed.rewrite(per_sequence, engine), rid,
                                            flight, t0, parsed.stream, parsed.stream and not parsed.client_wants_usage)
        finally:
            del self.flights[rid]
            self._settle(runtime, name, rid, parsed, flight, res, t0)

    def _decide(self, runtime: PoolRuntime, name: str, rid: str, parsed: ParsedRequest, cap: int,
                decision: Decision, queued_ms: int, linked: Linked, waits: bool = False) -> None:
        """Record the request's final decision, taken after ``queued_ms`` of waiting (0: on arrival), with the tokens
        it reserved, or would have; ``linked``: which attempt it is; ``waits``: the refusal a wait starts with, not a
        final decision."""
        ticket = decision.ticket
        reserved = (ticket.reserved_tokens if ticket is not None
                    else parsed.prompt_tokens_est + runtime.controller.output_reservation(name, cap))
        self._decided(Decided(
            runtime, name, rid, decision.outcome, decision.reason, decision.retry_after_s, parsed=parsed,
            max_tokens=cap, kv_bytes=ticket.reserved_kv_bytes if ticket else 0,
            priority=ticket.priority if ticket else _priority(runtime, name), cost=reserved,
            retry_after_ms=decision.retry_after_ms, queued_ms=queued_ms, waits=waits,
            would_refuse=decision.would_refuse, linked=linked))

    def _evict(self, pool: str, decision: Decision) -> None:
        """Abort the preemptible requests the core handed out for an admitted protected one, admitted on arrival or
        from the queue alike."""
        for victim in decision.evict:
            flight = self.flights.get(victim.request_id)
            if flight is not None and flight.evict():
                self.metrics.evictions[(pool, victim.entitlement)] += 1

    def _left_waiting(self, runtime: PoolRuntime, name: str, rid: str, parsed: ParsedRequest, cap: int,
                      waiter: Waiter, t0: float, linked: Linked) -> None:
        """The client went away while its request waited (``Waits.wait`` withdrew it): the decision is recorded as it
        stood, its latest refusal. One the queue admitted a moment before is recorded as admitted and settled at
        once as a client abort that used nothing (it never reached a backend), so its slot and tokens come back."""
        decision = waiter.decision
        self._decide(runtime, name, rid, parsed, cap, decision, _ms(waiter.waited_s), linked)
        if decision.ticket is None:
            self.budgets.release(name, rid)
        else:
            self._settle(runtime, name, rid, parsed, Flight(decision.ticket, None),
                         Result(status=CompletionStatus.CLIENT_ABORT, usage=(0, 0)), t0)

    def _not_bound(self, tenant: Tenant, names: tuple[str, ...], rid: str, t0: float, headers: Mapping[str, str],
                   digest: bytes | None) -> Response | None:
        """A 403 when none of ``names`` (the tenant's entitlements) is Bound now, naming the first and its state;
        ``headers`` and ``digest`` (of the body, None: not read) tell which attempt it refuses."""
        first: tuple[PoolRuntime, str, EntitlementState] | None = None
        for name in names:
            runtime = self.runtime_of[name]
            spec = runtime.entitlements[name]
            state = EntitlementState.EXPIRED if spec.is_expired(t0) else spec.state
            if state is EntitlementState.BOUND:
                return None
            first = first or (runtime, name, state)
        if first is None:
            return None
        runtime, name, state = first
        linked = self.retries.attempt(headers, tenant.digest, digest, rid, self.clock.now_s())
        return self._refuse(runtime, name, rid, AdmissionOutcome.REFUSED_NOT_BOUND,
                            f"entitlement {name} is {state.value}", 0, linked)

    async def _parse(self, request: Request, kind: Kind) -> tuple[ParsedRequest, bytes]:
        """The parsed body and the digest of its bytes (a retry sends the same ones)."""
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        try:
            raw = await request.read()
        except BodyTooLarge:
            raise _too_large(self.max_body_bytes) from None
        return parse(kind, raw), body_digest(raw)

    def _charge(self, runtime: PoolRuntime, name: str, ticket: Ticket, used: int) -> None:
        """Charge a running stream's use past its reservation and what it charged so far (about one token per
        chunk; the backend's usage settles it exactly at the end)."""
        charged = runtime.controller.charge(ticket, used, self.clock.now_s())
        if charged:
            runtime.own.charged(name, self.clock.wall_ms(), charged)

    def _settle(self, runtime: PoolRuntime, name: str, rid: str, parsed: ParsedRequest, flight: Flight,
                res: Result, t0: float) -> None:
        """Release the reservation with what was really used and report the completion."""
        ticket = flight.ticket
        now = self.clock.now_s()
        estimate = parsed.prompt_tokens_est
        prompt, completion = used_tokens(res.usage, _ENDING.get(res.status, Ending.CUT), parsed.stream, res.chunks,
                                         estimate, ticket.max_tokens)
        refund = runtime.controller.release(ticket, prompt + completion, now)
        cached = min(res.cached_prompt_tokens, prompt) if res.usage is not None else 0
        ran_to_end = res.status is CompletionStatus.OK and (res.usage is not None or parsed.stream)
        if ran_to_end and name in runtime.entitlements:  # (a removed entitlement has no estimate to teach)
            runtime.controller.observe(ticket, completion)  # ran to its end: teach the output estimate
        self.waits.wake(runtime)  # a slot (and maybe tokens) came back: a waiter may pass now
        pool = runtime.pool.name
        key = (pool, name, res.status.value)
        self.metrics.completions[key] += 1
        self.metrics.tokens[(pool, name, "prompt")] += prompt
        self.metrics.tokens[(pool, name, "completion")] += completion
        self.metrics.latency[(pool, name)].observe(now - t0)
        if res.ttft_s is not None:
            self.metrics.ttft[(pool, name)].observe(res.ttft_s)
        if self.metrics.gen_ai is not None:  # proxy.metric_names: gen_ai or both
            self.metrics.gen_ai.completed(pool, name, parsed.kind.operation, runtime.pool.model, status=res.status,
                                          prompt=prompt, completion=completion, server_s=now - t0,
                                          client_s=now - ticket.admitted_s, ttft_s=res.ttft_s)
        if res.status is CompletionStatus.BACKEND_REFUSED:
            self.metrics.backend_refusals[(pool, str(res.http_status))] += 1
        elif res.error_kind:
            self.metrics.backend_errors[(pool, res.error_kind)] += 1
        wall = self.clock.wall_ms()
        runtime.own.released(name, wall, refund)
        spec = runtime.entitlements.get(name)  # the budgets in force now (None: removed; its reservation goes)
        self.budgets.settle(name, spec.budgets if spec is not None else (), rid, wall,
                            Usage(prompt, cached, completion, 1) if prompt or completion else Usage())
        sequence = self._completed.get((pool, name), 0) + 1  # taken only once the record is valid: no gap
        try:
            record = RequestCompleted(
                request_id=rid, pool=pool, entitlement=name, proxy_id=self.proxy_id, t_ms=wall,
                proxy_start_ms=self._started_ms, sequence=sequence,
                admitted_t_ms=max(0, wall - int((now - ticket.admitted_s) * 1000)), status=res.status,
                prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=cached,
                reserved_tokens=ticket.reserved_tokens,
                kv_bytes=ticket.reserved_kv_bytes, ttft_s=res.ttft_s, e2e_s=max(0.0, now - t0),
                backend=res.backend, http_status=res.http_status or (499 if res.status is CompletionStatus.CLIENT_ABORT else 0))
        except ValueError as exc:  # a bug, not a reason to fail the request: count and log
            self.events.counts.dropped += 1
            log.error("completion record for %s is invalid: %s", rid, exc)
            return
        self._completed[(pool, name)] = sequence
        self.events.emit(self.topics.completions.name, pool, record)

    # ---- refusals and decisions -----------------------------------------------------------------------------
    def _not_loaded(self, rid: str | None) -> Response:
        """A key not known before the specs topic has been read to its end: no decision (it may be in a record not
        read yet), a 503 to retry shortly, counted."""
        self.metrics.specs_not_loaded += 1
        return specs_not_loaded(rid)

    def _refuse(self, runtime: PoolRuntime | None, name: str | None, rid: str, outcome: AdmissionOutcome,
                reason: str, retry_after_s: int, linked: Linked = NOT_LINKED) -> Response:
        priority = runtime.controller.limits_of(name).priority if runtime is not None and name is not None else 0.0
        self._decided(Decided(runtime, name, rid, outcome, reason, retry_after_s, priority=priority, linked=linked))
        limits = (ratelimit_headers(runtime.controller, name, self.clock.now_s())
                  if runtime is not None and name is not None else None)  # an unknown key: no entitlement to show
        response = refusal(outcome, reason, retry_after_s, rid, extra=limits)
        response.headers[REFUSED_BY] = "proxy"
        return response

    def _refuse_budget(self, runtime: PoolRuntime, name: str, rid: str, parsed: ParsedRequest, cap: int,
                       refused: BudgetRefusal, linked: Linked) -> Response:
        """The 429 of a request a budget of its entitlement cannot take, and its decision: the cost it would have
        reserved, the wait until the reset (capped)."""
        cost = parsed.prompt_tokens_est + runtime.controller.output_reservation(name, cap)
        self._decided(Decided(
            runtime, name, rid, AdmissionOutcome.REFUSED_BUDGET, refused.reason, refused.retry_after_s, parsed=parsed,
            max_tokens=cap, priority=_priority(runtime, name), cost=cost, retry_after_ms=refused.retry_after_ms,
            linked=linked))
        response = budget_refusal(refused, rid, ratelimit_headers(runtime.controller, name, self.clock.now_s()))
        response.headers[REFUSED_BY] = "proxy"
        return response

    def _decided(self, decided: Decided) -> None:
        """Count the decision (unless it is a refusal the request waits out), teach the retry linker and this
        proxy's fleet counts, and emit its ``request_decided`` event."""
        runtime, name, rid, outcome = decided.runtime, decided.name, decided.rid, decided.outcome
        parsed, waits, would_refuse, linked = decided.parsed, decided.waits, decided.would_refuse, decided.linked
        cost = decided.cost
        pool = runtime.pool.name if runtime is not None else ""
        if not waits:
            self.metrics.decisions[(pool, name or "", outcome.value)] += 1
            self.retries.decided(linked, rid, outcome is not AdmissionOutcome.ADMITTED, self.clock.now_s())
            if would_refuse is not None:
                self.metrics.would_refuse[(pool, name or "", would_refuse.value)] += 1
        estimate = parsed.prompt_tokens_est if parsed is not None else 0
        wall = self.clock.wall_ms()
        if runtime is not None and name is not None:  # what this proxy did, for the fleet counts
            if outcome is AdmissionOutcome.ADMITTED:
                runtime.own.admitted(name, wall, cost)
            else:
                runtime.own.refused(name, wall, cost)
        retry = linked.identity
        # numbered per (pool, entitlement), apart from the completions; taken only once the record is valid: no gap
        sequence = self._decisions.get((pool, name), 0) + 1 if name is not None else None
        try:
            record = RequestDecided(
                request_id=rid, pool=pool, entitlement=name, proxy_id=self.proxy_id, t_ms=wall,
                proxy_start_ms=self._started_ms if sequence is not None else None, sequence=sequence,
                outcome=outcome, reason=decided.reason, retry_after_s=decided.retry_after_s,
                retry_after_ms=decided.retry_after_ms, queued_ms=decided.queued_ms, waits=waits,
                prompt_tokens_est=estimate, max_tokens=decided.max_tokens, cost_tokens=cost,
                kv_bytes=decided.kv_bytes, priority=max(0.0, decided.priority), stream=bool(parsed and parsed.stream),
                would_refuse=would_refuse, attempt=retry.attempt if retry else None,
                first_request_id=retry.first_request_id if retry else None,
                retry_link=retry.link if retry else None,
                limits_version=runtime.limits_version if runtime is not None else None)
        except ValueError as exc:
            self.events.counts.dropped += 1
            log.error("decision record for %s is invalid: %s", rid, exc)
            return
        if sequence is not None and name is not None:
            self._decisions[(pool, name)] = sequence
        self.events.emit(self.topics.requests.name, pool, record)


_ENDING = {  # how a completion status ends a request, for its charge (core.settlement); any other: Ending.CUT
    CompletionStatus.OK: Ending.RAN,
    CompletionStatus.BACKEND_REFUSED: Ending.BACKEND_FAILED,
    CompletionStatus.BACKEND_ERROR: Ending.BACKEND_FAILED,
}


def _priority(runtime: PoolRuntime, name: str) -> float:
    """The entitlement's priority in force; 0 for one removed while its request waited (live specs)."""
    return runtime.controller.limits_of(name).priority if name in runtime.entitlements else 0.0


def _ms(seconds: float) -> int:
    """A wait in whole ms, rounded up: a request that waited at all says so."""
    return max(0, math.ceil(seconds * 1000))


def _too_large(limit: int) -> BadRequest:
    return BadRequest(f"request body exceeds {limit} bytes", "body_too_large", None, 413)
