"""Several kinds of tool servers (MCP, OpenAPI) as one ``ToolServers`` port.

Each kind owns the tool ids of its prefix (``mcp:NAME``, ``openapi:NAME``);
a turn's servers of every kind are connected together, their listings
merged in the order the kinds are given, and closed together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

from engine.ports import NoTurnToolServers, ToolCatalog, ToolServerListing, ToolServers, TurnToolServers
from engine.tools.calls import ToolHandle


class PrefixedServers(ToolServers, Protocol):
    prefix: str


class CombinedTurnServers:
    """``engine.ports.TurnToolServers`` over one turn's servers of each kind."""

    def __init__(self, parts: Sequence[TurnToolServers]) -> None:
        self._parts = list(parts)

    async def connect(self) -> ToolServerListing:
        listings = await asyncio.gather(*(part.connect() for part in self._parts))
        tools: dict[str, list[str]] = {}
        warnings: list[str] = []
        instructions: list[str] = []
        for listing in listings:
            tools.update(listing.tools)
            warnings += listing.warnings
            instructions += listing.instructions
        return ToolServerListing(tools, warnings, instructions)

    def handle(self, name: str) -> ToolHandle | None:
        for part in self._parts:
            found = part.handle(name)
            if found is not None:
                return found
        return None

    def listed(self) -> Mapping[str, ToolHandle]:
        merged: dict[str, ToolHandle] = {}
        for part in reversed(self._parts):  # the first kind wins a clash, as in ``handle``
            merged.update(part.listed())
        return merged

    async def close(self) -> None:
        await asyncio.gather(*(part.close() for part in self._parts), return_exceptions=True)


class ToolServerSet:
    """``engine.ports.ToolServers`` and the process's ``ToolCatalog``: the
    servers of each kind over the tool modules of ``base`` (so that their
    tool ids are ones a request may name)."""

    def __init__(self, base: ToolCatalog, kinds: Sequence[PrefixedServers]) -> None:
        self.base = base
        self.kinds = list(kinds)

    def known_ids(self) -> set[str]:
        ids = set(self.base.known_ids())
        for kind in self.kinds:
            ids |= kind.known_ids()
        return ids

    def handles(self, tool_ids: Sequence[str]) -> dict[str, ToolHandle]:
        prefixes = tuple(kind.prefix for kind in self.kinds)
        return self.base.handles([t for t in tool_ids if not t.startswith(prefixes)])

    def open(self, tool_ids: Sequence[str]) -> TurnToolServers:
        parts = [part for part in (kind.open(tool_ids) for kind in self.kinds) if not isinstance(part, NoTurnToolServers)]
        if not parts:
            return NoTurnToolServers()  # the plain request's fast path knows this one
        return parts[0] if len(parts) == 1 else CombinedTurnServers(parts)
