"""Real tool modules for the agent-loop tests, written into a tools folder."""

from __future__ import annotations

from pathlib import Path

WEATHER = '''
import asyncio
import time

# Lookups run in pairs that must overlap: the first of a pair returns only once
# the second has started, and the second only once the first has returned (so
# results come in call order, whatever the scheduling). Run one after the
# other, each waits alone and fails, well before the test's tool timeout.
ALONE_AFTER = 0.8  # seconds
_started: list[str] = []  # cities of the lookups running
_second_started = asyncio.Event()
_first_returned = asyncio.Event()


class Tools:
    async def get_weather(self, city: str, __event_emitter__=None) -> str:
        """Current weather of a city.

        :param city: the city name
        """
        first = len(_started) % 2 == 0
        _started.append(city)
        try:
            async with asyncio.timeout(ALONE_AFTER):
                if first:
                    await _second_started.wait()
                else:
                    _second_started.set()
                    await _first_returned.wait()
        except TimeoutError:
            _started.remove(city)
            raise RuntimeError(f"get_weather({city}) ran alone: no other lookup ran while it waited (not concurrent)") from None
        if __event_emitter__ is not None:
            await __event_emitter__({"type": "status", "data": {"description": f"looking up {city}", "done": False}})
        if first:
            _second_started.clear()
            _first_returned.set()  # the second of the pair may return now
        else:
            _first_returned.clear()
            del _started[:2]
        return f"{city}: sunny, 21C"

    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def explode(self, reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"kaboom: {reason}")

    async def slow(self, seconds: float) -> str:
        """Sleeps."""
        await asyncio.sleep(seconds)
        return "finally"

    async def render_chart(self, __event_emitter__=None) -> str:
        """Draws a chart and shows it to the user."""
        import base64

        png = base64.b64encode(bytes([0x89]) + b"PNG" + bytes([13, 10, 26, 10]) + bytes(range(256)) * 400).decode()
        await __event_emitter__({"type": "files", "data": {"files": [{"type": "image", "url": "data:image/png;base64," + png}]}})
        return "chart shown"

    def snapshot(self) -> str:
        """A screenshot for the model to look at."""
        return "data:image/png;base64,iVBORw0KGgo="

    def photo(self) -> str:
        """A large photo for the model to look at."""
        import base64

        return "data:image/png;base64," + base64.b64encode(bytes([0x89]) + b"PNG" + bytes([13, 10, 26, 10]) + bytes(range(256)) * 400).decode()

    def search(self, q: str) -> dict:
        """Search something."""
        return {"query": q, "hits": 1}
'''

SIDE_EFFECTS = '''
import asyncio
import json
import os
from pathlib import Path

LOG = Path(os.environ["TURNLOG_TEST_TOOL_LOG"])


def _note(name):
    with LOG.open("a") as fh:
        fh.write(name + "\\n")


class Tools:
    async def send_email(self, to: str) -> str:
        """Sends an email (not idempotent)."""
        _note("send_email")
        await asyncio.sleep(float(os.environ.get("TURNLOG_TEST_TOOL_SLEEP", "0")))
        return f"sent to {to}"
'''

IDEMPOTENT = '''
import asyncio
import os
from pathlib import Path

LOG = Path(os.environ["TURNLOG_TEST_TOOL_LOG"])


class Tools:
    idempotent = True

    async def lookup(self, key: str) -> str:
        """A read-only lookup (safe to run twice)."""
        with LOG.open("a") as fh:
            fh.write("lookup\\n")
        await asyncio.sleep(float(os.environ.get("TURNLOG_TEST_TOOL_SLEEP", "0")))
        return f"value of {key}"
'''


ORDER = '''
import asyncio

# Two calls of one batch that finish in the reverse of their call order: the
# first returns only once the second has returned.
_second_returned = asyncio.Event()


class Tools:
    async def first(self) -> str:
        """Returns after second() has returned."""
        await asyncio.wait_for(_second_returned.wait(), 5)
        return "first done"

    async def second(self) -> str:
        """Returns at once."""
        _second_returned.set()
        return "second done"
'''


def write_tools(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "order.py").write_text(ORDER)
    (folder / "weather.py").write_text(WEATHER)
    (folder / "mail.py").write_text(SIDE_EFFECTS)
    (folder / "kv.py").write_text(IDEMPOTENT)
    return folder
