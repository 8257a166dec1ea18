"""10,000 idle connections held open against the real proxy (by a child process, so that neither process needs
20,000 file descriptors) while a well-behaved client is served; then the header deadline clears them all."""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tokenpools.proxy.http.http_limits import CloseReason

from http_support import bystander, serving

pytestmark = [pytest.mark.component, pytest.mark.slow]

IDLE = 10_000
MARGIN = 200  # the process's other descriptors: event loop, backend, sockets of the test

HOLDER = textwrap.dedent("""
    import resource, socket, sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    held = []
    for _ in range(n):
        held.append(socket.create_connection((host, port)))
    print("ready", flush=True)
    sys.stdin.read()  # hold them until the test closes our stdin
""")


def room_for(n: int) -> int:
    """Raise the soft descriptor limit to the hard one; how many connections this process can then take."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return min(n, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - MARGIN)


async def test_ten_thousand_idle_connections_do_not_slow_a_bystander(tmp_path: Path) -> None:
    n = room_for(IDLE)
    if n < IDLE:
        pytest.skip(f"ulimit -n allows {n + MARGIN} descriptors (hard limit), {IDLE + MARGIN} are needed")
    async with serving(tmp_path, header_timeout_s=20.0, max_connections=IDLE + 10) as env:
        async with bystander(env) as seen:
            holder = await asyncio.create_subprocess_exec(
                sys.executable, "-c", HOLDER, env.host, str(env.port), str(n), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE)
            t0 = time.monotonic()
            assert holder.stdout is not None and holder.stdin is not None
            assert (await asyncio.wait_for(holder.stdout.readline(), 120)).strip() == b"ready"
            opened_s = time.monotonic() - t0
            while env.proxy.metrics.connections.open < n + 1:
                await asyncio.sleep(0.05)
            during = len(seen.latencies_ms)
            await asyncio.sleep(3.0)  # the sweeper looks at all of them every second
        seen.report(f"{n} idle connections (opened in {opened_s:.1f} s)")
        quiet = sorted(seen.latencies_ms[during:])
        print(f"bystander with {n} idle connections open: {len(quiet)} requests, "
              f"p99 {quiet[min(len(quiet) - 1, int(0.99 * len(quiet)))]:.2f} ms")
        assert seen.p(0.99) < 50.0
        holder.stdin.close()
        await holder.wait()
        while env.proxy.metrics.connections.open:
            await asyncio.sleep(0.05)
        assert env.proxy.metrics.connections.closed[CloseReason.CLIENT] >= n


async def test_idle_connections_past_the_header_deadline_are_closed(tmp_path: Path) -> None:
    n = room_for(2000)
    async with serving(tmp_path, header_timeout_s=0.5) as env:
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLDER, env.host, str(env.port), str(n), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE)
        assert holder.stdout is not None and holder.stdin is not None
        assert (await asyncio.wait_for(holder.stdout.readline(), 60)).strip() == b"ready"
        deadline = time.monotonic() + 10
        while env.proxy.metrics.connections.closed[CloseReason.HEADER_TIMEOUT] < n:
            assert time.monotonic() < deadline, env.proxy.metrics.connections
            await asyncio.sleep(0.05)
        assert env.proxy.metrics.connections.open == 0
        holder.stdin.close()
        await holder.wait()
