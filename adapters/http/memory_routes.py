"""Memories over HTTP: ``/v1/memories`` (docs/guides/memories.md).

A thin layer over :class:`adapters.knowledge.memories.Memories`: it checks
the body (a 400 that names the field), scopes everything to the caller
(``USER``; someone else's memory is the same 404 as a missing one) and maps
the service's failures to the OpenAI error shape: an embedding model that
fails a write or a search is a 502, never a 500.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from adapters.http.auth import USER
from adapters.http.context import services
from adapters.http.errors import ApiError, not_found
from adapters.http.schemas import NO_NUL, read_body
from adapters.knowledge.memories import EmbeddingFailed, Memories
from engine.ports import RetrievalError

MAX_QUERY_K = 100


class MemoryBody(BaseModel):
    """``{"content"}`` of a new or updated memory."""

    model_config = ConfigDict(extra="ignore")

    content: StrictStr = Field(pattern=NO_NUL)

    @field_validator("content")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class QueryBody(MemoryBody):
    """``{"content", "k"?}`` of a search; ``k`` defaults to ``memory_top_k``."""

    k: StrictInt | None = Field(default=None, ge=1, le=MAX_QUERY_K)


def _memories(request: web.Request) -> Memories:
    return services(request).memories


def _embedding_failed(exc: EmbeddingFailed) -> ApiError:
    return ApiError(502, str(exc), "upstream_error", "embedding_failed")


async def create_memory(request: web.Request) -> web.Response:
    body = await read_body(request, MemoryBody)
    try:
        memory = await _memories(request).add(request[USER], body.content)
    except EmbeddingFailed as exc:
        raise _embedding_failed(exc) from exc
    return web.json_response(memory.public())


async def list_memories(request: web.Request) -> web.Response:
    found = await _memories(request).list_for(request[USER])
    return web.json_response({"data": [m.public() for m in found]})


async def get_memory(request: web.Request) -> web.Response:
    memory = await _memories(request).get(request[USER], request.match_info["memory_id"])
    if memory is None:
        raise not_found("memory")
    return web.json_response(memory.public())


async def update_memory(request: web.Request) -> web.Response:
    body = await read_body(request, MemoryBody)
    try:
        memory = await _memories(request).update(request[USER], request.match_info["memory_id"], body.content)
    except EmbeddingFailed as exc:
        raise _embedding_failed(exc) from exc
    if memory is None:
        raise not_found("memory")
    return web.json_response(memory.public())


async def delete_memory(request: web.Request) -> web.Response:
    memory_id = request.match_info["memory_id"]
    if not await _memories(request).delete(request[USER], memory_id):
        raise not_found("memory")
    return web.json_response({"id": memory_id, "deleted": True})


async def query_memories(request: web.Request) -> web.Response:
    body = await read_body(request, QueryBody)
    k = body.k if body.k is not None else services(request).settings.memory_top_k
    try:
        hits = await _memories(request).search(request[USER], body.content, k)
    except RetrievalError as exc:
        raise ApiError(502, str(exc), "upstream_error", "retrieval_failed") from exc
    return web.json_response({"data": [{"id": h.id, "content": h.content, "created_at": h.created_at, "score": h.score} for h in hits]})


def setup(app: web.Application) -> None:
    # `/query` before `/{memory_id}`: aiohttp matches in the order of registration.
    app.router.add_post("/v1/memories/query", query_memories)
    app.router.add_post("/v1/memories", create_memory)
    app.router.add_get("/v1/memories", list_memories)
    app.router.add_get("/v1/memories/{memory_id}", get_memory)
    app.router.add_post("/v1/memories/{memory_id}", update_memory)
    app.router.add_patch("/v1/memories/{memory_id}", update_memory)
    app.router.add_delete("/v1/memories/{memory_id}", delete_memory)
