"""Helpers of the ``tokenpools calibrate`` integration tests (test_calibrate_sim.py, test_vllm_calibrate.py): run the
command as an operator would, and check its outputs against each other and against ``tokenpools validate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokenpools.calibrate.block import floor_significant
from tokenpools.cli import main

POOL = """\
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: calibrated}}
spec:
  model: {model}
  backendRef: {{name: backend}}
  kvBytesPerToken: {kv_bytes_per_token}
"""


def calibrate(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> dict[str, Any]:
    """``tokenpools calibrate ARGS --json --out OUT``: exit 0, and the JSON it printed, which is OUT's too."""
    assert main(["calibrate", *args, "--json", "--out", str(out)]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert json.loads((out / "calibration.json").read_text()) == document
    png = (out / "calibration.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    return document


def check_consistent(document: dict[str, Any]) -> dict[str, Any]:
    """The block is the chosen step's figures, that step met the target and no larger one did; the chosen step."""
    target_s = document["settings"]["ttft_p99_target_s"]
    steps = {s["concurrency"]: s for s in document["steps"]}
    chosen = steps[document["chosen_concurrency"]]
    assert chosen["verdict"] == "under target" and chosen["ttft_p99_s"] <= target_s
    assert all(s["verdict"] != "under target" for c, s in steps.items() if c > chosen["concurrency"])
    for s in steps.values():
        assert s["ttft_p50_s"] <= s["ttft_p99_s"] <= s["e2e_p99_s"]
        assert s["total_tokens_per_s"] * s["elapsed_s"] == pytest.approx(s["prompt_tokens"] + s["completion_tokens"])
    block = document["per_replica"]
    assert block["concurrency"] == chosen["concurrency"]
    assert block["tokensPerSecond"] == floor_significant(chosen["total_tokens_per_s"])
    return chosen


def check_validates(capsys: pytest.CaptureFixture[str], out: Path, model: str, kv_bytes_per_token: int) -> None:
    """calibration.yaml pasted under a TokenPool's spec: ``tokenpools validate`` accepts it, with the block's values."""
    snippet = (out / "calibration.yaml").read_text()
    pool = POOL.format(model=model, kv_bytes_per_token=kv_bytes_per_token)
    path = out / "pool.yaml"
    path.write_text(pool + "".join(f"  {line}\n" for line in snippet.splitlines()))
    assert main(["validate", str(path)]) == 0
    assert f"{path}: valid (1 pool, 0 entitlements)" in capsys.readouterr().out
