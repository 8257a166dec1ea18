"""``tokenpools calibrate``'s plan and workload (pure): settings checked at the start, steps, prompts, bodies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.calibrate.plan import DEFAULT_ROUNDS, Step, concurrencies, make_plan, steps
from tokenpools.calibrate.workload import body, prompt, words_for
from tokenpools.cli import COMMANDS, main
from tokenpools.errors import ConfigError

PROPERTY = settings(max_examples=200, deadline=None)
GOOD = {"max_concurrency": 8, "prompt_tokens": 64, "output_tokens": 16, "ttft_p99_target_ms": 500.0}


def problems(**changes: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        make_plan(str(changes.pop("url", "http://127.0.0.1:8000")), str(changes.pop("model", "m")),
                  **{**GOOD, **changes})  # type: ignore[arg-type]
    return [str(p) for p in caught.value.problems]


def test_the_row_points_at_the_calibrate_module() -> None:
    row = next(c for c in COMMANDS if c.name == "calibrate")
    assert (row.run, row.arguments) == ("tokenpools.calibrate.cli:run", "tokenpools.calibrate.cli:add_arguments")
    assert row.available()


def test_a_plan_keeps_its_values_in_seconds_and_defaults_to_rounds() -> None:
    plan = make_plan("http://127.0.0.1:8000/v1/", "tiny", **GOOD)  # type: ignore[arg-type]
    assert plan.base_url == "http://127.0.0.1:8000"  # /v1 and the slash dropped: the paths are added to it
    assert (plan.ttft_p99_target_s, plan.rounds, plan.step_s) == (0.5, DEFAULT_ROUNDS, None)
    timed = make_plan("http://h:1", "tiny", step_s=2.5, **GOOD)  # type: ignore[arg-type]
    assert (timed.rounds, timed.step_s) == (None, 2.5)


@pytest.mark.parametrize(("changes", "expected"), [
    ({"max_concurrency": 0}, "--max-concurrency must be a whole number >= 1, got 0"),
    ({"prompt_tokens": -3}, "--prompt-tokens must be a whole number >= 1, got -3"),
    ({"output_tokens": 0}, "--output-tokens must be a whole number >= 1, got 0"),
    ({"rounds": 0}, "--rounds must be a whole number >= 1, got 0"),
    ({"kv_bytes_per_token": 0}, "--kv-bytes-per-token must be a whole number >= 1, got 0"),
    ({"ttft_p99_target_ms": 0.0}, "--ttft-p99-target-ms must be a positive number, got 0"),
    ({"ttft_p99_target_ms": float("inf")}, "--ttft-p99-target-ms must be a positive number, got inf"),
    ({"step_s": -1.0}, "--seconds-per-step must be a positive number, got -1"),
    ({"request_timeout_s": 0.0}, "--request-timeout-s must be a positive number, got 0"),
    ({"rounds": 2, "step_s": 1.0}, "give --rounds or --seconds-per-step, not both"),
    ({"model": " "}, "--model must name the model the backend serves, got an empty name"),
    ({"url": "ftp://host"}, "URL must be an http(s) URL such as http://127.0.0.1:8000, got 'ftp://host'"),
])
def test_each_bad_value_is_one_line_naming_the_flag(changes: dict[str, object], expected: str) -> None:
    assert problems(**changes) == [f"tokenpools calibrate: {expected}"]


def test_every_bad_value_is_reported_at_once() -> None:
    assert len(problems(max_concurrency=0, output_tokens=0, ttft_p99_target_ms=-1.0)) == 3


def test_bad_numbers_exit_2_with_one_line_and_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "http://127.0.0.1:9", "--model", "m", "--max-concurrency", "-1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["tokenpools calibrate: --max-concurrency must be a whole number >= 1, "
                                         "got -1"]
    assert captured.out == ""


@PROPERTY
@given(st.integers(1, 5000))
def test_concurrencies_double_from_1_and_end_at_the_maximum(n: int) -> None:
    cs = concurrencies(n)
    assert cs[0] == 1 and cs[-1] == n
    assert all(b == 2 * a for a, b in zip(cs[:-2], cs[1:-1]))  # powers of two...
    assert all(a < b <= 2 * a for a, b in zip(cs, cs[1:]))  # ...then the maximum, at most one doubling further


def test_steps_send_rounds_per_client_or_run_for_seconds() -> None:
    by_rounds = steps(make_plan("http://h:1", "m", rounds=3, **{**GOOD, "max_concurrency": 6}))  # type: ignore[arg-type]
    assert [(s.concurrency, s.requests) for s in by_rounds] == [(1, 3), (2, 6), (4, 12), (6, 18)]
    step = by_rounds[1]
    assert [step.sends_another(sent, 1e9) for sent in (0, 5, 6)] == [True, True, False]  # time does not count
    timed = Step(concurrency=4, requests=None, duration_s=2.0)
    assert timed.sends_another(0, 5.0) and timed.sends_another(3, 5.0)  # every client sends once, late or not
    assert timed.sends_another(100, 1.9) and not timed.sends_another(4, 2.0)


@PROPERTY
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 300))
def test_prompts_are_distinct_from_their_first_word(a: int, b: int, words: int) -> None:
    pa, pb = prompt(a, words), prompt(b, words)
    assert len(pa.split()) == words and pa.split()[0] == str(a)
    assert (pa == pb) == (a == b)
    assert prompt(a, words) == pa  # deterministic


@pytest.mark.parametrize(("asked", "sent", "seen", "expected"), [
    (256, 256, 128, 512),  # 2 words a token: twice the words
    (64, 64, 160, 26),  # 2.5 tokens a word (the tiny model's tokenizer on these words)
    (1, 64, 160, 1),  # never below one word
    (64, 50, 0, 50),  # the backend counted nothing: keep what was sent
])
def test_words_for_scales_the_words_by_the_tokens_they_made(asked: int, sent: int, seen: int, expected: int) -> None:
    assert words_for(asked, sent, seen) == expected


def test_a_body_streams_with_usage_and_asks_ignore_eos_only_when_accepted() -> None:
    with_eos = body("m", "text", 32, True)
    assert with_eos == {"model": "m", "prompt": "text", "max_tokens": 32, "stream": True,
                        "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert "ignore_eos" not in body("m", "text", 32, False)
