"""Direct tools: declared by the client, run by the client over the WebSocket.

The turn asks with ``execute:tool`` and waits (with a timeout) for the client's
``tool_result``. A missing client or a timeout is an error result the model
sees, never a hung turn.
"""

from __future__ import annotations

from typing import Protocol

from engine.json_types import JsonObject
from engine.tools.calls import ToolContext, ToolSpec


class ClientChannel(Protocol):
    """A turn's way to the WebSocket clients that run its direct tools."""

    async def ask(self, call_id: str, name: str, arguments: JsonObject, timeout: float) -> object:
        """Send ``execute:tool`` and wait for the client's result (an error dict
        when no client is connected or none answers in time): whatever JSON the
        client sent, which ``normalize_result`` reads."""
        ...


def _parameters(value: object) -> JsonObject:
    return value if isinstance(value, dict) else {"type": "object", "properties": {}}


def direct_tool_specs(declared: object) -> list[ToolSpec]:
    """Specs from the request's ``direct_tools`` (OpenAI tool shape, or the bare function)."""
    specs = []
    for entry in declared if isinstance(declared, list) else []:
        fn = entry.get("function", entry) if isinstance(entry, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        specs.append(
            ToolSpec(
                name=fn["name"],
                description=str(fn.get("description") or ""),
                parameters=_parameters(fn.get("parameters")),
                tool_id=f"direct:{fn['name']}",
                kind="direct",
            )
        )
    return specs


class DirectToolHandle:
    """A ``ToolHandle`` whose call is answered by the client."""

    def __init__(self, spec: ToolSpec, channel: ClientChannel, timeout: float) -> None:
        self.spec = spec
        self._channel = channel
        self._timeout = timeout

    async def __call__(self, args: JsonObject, ctx: ToolContext) -> object:
        return await self._channel.ask(ctx.call_id or "", self.spec.name, args, self._timeout)
