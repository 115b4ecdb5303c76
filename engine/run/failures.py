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

from typing import Any

from engine.ports import UpstreamError, UpstreamErrorDetail


def failure_fields(exc: UpstreamError, iteration: int) -> dict[str, Any]:
    """The fields of ``turn.failed``'s error beyond message, type and status."""
    out: dict[str, Any] = {"iteration": iteration}
    if exc.unreachable:
        out["unreachable"] = True
    detail = exc.upstream
    if detail is not None:
        upstream: dict[str, Any] = {"message": detail.message}
        for key in ("param", "code", "retry_after"):
            value = getattr(detail, key)
            if value is not None:
                upstream[key] = value
        out["upstream"] = upstream
    return out


def recorded_upstream_error(error: dict[str, Any]) -> UpstreamError:
    """The ``UpstreamError`` a recorded ``turn.failed`` error was made from."""
    detail = error.get("upstream")
    upstream = None
    if isinstance(detail, dict):
        upstream = UpstreamErrorDetail(
            message=str(detail.get("message", "")),
            param=detail.get("param"),
            code=detail.get("code"),
            retry_after=detail.get("retry_after"),
        )
    return UpstreamError(
        error.get("message", ""),
        error.get("type", "upstream_error"),
        error.get("status"),
        upstream=upstream,
        unreachable=bool(error.get("unreachable")),
    )
