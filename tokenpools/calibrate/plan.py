"""What one calibration does: its settings, checked once at the start, and its steps (pure).

The steps are the concurrencies 1, 2, 4, … below the maximum, then the maximum itself. A step of concurrency c runs
c clients, each sending its next request when its previous one has ended (a closed loop: c requests in flight, as
a pool's ``concurrency`` slots would be). A step ends after a fixed number of requests (``rounds`` per client,
c × rounds in all) or once ``step_s`` seconds have passed since it began (every client sends at least one request,
so the step does reach c in flight; the requests still running then finish and count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenpools.config.documents import check_http_url
from tokenpools.errors import ConfigError, ConfigProblem

SOURCE = "tokenpools calibrate"  # how its problems are labelled (one line each)
DEFAULT_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class CalibrationPlan:
    """A calibration's settings, valid by construction (build one with :func:`make_plan`)."""

    base_url: str  # without a trailing slash or /v1
    model: str
    max_concurrency: int
    prompt_tokens: int  # asked of every request's prompt (approximately: see ``workload``)
    output_tokens: int  # max_tokens of every request
    ttft_p99_target_s: float
    rounds: int | None  # requests per client per step, or None: ``step_s``
    step_s: float | None  # seconds per step, or None: ``rounds``
    request_timeout_s: float
    kv_bytes_per_token: int | None  # the pool's c, to convert vLLM's KV blocks into GiB


@dataclass(frozen=True, slots=True)
class Step:
    """One step: ``concurrency`` clients, until ``requests`` are sent or ``duration_s`` has passed."""

    concurrency: int
    requests: int | None
    duration_s: float | None

    def sends_another(self, sent: int, elapsed_s: float) -> bool:
        """Whether a client that is free after ``sent`` requests of the step, ``elapsed_s`` into it, sends again."""
        if self.requests is not None:
            return sent < self.requests
        assert self.duration_s is not None
        return sent < self.concurrency or elapsed_s < self.duration_s


def make_plan(url: str, model: str, *, max_concurrency: int, prompt_tokens: int, output_tokens: int,
              ttft_p99_target_ms: float, rounds: int | None = None, step_s: float | None = None,
              request_timeout_s: float = 120.0, kv_bytes_per_token: int | None = None) -> CalibrationPlan:
    """The plan, or a ``ConfigError`` naming every bad value (each its own line, as the command line spells it)."""
    problems: list[str] = []
    try:
        base_url = check_http_url(url)
    except ValueError as exc:
        problems.append(f"URL {exc}")
        base_url = url
    base_url = base_url.removesuffix("/v1")
    if not model.strip():
        problems.append("--model must name the model the backend serves, got an empty name")
    for flag, value in (("--max-concurrency", max_concurrency), ("--prompt-tokens", prompt_tokens),
                        ("--output-tokens", output_tokens), ("--rounds", rounds),
                        ("--kv-bytes-per-token", kv_bytes_per_token)):
        if value is not None and value < 1:
            problems.append(f"{flag} must be a whole number >= 1, got {value}")
    for flag, seconds in (("--ttft-p99-target-ms", ttft_p99_target_ms), ("--seconds-per-step", step_s),
                          ("--request-timeout-s", request_timeout_s)):
        if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
            problems.append(f"{flag} must be a positive number, got {seconds:g}")
    if rounds is not None and step_s is not None:
        problems.append("give --rounds or --seconds-per-step, not both")
    if problems:
        raise ConfigError([ConfigProblem(SOURCE, p) for p in problems])
    if rounds is None and step_s is None:
        rounds = DEFAULT_ROUNDS
    return CalibrationPlan(base_url, model, max_concurrency, prompt_tokens, output_tokens, ttft_p99_target_ms / 1000,
                           rounds, step_s, request_timeout_s, kv_bytes_per_token)


def concurrencies(max_concurrency: int) -> tuple[int, ...]:
    """1, 2, 4, … below ``max_concurrency``, then ``max_concurrency``."""
    out = []
    c = 1
    while c < max_concurrency:
        out.append(c)
        c *= 2
    return (*out, max_concurrency)


def steps(plan: CalibrationPlan) -> tuple[Step, ...]:
    return tuple(Step(c, None if plan.rounds is None else c * plan.rounds, plan.step_s)
                 for c in concurrencies(plan.max_concurrency))
