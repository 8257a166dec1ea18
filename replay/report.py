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
from tokenpools.replay.results import PAPER, fmt, lookup
from tokenpools.replay.texts import DIFFERENCES, FINDINGS


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


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
    ("exp1", "requests given up after 5 retries", "abandoned"),
    ("exp2", "priority w_e at first tick", "priority"),
    ("exp2", "low-priority denials", "low_priority_denials"),
    ("exp2", "successful requests", "successes"),
    ("exp2", "peak debt d_e", "peak_debt"),
    ("exp2", "debt back below 0.05 after recovery (s)", "debt_decay_s"),
    ("exp2", "debt within ±0.05 after recovery (s)", "debt_decay_abs_s"),
    ("exp2", "mean running slots in the outage", "mean_running_in_outage"),
    ("exp2", "P99 TTFT (s)", "p99_ttft_s"),
    ("exp2", "P99 client TTFT incl. retries (s)", "p99_client_ttft_s"),
    ("exp2", "max backend waiting queue", "max_waiting"),
    ("exp2", "requests given up after 5 retries", "abandoned"),
)


def _paper(exp: str, key: str) -> str:
    direct = PAPER.get(f"{exp}.token_pools.{key}")
    if direct is not None:
        return fmt(direct)
    parts = {k.rsplit(".", 1)[1]: v for k, v in PAPER.items() if k.startswith(f"{exp}.token_pools.{key}.")}
    return fmt(parts) if parts else "—"


def results_table(results: Mapping[str, object], experiments: Sequence[str]) -> str:
    lines = ["| experiment | metric | paper (token pools) | ours: token pools | ours: no admission control |",
             "|---|---|---|---|---|"]
    for exp, label, key in ROWS:
        if exp not in experiments:
            continue
        ours = lookup(results, f"{exp}.token_pools.{key}")
        base = lookup(results, f"{exp}.baseline.{key}")
        extra = ""
        if exp == "exp1" and key in ("guaranteed_p99_ttft_s", "max_waiting"):
            extra = f" (baseline: {fmt(PAPER[f'exp1.baseline.{key}'])})"
        lines.append(f"| {exp} | {label} | {_paper(exp, key)}{extra} | {fmt(ours)} | {fmt(base)} |")
    return "\n".join(lines) + "\n"


def refusal_table(results: Mapping[str, object], exp: str) -> str:
    decisions = lookup(results, f"{exp}.token_pools.decisions_by_phase") or {}
    lines = ["| phase | entitlement | admitted | concurrency | token_budget | low_priority | kv_cache |",
             "|---|---|---|---|---|---|---|"]
    for phase, by_ent in decisions.items():
        for ent, counts in by_ent.items():
            cells = [str(counts.get(k, 0)) for k in ("admitted", "concurrency", "token_budget", "low_priority", "kv_cache")]
            lines.append(f"| {phase} | {ent} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render(
    results: Mapping[str, object],
    experiments: Sequence[str],
    figures: Mapping[str, Sequence[str]],
    sweeps: Mapping[str, str],
    command: str,
    overrides: Sequence[str] = (),
) -> str:
    out = ["# Token pools against no admission control: the paper's experiments in replay", ""]
    out.append(f"Produced by `{command}`; deterministic (same input, same bytes). Every admission decision, usage "
               "window, debt, priority and limit below comes from the project's core (`tokenpools.core`), run in "
               "event time by `tokenpools.replay` over a discrete-event model of the vLLM backend. "
               "The paper's numbers are from docs/paper.md#experiments.")
    if overrides:
        out.append(f"\n**Non-default parameters:** `{' '.join(overrides)}`. The explanations below describe the "
                   "mechanisms seen with the defaults; check them against these numbers.")
    out += ["", "## Results beside the paper", "", results_table(results, experiments)]
    out += ["Definitions: P99 is nearest-rank. TTFT is per admitted request, from admission to first token (what "
            "vLLM measures); the client TTFT adds the time from the request's first attempt to the admitted one. "
            "The waiting queue is exact (from every request's queue interval), not sampled. Refusal rates count "
            "decisions, retries included.", ""]
    for exp in experiments:
        out += [f"### {exp}: decisions by phase (token pools)", "", refusal_table(results, exp)]
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
    out += ["", "## What the replay found in the control plane (for the core's owners)", ""]
    for text in FINDINGS:
        out.append("- " + text(results))
    if sweeps:
        out += ["", "## Sweeps", ""]
        for title, table in sweeps.items():
            out += [f"### {title}", "", table]
    out += ["", "## Reproduce", "", "```", command, "```", ""]
    return "\n".join(out)
