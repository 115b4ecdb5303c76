"""Request fields turnlog accepts but does not act on yet, reported instead of dropped.

A client that sends ``features.web_search`` or ``files`` expects them to shape
the answer. Until they do, the turn records one ``assembly.step`` named
``unsupported`` that lists what was ignored and why; the projection turns it
into the view's ``warnings`` and the HTTP adapter shows it to the client (a
``turnlog`` field in the response, or an extension chunk early in the stream).
Recording it, rather than computing it at render time, keeps the warning part
of the audited log: a replay and ``turnlog verify`` see exactly what the
client was told.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.json_types import JsonObject, JsonValue
from engine.protocols.shapes import list_of

STEP = "unsupported"

# Why a feature cannot be used, in the words the client sees.
NOT_CONFIGURED: dict[str, str] = {
    "web_search": "no web search engine is configured (TURNLOG_WEB_SEARCH_ENGINE)",
    "image_generation": "no image generation endpoint is configured (TURNLOG_IMAGES_BASE_URL or an OpenAI upstream)",
    "memory": "no memory store is configured",
    "code_interpreter": "code execution is off (TURNLOG_CODE_EXECUTOR)",
}
NO_BUILTIN_TOOLS = "the model's builtin_tools capability is off, and with native function calling features are the model's tools"
KNOWN = frozenset(NOT_CONFIGURED)


def ignored_fields(
    request: Mapping[str, JsonValue], *, native: bool = True, available: Mapping[str, bool] | None = None, builtin_tools: bool = True
) -> list[JsonObject]:
    """The features ``request`` switched on that cannot work for this turn, with why.

    Only what the client switched on counts: ``{"web_search": false}`` asks for
    nothing. ``native``: the turn's function calling (features are the model's
    tools then, injected context otherwise); ``available``: which features'
    services are configured (all, when not given).
    """
    out: list[JsonObject] = []
    features = request.get("features")
    if not isinstance(features, dict):
        return out
    for name in sorted(features):
        if not features[name]:
            continue
        key = f"features.{name}"
        if name not in KNOWN:
            out.append({"field": key, "reason": "this feature is not known to turnlog"})
        elif available is not None and not available.get(name, False):
            out.append({"field": key, "reason": NOT_CONFIGURED[name]})
        elif native and not builtin_tools:
            out.append({"field": key, "reason": NO_BUILTIN_TOOLS})
    return out


def warnings_of(detail: Mapping[str, object]) -> list[str]:
    """The sentences a client is shown for a recorded ``unsupported`` step."""
    return [f"{entry.get('field')} was ignored: {entry.get('reason')}" for entry in list_of(detail.get("ignored")) if isinstance(entry, dict)]


def file_warnings(detail: Mapping[str, object]) -> list[str]:
    """What a client is told about files that could not be used."""
    out = []
    for f in list_of(detail.get("files")):
        if not isinstance(f, dict):
            continue
        if f.get("status") != "ready":
            out.append(f"{f.get('type', 'file')} {f.get('id')} was not used: {f.get('reason') or f.get('status')}")
        elif f.get("reason"):  # used in part
            out.append(f"{f.get('type', 'file')} {f.get('id')}: {f['reason']}")
    if detail.get("query_warning"):
        out.append(f"files: {detail['query_warning']}")
    if detail.get("error"):
        out.append(f"files were not used: {detail['error']}")
    return out
