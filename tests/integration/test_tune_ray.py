"""``tokenpools tune --ray`` on a real local Ray cluster: a head and one worker node, one CPU each.

Pinned: trials run as Ray tasks give the same trial digests and the same best point as a serial run on the same
log, space and seed. The cluster lives in a temporary directory with a small object store and is stopped at the
end (``ray stop``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenpools.cli import main
from tokenpools.replay import experiments, logio
from tokenpools.replay.replayer import replay

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = str(80 * 2**20)
SPACE = """\
parameters:
  policy.alpha_debt: {low: 0.5, high: 4.0}
  policy.queue_slo_fraction: {low: 0.0, high: 1.0}
objectives:
  - {outcome: p99_client_ttft_s.guaranteed, direction: minimize}
constraints:
  - {outcome: refused.guaranteed-a, "<=": 200}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--num-cpus", "1", "--object-store-memory", OBJECT_STORE_BYTES, "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
                        "--temp-dir", temp, "--include-dashboard", "false", *common],
                       check=True, capture_output=True, env=env, timeout=180)
        subprocess.run([RAY, "start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.1", *common],
                       check=True, capture_output=True, env=env, timeout=180)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, env=env, timeout=120)


def test_ray_gives_the_serial_trials(ray_cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    logio.write_log(replay(experiments.build("exp1", ["load.compress=0.3"]), "token-pools"), log)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE, encoding="utf-8")
    runs = {}
    for name, extra in (("serial", ["--workers", "1"]), ("ray", ["--ray", ray_cluster])):
        code = main(["tune", str(log), "--config", str(ROOT / "examples" / "exp1.yaml"), "--space", str(space),
                     "--out", str(tmp_path / name), "--trials", "8", "--batch", "4", "--no-progress", "--json", *extra])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        runs[name] = json.loads(captured.out)
    assert runs["ray"]["digests"] == runs["serial"]["digests"]
    assert runs["ray"]["best"] == runs["serial"]["best"]
