"""What in a turn request steers turnlog (or Open WebUI) and never reaches an upstream.

The one deny-list: context assembly (``engine.context.assemble``) and the Open
WebUI params helper (``engine.context.messages``) both take it from here. An
OpenAI upstream answers an unknown top-level field with HTTP 400
("Unrecognized request argument supplied"), so every extension must be named.
"""

from __future__ import annotations

# Top-level request fields of turnlog and of Open WebUI's client (its chat
# request body), never forwarded upstream. ``metadata`` goes as a whole: Open
# WebUI puts its own keys there (``task``, ``chat_id``, ...), which OpenAI
# would store or refuse.
EXTENSION_FIELDS = frozenset(
    {
        # turnlog's own
        "chat_id",
        "history",
        "features",
        "files",
        "tool_ids",
        "params",
        "direct_tools",
        "background_tasks",
        "metadata",
        "responses",  # what only the served Responses API needs (its record of the request)
        # Open WebUI's client
        "session_id",
        "id",
        "parent_id",
        "parent_message",
        "user_message",
        "filter_ids",
        "tool_servers",
        "variables",
        "model_item",
        "regeneration_prompt",
    }
)

# Keys of ``params`` that steer turnlog or Open WebUI and are not model
# parameters. ``custom_params`` is decoded into model parameters instead.
TURNLOG_PARAMS = frozenset(
    {
        "stream_response",
        "stream_delta_chunk_size",
        "function_calling",
        "reasoning_tags",
        "compact_token_threshold",
        "system",
        "note_id",
        "tool_approval",  # turnlog's approval mode
        "tool_approval_mode",  # Open WebUI's
        "model_controls",
        "max_tool_call_iterations",
        "custom_params",
    }
)
