"""``POST /v1/turns/{id}/fork``: a new turn that continues a finished turn from one
of its events (``engine.run.fork``)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from adapters.http.auth import KEY_HASH, USER
from adapters.http.chat_ids import ChatIds
from adapters.http.context import services
from adapters.http.errors import ApiError, not_found
from adapters.http.schemas import read_json, validate_body
from adapters.http.turn_routes import checked_turn_events
from engine.run.fork import ForkError
from engine.run.supervisor import TurnConflict


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at: StrictInt
    model: str | None = Field(default=None, min_length=1)
    # call id -> the output recorded in place of running the call (a string;
    # any other JSON value is recorded as its JSON text).
    tool_results: dict[str, Any] | None = None

    def outputs(self) -> dict[str, str]:
        return {call_id: value if isinstance(value, str) else json.dumps(value, ensure_ascii=False) for call_id, value in (self.tool_results or {}).items()}


def parse_fork_request(body: Any) -> ForkRequest:
    return validate_body(ForkRequest, body)


async def post_fork(request: web.Request) -> web.Response:
    svc = services(request)
    parent = await svc.store.get_turn(request.match_info["turn_id"])
    if parent is None or parent.user_id != request[USER]:
        raise not_found("turn")
    body = parse_fork_request(await read_json(request))
    # A fork copies the parent's log: never a damaged one. Read and checked
    # once, here, for the fork to copy (a running parent is refused by the fork).
    parent_log = None if parent.status == "running" else await checked_turn_events(svc, parent.id)
    # The model the fork calls: the one asked for, else the parent's.
    model = body.model or parent.model
    if await svc.catalog.resolve(model) is None:
        whose = "" if body.model else " (the parent's; name another with 'model')"
        hint = "GET /v1/models lists the models of the configured upstreams"
        raise ApiError(404, f"model '{model}'{whose} not found: {hint}", "not_found_error", "model_not_found", "model")
    try:
        actor = await svc.supervisor.fork(parent, at=body.at, model=body.model, tool_results=body.outputs(), parent_log=parent_log, key_hash=request[KEY_HASH])
    except KeyError as exc:
        raise not_found("turn") from exc
    except TurnConflict as exc:
        raise ApiError(409, str(exc), "conflict_error", "turn_not_ended") from exc
    except ForkError as exc:
        raise ApiError(400, exc.message, code="invalid_fork_point", param=exc.param) from exc
    chat_id = ChatIds.of(request).shown(actor.view.chat_id) or ""
    return web.json_response({"turn_id": actor.turn_id, "chat_id": chat_id}, status=201, headers={"X-Turn-Id": actor.turn_id, "X-Chat-Id": chat_id})


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/turns/{turn_id}/fork", post_fork)
