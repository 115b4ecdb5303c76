"""A turn's builtin tools, built when first looked at.

Every turn gets a table of turnlog's own tools (closures over its ports), but
most turns never look at it: a plain request's assembly offers no tool and
its model calls none. Building the table on first use keeps its cost (a
``ToolSpec`` and a closure per configured tool) off the start of those turns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from engine.tools.builtin import BuiltinPorts, BuiltinTool, builtin_tools


class LazyBuiltins(Mapping[str, BuiltinTool]):
    """``builtin_tools(ports)``, computed once, on the first lookup."""

    def __init__(self, ports: BuiltinPorts, build: Callable[[BuiltinPorts], dict[str, BuiltinTool]] = builtin_tools) -> None:
        self._ports = ports
        self._build = build
        self._tools: dict[str, BuiltinTool] | None = None

    def _table(self) -> dict[str, BuiltinTool]:
        if self._tools is None:
            self._tools = self._build(self._ports)
        return self._tools

    def __getitem__(self, name: str) -> BuiltinTool:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())
