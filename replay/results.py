"""The numbers each experiment reports (``results.json``), and the paper's values to put beside them.

``summarize(name, runs)`` takes the replay results of one experiment keyed by policy ("token-pools", "none") and
returns plain JSON data: floats rounded to 4 decimals, keys sorted when written, no time of day anywhere, so the
same replay gives byte-identical files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tokenpools.core.budgets import NEVER_END_MS, iso_ms
from tokenpools.replay import metrics as m
from tokenpools.replay.replayer import ReplayResult

POLICY_KEYS = {"token-pools": "token_pools", "none": "baseline"}
MODE_KEYS = {"open": "open_loop", "closed": "closed_loop"}  # results.json: <mode>.<experiment>.<policy>.<metric>
MODE_LABELS = {"open": "open loop", "closed": "closed loop"}  # as every table names them

PAPER: dict[str, dict[str, object]] = {
    "exp1.token_pools.guaranteed_p99_ttft_s": "< 1.2",
    "exp1.baseline.guaranteed_p99_ttft_s": "19+",
    "exp1.token_pools.max_waiting": 0,
    "exp1.baseline.max_waiting": 34,
    "exp1.token_pools.spot_throttle_rate": 0.47,
    "exp2.token_pools.priority.copilot": 93.8,
    "exp2.token_pools.priority.synth": 20.3,
    "exp2.token_pools.priority.reports": "≈ 60",
    "exp2.token_pools.low_priority_denials.copilot": 0,
    "exp2.token_pools.low_priority_denials.synth": 317,
    "exp2.token_pools.low_priority_denials.reports": 22,
    "exp2.token_pools.low_priority_refusals.copilot": 0,
    "exp2.token_pools.low_priority_refusals.synth": 317,
    "exp2.token_pools.low_priority_refusals.reports": 22,
    "exp2.token_pools.peak_debt.copilot": 0.607,
    "exp2.token_pools.peak_debt.synth": 0.775,
    "exp2.token_pools.peak_debt.reports": 0.414,
    "exp2.token_pools.debt_decay_s": "≈ 50",
    "exp2.token_pools.successes.copilot": 700,
    "exp2.token_pools.successes.synth": 381,
    "exp2.token_pools.successes.reports": 60,
}


def r4(value: float | None) -> float | None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return round(float(value), 4)


def fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:.3g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {fmt(v, digits)}" for k, v in value.items())
    return str(value)


def short(name: str) -> str:
    """elastic-copilot → copilot (the paper's names); Exp-1 names stay."""
    return name.removeprefix("elastic-")


NOT_EXHAUSTED = "not exhausted"


def budget_rows(result: ReplayResult) -> list[dict[str, object]]:
    """Per budget and period the replay saw (docs/budgets.md#replay): its allowance and spending in units, when it
    ran out (the event time of its first ``budget_exhausted`` refusal, RFC 3339 in the budget's time zone) or
    "not exhausted", and how many decisions it refused. Empty when no entitlement has a budget."""
    return [{
        "entitlement": p.entitlement,
        "budget": p.budget,
        "period_start": iso_ms(p.start_ms, p.time_zone),
        "period_end": iso_ms(p.end_ms, p.time_zone) if p.end_ms < NEVER_END_MS else None,
        "allowance": r4(p.allowance),
        "spent": r4(p.spent_units),
        "spent_tokens": {"prompt": p.spent.prompt, "cached_prompt": p.spent.cached_prompt,
                         "completion": p.spent.completion, "requests": p.spent.requests},
        "exhausted_at": NOT_EXHAUSTED if p.exhausted_ms is None else iso_ms(p.exhausted_ms, p.time_zone),
        "refused_budget_exhausted": p.refused,
    } for p in result.budgets]


def budget_lines(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """One line per budget period, for a command's summary."""
    return [f"budget {r['entitlement']}/{r['budget']} from {r['period_start']}: allowance {fmt(r['allowance'])}, spent "
            f"{fmt(r['spent'])}, " + (str(r["exhausted_at"]) if r["exhausted_at"] == NOT_EXHAUSTED else
                                     f"exhausted at {r['exhausted_at']}") +
            f", {r['refused_budget_exhausted']} refused budget_exhausted" for r in rows]


def _common(result: ReplayResult) -> dict[str, object]:
    names = [e.name for e in result.scenario.entitlements]
    phases = result.scenario.phases
    waits = m.waits_by_reason(result)
    return {
        "max_waiting": m.max_waiting(result),
        "max_sampled_waiting": max((p[2] for p in result.samples.pool), default=0),
        "max_backend_wait_s": r4(max(result.completions.queue_s, default=0.0)),
        "max_waiting_by_phase": {p.name: m.max_waiting(result, p.start_s, p.end_s) for p in phases},
        "decisions": m.decision_counts(result),
        "decisions_by_phase": {p.name: m.decision_counts(result, p.start_s, p.end_s) for p in phases},
        "successes": {short(n): m.served(result, n) for n in names},
        "abandoned": {short(n): result.abandoned.get(n, 0) for n in names},
        "p99_ttft_s": {short(n): r4(m.p99(m.ttfts(result, [n]))) for n in names},
        "p99_client_ttft_s": {short(n): r4(m.p99(m.ttfts(result, [n], client=True))) for n in names},
        "p99_e2e_s": {short(n): r4(m.p99(m.e2es(result, [n]))) for n in names},
        "refusals": {short(n): m.refusals(result).get(n, {}) for n in names},
        "queue_outcomes": {short(n): dict(sorted(result.queue_outcomes.get(n, {}).items())) for n in names},
        "waits_by_reason": {short(n): waits.get(n, {}) for n in names},
        "p99_queue_wait_s": {short(n): r4(m.p99(m.queue_waits(result, [n]))) for n in names},
        "preempted": result.preempted,
        **({"shadow": {short(n): v for n, v in shadow.items()}} if (shadow := m.shadow_counts(result)) else {}),
        **({"budgets": budgets} if (budgets := budget_rows(result)) else {}),
    }


def _exp1(result: ReplayResult) -> dict[str, object]:
    guaranteed = [e.name for e in result.scenario.entitlements if e.service_class.protected]
    _, overload, after = result.scenario.phases
    out = _common(result)
    out.update({
        "guaranteed_p99_ttft_s": r4(m.p99(m.ttfts(result, guaranteed))),
        "guaranteed_p99_client_ttft_s": r4(m.p99(m.ttfts(result, guaranteed, client=True))),
        "guaranteed_p99_e2e_s": r4(m.p99(m.e2es(result, guaranteed))),
        "guaranteed_max_ttft_s": r4(max(m.ttfts(result, guaranteed), default=None)),
        "guaranteed_p99_ttft_by_phase_s": {
            p.name: r4(m.p99(m.ttfts(result, guaranteed, p.start_s, p.end_s))) for p in result.scenario.phases
        },
        "guaranteed_refusals": {
            short(n): sum(v for k, v in m.decision_counts(result).get(n, {}).items() if k != "admitted") for n in guaranteed
        },
        "spot_throttle_rate": r4(m.refusal_rate(result, "spot-b", overload.start_s, overload.end_s)),
        "spot_throttle_rate_first_attempts": r4(m.refusal_rate(result, "spot-b", overload.start_s, overload.end_s, True)),
        "spot_throttle_rate_after_overload": r4(m.refusal_rate(result, "spot-b", after.start_s, after.end_s)),
        "spot_mean_running_by_phase": {
            p.name: r4(m.mean_running(result, "spot-b", p.start_s, p.end_s)) for p in result.scenario.phases
        },
    })
    return out


def _exp2(result: ReplayResult) -> dict[str, object]:
    names = [e.name for e in result.scenario.entitlements]
    phases = {p.name: p for p in result.scenario.phases}
    _, outage, recovered, _ = result.scenario.phases
    out = _common(result)
    if result.entitlement_ticks:
        peaks = {short(n): m.peak_debt(result, n) for n in names}
        first = m.first_refusals(result)
        out.update({
            "priority": {short(n): r4(m.first_priority(result, n)) for n in names},
            "low_priority_denials": {
                short(n): m.decision_counts(result).get(n, {}).get("low_priority", 0) for n in names
            },
            "low_priority_refusals": {  # first refusals: a wait that timed out is not counted twice
                short(n): first.get(n, {}).get("low_priority", 0) for n in names
            },
            "peak_debt": {k: r4(v[0]) if v else None for k, v in peaks.items()},
            "mean_demand_in_outage_tokens_per_s": {
                short(n): r4(m.mean_demand(result, n, outage.start_s, outage.end_s)) for n in names},
            "peak_debt_t_s": {k: r4(v[1]) if v else None for k, v in peaks.items()},
            "debt_decay_s": r4(m.debt_decay_s(result, recovered.start_s, recovered.end_s)),
            "debt_decay_abs_s": r4(m.debt_decay_s(result, recovered.start_s, recovered.end_s, absolute=True)),
        })
    out.update({
        "mean_running_in_outage": {short(n): r4(m.mean_running(result, n, outage.start_s, outage.end_s)) for n in names},
        "successes_in_outage": {short(n): m.served_between(result, n, outage.start_s, outage.end_s) for n in names},
        "output_tokens_per_s_by_phase": {
            p: {short(n): r4(m.output_tokens_per_s(result, n, ph.start_s, ph.end_s)) for n in names}
            for p, ph in phases.items()
        },
        "p99_ttft_by_phase_s": {
            p: {short(n): r4(m.p99(m.ttfts(result, [n], ph.start_s, ph.end_s))) for n in names}
            for p, ph in phases.items()
        },
    })
    return out


SUMMARIES = {"exp1": _exp1, "exp2": _exp2}


def summarize(name: str, runs: Mapping[str, ReplayResult]) -> dict[str, object]:
    """{"token_pools": {...}, "baseline": {...}} for one experiment."""
    return {POLICY_KEYS.get(policy, policy): SUMMARIES[name](result) for policy, result in runs.items()}


TARGETS: tuple[tuple[str, str], ...] = (
    # (key, what the issue asks of the run); each value is measured per load model, never tuned to
    ("exp1_guaranteed_p99_client_ttft_s", "Exp 1: guaranteed P99 client TTFT, incl. waits, refusals and retries (s)"),
    ("exp2_copilot_p99_client_ttft_s", "Exp 2: copilot P99 client TTFT (s), token pools vs no admission control"),
    ("exp2_successes_vs_baseline", "Exp 2: successful requests, token pools ÷ no admission control"),
    ("exp2_outage_copilot_per_synth", "Exp 2: copilot ÷ synth successes completed in the outage (token pools)"),
    ("exp1_guaranteed_given_up", "Exp 1: guaranteed requests given up (token pools)"),
    ("exp2_elastic_given_up", "Exp 2: elastic requests given up (token pools)"),
)


def _ratio(a: object, b: object) -> float | None:
    return r4(a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _total(values: object) -> int | None:
    return sum(values.values()) if isinstance(values, Mapping) else None


def _targets(results: Mapping[str, object]) -> dict[str, object]:
    """The targets of one load model's results ({experiment: {policy: summary}}); None where an experiment is missing."""
    guaranteed = ("guaranteed-a", "guaranteed-c")
    given_up = lookup(results, "exp1.token_pools.abandoned")
    return {
        "exp1_guaranteed_p99_client_ttft_s": lookup(results, "exp1.token_pools.guaranteed_p99_client_ttft_s"),
        "exp2_copilot_p99_client_ttft_s": {
            "token_pools": lookup(results, "exp2.token_pools.p99_client_ttft_s.copilot"),
            "baseline": lookup(results, "exp2.baseline.p99_client_ttft_s.copilot")},
        "exp2_successes_vs_baseline": _ratio(_total(lookup(results, "exp2.token_pools.successes")),
                                             _total(lookup(results, "exp2.baseline.successes"))),
        "exp2_outage_copilot_per_synth": _ratio(lookup(results, "exp2.token_pools.successes_in_outage.copilot"),
                                                lookup(results, "exp2.token_pools.successes_in_outage.synth")),
        "exp1_guaranteed_given_up": (sum(v for k, v in given_up.items() if k in guaranteed)
                                     if isinstance(given_up, Mapping) else None),
        "exp2_elastic_given_up": _total(lookup(results, "exp2.token_pools.abandoned")),
    }


def targets(by_mode: Mapping[str, Mapping[str, object]]) -> dict[str, dict[str, object]]:
    """{target key: {"open_loop": value, "closed_loop": value}} for the modes that ran (``TARGETS``)."""
    out: dict[str, dict[str, object]] = {key: {} for key, _ in TARGETS}
    for mode_key, results in by_mode.items():
        for key, value in _targets(results).items():
            out[key][mode_key] = value
    return out


def lookup(results: Mapping[str, object], dotted: str) -> object:
    """results["exp1"]["token_pools"]["max_waiting"] for "exp1.token_pools.max_waiting" (None if absent)."""
    node: object = results
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node
