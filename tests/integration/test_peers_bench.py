"""``benchmarks/peers.py --quick`` still runs end to end against direct and the tokenpools proxy.

A smoke test of the script, not of its figures (on 2 shared cores one short block says little): the real
llm-d-inference-sim and the real ``tokenpools proxy`` processes, both tables, ``--json`` written. LiteLLM is left
out: installing it (``scripts/install-litellm.sh``) takes minutes, far more than this test may.

What it asserts: every leg answered (samples at each rate, no errors), proxied responses have direct's bytes (like
with like), the throughput ratio is a ratio, and in table 2 the two standalone replicas hold at most twice the
key's limit in flight and refuse the rest with 429 (each enforces the limit alone: it knows no other replica without Kafka).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"


def test_peers_quick_direct_and_tokenpools(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--targets", "direct", "tokenpools",
                          "--rates", "100", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "| zero latency | no stream | direct |" in run.stdout and "| | | tokenpools |" in run.stdout  # table 1
    assert "| tokenpools | --no-kafka" in run.stdout  # table 2
    result = json.loads(out.read_text())
    assert result["machine"]["cores"] >= 1 and result["machine"]["date_utc"]
    assert len(result["overhead"]) == 4  # two backends × stream and not
    for case, rows in result["overhead"].items():
        assert set(rows) == {"direct", "tokenpools"}, case
        for name, row in rows.items():
            assert row["errors"] == {}, (case, name, row)
            cell = row["open_100"]
            assert cell["samples"] >= 90 and cell["failed"] == 0, (case, name, cell)
        tp, direct = rows["tokenpools"], rows["direct"]
        assert "added_p50_ms" in tp["open_100"] and "added_p99_ms" in tp["open_100"]
        assert tp["bytes_per_response"] > 0 and direct["bytes_per_response"] > 0
        if "no stream" in case:  # one JSON body each; a stream's chunk ids and timestamps vary in length
            assert abs(tp["bytes_per_response"] - direct["bytes_per_response"]) < 0.1 * direct["bytes_per_response"]
        assert direct["throughput_ratio"] == 1.0
        assert 0 < tp["throughput_ratio"] < 2
    conc = result["concurrency"]
    limit, sent = conc["limit"], conc["sent"]
    tp = conc["tokenpools"]
    assert sum(tp["outcomes"].values()) == sent
    assert limit <= tp["backend_max_running"] <= 2 * limit, tp
    served = tp["outcomes"].get("at once", 0) + tp["outcomes"].get("waited", 0)  # "waited": slow, not queued
    assert limit <= served <= 2 * limit and tp["outcomes"].get("429", 0) == sent - served, tp
    assert "litellm" not in conc
