"""Which requests the assembly may take by its short path.

Most turns are plain: text messages, no features, files, tools or filters.
For them every step between the history and the system messages finds
nothing to do (each returns None and leaves the draft as it was), yet building
and running them is most of the assembly's cost at the start of a turn. A
plain draft skips them; everything recorded and the upstream request stay
the same (``tests/test_plain_assembly.py`` compares both paths).

The test below is a conjunction of the conditions under which each skipped
step is a no-op; a step added to the pipeline must be added here too (or the
short path taken only when it would do nothing).
"""

from __future__ import annotations

from engine.context.steps import Draft
from engine.ports import Filters, NoTurnToolServers, TurnToolServers

# Request fields that make one of the skipped steps act: files (Files,
# AttachedFiles), tools (_OfferedTools, _LegacyTools, ToolServersStep: a turn's
# own tools come only from these two), features (Memory, web search, images,
# the code interpreter, Unsupported).
_ACTING_FIELDS = ("files", "tool_ids", "direct_tools")


def plain_request(draft: Draft, filters: Filters, servers: TurnToolServers) -> bool:
    """True when every step after the history and before the system messages
    would leave ``draft`` unchanged and record nothing."""
    request = draft.request
    for name in _ACTING_FIELDS:
        if request.get(name):
            return False
    features = request.get("features")
    if isinstance(features, dict) and any(features.values()):
        return False
    if draft.profile.knowledge or draft.params.get("tools"):
        return False
    if not isinstance(servers, NoTurnToolServers) or "inlet" in filters.hooks():
        return False
    # UserImages and AttachedFiles: only text messages without files.
    return all(_plain_message(m) for m in draft.messages)


def _plain_message(message: object) -> bool:
    if not isinstance(message, dict) or "files" in message:
        return False
    content = message.get("content")
    return content is None or isinstance(content, str)
