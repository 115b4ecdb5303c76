"""What ``turn.failed`` keeps of an upstream's failure, and back.

Beyond its message and kind, the recorded error says what a client's answer is
derived from (the error rules in docs/reference/basics.md, applied by the HTTP
layer): the upstream's
HTTP status, its own error object (message, param, code) and ``Retry-After``,
whether the upstream could be reached at all, and the tool round of the call
(a 400 on the turn's first call is the client's own request; on a later round
it is a request turnlog built). ``verify`` turns the record back into the
exception, so a re-run records the same event.
"""

from __future__ import annotations

from engine.json_types import JsonObject, JsonValue
from engine.ports import UpstreamError, UpstreamErrorDetail


def failure_fields(exc: UpstreamError, iteration: int) -> JsonObject:
    """The fields of ``turn.failed``'s error beyond message, type and status."""
    out: JsonObject = {"iteration": iteration}
    if exc.unreachable:
        out["unreachable"] = True
    detail = exc.upstream
    if detail is not None:
        upstream: JsonObject = {"message": detail.message}
        for key, value in (("param", detail.param), ("code", detail.code), ("retry_after", detail.retry_after)):
            if value is not None:
                upstream[key] = value
        out["upstream"] = upstream
    return out


def recorded_upstream_error(error: JsonObject) -> UpstreamError:
    """The ``UpstreamError`` a recorded ``turn.failed`` error was made from."""
    detail = error.get("upstream")
    upstream = None
    if isinstance(detail, dict):
        retry_after = detail.get("retry_after")
        upstream = UpstreamErrorDetail(
            message=str(detail.get("message", "")),
            param=_text(detail.get("param")),
            code=_text(detail.get("code")),
            retry_after=retry_after if isinstance(retry_after, int | float) and not isinstance(retry_after, bool) else None,
        )
    status = error.get("status")
    return UpstreamError(
        str(error.get("message", "")),
        str(error.get("type", "upstream_error")),
        status if isinstance(status, int) and not isinstance(status, bool) else None,
        upstream=upstream,
        unreachable=bool(error.get("unreachable")),
    )


def _text(value: JsonValue) -> str | None:
    return value if isinstance(value, str) else None
