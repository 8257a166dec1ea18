"""Closed-loop clients on the real stack: Exp 1's clients (guaranteed-a 6, spot-b 10, guaranteed-c 6 while it is
in), compressed to 30 s of experiment and run 4× faster (7.5 s wall), through the proxy, the agents and
llm-d-inference-sim, token pools only, with one retry before a refused request is given up.

What it proves, from the clients' own records (docs/load.md#open-and-closed-loop):
- an entitlement never has more than its N requests open at once, from a request's first attempt to its end
  (retry waits included), although spot-b's 10 clients want more than the 4 slots it keeps during the overload;
- each client's requests are one after the other: the next one is sent after the previous one ended;
- a request given up after its retries ends its client's request: the same client sends its next one after it;
- the live report runs on these records unchanged and names the mode beside its numbers.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tokenpools_dev.live import report, runner
from tokenpools_dev.loadgen.closed import experiment_clients
from tokenpools_dev.loadgen.plan import LoadMode, RequestSpan, max_overlap, request_spans

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIME_SCALE = 0.25
# 30 s of experiment, c in [10 s, 20 s); waiting off (policy.queue_slo_fraction=0), so the overload refuses spot-b
# and the given-up path is exercised (with waiting on, spot-b's clients wait out the overload instead)
OVERRIDES = ("load.compress=0.3333333333", "load.max_retries=1", "policy.queue_slo_fraction=0")
ClosedPass = tuple[runner.LiveOptions, runner.PassRecord, dict[str, Any]]


@pytest.fixture(scope="module")
def closed_pass(tmp_path_factory: pytest.TempPathFactory) -> ClosedPass:
    out = tmp_path_factory.mktemp("closed-live")
    options = runner.LiveOptions(name="exp1", out=out, time_scale=TIME_SCALE, overrides=OVERRIDES,
                                 policies=("token-pools",), load_mode=LoadMode.CLOSED)
    records = runner.run(options, progress=lambda _: None)
    stack_options = runner.stack_options(options, runner.scenario_for(options))
    live = report.write(options, records, 0.22, stack_options.scrape_s / TIME_SCALE, "test")
    return options, records["token-pools"], live


def by_client(spans: list[RequestSpan]) -> dict[str, list[tuple[int, RequestSpan]]]:
    """client ("spot-b-c003") → its requests in the order it sent them (``closed_requests`` numbers them)."""
    out: dict[str, list[tuple[int, RequestSpan]]] = defaultdict(list)
    for span in spans:
        client, _, n = span.request_id.rpartition("-")
        out[client].append((int(n), span))
    return {client: sorted(requests, key=lambda r: r[0]) for client, requests in out.items()}


def test_no_entitlement_has_more_requests_open_than_clients(closed_pass: ClosedPass) -> None:
    options, rec, _ = closed_pass
    assert rec.failures == 0 and rec.load_mode is LoadMode.CLOSED
    clients = {c.entitlement: c.clients for c in experiment_clients(runner.scenario_for(options))}
    spans = request_spans(rec.load)
    clients_seen: dict[str, set[str]] = defaultdict(set)
    for client in by_client(spans):
        clients_seen[client.rsplit("-c", 1)[0]].add(client)
    assert {name: len(seen) for name, seen in clients_seen.items()} == clients  # every client sent
    for name, n in clients.items():
        open_at_once = max_overlap([(s.start_s, s.end_s) for s in spans if s.entitlement == name])
        assert 0 < open_at_once <= n, (name, open_at_once, n)
    # spot-b wanted more than it kept: refused, and its clients waited rather than piled up
    assert sum(a.outcome != "admitted" for a in rec.load.attempts if a.entitlement == "spot-b") > 0


def test_each_client_sends_its_next_request_after_the_previous_one_ended(closed_pass: ClosedPass) -> None:
    _, rec, _ = closed_pass
    for client, requests in by_client(request_spans(rec.load)).items():
        assert [n for n, _ in requests] == list(range(len(requests))), client  # none skipped, none twice
        for (_, before), (_, after) in zip(requests, requests[1:]):
            assert after.start_s >= before.end_s, (client, before, after)


def test_a_request_given_up_after_its_retries_ends_its_clients_request(closed_pass: ClosedPass) -> None:
    _, rec, _ = closed_pass
    attempts = defaultdict(list)
    for a in rec.load.attempts:
        attempts[a.request_id].append(a)
    given_up, followed = 0, []
    for client, requests in by_client(request_spans(rec.load)).items():
        for i, (_, span) in enumerate(requests):
            tries = sorted(attempts[span.request_id], key=lambda a: a.attempt)
            # refused every time and not retried after the last (a pending retry would carry its wait)
            if all(a.http_status == 429 for a in tries) and tries[-1].retry_wait_s == 0:
                given_up += 1
                assert len(tries) == 2, tries  # load.max_retries=1: the first attempt and one retry
                if i + 1 < len(requests):
                    followed.append((span, requests[i + 1][1]))
    assert given_up == sum(rec.load.abandoned.values())
    assert followed, "no request was given up before its client's last: the overload refused spot-b too little"
    for span, following in followed:
        assert following.start_s >= span.end_s, (span, following)


def test_the_report_names_the_closed_loop_beside_its_numbers(closed_pass: ClosedPass) -> None:
    options, _, live = closed_pass
    assert live["token_pools"]["load_mode"] == "closed"
    assert json.loads((options.out / "results.json").read_text())["exp1"]["token_pools"]["load_mode"] == "closed"
    text = (options.out / "report.md").read_text()
    assert "# exp1, live (closed loop)" in text and "live (closed loop): token pools" in text
    assert "simulation (closed loop): token pools" in text and "## Client side, per tenant" in text  # same load
    assert "| spot-b | given up after their retries |" in text
    summary = json.loads((options.out / "records" / "token-pools" / "summary.json").read_text())
    assert summary["mode"] == "closed"
