"""A whole calibration: what was measured, what it concludes, and the JSON document that records both (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenpools.calibrate.block import per_replica, snippet
from tokenpools.calibrate.choose import StepVerdict, choose, verdict
from tokenpools.calibrate.kv import KvCache, KvEstimate, kv_cache_gib
from tokenpools.calibrate.plan import CalibrationPlan
from tokenpools.calibrate.stats import StepStats

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Calibration:
    plan: CalibrationPlan
    measured_at: str  # RFC 3339, UTC, when the first step began
    ignore_eos: bool  # whether the backend accepted vLLM's ignore_eos (the warm-up found out)
    prompt_words: int  # the words of every step's prompts (``workload.words_for``)
    kv: KvCache | None
    steps: tuple[StepStats, ...]
    warm_up_tokens: tuple[int, int] = (0, 0)  # (prompt, completion) of the two warm-up requests, in no step

    def verdicts(self) -> tuple[StepVerdict, ...]:
        return tuple(verdict(s, self.plan.ttft_p99_target_s) for s in self.steps)

    def chosen(self) -> StepStats | None:
        return choose(self.steps, self.plan.ttft_p99_target_s)

    def kv_estimate(self) -> KvEstimate:
        return kv_cache_gib(self.kv, self.plan.kv_bytes_per_token)

    def block(self) -> dict[str, float | int] | None:
        """The proposed ``perReplica`` (None when no step met the target)."""
        chosen = self.chosen()
        return None if chosen is None else per_replica(chosen, self.kv_estimate().gib)

    def notes(self) -> list[str]:
        """What a reader of the figures should know: the KV cache's source, early stops, failures."""
        plan, out = self.plan, [f"kvCacheGiB: {self.kv_estimate().how}"]
        if not self.ignore_eos:
            out.append("the backend refused vLLM's ignore_eos: requests may end before max_tokens (counted as "
                       "they came, from the usage)")
        answered = sum(s.answered for s in self.steps)
        if answered and (mean := sum(s.completion_tokens for s in self.steps) / answered) < plan.output_tokens:
            out.append(f"requests made {mean:.1f} completion tokens on average, below --output-tokens "
                       f"{plan.output_tokens}")
        for s, v in zip(self.steps, self.verdicts()):
            if v is StepVerdict.FAILED:
                kinds = ", ".join(f"{n} {outcome}" for outcome, n in s.failures.items()) or "no request sent"
                out.append(f"concurrency {s.concurrency}: {kinds} ({s.failure_detail or 'no detail'}); not chosen")
        chosen = self.chosen()
        if chosen is not None and engine_full(chosen):
            out.append(f"at concurrency {chosen.concurrency} requests waited {ms(chosen.backend_queue_mean_s)} ms on "
                       "average in the backend's own queue, half their median TTFT or more: it runs fewer at once "
                       "(vLLM's --max-num-seqs, or its KV cache), and the pool's concurrency would admit requests that "
                       "wait there. The target held; a lower --max-concurrency keeps the pool within the engine")
        if chosen is None:
            lowest = min((s.ttft_p99_s for s in self.steps if s.ttft_p99_s is not None), default=None)
            seen = "no step answered every request" if lowest is None else f"the lowest P99 TTFT was {lowest * 1000:.0f} ms"
            out.append(f"no concurrency kept P99 TTFT within {plan.ttft_p99_target_s * 1000:g} ms ({seen}): "
                       "no perReplica proposed")
        return out

    def header(self) -> list[str]:
        """The snippet's comment lines: where, when, what was chosen and why."""
        plan, chosen = self.plan, self.chosen()
        lines = [f"tokenpools calibrate {plan.base_url} --model {plan.model}, {self.measured_at}",
                 f"prompts of ~{plan.prompt_tokens} tokens, max_tokens {plan.output_tokens}"
                 f"{', ignore_eos' if self.ignore_eos else ''}; concurrency 1 to {plan.max_concurrency}"]
        if chosen is not None and chosen.ttft_p99_s is not None:
            lines.append(f"concurrency {chosen.concurrency}: the largest whose P99 TTFT "
                         f"({chosen.ttft_p99_s * 1000:.0f} ms) stayed within {plan.ttft_p99_target_s * 1000:g} ms; "
                         f"{chosen.total_tokens_per_s:,.1f} tokens/s (prompt + completion) there")
        estimate = self.kv_estimate()
        if estimate.gib is not None:
            lines.append(f"kvCacheGiB: {estimate.how}")
        return lines

    def snippet(self) -> str | None:
        block = self.block()
        return None if block is None else snippet(block, self.header(), self.kv_estimate().how)

    def document(self) -> dict[str, Any]:
        """Everything, as JSON-ready data: the settings, the backend's facts, every step, the choice."""
        plan, chosen, estimate = self.plan, self.chosen(), self.kv_estimate()
        return {
            "schema_version": SCHEMA_VERSION,
            "url": plan.base_url, "model": plan.model, "measured_at": self.measured_at,
            "settings": {"max_concurrency": plan.max_concurrency, "prompt_tokens": plan.prompt_tokens,
                         "output_tokens": plan.output_tokens, "ttft_p99_target_s": plan.ttft_p99_target_s,
                         "rounds": plan.rounds, "step_s": plan.step_s, "request_timeout_s": plan.request_timeout_s,
                         "kv_bytes_per_token": plan.kv_bytes_per_token},
            "backend": {"ignore_eos": self.ignore_eos, "prompt_words": self.prompt_words,
                        "warm_up_tokens": {"prompt": self.warm_up_tokens[0], "completion": self.warm_up_tokens[1]},
                        "kv_cache": None if self.kv is None else {
                            "engines": self.kv.engines, "tokens": self.kv.tokens,
                            "memory_bytes": self.kv.memory_bytes, "blocks": self.kv.blocks,
                            "block_size_tokens": self.kv.block_size_tokens}},
            "steps": [_step(s, v) for s, v in zip(self.steps, self.verdicts())],
            "chosen_concurrency": None if chosen is None else chosen.concurrency,
            "per_replica": self.block(),
            "kv_cache_gib": {"value": estimate.gib, "how": estimate.how},
            "notes": self.notes(),
        }


def engine_full(step: StepStats) -> bool:
    """Whether the step's requests spent half their median TTFT or more in the backend's queue (a full engine)."""
    queued_s, ttft_s = step.backend_queue_mean_s, step.ttft_p50_s
    return queued_s is not None and ttft_s is not None and queued_s >= ttft_s / 2


def ms(seconds: float | None) -> str:
    """Seconds as whole milliseconds for a reader ("—" for none)."""
    return "—" if seconds is None else f"{seconds * 1000:,.0f}"


def _step(s: StepStats, v: StepVerdict) -> dict[str, Any]:
    return {"concurrency": s.concurrency, "requests": s.requests, "answered": s.answered,
            "failures": {str(k): n for k, n in s.failures.items()}, "elapsed_s": s.elapsed_s,
            "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
            "output_tokens_per_s": s.output_tokens_per_s, "total_tokens_per_s": s.total_tokens_per_s,
            "ttft_p50_s": s.ttft_p50_s, "ttft_p99_s": s.ttft_p99_s, "e2e_p99_s": s.e2e_p99_s,
            "backend_queue_mean_s": s.backend_queue_mean_s, "verdict": str(v)}
