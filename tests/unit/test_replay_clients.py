"""A log replay's requests and clients: grouping attempts (replay/attempts.py), the fitted client model
(replay/clients.py), and a log decoded once (logio.read_log / scenario_from_data / split_log)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.replay import attempts, clients, logio
from tokenpools.replay.experiments import _config, build
from tokenpools.replay.replayer import replay

T0 = 1_772_150_400_000


def _row(rid: str, arrived_s: float, refused: bool, estimate_ms: int = 500, ent: str = "a", prompt: int = 64,
         attempt: int | None = None, first: str | None = None, queued_ms: int = 0) -> attempts.Attempt:
    arrived = T0 + round(arrived_s * 1000)
    return attempts.Attempt(rid, ent, arrived, arrived + queued_ms, refused, estimate_ms if refused else 0, prompt, 64,
                            attempt, first)


def test_an_unmarked_attempt_just_after_a_refusals_estimate_retries_it_and_one_of_another_shape_does_not() -> None:
    rows = [_row("r1", 0.0, True), _row("r2", 0.55, True), _row("x", 0.56, False, prompt=10),
            _row("r3", 1.1, False), _row("r4", 3.0, False)]
    assert attempts.group(rows) == [attempts.Link("r1", 0), attempts.Link("r1", 1), attempts.Link("x", 0),
                                    attempts.Link("r1", 2), attempts.Link("r4", 0)]  # r4: past the window


def test_marks_win_over_the_heuristic_and_a_refusal_is_retried_once() -> None:
    rows = [_row("r1", 0.0, True, attempt=0), _row("q", 0.5, False, attempt=1, first="r1"),
            _row("u", 0.52, False), _row("v", 0.53, False)]
    assert attempts.group(rows) == [attempts.Link("r1", 0), attempts.Link("r1", 1), attempts.Link("u", 0),
                                    attempts.Link("v", 0)]


@st.composite
def _chains(draw: st.DrawFn) -> list[attempts.Attempt]:
    """Requests of distinct shapes, each refused k times and retried 0–99 ms after each estimate."""
    rows = []
    for n in range(draw(st.integers(1, 12))):
        t = draw(st.integers(0, 60_000)) / 1000
        tries = draw(st.integers(1, 6))
        for k in range(tries):
            refused = k < tries - 1 or draw(st.booleans())
            estimate = draw(st.integers(1, 3000))
            rows.append(_row(f"q{n}", t, refused, estimate, prompt=n + 1, attempt=k,
                             first=None if k == 0 else f"q{n}"))
            t += estimate / 1000 + draw(st.integers(0, 99)) / 1000
    return rows


@settings(max_examples=60, deadline=None)
@given(_chains())
def test_invariant_unmarked_retries_of_distinguishable_requests_are_grouped_as_marked(
        rows: list[attempts.Attempt]) -> None:
    truth = attempts.group(rows)
    assert attempts.grouping_errors(truth, attempts.group(attempts.stripped(rows))) == (0, 0)


@settings(max_examples=60, deadline=None)
@given(_chains(), st.integers(0, 3))
def test_invariant_a_fitted_client_is_deterministic_and_never_retries_before_the_refusal(
        rows: list[attempts.Attempt], seed: int) -> None:
    links = attempts.group(rows)
    by: dict[str, list[attempts.Attempt]] = {}
    for row, link in zip(rows, links):
        by.setdefault(link.request, []).append(row)
    observed = [clients.Observed(r, "a", tuple((x.arrived_ms, x.decided_ms, x.refused, x.retry_after_ms) for x in xs))
                for r, xs in by.items()]
    model = clients.fit(observed, max(r.arrived_ms for r in rows), attempts.RETRY_WINDOW_MS, min_refusals=1)
    for request in [*by, "never-seen"]:
        for k in range(8):
            first = model.retry_delay_ms("a", request, k, 700, seed)
            assert first == model.retry_delay_ms("a", request, k, 700, seed)
            assert first is None or first >= 0
    fit = model.fit_of("a")
    assert fit.max_retries <= 5 and all(0 <= o <= 99 for o in fit.offsets_ms)


def test_a_log_without_refusals_assumes_the_load_generators_clients() -> None:
    model = clients.fit([clients.Observed("r", "a", ((T0, T0, False, 0),))], T0, 1000)
    fit = model.fit_of("a")
    assert fit.basis is clients.Basis.ASSUMED and fit.max_retries == 5
    assert model.retry_delay_ms("a", "r", 5, 700, 0) is None
    assert 700 <= (model.retry_delay_ms("a", "r", 0, 700, 0) or 0) < 800


def test_a_recorded_refusal_is_retried_as_its_client_did_then_and_an_unrecorded_one_from_the_fit() -> None:
    # r: refused twice (retried 40 ms, then 70 ms after the estimate), then gave up; s: admitted at once
    reqs = [clients.Observed("r", "a", ((T0, T0, True, 500), (T0 + 540, T0 + 540, True, 500),
                                        (T0 + 1110, T0 + 1110, True, 500))),
            clients.Observed("s", "a", ((T0 + 60_000, T0 + 60_000, False, 0),))]
    model = clients.fit(reqs, T0 + 60_000, 1000, min_refusals=1)
    assert model.paths["r"] == clients.RecordedPath((40, 70), True)
    assert model.retry_delay_ms("a", "r", 0, 900, 1) == 940  # the replay's estimate + the recorded offset
    assert model.retry_delay_ms("a", "r", 2, 900, 1) is None  # it gave up there
    fit = model.fit_of("a")
    assert fit.retry_share == (1.0, 1.0) and fit.offsets_ms == (40, 70) and fit.max_retries == 2
    assert model.retry_delay_ms("a", "s", 0, 900, 1) in (940, 970)  # the log never refused s: drawn
    assert model.retry_delay_ms("a", "s", 2, 900, 1) is None  # no client went further


def test_invariant_unrecorded_refusals_retry_at_the_fits_share_and_draw_every_offset_alike() -> None:
    # one fit: 30 % of first refusals retried, offsets 10/20/30/40 ms; 20,000 requests the log never refused
    fit = clients.ClientFit(clients.Basis.POOL, 1000, (0.3,), (10, 20, 30, 40))
    model = clients.ClientModel(fit)
    delays = [model.retry_delay_ms("a", f"q{i}", 0, 500, 11) for i in range(20_000)]
    retried = [d for d in delays if d is not None]
    assert abs(len(retried) / len(delays) - 0.3) < 0.015  # 4.6 standard deviations of a binomial share
    counts = {offset: retried.count(500 + offset) for offset in (10, 20, 30, 40)}
    assert sum(counts.values()) == len(retried)
    assert all(abs(c / len(retried) - 0.25) < 0.025 for c in counts.values()), counts
    assert delays != [model.retry_delay_ms("a", f"q{i}", 0, 500, 12) for i in range(20_000)]  # the seed matters


@pytest.fixture(scope="module")
def exp1_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("exp1")
    scenario = build("exp1", ["load.compress=0.3"])
    for policy in ("token-pools", "none"):
        logio.write_log(replay(scenario, policy), root / f"log-{policy}")
    return root


def test_read_log_keeps_first_attempts_only_as_arrivals_and_is_picklable(exp1_logs: Path) -> None:
    data = logio.read_log(exp1_logs / "log-token-pools")
    assert all(a.attempt == 0 for a in data.first_attempts)
    assert len(data.attempts) > len(data.first_attempts)  # the log has retries
    assert pickle.loads(pickle.dumps(data)) == data
    assert data.digest == logio.read_log(exp1_logs / "log-token-pools").digest != logio.read_log(
        exp1_logs / "log-none").digest
    pool, ents, _ = _config(None, "exp1.yaml")
    scenario, recorded = logio.scenario_from_data(data, pool, ents, build("exp1", ["load.compress=0.3"]).params)
    assert len(scenario.arrivals) == len(data.first_attempts) and recorded.height == len(data.attempts)
    assert [a.t_s for a in scenario.arrivals] == sorted(a.t_s for a in scenario.arrivals)


def test_split_log_cuts_whole_requests_in_time_and_each_part_replays_on_its_own(exp1_logs: Path) -> None:
    data = logio.read_log(exp1_logs / "log-token-pools")
    tuning, held = logio.split_log(data, 0.25)
    assert len(tuning.first_attempts) + len(held.first_attempts) == len(data.first_attempts)
    assert len(tuning.attempts) + len(held.attempts) == len(data.attempts)
    assert max(a.arrived_ms for a in tuning.first_attempts) <= min(a.arrived_ms for a in held.first_attempts)
    assert len(held.first_attempts) == round(len(data.first_attempts) * 0.25)
    assert len({data.digest, tuning.digest, held.digest}) == 3
    pool, ents, _ = _config(None, "exp1.yaml")
    params = build("exp1", ["load.compress=0.3"]).params
    for part in (tuning, held):
        scenario, _ = logio.scenario_from_data(part, pool, ents, params)
        assert scenario.arrivals[0].t_s < params.tick_s  # (each part starts at its own first arrival's window)
        assert replay(scenario, "none").decisions.outcome.count("admitted") == len(part.first_attempts)
    with pytest.raises(ValueError, match="holdout_fraction"):
        logio.split_log(data, 1.0)
