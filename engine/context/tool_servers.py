"""The assembly step that connects a turn's tool servers (MCP) and lists their tools.

It runs before the tools are offered (native) or chosen (prompt-based), so a
server's tools are among them. What it found is recorded: the tool names per
server, and a warning for each server that could not be reached or listed —
the turn goes on without that server's tools, and a resume or a ``verify``
never connects again to know what was offered. Server instructions are
appended to the system message, as Open WebUI does.
"""

from __future__ import annotations

from engine.context.messages import add_or_update_system_message
from engine.context.steps import Draft
from engine.json_types import JsonObject
from engine.ports import TurnToolServers
from engine.protocols.shapes import json_list

STEP = "tool_servers"


class ToolServersStep:
    name = STEP

    def __init__(self, servers: TurnToolServers) -> None:
        self._servers = servers

    async def run(self, draft: Draft) -> JsonObject | None:
        listing = await self._servers.connect()
        if not listing.tools and not listing.warnings:
            return None
        for text in listing.instructions:
            draft.messages = add_or_update_system_message(text, list(draft.messages), append=True)
        detail: JsonObject = {"servers": {tool_id: json_list(names) for tool_id, names in listing.tools.items()}}
        if listing.warnings:
            detail["warnings"] = json_list(listing.warnings)
        return detail
