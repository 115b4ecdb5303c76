"""``POST /v1/turns/{id}/approvals``: a person's decision on a tool call that
waits for approval (``engine.run.approvals``), and the same for the WebSocket's
``approval`` message."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from adapters.http.auth import USER
from adapters.http.context import Services, services
from adapters.http.errors import ApiError, not_found
from adapters.http.schemas import read_json, validate_body
from engine.events import Event
from engine.run.approvals import ApprovalError

# ApprovalError code -> HTTP status.
STATUS = {"call_not_found": 404, "already_decided": 409, "turn_not_waiting": 409, "turn_busy": 409}


class ApprovalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1)
    approve: StrictBool
    reason: str | None = Field(default=None, max_length=4000)


def parse_approval(body: Any) -> ApprovalRequest:
    return validate_body(ApprovalRequest, body)


def approval_request(event: Event) -> dict[str, Any]:
    """What a subscriber is told of a ``tool.approval_requested`` event (WebSocket
    ``approval:request``, SSE ``turnlog.approval_request``)."""
    d = event.data
    return {"call_id": d["call_id"], "name": d["name"], "arguments": d["arguments"]}


async def record_decision(svc: Services, turn_id: str, user: str, body: ApprovalRequest) -> dict[str, Any]:
    """Record the decision on the caller's own turn; the answer body, or an ApiError."""
    record = await svc.store.get_turn(turn_id)
    if record is None or record.user_id != user:
        raise not_found("turn")
    try:
        status = await svc.supervisor.decide(record.id, body.call_id, approve=body.approve, reason=body.reason, by=user)
    except KeyError as exc:
        raise not_found("turn") from exc
    except ApprovalError as exc:
        kind = "not_found_error" if STATUS[exc.code] == 404 else "conflict_error"
        raise ApiError(STATUS[exc.code], exc.message, kind, exc.code, "call_id" if exc.code == "call_not_found" else None) from exc
    return {"turn_id": record.id, "call_id": body.call_id, "approve": body.approve, "status": status}


async def post_approval(request: web.Request) -> web.Response:
    body = parse_approval(await read_json(request))
    out = await record_decision(services(request), request.match_info["turn_id"], request[USER], body)
    return web.json_response(out, status=202)


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/turns/{turn_id}/approvals", post_approval)
