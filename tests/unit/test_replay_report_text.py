"""report.md's text (``replay.report``): a plain-language opening quoting this run, one name per tenant, no empty rows."""

from __future__ import annotations

from tokenpools.replay.report import client_table, in_short, refusal_table, render, results_table


def _results(guaranteed_ttft_s: float) -> dict[str, object]:
    def policy(ttft_s: float, waiting: int, copilot_s: float) -> dict[str, object]:
        return {"guaranteed_p99_ttft_s": ttft_s, "max_waiting": waiting, "p99_ttft_s": {"copilot": copilot_s},
                "successes": {"copilot": 10}, "p99_queue_wait_s": {"copilot": None},
                "decisions_by_phase": {"outage (8 slots)": {"elastic-copilot": {"admitted": 3, "concurrency": 1}}}}
    mode = {"exp1": {"token_pools": policy(guaranteed_ttft_s, 2, 0.4), "baseline": policy(16.5, 59, 11.0)},
            "exp2": {"token_pools": policy(0.1, 4, 0.443), "baseline": policy(2.0, 47, 10.998)}}
    return {"open_loop": mode,
            "targets": {"exp1_guaranteed_p99_client_ttft_s": {"open_loop": 4.037},
                        "exp2_successes_vs_baseline": {"open_loop": 0.967}}}


def test_the_opening_says_what_ran_and_quotes_three_numbers_of_this_run() -> None:
    text = "\n".join(in_short(_results(0.15), ["exp1", "exp2"]))
    assert "## In short" in text and "**Exp 1**" in text and "**Exp 2**" in text
    assert "0.15 s with token pools against 16.5 s with no admission control" in text
    assert "2 with token pools against 59" in text
    assert "0.443 s with token pools against 10.998 s" in text
    assert "4.037 s" in text and "0.967 ×" in text
    assert "0.25 s with token pools" in "\n".join(in_short(_results(0.25), ["exp1", "exp2"]))  # quoted, not fixed
    only_exp1 = "\n".join(in_short(_results(0.15), ["exp1"]))
    assert "**Exp 2**" not in only_exp1 and "copilot" not in only_exp1.lower()


def test_a_row_with_nothing_measured_is_left_out() -> None:
    results = _results(0.15)
    assert "P99 queue wait" not in client_table(results, "exp2")  # None in every column
    assert "guaranteed P99 end-to-end" not in results_table(results, ["exp1"])  # absent from every column
    assert "guaranteed P99 TTFT (s)" in results_table(results, ["exp1"])


def test_a_tenant_has_one_name_throughout() -> None:
    table = refusal_table(_results(0.15), "exp2")
    assert "| outage (8 slots) | copilot | 3 | 1 |" in table and "elastic-copilot" not in table


def test_no_internal_phrasing() -> None:
    text = render(_results(0.15), ["exp1", "exp2"], {}, {}, "tokenpools demo")
    assert "issue" not in text.lower() and "core's owners" not in text
    assert text.index("## In short") < text.index("## Results beside the paper")
