"""Calibration of one simulated vLLM replica (pure data, no behaviour beyond arithmetic).

The defaults describe the paper's testbed (§5.1): one vLLM replica of Qwen3-8B-NVFP4 on a DGX Spark with
16 sequence slots and "about 240 tokens/s total". A decode step at batch size B takes
``decode_step_base_s + decode_step_per_seq_s * B`` seconds; 0.030 s + 0.0023 s x 16 = 66.8 ms, which is
16 / 0.0668 = 239.5 output tokens/s with every slot decoding. Prefill costs ``prefill_s_per_token`` per prompt
token; the paper gives no prefill figure, so 0.000125 s (8k prompt tokens/s) is chosen to keep the Exp-1
request shape (64 in / 64 out) at 232.6 output tokens/s in steady state, within 5% of the paper's 240, while
a burst of 16 x 64-token prefills costs 0.128 s of TTFT. (0.0005 s/token would drop Exp 1 to 214 tokens/s.)

Every duration is quantised to whole nanoseconds by the simulator (see ``simulator``); the helpers here
use the unquantised floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ReplicaModel", "decode_step_s", "full_load_tokens_per_s"]


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{name}` must be an int, got {value!r}")
    if value <= 0:
        raise ValueError(f"`{name}` must be positive, got {value}")


def _require_non_negative_s(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number of seconds, got {value!r}")
    if value < 0:
        raise ValueError(f"`{name}` must be non-negative, got {value}")


@dataclass(frozen=True, slots=True)
class ReplicaModel:
    """Timing and capacity of one vLLM replica. Immutable; validated on construction."""

    max_num_seqs: int = 16
    """Sequence slots per replica (vLLM ``--max-num-seqs``)."""
    kv_capacity_tokens: int = 16 * 4096
    """KV-cache capacity in tokens; the default is large enough that Exp 1/2 never run out."""
    prefill_s_per_token: float = 0.000125
    """Prefill cost per prompt token (s); added to the step that schedules the sequence."""
    decode_step_base_s: float = 0.030
    """Fixed cost of one decode step (s), whatever the batch size."""
    decode_step_per_seq_s: float = 0.0023
    """Marginal cost of one more sequence in a decode step (s)."""
    startup_delay_s: float = 30.0
    """Time from a scale-up decision until a new replica serves (s)."""
    preempt_on_kv_exhaustion: bool = True
    """True: vLLM recompute preemption when KV runs out. False: admission reserves prompt + output up front."""

    def __post_init__(self) -> None:
        _require_positive_int("max_num_seqs", self.max_num_seqs)
        _require_positive_int("kv_capacity_tokens", self.kv_capacity_tokens)
        _require_non_negative_s("prefill_s_per_token", self.prefill_s_per_token)
        _require_non_negative_s("decode_step_base_s", self.decode_step_base_s)
        _require_non_negative_s("decode_step_per_seq_s", self.decode_step_per_seq_s)
        _require_non_negative_s("startup_delay_s", self.startup_delay_s)
        if self.decode_step_base_s + self.decode_step_per_seq_s < 1e-9:
            raise ValueError(
                "`decode_step_base_s + decode_step_per_seq_s` must be at least 1 ns (a step must take time), "
                f"got {self.decode_step_base_s + self.decode_step_per_seq_s}"
            )
        if not isinstance(self.preempt_on_kv_exhaustion, bool):
            raise ValueError(f"`preempt_on_kv_exhaustion` must be a bool, got {self.preempt_on_kv_exhaustion!r}")


def decode_step_s(model: ReplicaModel, batch_size: int) -> float:
    """Duration of one decode step with ``batch_size`` running sequences (no prefill in it)."""
    return model.decode_step_base_s + model.decode_step_per_seq_s * batch_size


def full_load_tokens_per_s(model: ReplicaModel, prompt_tokens: int = 0, output_tokens: int = 1) -> float:
    """Steady-state output tokens/s of one replica kept full (every slot refilled as soon as it frees).

    Each request of the given shape needs ``output_tokens`` decode steps at batch ``max_num_seqs`` and adds its
    prefill to one of them, so per ``max_num_seqs`` completions the replica spends
    ``output_tokens * step(B) + B * prompt_tokens * prefill_s_per_token`` seconds. With the defaults
    (``prompt_tokens=0``) this is the pure decode rate B / step(B).
    """
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 0:
        raise ValueError(f"`prompt_tokens` must be a non-negative int, got {prompt_tokens!r}")
    _require_positive_int("output_tokens", output_tokens)
    batch = model.max_num_seqs
    cycle_s = output_tokens * decode_step_s(model, batch) + batch * prompt_tokens * model.prefill_s_per_token
    return batch * output_tokens / cycle_s
