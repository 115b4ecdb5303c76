"""Errors in the OpenAI JSON shape, and the middleware that guarantees them.

Whatever a client sends, the answer is JSON ``{"error": {"message", "type",
"code"}}`` with a 4xx status that names the problem. A 500 is a bug: it is
logged with its traceback and still answered in the same shape.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from adapters.store.faults import unavailable_reason
from engine.run.supervisor import Draining

log = logging.getLogger("turnlog.http")


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.extra = extra  # more fields of the error object (e.g. a damaged log's ``damage``)
        self.headers = headers  # of the HTTP answer (``Retry-After``)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def error_response(
    status: int, message: str, type_: str = "invalid_request_error", code: str | None = None, param: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(error_body(message, type_, code, param), status=status, headers=headers)


#: Seconds a client is told to wait (``Retry-After``) during a drain, and while the store is down.
DRAIN_RETRY_AFTER = 1
STORE_RETRY_AFTER = 2


def unavailable_response(message: str, code: str, retry_after: int, headers: dict[str, str] | None = None) -> web.Response:
    """503 in the OpenAI error shape, with ``Retry-After``: the client may retry then."""
    return error_response(503, message, "service_unavailable_error", code, headers={**(headers or {}), "Retry-After": str(retry_after)})


def draining_response() -> web.Response:
    """This instance is shutting down: the client retries (another instance, or this one restarted).

    The connection is closed after it (``Connection: close``): a client that
    keeps its connections alive would otherwise send its retry down the same
    one, to this instance again, where a new connection reaches another."""
    response = unavailable_response("this instance is shutting down; retry the request", "draining", DRAIN_RETRY_AFTER)
    response.force_close()
    return response


#: Seconds a client is told to wait after an upstream's 429 or while it cannot be
#: reached, when the upstream itself said nothing.
UPSTREAM_RETRY_AFTER = 5


@dataclass(frozen=True)
class TurnError:
    """A failed turn's answer to its client (HTTP status, the OpenAI error
    object, ``Retry-After``), from the error its ``turn.failed`` recorded."""

    status: int
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    retry_after: int | None = None

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


def turn_error(error: dict[str, Any]) -> TurnError:
    """How a turn's failure is answered. An upstream's 400/422 on the turn's
    first model call is the client's own request: its status, message and
    param. 429: the client retries after ``Retry-After``. An upstream that
    cannot be reached: 503. Anything else (the operator's key refused, a
    request turnlog built for a later round, a broken stream) is a 502
    ``upstream_error`` whose ``code`` says how; a failure that is not the
    upstream's (an inlet filter raised) is a 502 whose ``type`` says what."""
    kind = str(error.get("type") or "upstream_error")
    message = str(error.get("message") or "the turn failed")
    status = error.get("status")
    found = error.get("upstream")
    upstream: dict[str, Any] = found if isinstance(found, dict) else {}
    if kind == "upstream_http_error" and status in (400, 422) and error.get("iteration") == 0:
        own = str(upstream.get("message") or message)
        return TurnError(status, own, "invalid_request_error", _text(upstream.get("code")), _text(upstream.get("param")))
    if status == 429:
        return TurnError(429, message, "rate_limit_error", _text(upstream.get("code")) or "rate_limit_exceeded", None, _seconds(upstream.get("retry_after")))
    if error.get("unreachable"):
        return TurnError(503, message, "service_unavailable_error", "upstream_unavailable", None, UPSTREAM_RETRY_AFTER)
    if kind.startswith("upstream_") or kind == "previous_response_not_found":
        return TurnError(502, message, "upstream_error", kind)
    # Not the upstream's (an inlet filter raised, ...): the type says what failed.
    return TurnError(502, message, kind, str(status) if status is not None else None)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _seconds(value: Any) -> int:
    """A ``Retry-After`` in whole seconds (rounded up: never earlier than asked)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 86_400:
        return max(1, math.ceil(value))
    return UPSTREAM_RETRY_AFTER


def not_found(what: str) -> ApiError:
    return ApiError(404, f"{what} not found", "not_found_error", "not_found")


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """One readable sentence naming the first offending field."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "__root__")
    msg = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        return f"missing required field '{loc}'", loc or None
    return (f"invalid field '{loc}': {msg}" if loc else msg), loc or None


_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
}


def refuse_nul_in_url(request: web.Request) -> None:
    """400 for a NUL character in the path or the query: no id or name holds
    one, and PostgreSQL refuses it in any text it is asked to compare."""
    if "\x00" in request.path or any("\x00" in k or "\x00" in v for k, v in request.query.items()):
        raise ApiError(400, "the URL contains a NUL character", "invalid_request_error", "invalid_value")


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        if exc.extra:
            body = error_body(exc.message, exc.type, exc.code, exc.param)
            body["error"].update(exc.extra)
            return web.json_response(body, status=exc.status, headers=exc.headers)
        return error_response(exc.status, exc.message, exc.type, exc.code, exc.param, headers=exc.headers)
    except web.HTTPRequestEntityTooLarge:
        limit = getattr(request, "_client_max_size", None)
        return error_response(413, f"request body too large (limit {limit} bytes)", "invalid_request_error", "body_too_large")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason if exc.text is None or exc.text.startswith(f"{exc.status}:") else exc.text
        return error_response(exc.status, message or exc.reason, _STATUS_TYPES.get(exc.status, "api_error"))
    except ValidationError as exc:
        message, param = validation_message(exc)
        return error_response(400, message, "invalid_request_error", "invalid_value", param)
    except (ConnectionResetError, web.HTTPClientError):
        raise
    except Draining:
        return draining_response()
    except Exception as exc:
        reason = unavailable_reason(exc)
        if reason is not None:
            log.warning("%s %s: store unavailable: %s", request.method, request.path, reason)
            return unavailable_response(f"the event store is unavailable ({reason}); retry later", "store_unavailable", STORE_RETRY_AFTER)
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal server error", "api_error", "internal_error")
