"""Tool approval: which calls wait for a person's decision, and what a
rejected call answers the model.

A call asks when the request says ``params.tool_approval: "ask"`` or when its
tool is configured so (``EngineSettings.approval_tools``: tool ids or function
names). The question and the answer are both events (``tool.approval_requested``,
``tool.approval``), so the wait survives restarts and a replay never asks again.
"""

from __future__ import annotations

from typing import Any

from engine.tools.calls import ToolHandle

ASK = "ask"
MODES = ("ask", "auto")


def request_mode(request: dict[str, Any]) -> str | None:
    """The request's ``params.tool_approval`` (None when it does not set it)."""
    params = request.get("params")
    value = params.get("tool_approval") if isinstance(params, dict) else None
    return value if isinstance(value, str) else None


def asks(request: dict[str, Any], approval_tools: frozenset[str], name: str, handle: ToolHandle | None) -> bool:
    """Whether a call of ``name`` (run by ``handle``; None: the legacy code
    interpreter) waits for a decision. ``"auto"`` in the request does not
    override a tool configured to ask: the operator's setting wins."""
    if request_mode(request) == ASK:
        return True
    if handle is None:
        return False
    return name in approval_tools or bool(handle.spec.tool_id and handle.spec.tool_id in approval_tools)


def rejected_output(name: str, reason: str | None) -> str:
    """What the model sees for a call a person rejected."""
    text = f"Error: the call to `{name}` was rejected by the user and was not run."
    return f"{text} Reason: {reason}" if reason else text
