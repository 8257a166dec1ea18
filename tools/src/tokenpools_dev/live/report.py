"""Outputs of a live experiment: ``results.json`` (the simulation's keys, plus ``backend``, ``client``, ``proxies``),
the simulation's figures drawn from the live passes, and ``report.md`` with the live / simulation / paper table.

The summaries are the simulation's own (``replay.results.summarize`` over ``live.assemble``'s results); what a
client cannot know is replaced by what the system itself reported:

- ``max_waiting`` and ``max_waiting_by_phase``: the simulators' ``vllm:num_requests_waiting`` from Prometheus;
- ``backend``: running/waiting per phase from Prometheus;
- ``proxies``: per entitlement, the largest number of requests admitted and not yet completed across all proxy
  replicas at one instant, from the proxies' own request/completion events (``limit`` is the agents' highest
  concurrency limit for it in the pass);
- ``client``: how late the load generator sent its requests (99th percentile, experiment s) and how many
  requests failed inside it (must be 0);
- ``load_mode``: how the pass sent its load, ``open`` or ``closed`` loop (the simulation columns,
  ``results_sim.json``, replay the same load model): every table of report.md names it beside its numbers, the client-side table per tenant too
  (P99 client TTFT from a request's first attempt, so refusals, retry waits and any wait at the proxy count;
  successes; requests given up after their retries).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenpools.replay import plots, results
from tokenpools.replay.replayer import ReplayResult, replay
from tokenpools.replay.report import ROWS, _paper, write_json
from tokenpools.replay.results import POLICY_KEYS, fmt, lookup
from tokenpools.replay.scenario import Scenario
from tokenpools_dev.live import relog, runner
from tokenpools_dev.live.assemble import to_replay_result
from tokenpools_dev.live.runner import LiveOptions, PassRecord, scenario_for
from tokenpools_dev.loadgen.closed import describe, experiment_clients
from tokenpools_dev.loadgen.plan import LoadMode, max_overlap

CLIENT_ROWS: tuple[tuple[str, str], ...] = (
    # (label, per-tenant key of the summaries): what the clients lived, per tenant
    ("P99 client TTFT incl. refusals, retries and waits (s)", "p99_client_ttft_s"),
    ("successful requests", "successes"),
    ("given up after their retries", "abandoned"),
)


def replay_results(scenario: Scenario, records: Mapping[str, PassRecord], reference_ttft_s: float,
                   scrape_s: float) -> dict[str, ReplayResult]:
    out = {}
    for policy, rec in records.items():
        updates = rec.topics.get(next((t for t in rec.topics if t.endswith("limits")), ""), [])
        decided = rec.topics.get(next((t for t in rec.topics if t.endswith("requests")), ""), [])
        out[policy] = to_replay_result(scenario, policy, rec.load, rec.pool, updates, reference_ttft_s, scrape_s,
                                       scenario.params.sample_s, decided)
    return out


def _max_in(pool: Sequence[tuple[float, int, int, int]], column: int, start: float, end: float) -> int:
    return max((row[column] for row in pool if start <= row[0] < end), default=0)


def _mean_in(pool: Sequence[tuple[float, int, int, int]], column: int, start: float, end: float) -> float | None:
    values = [row[column] for row in pool if start <= row[0] < end]
    return round(sum(values) / len(values), 4) if values else None


def proxy_concurrency(rec: PassRecord) -> dict[str, dict[str, Any]]:
    """Per entitlement: the max admitted-and-not-completed across all proxies, and the largest limit in force."""
    decided = next((v for t, v in rec.topics.items() if t.endswith("requests")), [])
    completed = next((v for t, v in rec.topics.items() if t.endswith("completions")), [])
    limits = next((v for t, v in rec.topics.items() if t.endswith("limits")), [])
    ends = {c.request_id: c.t_ms / 1000 for c in completed}
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    replicas: dict[str, set[str]] = defaultdict(set)
    for d in decided:
        if d.outcome.value == "admitted" and d.entitlement and d.request_id in ends:
            intervals[d.entitlement].append((d.t_ms / 1000, ends[d.request_id]))
            replicas[d.entitlement].add(d.proxy_id)
    highest: dict[str, int] = defaultdict(int)
    for u in limits:
        for e in u.entitlements:
            highest[e.name] = max(highest[e.name], e.concurrency)
    return {name: {"max_admitted_in_flight": max_overlap(iv), "limit": highest.get(name), "proxies": len(replicas[name])}
            for name, iv in sorted(intervals.items())}


def summarize(name: str, scenario: Scenario, records: Mapping[str, PassRecord],
              runs: Mapping[str, ReplayResult]) -> dict[str, Any]:
    summary = results.summarize(name, runs)
    for policy, rec in records.items():
        out = summary[POLICY_KEYS.get(policy, policy)]
        phases = scenario.phases
        out["max_waiting_client_estimate"] = out.get("max_waiting")
        out["max_waiting"] = _max_in(rec.pool, 2, 0.0, float("inf"))
        out["max_waiting_by_phase"] = {p.name: _max_in(rec.pool, 2, p.start_s, p.end_s) for p in phases}
        out["backend"] = {
            "max_running": _max_in(rec.pool, 1, 0.0, float("inf")),
            "mean_running_by_phase": {p.name: _mean_in(rec.pool, 1, p.start_s, p.end_s) for p in phases},
            "mean_waiting_by_phase": {p.name: _mean_in(rec.pool, 2, p.start_s, p.end_s) for p in phases},
            "samples": len(rec.pool),
        }
        out["load_mode"] = rec.load_mode.value
        out["client"] = {"failures": rec.failures, "schedule_lag_p99_s": results.r4(rec.schedule_lag_p99_s),
                         "loop_lag_p99_ms": rec.loop_lag_p99_ms, "cpu_s": round(rec.client_cpu_s, 2),
                         "errors": sum(1 for c in rec.load.completions if c.status == "error")
                         + sum(1 for a in rec.load.attempts if a.outcome == "error"),
                         "evicted": sum(1 for c in rec.load.completions if c.status == "evicted")}
        if policy == "token-pools":
            out["proxies"] = proxy_concurrency(rec)
    return summary


def save_records(rec: PassRecord, out: Path) -> None:
    """The pass's raw records: the client's (``loadgen`` format), and each observed topic as JSON lines."""
    from tokenpools.topics.codec import encode
    from tokenpools_dev.loadgen.cli import write_records
    from tokenpools_dev.loadgen.plan import summary_rows

    write_records(rec.load, out, summary_rows(rec.load), rec.load_mode)
    for topic, items in rec.topics.items():
        with open(out / f"{topic}.jsonl", "wb") as f:
            f.writelines(encode(r) + b"\n" for r in items)
    with open(out / "prometheus_pool.jsonl", "w") as f:
        f.writelines(f"[{t}, {r}, {w}, {s}]\n" for t, r, w, s in rec.pool)


def _columns(live_mode: LoadMode, sim_mode: LoadMode) -> list[tuple[str, str, str]]:
    """(header, source, policy key) of the four value columns, each naming its load mode."""
    return [(f"simulation ({sim_mode.label}): token pools", "sim", "token_pools"),
            (f"live ({live_mode.label}): token pools", "live", "token_pools"),
            (f"simulation ({sim_mode.label}): baseline", "sim", "baseline"),
            (f"live ({live_mode.label}): baseline", "live", "baseline")]


def comparison_table(name: str, live: Mapping[str, Any], sim: Mapping[str, Any],
                     live_mode: LoadMode = LoadMode.OPEN, sim_mode: LoadMode = LoadMode.OPEN) -> str:
    columns = _columns(live_mode, sim_mode)
    sources = {"live": live, "sim": sim}
    lines = ["| metric | paper | " + " | ".join(c[0] for c in columns) + " |", "|---|---|---|---|---|---|"]
    for exp, label, key in ROWS:
        if exp != name:
            continue
        cells = [fmt(lookup({name: sources[src]}, f"{name}.{p}.{key}")) for _, src, p in columns]
        paper = _paper(exp, key)
        if exp == "exp1" and key in ("guaranteed_p99_ttft_s", "max_waiting"):
            paper += f" (baseline {fmt(results.PAPER[f'exp1.baseline.{key}'])})"
        lines.append(f"| {label} | {paper} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def client_table(scenario: Scenario, live: Mapping[str, Any], sim: Mapping[str, Any],
                 live_mode: LoadMode = LoadMode.OPEN, sim_mode: LoadMode = LoadMode.OPEN) -> str:
    """Per tenant, what its clients lived (``CLIENT_ROWS``), live and simulated, each column naming its load mode."""
    columns = _columns(live_mode, sim_mode)
    sources = {"live": live, "sim": sim}
    lines = ["| tenant | metric | " + " | ".join(c[0] for c in columns) + " |", "|---|---|---|---|---|---|"]
    for entitlement in scenario.entitlements:
        tenant = results.short(entitlement.name)
        for label, key in CLIENT_ROWS:
            cells = [fmt((sources[src].get(p, {}).get(key) or {}).get(tenant)) for _, src, p in columns]
            lines.append(f"| {tenant} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write(options: LiveOptions, records: Mapping[str, PassRecord], reference_ttft_s: float, scrape_s: float,
          command: str, backend_note: str = "") -> dict[str, Any]:
    """results.json, figures and report.md in ``options.out``; returns the live results."""
    name, out = options.name, options.out
    scenario = scenario_for(options)
    runs = replay_results(scenario, records, reference_ttft_s, scrape_s)
    live = summarize(name, scenario, records, runs)
    sim = results.summarize(name, {p: replay(scenario, p) for p in records})
    live_mode = sim_mode = options.load_mode  # the simulation replays the load the live passes sent
    for summary in sim.values():
        summary["load_mode"] = sim_mode.value
    figures = [p.name for p in plots.experiment_figures(name, runs, out)]
    for policy, rec in records.items():
        save_records(rec, out / "records" / policy)
    if "token-pools" in records:  # the pass as a recorded log, and how closely a replay of it decides like the proxy
        relog.write_log(records["token-pools"], out / "log")
        config = runner.stack_options(options, scenario).run_dir / "config-proxy.yaml"
        live["token_pools"]["replay_match"] = relog.replay_match(out / "log", config, options.overrides,
                                                                 options.time_scale)
    write_json(out / "results.json", {name: live})
    write_json(out / "results_sim.json", {name: sim})
    text = [f"# {name}, live ({live_mode.label})\n", f"`{command}`\n",
            f"Time scale {options.time_scale:g}: every latency and control-loop time ran × {options.time_scale:g}, "
            f"every number here is in experiment seconds. The live passes sent {_sent(options, scenario)}; the "
            f"simulation columns replay the experiment in {sim_mode.label} (`--mode sim`). Each column names its "
            "load mode.\n", *([backend_note + "\n"] if backend_note else []), comparison_table(name, live, sim, live_mode, sim_mode),
            "\n## Client side, per tenant\n",
            "As the clients lived it: the client TTFT runs from a request's first attempt, so the time spent refused, "
            "waiting to retry and waiting at the proxy counts (served requests); given up: refused after the last "
            "retry.\n", client_table(scenario, live, sim, live_mode, sim_mode), "\n## Live only\n"]
    for policy in records:
        key = POLICY_KEYS.get(policy, policy)
        tag = f"{key} ({records[policy].load_mode.label})"
        text.append(f"- {tag}: backend (Prometheus) {fmt(live[key]['backend'])}; client {fmt(live[key]['client'])}")
        if "proxies" in live[key]:
            text.append(f"- {tag}: admitted concurrency across proxies {fmt(live[key]['proxies'])}")
        if "replay_match" in live[key]:
            text.append(f"- {tag}: the pass's recorded log (`log/`) replayed with `tokenpools replay`, share of the "
                        f"live decisions made the same way {fmt(live[key]['replay_match'])} (`recorded`: the log's "
                        "service times as the backend; `sim`: the backend simulator)")
    text.append("\n## Figures\n")
    text += [f"![{f}]({f})" for f in figures]
    (out / "report.md").write_text("\n".join(text) + "\n", encoding="utf-8")
    return live


def _sent(options: LiveOptions, scenario: Scenario) -> str:
    if options.load_mode is LoadMode.CLOSED:
        return (f"closed-loop clients, {describe(experiment_clients(scenario))}, each sending its "
                "next request when its previous one ended")
    return f"the experiment's open-loop schedule ({len(scenario.arrivals)} requests)"
