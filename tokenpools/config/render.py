"""Rich tables for ``tokenpools validate`` and ``tokenpools demo`` (imported only by those commands)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tokenpools.config.documents import GIB
from tokenpools.config.loader import LoadedConfig
from tokenpools.config.settings import PolicySettings
from tokenpools.config.summary import PoolSummary
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState

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


def pool_table(s: PoolSummary) -> Table:
    p = s.pool
    table = Table(title=f"TokenPool [bold]{p.name}[/] — {p.model}", title_justify="left")
    table.add_column("dimension")
    table.add_column("per replica", justify="right")
    table.add_column(f"now ({_plural(p.replicas, 'replica')})", justify="right")
    table.add_column(f"max ({_plural(p.max_replicas, 'replica')})", justify="right")
    c = p.kv_bytes_per_token
    table.add_row("tokens/s (prompt + completion)", *(_num(x.tokens_per_s) for x in (p.per_replica, s.capacity, s.max_capacity)))
    table.add_row("KV cache GiB", *(f"{x.kv_bytes / GIB:.2f}" for x in (p.per_replica, s.capacity, s.max_capacity)))
    table.add_row("  = context tokens", *(_num(x.kv_bytes // c) for x in (p.per_replica, s.capacity, s.max_capacity)))
    table.add_row("concurrency (sequences)", *(_num(x.concurrency) for x in (p.per_replica, s.capacity, s.max_capacity)))
    return table


def pool_notes(config: LoadedConfig, s: PoolSummary) -> list[str]:
    p = s.pool
    ref = config.backend_refs[p.name]
    return [
        f"c = {p.kv_bytes_per_token:,} B/token · replicas {p.replicas} in [{p.min_replicas}, {p.max_replicas}] · "
        f"default max_tokens {p.default_max_tokens} · token bucket {p.token_bucket_window_s:g} s",
        f"backend {ref.api_version} {ref.kind} {ref.namespace + '/' if ref.namespace else ''}{ref.name} · "
        f"endpoints {', '.join(config.endpoints[p.name]) or 'none'}",
    ]


def entitlement_table(s: PoolSummary, policy: PolicySettings) -> Table:
    table = Table(title=f"Entitlements of {s.pool.name}", title_justify="left")
    for name, justify in (("entitlement", "left"), ("tenant", "left"), ("class", "left"), ("SLO ms", "right"),
                          ("baseline tok/s · GiB · slots", "right"), ("state", "left"), ("w_e", "right"),
                          ("limit tok/s · GiB · slots", "right"), ("keys", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in s.rows:
        e = r.spec
        state = r.binding.state
        w = "—" if r.priority is None else _weight(r.priority)
        table.add_row(
            e.name, e.tenant, e.service_class.value, _num(e.slo_ms),
            _triple(e.baseline) if e.service_class.has_baseline else "none",
            f"[{_STATE_STYLE[state]}]{state.value}[/]", w if state is EntitlementState.BOUND else f"({w})",
            _triple(r.static_limit), str(r.api_keys),
        )
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
    table.caption = "\n".join(notes)
    table.caption_justify = "left"
    return table


def render(console: Console, config: LoadedConfig, summaries: list[PoolSummary], policy: PolicySettings) -> None:
    for s in summaries:
        console.print(pool_table(s))
        for line in pool_notes(config, s):
            console.print(line, highlight=False)
        console.print()
        console.print(entitlement_table(s, policy))
        console.print()


def make_console(stderr: bool = False) -> Console:
    """A console that does not squeeze the tables to 80 columns when output is piped."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=max(console.width, 150))
    return console
