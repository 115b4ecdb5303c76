"""Direct tools' way to the client: ``execute:tool`` out over the live bus, the
client's ``tool_result`` back through the supervisor."""

from __future__ import annotations

import asyncio

from engine.json_types import JsonObject
from engine.ports import LiveBus, LiveRequest


class ClientRequests:
    """``engine.tools.direct.ClientChannel`` of one turn."""

    def __init__(self, bus: LiveBus, turn_id: str) -> None:
        self._bus = bus
        self._turn_id = turn_id
        self._waits: dict[str, asyncio.Future[object]] = {}

    async def ask(self, call_id: str, name: str, arguments: JsonObject, timeout: float) -> object:
        if not self._bus.has_client(self._turn_id):
            return {"error": f"no client is connected to run the direct tool {name}"}
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._waits[call_id] = future
        payload: JsonObject = {"type": "execute:tool", "turn_id": self._turn_id, "call_id": call_id, "name": name, "arguments": arguments}
        self._bus.publish(self._turn_id, LiveRequest(payload))
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            return {"error": f"the client did not answer the direct tool {name} within {timeout:g} s"}
        finally:
            self._waits.pop(call_id, None)

    def deliver(self, call_id: str, result: object) -> bool:
        """A client's answer; False if no call of that id is waiting."""
        future = self._waits.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(result)
        return True
