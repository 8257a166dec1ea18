"""``report.md`` and ``results.json``: our numbers beside the paper's, the choices, the differences and why.

Everything written is a function of the replay results (no clock, no host name), so a rerun writes the same bytes.
The prose that explains a difference quotes the numbers of *this* run; the mechanism it names is the one seen with
the default parameters (a ``--set`` run says so in its header).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenpools.replay.experiments import CHOICES
from tokenpools.replay.results import MODE_KEYS, NOT_EXHAUSTED, PAPER, TARGETS, fmt, lookup, short
from tokenpools.replay.texts import DIFFERENCES, FINDINGS


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


POLICY_TITLES = {"token_pools": "token pools", "baseline": "no admission control"}

ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, results key under <exp>.<policy>., paper key or "")
    ("exp1", "guaranteed P99 TTFT (s)", "guaranteed_p99_ttft_s"),
    ("exp1", "guaranteed P99 client TTFT incl. retries (s)", "guaranteed_p99_client_ttft_s"),
    ("exp1", "guaranteed P99 end-to-end (s)", "guaranteed_p99_e2e_s"),
    ("exp1", "max backend waiting queue", "max_waiting"),
    ("exp1", "spot refused / spot attempts in overload", "spot_throttle_rate"),
    ("exp1", "spot first attempts refused in overload", "spot_throttle_rate_first_attempts"),
    ("exp1", "spot refused / attempts after c left", "spot_throttle_rate_after_overload"),
    ("exp1", "spot mean running slots per phase", "spot_mean_running_by_phase"),
    ("exp1", "guaranteed refusals (all reasons)", "guaranteed_refusals"),
    ("exp1", "requests given up (after 5 retries, or refused with no retry)", "abandoned"),
    ("exp2", "priority w_e at first tick", "priority"),
    ("exp2", "low-priority refusals (first refusals: a wait at the proxy counts once, at its start)", "low_priority_refusals"),
    ("exp2", "low-priority denials (429)", "low_priority_denials"),
    ("exp2", "successes in the outage", "successes_in_outage"),
    ("exp2", "successful requests", "successes"),
    ("exp2", "peak debt d_e", "peak_debt"),
    ("exp2", "debt back below 0.05 after recovery (s)", "debt_decay_s"),
    ("exp2", "debt within ±0.05 after recovery (s)", "debt_decay_abs_s"),
    ("exp2", "mean running slots in the outage", "mean_running_in_outage"),
    ("exp2", "P99 TTFT (s)", "p99_ttft_s"),
    ("exp2", "P99 client TTFT incl. retries (s)", "p99_client_ttft_s"),
    ("exp2", "max backend waiting queue", "max_waiting"),
    ("exp2", "requests given up (after 5 retries, or refused with no retry)", "abandoned"),
)


def _paper(exp: str, key: str) -> str:
    direct = PAPER.get(f"{exp}.token_pools.{key}")
    if direct is not None:
        return fmt(direct)
    parts = {k.rsplit(".", 1)[1]: v for k, v in PAPER.items() if k.startswith(f"{exp}.token_pools.{key}.")}
    return fmt(parts) if parts else "—"


def modes(results: Mapping[str, object]) -> list[str]:
    """The load models in ``results`` (its ``open_loop`` / ``closed_loop`` keys), in the order they ran."""
    return [key for key in MODE_KEYS.values() if isinstance(results.get(key), Mapping)]


def _label(mode_key: str) -> str:
    return mode_key.replace("_", " ")


def _columns(results: Mapping[str, object]) -> list[tuple[str, str]]:
    """(header, results prefix) per (load model, policy): every number sits under the model it comes from."""
    return [(f"{POLICY_TITLES[policy]}, {_label(mode)}", f"{mode}.{{exp}}.{policy}")
            for mode in modes(results) for policy in ("token_pools", "baseline")]


def _empty(cells: Sequence[str]) -> bool:
    """A row with nothing measured in any column: left out of the report."""
    return all(cell == "—" for cell in cells)


def _value(value: object) -> str:
    if isinstance(value, Mapping) and not value:
        return "0"
    return fmt(value)


def results_table(results: Mapping[str, object], experiments: Sequence[str]) -> str:
    columns = _columns(results)
    lines = ["| experiment | metric | paper (token pools) | " + " | ".join(h for h, _ in columns) + " |",
             "|---|---|---|" + "---|" * len(columns)]
    for exp, label, key in ROWS:
        if exp not in experiments:
            continue
        extra = ""
        if exp == "exp1" and key in ("guaranteed_p99_ttft_s", "max_waiting"):
            extra = f" (baseline: {fmt(PAPER[f'exp1.baseline.{key}'])})"
        cells = [fmt(lookup(results, f"{prefix.format(exp=exp)}.{key}")) for _, prefix in columns]
        if _empty(cells):
            continue
        lines.append(f"| {exp} | {label} | {_paper(exp, key)}{extra} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


CLIENT_ROWS: tuple[tuple[str, str], ...] = (
    ("P99 TTFT from admission (s)", "p99_ttft_s"),
    ("P99 client TTFT, incl. waits, refusals, retries (s)", "p99_client_ttft_s"),
    ("successful requests", "successes"),
    ("given up (refused with no retry left)", "abandoned"),
    ("refusals by reason (decisions)", "refusals"),
    ("queue outcomes (requests)", "queue_outcomes"),
    ("P99 queue wait of those that waited (s)", "p99_queue_wait_s"),
)


def client_table(results: Mapping[str, object], exp: str) -> str:
    """Per tenant, what its clients saw, under each load model and policy."""
    columns = _columns(results)
    first = lookup(results, f"{modes(results)[0]}.{exp}.token_pools.successes") if modes(results) else None
    tenants = list(first) if isinstance(first, Mapping) else []
    lines = ["| tenant | metric | " + " | ".join(h for h, _ in columns) + " |", "|---|---|" + "---|" * len(columns)]
    for tenant in tenants:
        for label, key in CLIENT_ROWS:
            cells = [_value(lookup(results, f"{prefix.format(exp=exp)}.{key}.{tenant}")) for _, prefix in columns]
            if _empty(cells):
                continue
            lines.append(f"| {tenant} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _target(value: object) -> str:
    if isinstance(value, Mapping):
        return f"{fmt(value.get('token_pools'))} vs {fmt(value.get('baseline'))} (no admission control)"
    return fmt(value)


def targets_table(results: Mapping[str, object]) -> str:
    found = results.get("targets")
    targets = found if isinstance(found, Mapping) else {}
    present = modes(results)
    lines = ["| target | " + " | ".join(f"measured, {_label(m)}" for m in present) + " |",
             "|---|" + "---|" * len(present)]
    for key, label in TARGETS:
        row = targets.get(key)
        values = row if isinstance(row, Mapping) else {}
        lines.append(f"| {label} | " + " | ".join(_target(values.get(m)) for m in present) + " |")
    return "\n".join(lines) + "\n"


def refusal_table(results: Mapping[str, object], exp: str, mode: str = MODE_KEYS["open"]) -> str:
    decisions = lookup(results, f"{mode}.{exp}.token_pools.decisions_by_phase") or {}
    lines = [f"| phase | tenant | {_label(mode)}: admitted | concurrency | token_budget | low_priority | kv_cache "
             "| not_bound |", "|---|---|---|---|---|---|---|---|"]
    for phase, by_ent in decisions.items():
        for ent, counts in by_ent.items():
            cells = [str(counts.get(k, 0)) for k in ("admitted", "concurrency", "token_budget", "low_priority",
                                                     "kv_cache", "not_bound")]
            lines.append(f"| {phase} | {short(ent)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def shadow_table(results: Mapping[str, object], exp: str, mode: str = MODE_KEYS["open"]) -> str | None:
    """Per entitlement in shadow (docs/shadow.md): what it was served, and what enforce would have refused of it, by
    reason. None when no entitlement of the experiment is in shadow."""
    shadow = lookup(results, f"{mode}.{exp}.token_pools.shadow")
    if not shadow:
        return None
    reasons = ("concurrency", "token_budget", "kv_cache", "low_priority")
    lines = [f"| entitlement | {_label(mode)}: served | would refuse: " + " | ".join(reasons) + " | total |",
             "|---|---|" + "---|" * (len(reasons) + 1)]
    for ent, counts in shadow.items():
        cells = [str(counts.get(k, 0)) for k in reasons]
        lines.append(f"| {short(ent)} | {counts.get('served', 0)} | " + " | ".join(cells) + f" | "
                     f"{sum(counts.get(k, 0) for k in reasons)} |")
    return "\n".join(lines) + "\n"


def budget_table(results: Mapping[str, object], exp: str, mode: str = MODE_KEYS["open"]) -> str | None:
    """Per budget and period (docs/budgets.md#replay): allowance, spent, when it ran out, its refusals. None when no
    entitlement of the experiment has a budget."""
    rows = lookup(results, f"{mode}.{exp}.token_pools.budgets")
    if not rows or not isinstance(rows, Sequence):
        return None
    lines = ["| entitlement | budget | period from | allowance | spent | ran out | refused budget_exhausted |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        ran_out = row["exhausted_at"]
        lines.append(f"| {short(row['entitlement'])} | {row['budget']} | {row['period_start']} | {fmt(row['allowance'])} | "
                     f"{fmt(row['spent'])} | {ran_out if ran_out != NOT_EXHAUSTED else 'not exhausted'} | "
                     f"{row['refused_budget_exhausted']} |")
    return "\n".join(lines) + "\n"


def in_short(results: Mapping[str, object], experiments: Sequence[str]) -> list[str]:
    """The report's opening in plain words: what ran, and what token pools did against no admission control, in the
    three numbers that matter, quoted from this run (the first load model that ran; the tables have both)."""
    present = modes(results)
    if not present:
        return []
    mode = present[0]

    def pair(dotted: str, unit: str = "") -> str | None:
        ours, theirs = (lookup(results, f"{mode}.{dotted.format(policy=p)}") for p in ("token_pools", "baseline"))
        if ours is None or theirs is None:
            return None
        return f"{fmt(ours)}{unit} with token pools against {fmt(theirs)}{unit} with no admission control"

    ran = []
    if "exp1" in experiments:
        ran.append("**Exp 1**: two guaranteed tenants and a spot tenant share one 16-slot vLLM replica, and the "
                   "second guaranteed tenant's arrival from 30 s to 60 s overloads it")
    if "exp2" in experiments:
        ran.append("**Exp 2**: three elastic tenants with different latency targets (copilot 0.5 s, reports 5 s, "
                   "synth 30 s) share it; a GPU failure halves it from 30 s to 120 s, and reports joins at 210 s")
    numbers = []
    if "exp1" in experiments:
        numbers += [("The guaranteed tenants' P99 time to first token in Exp 1: ", pair("exp1.{policy}.guaranteed_p99_ttft_s", " s")),
                    ("The most requests waiting in the backend's queue in Exp 1: ", pair("exp1.{policy}.max_waiting"))]
    if "exp2" in experiments:
        numbers.append(("Copilot's P99 time to first token over the whole of Exp 2, the outage included: ",
                        pair("exp2.{policy}.p99_ttft_s.copilot", " s")))
    out = ["## In short", "",
           "Token pools is an admission controller in front of shared LLM inference: each tenant's requests are "
           "admitted against its entitlement, and the rest are refused with a time to retry or held briefly in the "
           "proxy's queue. This report replays the paper's two experiments in simulated time, each once with token "
           "pools and once with no admission control (every request forwarded to the backend):", ""]
    out += [f"- {text}." for text in ran]
    out += ["", f"The three numbers that matter ({_label(mode)}):", ""]
    out += [f"{i}. {label}{value}." for i, (label, value) in enumerate((n for n in numbers if n[1] is not None), 1)]
    price = lookup(results, f"targets.exp1_guaranteed_p99_client_ttft_s.{mode}") if "exp1" in experiments else None
    ratio = lookup(results, f"targets.exp2_successes_vs_baseline.{mode}") if "exp2" in experiments else None
    costs = []
    if price is not None:
        costs.append(f"a refused guaranteed request waits and retries, so its P99 from its first attempt is "
                     f"{fmt(price)} s in Exp 1")
    if ratio is not None:
        costs.append(f"Exp 2 completes {fmt(ratio)} × the requests that no admission control completes")
    if costs:
        out += ["", "What it costs: " + "; ".join(costs) + "."]
    if "exp2" in experiments:
        out += ["", "Exp 2's entitlements (elastic-copilot, elastic-synth, elastic-reports in examples/exp2.yaml) are "
                    "named by their tenant throughout: copilot, synth, reports."]
    return out + [""]


def render(
    results: Mapping[str, object],
    experiments: Sequence[str],
    figures: Mapping[str, Sequence[str]],
    sweeps: Mapping[str, str],
    command: str,
    overrides: Sequence[str] = (),
) -> str:
    present = modes(results)
    out = ["# Token pools against no admission control: the paper's experiments in replay", ""]
    out += in_short(results, experiments)
    out += ["## How this was run", ""]
    out.append(f"Produced by `{command}`; deterministic (same input, same bytes). Every admission decision, wait in "
               "the proxy's queue, usage window, debt, priority and limit below comes from the project's core "
               "(`tokenpools.core`), run in event time by `tokenpools.replay` over a discrete-event model of the vLLM "
               "backend. The paper's numbers are from docs/paper.md#experiments. Each experiment runs under two "
               "load models, and every number is named with its own: **open loop** (Poisson arrivals that keep "
               "coming whatever the system does) and **closed loop** (N clients per tenant, each sending its next "
               "request when its previous one has ended).")
    if overrides:
        out.append(f"\n**Non-default parameters:** `{' '.join(overrides)}`. The explanations below describe the "
                   "mechanisms seen with the defaults; check them against these numbers.")
    out += ["", "## Results beside the paper", "", results_table(results, experiments)]
    out += ["Definitions: P99 is nearest-rank. TTFT is per admitted request, from admission to first token (what "
            "vLLM measures); the client TTFT adds the time from the request's first attempt to its admission: its "
            "waits in the proxy's queue, its refusals and its retries. A decision's time is its final one (after "
            "any wait). The waiting queue is the backend's, exact (from every request's queue interval), not "
            "sampled. Refusal rates count decisions, retries included.", ""]
    out += ["## What the client sees", "",
            "Per tenant: latency from admission and as its client saw it, what it got done, what it gave up, why it "
            "was refused and how its waits in the proxy's queue ended (`admitted`: the check passed while it "
            "waited; `timed_out`: refused at its deadline; `too_long`, `queue_full`: refused at once; `withdrawn`: "
            "its entitlement left). The no-admission-control baseline forwards everything, so it neither refuses "
            "nor queues: its clients wait in the backend's queue instead, which its TTFT shows.", ""]
    for exp in experiments:
        note = " (reports is Bound, and sends, from 210 s)" if exp == "exp2" else " (guaranteed-c from 30 s to 60 s)"
        out += [f"### {exp}{note}", "", client_table(results, exp)]
    out += ["## Targets, measured", "",
            "What token pools set out to do for these tenants, computed from this run as it came: no constant was "
            "tuned to reach a target.", "",
            targets_table(results)]
    for exp in experiments:
        for mode in present:
            out += [f"### {exp}: decisions by phase (token pools, {_label(mode)})", "",
                    refusal_table(results, exp, mode)]
            shadow = shadow_table(results, exp, mode)
            if shadow is not None:  # docs/shadow.md: served, and what enforce would have refused
                out += [f"### {exp}: shadow (token pools, {_label(mode)})", "", shadow]
            budgets = budget_table(results, exp, mode)
            if budgets is not None:  # docs/budgets.md#replay: when each budget ran out
                out += [f"### {exp}: budgets (token pools, {_label(mode)})", "", budgets]
        out += [f"### {exp}: figures", ""]
        out += [f"![{name}]({name})" for name in figures.get(exp, ())]
        out.append("")
    out += ["## Choices the paper leaves open (docs/paper.md#choices-the-paper-leaves-open), and ours", "",
            "| question | choice |", "|---|---|"]
    out += [f"| {q} | {a} |" for q, a in CHOICES]
    out += ["", "## Where ours differ from the paper, and why", ""]
    for exp in experiments:
        for text in DIFFERENCES.get(exp, ()):
            out.append("- " + text(results))
    out += ["", "## What the replay found in the control plane", ""]
    for text in FINDINGS:
        out.append("- " + text(results))
    if sweeps:
        out += ["", "## Sweeps", ""]
        for title, table in sweeps.items():
            out += [f"### {title}", "", table]
    out += ["", "## Reproduce", "", "```", command, "```", ""]
    return "\n".join(out)
