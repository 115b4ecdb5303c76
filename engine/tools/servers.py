"""A turn's tools by function name, tool servers (MCP) included.

A tool server's tools are known only once the turn has listed them (in its
assembly), so the table is a view rather than a dict built up front: turnlog's
own tools rank lowest, the servers' next, the turn's modules and direct tools
highest (a builtin never shadows a tool the request chose).
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping

from engine.ports import TurnToolServers
from engine.tools.calls import ToolHandle


class TurnTools(Mapping[str, ToolHandle]):
    """``TurnPorts.tools`` of a live turn."""

    def __init__(self, builtins: Mapping[str, ToolHandle], servers: TurnToolServers, own: Mapping[str, ToolHandle]) -> None:
        self._builtins = builtins
        self._servers = servers
        self._own = own

    def _merged(self) -> dict[str, ToolHandle]:
        return {**self._builtins, **self._servers.listed(), **self._own}

    def __getitem__(self, name: str) -> ToolHandle:
        for found in (self._own.get(name), self._servers.handle(name), self._builtins.get(name)):
            if found is not None:
                return found
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._merged())

    def items(self) -> ItemsView[str, ToolHandle]:
        """One merge, not a lookup per name (the assembly filters every tool
        of every turn through this)."""
        return self._merged().items()

    def __len__(self) -> int:
        return len(self._merged())
