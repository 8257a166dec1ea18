"""One request's result and one step's statistics (pure: results in, figures out).

Definitions:

- TTFT: from sending the request to the first chunk of output (the first ``data:`` event with a choice), as the
  client sees it: it includes any wait in the backend's queue. End-to-end (e2e): from sending to the stream's end.
- Tokens: the backend's own counts, ``usage.prompt_tokens`` and ``usage.completion_tokens`` of each answered request.
- A step's elapsed time runs from its start to the end of its last request; tokens/s = tokens of the answered
  requests ÷ that time. *Total* tokens/s counts prompt + completion tokens: the unit of a pool's ``tokensPerSecond``.
- Backend queue: the mean time a request of the step waited in the backend's own queue before it was scheduled,
  from vLLM's ``vllm:request_queue_time_seconds_sum`` read before and after the step, over the answered requests
  (None where the backend does not expose it). It is what tells a TTFT that grows because the engine is full
  (``--max-num-seqs``, or the KV cache) from one that grows because each step computes more.
- Percentiles are nearest-rank (``tokenpools.core.quantiles``), over the answered requests only. A step in which
  any request failed is reported, never chosen (``choose``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tokenpools.core.quantiles import percentile


class RequestOutcome(StrEnum):
    """How one request ended."""

    OK = "ok"  # streamed to its end, with the backend's usage
    HTTP_ERROR = "http error"  # the backend answered with a status other than 200
    STREAM_ERROR = "stream error"  # an error event in the stream
    BROKEN = "broken"  # the connection failed, or the stream ended without any output
    TIMED_OUT = "timed out"  # not ended within the request timeout
    NO_USAGE = "no usage"  # the stream ended without a usage chunk: its tokens are unknown


@dataclass(frozen=True, slots=True)
class RequestResult:
    """``start_s`` and ``end_s`` on the shell's monotonic clock; ``detail`` says what went wrong, if anything."""

    outcome: RequestOutcome
    start_s: float
    end_s: float
    ttft_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    status: int | None = None  # the HTTP status, when the backend answered
    detail: str = ""

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class StepStats:
    concurrency: int
    requests: int  # sent
    answered: int  # outcome OK
    elapsed_s: float
    prompt_tokens: int  # of the answered requests
    completion_tokens: int
    ttft_p50_s: float | None  # None: no request was answered
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    failures: Mapping[RequestOutcome, int] = field(default_factory=dict)
    failure_detail: str = ""  # the first failure's detail
    backend_queue_mean_s: float | None = None  # None: the backend does not say

    @property
    def output_tokens_per_s(self) -> float:
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        """Prompt + completion tokens per second."""
        return (self.prompt_tokens + self.completion_tokens) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def failed(self) -> int:
        return self.requests - self.answered


def summarize(concurrency: int, started_s: float, results: Sequence[RequestResult],
              backend_queue_s: float | None = None) -> StepStats:
    """The statistics of a step that began at ``started_s`` and sent ``results`` (in any order); its requests
    waited ``backend_queue_s`` in all in the backend's queue, if known."""
    ok = [r for r in results if r.outcome is RequestOutcome.OK]
    failed = [r for r in results if r.outcome is not RequestOutcome.OK]
    ended_s = max((r.end_s for r in results), default=started_s)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2es = [r.e2e_s for r in ok]
    return StepStats(
        concurrency=concurrency, requests=len(results), answered=len(ok), elapsed_s=ended_s - started_s,
        prompt_tokens=sum(r.prompt_tokens for r in ok), completion_tokens=sum(r.completion_tokens for r in ok),
        ttft_p50_s=percentile(ttfts, 0.5), ttft_p99_s=percentile(ttfts, 0.99), e2e_p99_s=percentile(e2es, 0.99),
        failures=dict(Counter(r.outcome for r in failed)), failure_detail=failed[0].detail if failed else "",
        backend_queue_mean_s=backend_queue_s / len(ok) if backend_queue_s is not None and ok else None)
