"""Rich tables for ``tokenpools validate`` and ``tokenpools demo`` (imported only by those commands)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from tokenpools.config.documents import GIB
from tokenpools.config.loader import LoadedConfig
from tokenpools.config.settings import PolicySettings
from tokenpools.config.summary import PoolSummary
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState
from tokenpools.tables import Column, console_for, fit

_STATE_STYLE = {
    EntitlementState.BOUND: "green",
    EntitlementState.DEGRADED: "red",
    EntitlementState.PENDING: "yellow",
    EntitlementState.EXPIRED: "dim",
}


def _num(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _triple(c: Capacity | None) -> str:
    """tokens/s · KV GiB · slots."""
    if c is None:
        return "—"
    return f"{_num(c.tokens_per_s)} · {c.kv_bytes / GIB:.2f} · {_num(c.concurrency)}"


def _weight(w: float) -> str:
    return f"{w:,.1f}" if w >= 10 else f"{w:.3g}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def pool_table(s: PoolSummary, width: int) -> Table:
    p = s.pool
    columns = (Column("dimension", keep=3), Column("per replica", number=True, keep=1),
               Column(f"now ({_plural(p.replicas, 'replica')})", number=True, keep=2),
               Column(f"max ({_plural(p.max_replicas, 'replica')})", number=True, keep=2))
    c = p.kv_bytes_per_token
    caps = (p.per_replica, s.capacity, s.max_capacity)
    rows = [["tokens/s (prompt + completion)", *(_num(x.tokens_per_s) for x in caps)],
            ["KV cache GiB", *(f"{x.kv_bytes / GIB:.2f}" for x in caps)],
            ["  = context tokens", *(_num(x.kv_bytes // c) for x in caps)],
            ["concurrency (sequences)", *(_num(x.concurrency) for x in caps)]]
    return fit(columns, rows, width, title=f"TokenPool [bold]{p.name}[/] — {p.model}")


def pool_notes(config: LoadedConfig, s: PoolSummary) -> list[str]:
    p = s.pool
    ref = config.backend_refs[p.name]
    return [
        f"c = {p.kv_bytes_per_token:,} B/token · replicas {p.replicas} in [{p.min_replicas}, {p.max_replicas}] · "
        f"default max_tokens {p.default_max_tokens} · token bucket {p.token_bucket_window_s:g} s",
        f"backend {ref.api_version} {ref.kind} {ref.namespace + '/' if ref.namespace else ''}{ref.name} · "
        f"endpoints {', '.join(config.endpoints[p.name]) or 'none'}",
    ]


ENTITLEMENT_COLUMNS = (
    Column("entitlement", keep=9), Column("tenant", keep=3), Column("class", keep=5),
    Column("SLO ms", number=True, keep=6), Column("baseline tok/s · GiB · slots", number=True, wrap=True, keep=4),
    Column("state", keep=8), Column("w_e", number=True, keep=7),
    Column("limit tok/s · GiB · slots", number=True, wrap=True, keep=6), Column("keys", number=True, keep=1),
)


def entitlement_table(s: PoolSummary, policy: PolicySettings, width: int) -> Table:
    rows = []
    for r in s.rows:
        e = r.spec
        state = r.binding.state
        w = "—" if r.priority is None else _weight(r.priority)
        rows.append([
            e.name, e.tenant, e.service_class.value, _num(e.slo_ms),
            _triple(e.baseline) if e.service_class.has_baseline else "none",
            f"[{_STATE_STYLE[state]}]{state.value}[/]", w if state is EntitlementState.BOUND else f"({w})",
            _triple(r.static_limit), str(r.api_keys),
        ])
    mean = "—" if s.mean_slo_ms is None else f"{s.mean_slo_ms:,.0f} ms"
    bound = sum(1 for r in s.rows if r.binding.state is EntitlementState.BOUND)
    notes = [
        f"Σ Bound baselines {_triple(s.bound_baselines)} of {_triple(s.max_capacity)} at max replicas",
        f"ℓ̄* = {mean} (mean SLO of {_plural(bound, 'Bound entitlement')}; policy.mean_slo = {policy.mean_slo}) · "
        f"α_slo {policy.alpha_slo:g} · α_burst {policy.alpha_burst:g} · α_debt {policy.alpha_debt:g}",
        "w_e: priority with no burst and no debt, (w_e) for a non-Bound entitlement once Bound; "
        "limit: the fail-static limit (no measurement yet)",
    ]
    notes += [f"{r.spec.name}: {r.binding.state.value}: {r.binding.reason}"
              for r in s.rows if r.binding.state is not EntitlementState.BOUND]
    return fit(ENTITLEMENT_COLUMNS, rows, width, title=f"Entitlements of {s.pool.name}", caption="\n".join(notes))


def render(console: Console, config: LoadedConfig, summaries: list[PoolSummary], policy: PolicySettings) -> None:
    for s in summaries:
        console.print(pool_table(s, console.width))
        for line in pool_notes(config, s):
            console.print(line, highlight=False)
        console.print()
        console.print(entitlement_table(s, policy, console.width))
        console.print()


def make_console(stderr: bool = False) -> Console:
    """``tokenpools.tables.console_for`` on stdout (or stderr): ``COLUMNS`` or the terminal's width, wide in a pipe."""
    return console_for(sys.stderr if stderr else None)
