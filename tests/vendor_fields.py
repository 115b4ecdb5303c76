"""The top-level request fields OpenAI's APIs accept, taken from the installed
``openai`` SDK's request types (not a hand list, so the scripted upstream
follows the vendor as the SDK is upgraded).

``unknown_field_error(path, body)`` is what the scripted upstream answers a
body with a field the vendor refuses: OpenAI's HTTP 400 ``{"error":
{"message": "Unrecognized request argument supplied: NAME", "type":
"invalid_request_error", "param": "NAME", "code": null}}`` (several unknown
fields: "Unrecognized request arguments supplied: A, B", ``param`` the first).
Ollama's ``/api/chat`` ignores unknown fields, so it is not checked.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params

__all__ = ["CHAT_FIELDS", "RESPONSES_FIELDS", "accepted_fields", "unknown_field_error"]


def _keys(*typed_dicts: Any) -> frozenset[str]:
    """Every key of the TypedDicts (required or not, inherited ones included)."""
    keys: set[str] = set()
    for td in typed_dicts:
        keys |= set(td.__required_keys__) | set(td.__optional_keys__)
    return frozenset(keys)


# The streaming and non-streaming variants differ only in ``stream``'s type;
# the union is what the endpoint accepts.
CHAT_FIELDS = _keys(
    completion_create_params.CompletionCreateParamsStreaming,
    completion_create_params.CompletionCreateParamsNonStreaming,
)
RESPONSES_FIELDS = _keys(
    response_create_params.ResponseCreateParamsStreaming,
    response_create_params.ResponseCreateParamsNonStreaming,
)

_BY_PATH = {"/v1/chat/completions": CHAT_FIELDS, "/v1/responses": RESPONSES_FIELDS}


def accepted_fields(path: str) -> frozenset[str] | None:
    """The top-level fields the vendor accepts at ``path``; None: not checked (Ollama)."""
    return _BY_PATH.get(path)


def unknown_field_error(path: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI's 400 body for the fields of ``body`` the endpoint does not
    accept, or None when every field is accepted (or ``path`` is not checked)."""
    accepted = accepted_fields(path)
    if accepted is None:
        return None
    unknown = [name for name in body if name not in accepted]
    if not unknown:
        return None
    if len(unknown) == 1:
        message = f"Unrecognized request argument supplied: {unknown[0]}"
    else:
        message = "Unrecognized request arguments supplied: " + ", ".join(unknown)
    return {"error": {"message": message, "type": "invalid_request_error", "param": unknown[0], "code": None}}
