"""The function names a tool server's tools get (MCP and OpenAPI alike).

The model sees ``SERVER_TOOL``: characters OpenAI refuses in a function name
replaced by ``_``, and a name over 64 characters cut to its first 55 + ``_`` +
8 hex digits of the full name's sha256, as Open WebUI does, so two long names
sharing a prefix stay apart.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

from engine.tools.calls import ToolSpec

MAX_NAME = 64  # OpenAI's limit for a function name
INVALID = re.compile(r"[^A-Za-z0-9_-]")


def _hashed(full: str) -> str:
    return f"{INVALID.sub('_', full)[:55]}_{hashlib.sha256(full.encode()).hexdigest()[:8]}"


def function_name(server: str, tool: str) -> str:
    """The name the model sees for ``tool`` of ``server``."""
    full = f"{server}_{tool}"
    name = INVALID.sub("_", full)
    return _hashed(full) if len(name) > MAX_NAME else name


def function_names(server: str, tools: Sequence[str]) -> dict[str, str]:
    """Function name -> the server's tool name, unique within the server (a
    clash after replacing characters gets the hash too). Deterministic in the
    listing, so a resumed turn finds the same names again."""
    names: dict[str, str] = {}
    for tool in tools:
        name = function_name(server, tool)
        if name in names:
            name = _hashed(f"{server}_{tool}")
        names[name] = tool
    return names


def server_prefix(server: str) -> str:
    """What every function name of ``server`` starts with."""
    return f"{INVALID.sub('_', server)}_"


def unlisted_spec(name: str, prefix: str, timeouts: Mapping[str, float | None]) -> tuple[str, ToolSpec] | None:
    """A function name this process did not list (a resumed turn's call) as
    the server it names (``timeouts``: each server's call timeout) and a spec
    whose parameters are known only at the call, or None."""
    for server, timeout in timeouts.items():
        if name.startswith(server_prefix(server)):
            spec = ToolSpec(
                name=name,
                description=name,
                parameters={"type": "object", "properties": {}},
                tool_id=f"{prefix}{server}",
                kind="server",
                timeout=timeout,
                filter_parameters=False,  # the tool's parameters are known only at the call
            )
            return server, spec
    return None
