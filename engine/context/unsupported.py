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
from typing import Any

from engine.context.assemble import legacy_code_interpreter
from engine.events import AssemblyStep

STEP = "unsupported"

# Why each field is ignored, in the words the client sees.
REASONS: dict[str, str] = {
    "features.memory": (
        'with native function calling memories are the model\'s tools, which are not available yet; '
        'with params.function_calling: "default" they are injected'
    ),
    "features.web_search": "web search is not available yet",
    "features.image_generation": "image generation is not available yet",
    "features.code_interpreter": (
        'the code interpreter runs only with params.function_calling: "default" '
        "(code blocks in the answer); with native function calling it is not available yet"
    ),
}


def ignored_fields(request: dict[str, Any], *, native: bool = True) -> list[dict[str, str]]:
    """The fields of ``request`` that ask for something not implemented, with why.

    Only what the client switched on counts: ``{"web_search": false}`` asks for
    nothing, so it is not reported. ``native``: the turn's function calling.
    """
    out: list[dict[str, str]] = []
    features = request.get("features")
    if isinstance(features, dict):
        for name in sorted(features):
            if not features[name]:
                continue
            if name == "code_interpreter" and legacy_code_interpreter(request):
                continue  # this combination runs (code blocks in the answer)
            if name == "memory" and not native:
                continue  # injected by the memory step
            key = f"features.{name}"
            out.append({"field": key, "reason": REASONS.get(key, "this feature is not known to turnlog")})
    return out


def unsupported_step(request: dict[str, Any]) -> AssemblyStep | None:
    """The ``assembly.step`` to record for ``request``, or None if it asks for nothing unsupported."""
    ignored = ignored_fields(request)
    if not ignored:
        return None
    return AssemblyStep(step=STEP, detail={"ignored": ignored})


def warnings_of(detail: dict[str, Any]) -> list[str]:
    """The sentences a client is shown for a recorded ``unsupported`` step."""
    return [
        f"{entry.get('field')} was ignored: {entry.get('reason')}"
        for entry in detail.get("ignored") or []
        if isinstance(entry, dict)
    ]


def file_warnings(detail: Mapping[str, Any]) -> list[str]:
    """What a client is told about files that could not be used."""
    out = []
    for f in detail.get("files") or []:
        if isinstance(f, dict) and f.get("status") != "ready":
            out.append(f"{f.get('type', 'file')} {f.get('id')} was not used: {f.get('reason') or f.get('status')}")
    if detail.get("error"):
        out.append(f"files were not used: {detail['error']}")
    return out
