"""Waiting, bounded, for a condition that nothing signals.

Tests wait on events wherever the code offers one. Some conditions have no
event to wait on: another process writing a file, the kernel draining a socket
buffer or emptying a pid namespace, a worker thread popping its queue. Those
are polled here, always against a deadline, so a condition that never comes
fails the test with what it waited for instead of hanging it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], object], what: str, *, within: float = 10.0, every: float = 0.01) -> None:
    """Return once ``condition()`` is true; fail naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        if condition():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {within} s")
        await asyncio.sleep(every)
