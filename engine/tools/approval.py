"""Tool approval: which calls wait for a person's decision, and what a
rejected call answers the model.

A call asks when the request says ``params.tool_approval: "ask"`` or when its
tool is configured so (``EngineSettings.approval_tools``: tool ids or function
names). The question and the answer are both events (``tool.approval_requested``,
``tool.approval``), so the wait survives restarts and a replay never asks again.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.json_types import JsonObject
from engine.tools.calls import ToolHandle

ASK = "ask"
MODES = ("ask", "auto")


def request_mode(request: JsonObject) -> str | None:
    """The request's ``params.tool_approval`` (None when it does not set it)."""
    params = request.get("params")
    value = params.get("tool_approval") if isinstance(params, dict) else None
    return value if isinstance(value, str) else None


def asks(request: JsonObject, approval_tools: frozenset[str], name: str, handle: ToolHandle | None) -> bool:
    """Whether a call of ``name`` (run by ``handle``; None: the legacy code
    interpreter) waits for a decision. ``"auto"`` in the request does not
    override a tool configured to ask: the operator's setting wins."""
    if request_mode(request) == ASK:
        return True
    if handle is None:
        return False
    return _configured(approval_tools, name, handle.spec.tool_id)


def _configured(approval_tools: frozenset[str], name: str, tool_id: str | None) -> bool:
    return bool(name and name in approval_tools) or bool(tool_id and tool_id in approval_tools)


def unaskable(request: JsonObject, approval_tools: frozenset[str], tools: Iterable[tuple[str, str | None]]) -> list[str]:
    """Of a prompt-based turn's ``tools`` (``(function name, tool id)``; a tool
    server whose functions are not listed yet: ``("", its id)``), the names
    whose calls would wait for a decision. Prompt mode runs the tools it
    selects during assembly, where no call can wait, so these must not run."""
    ask_all = request_mode(request) == ASK
    return sorted({name or tool_id or "" for name, tool_id in tools if ask_all or _configured(approval_tools, name, tool_id)})


def prompt_mode_refusal(names: Iterable[str]) -> str:
    """Why a prompt-based turn cannot offer tools that ask for approval."""
    listed = ", ".join(f"`{n}`" for n in names)
    return (
        f"tool approval is not available with prompt-based function calling (params.function_calling "
        f'"default" or "legacy"): calls of {listed} wait for a person\'s approval, but prompt mode runs the tools '
        f'it selects before the answer, with nobody to ask. Use function_calling "native", or leave these tools out.'
    )


def rejected_output(name: str, reason: str | None) -> str:
    """What the model sees for a call a person rejected."""
    text = f"Error: the call to `{name}` was rejected by the user and was not run."
    return f"{text} Reason: {reason}" if reason else text
