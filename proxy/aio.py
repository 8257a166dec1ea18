"""One asyncio helper: wait for something at most so long, without ever waiting on its cancellation.

``asyncio.wait_for`` cancels on timeout and then *waits for the cancellation to finish*; a library call that
shields itself or swallows CancelledError (seen with aiokafka clients at shutdown) then hangs the caller forever.
Shutdown paths use ``bounded`` instead: on timeout the call is cancelled and left behind, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

log = logging.getLogger("tokenpools.proxy")


def _retrieve(task: asyncio.Future[object]) -> None:
    if not task.cancelled():
        task.exception()  # mark it retrieved: a late failure of an abandoned call is not an unhandled error


async def bounded(aw: Awaitable[object], timeout_s: float, what: str) -> bool:
    """True if ``aw`` finished (successfully or not) within ``timeout_s``."""
    task = asyncio.ensure_future(aw)
    task.add_done_callback(_retrieve)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if done:
        return True
    task.cancel()
    log.warning("%s did not finish within %.1f s; going on without it", what, timeout_s)
    return False
