"""``--backend vllm``: measure one vLLM replica with ``tokenpools calibrate``, then write Exp 1 rescaled to it.

The replica is the one the stack would start for the file's pool (``components.vllm_replica``: the tiny model under
the pool's model name, ``--max-num-seqs`` the file's slots, the engine reniced), started on its own, calibrated at
1, 2, 4, … up to the file's slots with Exp 1's requests (64 prompt + 64 output tokens) against the guaranteed
tenants' SLO, and stopped. ``OUT/calibration/`` keeps the calibration's files (``tokenpools calibrate --out``'s)
and the replica's log; ``OUT/exp1-vllm.yaml`` is the rescaled config (``live.rescale``) the run then uses, with
``load.service_s`` the measured service time. The stack then starts its own vLLM with ``--max-num-seqs`` the
rescaled slots.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tokenpools.errors import PermanentError
from tokenpools_dev.live.rescale import MeasuredReplica, guaranteed_slo_ms, rescale_documents
from tokenpools_dev.live.runner import LiveOptions

EXP1_PROMPT_TOKENS = EXP1_OUTPUT_TOKENS = 64  # replay.experiments.exp1's Lengths(64, 64)
CALIBRATION_STEP_S = 5.0
"""Seconds a calibration step sends for: its default 8 rounds took 2–3 s a step with this tiny model, and a
neighbour's burst then decided a step (P99 TTFT 1.2 s at concurrency 4 between 0.3 and 0.5 s at 2 and 8)."""


class CalibrationFailed(PermanentError):
    """No concurrency of the backend kept P99 TTFT within the guaranteed SLO: there is no pool to rescale to."""


@dataclass(frozen=True, slots=True)
class Rescaled:
    options: LiveOptions  # the run's options on the rescaled config, with load.service_s
    measured: MeasuredReplica
    target_ms: float
    calibration_s: float  # wall seconds: vLLM's start, the calibration and its stop
    reference_ttft_s: float  # P50 TTFT of one request alone (concurrency 1): a TTFT with no wait in vLLM's queue

    def note(self) -> str:
        """What report.md says of the backend."""
        m = self.measured
        return (f"Backend: real vLLM (CPU build, the tiny random-weight model of docs/vllm.md), one replica. The pool "
                f"and the load were rescaled to `tokenpools calibrate` on it (`calibration/`): {m.concurrency} slots "
                f"kept P99 TTFT within {self.target_ms:g} ms at {m.tokens_per_s:,.0f} prompt + completion tokens/s, "
                f"{m.service_s * 1000:.0f} ms per request at full load (`load.service_s`); the config the run used "
                f"is `{self.options.config}`. The simulation columns replay the same rescaled experiment on the "
                "simulated replica with its step times scaled to that service time.")


def calibrate_and_rescale(options: LiveOptions, progress: Any = print, *, max_slots: int | None = None,
                          step_s: float = CALIBRATION_STEP_S) -> Rescaled:
    """Calibrate (concurrency 1, 2, 4, … up to the file's slots or ``max_slots``, ``step_s`` a step), rescale."""
    from tokenpools.calibrate.cli import write
    from tokenpools.calibrate.plan import make_plan
    from tokenpools.calibrate.probe import calibrate
    from tokenpools.config import load_config
    from tokenpools.replay.experiments import examples_dir
    from tokenpools.runtime.clock import SystemClock
    from tokenpools_dev.devstack.stack.backend import VLLM_READY_TIMEOUT_S
    from tokenpools_dev.devstack.stack.components import vllm_replica
    from tokenpools_dev.devstack.stack.config import pool_layouts
    from tokenpools_dev.devstack.vllm import VLLMError, VLLMInstall

    started = time.monotonic()
    config = options.config or examples_dir() / f"{options.name}.yaml"
    source = load_config(config)
    documents = list(source.raw_documents)
    target_ms = guaranteed_slo_ms(documents)
    (layout,) = pool_layouts(source).values()
    try:
        install = VLLMInstall.find()
    except VLLMError as exc:
        raise PermanentError(str(exc)) from None
    out = options.out / "calibration"
    out.mkdir(parents=True, exist_ok=True)
    server = vllm_replica(layout, 0, out, install, VLLM_READY_TIMEOUT_S)
    progress(f"calibration: starting vLLM ({layout.slots} sequences; log {server.log_path})")
    most = min(layout.slots, max_slots or layout.slots)
    with server:
        prompt_tokens = load_prompt_tokens(server.base_url, layout.model)
        progress(f"calibration: vLLM ready in {server.startup_seconds:.0f} s; the load generator's prompts of "
                 f"{EXP1_PROMPT_TOKENS} are {prompt_tokens} of its tokens; tokenpools calibrate {server.base_url} "
                 f"--model {layout.model} --max-concurrency {most} --prompt-tokens {prompt_tokens} "
                 f"--output-tokens {EXP1_OUTPUT_TOKENS} --ttft-p99-target-ms {target_ms:g} --seconds-per-step "
                 f"{step_s:g}")
        plan = make_plan(server.base_url, layout.model, max_concurrency=most, prompt_tokens=prompt_tokens,
                         output_tokens=EXP1_OUTPUT_TOKENS, ttft_p99_target_ms=target_ms, step_s=step_s)
        calibration = asyncio.run(calibrate(plan, SystemClock()))
    write(calibration, out)
    for step, verdict in zip(calibration.steps, calibration.verdicts()):
        progress(f"calibration: concurrency {step.concurrency}: {step.total_tokens_per_s:,.0f} tokens/s, P99 TTFT "
                 f"{(step.ttft_p99_s or 0) * 1000:,.0f} ms, {verdict}")
    chosen = calibration.chosen()
    if chosen is None:
        raise CalibrationFailed(f"no concurrency kept vLLM's P99 TTFT within {target_ms:g} ms "
                                f"({out / 'calibration.json'})")
    measured = MeasuredReplica.from_step(chosen)
    rescaled = config_path(options)
    rescaled.write_text(header(config, measured, target_ms, out) + demo_keys(config.read_text(encoding="utf-8"))
                        + yaml.safe_dump_all(rescale_documents(documents, measured), sort_keys=False))
    new = replace(options, config=rescaled,
                  overrides=(*options.overrides, f"load.service_s={measured.service_s:.4f}"))
    progress(f"calibration: {measured.concurrency} slots, {measured.tokens_per_s:,.0f} tokens/s, "
             f"{measured.service_s * 1000:.0f} ms per request at full load; Exp 1 rescaled to it: {rescaled}")
    alone = next((s.ttft_p50_s for s in calibration.steps if s.concurrency == 1 and s.ttft_p50_s is not None),
                 chosen.ttft_p50_s or 0.0)
    return Rescaled(new, measured, target_ms, time.monotonic() - started, alone)


def load_prompt_tokens(base_url: str, model: str) -> int:
    """How many tokens the backend counts in the load generator's prompt of ``EXP1_PROMPT_TOKENS`` (its usage of one
    request of one output token): the tokens/s a slot moves are measured for requests of that size."""
    import json
    import urllib.request

    from tokenpools_dev.loadgen.plan import prompt_text

    body = json.dumps({"model": model, "prompt": prompt_text(EXP1_PROMPT_TOKENS), "max_tokens": 1}).encode()
    request = urllib.request.Request(base_url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return int(json.load(answer)["usage"]["prompt_tokens"])


def demo_keys(text: str) -> str:
    """The file's clear-text demo keys, as comment lines the load generator reads (``loadgen.keys``)."""
    from tokenpools_dev.loadgen.keys import comment_keys

    keys = comment_keys(text)
    return "".join(["# Demo API keys (from the file above):\n", *(f"#   {n}: {k}\n" for n, k in keys.items())]) if keys else ""


def config_path(options: LiveOptions) -> Path:
    return options.out / f"{options.name}-vllm.yaml"


def header(config: Path, measured: MeasuredReplica, target_ms: float, calibration_dir: Path) -> str:
    return (f"# {config} rescaled to one vLLM replica as `tokenpools calibrate` measured it ({calibration_dir}):\n"
            f"# {measured.concurrency} slots kept P99 TTFT within {target_ms:g} ms, at {measured.tokens_per_s:.1f} "
            f"prompt + completion tokens/s, a request holding its slot {measured.service_s:.4f} s.\n"
            "# Written by tokenpools_dev.live.calibrated (the rules: tokenpools_dev.live.rescale).\n")
