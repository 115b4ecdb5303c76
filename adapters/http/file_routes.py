"""``/v1/files`` and ``/v1/knowledge``: uploads, their ingestion status, collections.

An upload is read as a stream, part by part: the file part's type is checked
from its headers before any byte of it is read (415), and its bytes are
counted as they come, so a file over ``max_file_bytes`` is refused (413)
having buffered at most the limit. A request whose declared length is far
over the limit is refused before its body is read at all.

Someone else's file or collection is answered exactly like a missing one
(404). The work itself is ``adapters.knowledge.files.FileKnowledge``.
"""

from __future__ import annotations

from aiohttp import BodyPartReader, web
from aiohttp.hdrs import CONTENT_TYPE
from aiohttp.http_exceptions import BadHttpMessage
from pydantic import BaseModel, ConfigDict, Field

from adapters.http.auth import USER, require_admin
from adapters.http.context import services
from adapters.http.errors import ApiError, not_found
from adapters.http.schemas import NO_NUL, read_body
from adapters.knowledge.extract import SUPPORTED_TYPES, content_type_for
from adapters.knowledge.files import FileKnowledge, NotFound

#: Room for the multipart framing (boundaries, part headers, small fields)
#: around a file of exactly the limit.
MULTIPART_SLACK = 64 * 1024
_READ = 64 * 1024


class NewCollection(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=256, pattern=NO_NUL)
    description: str = Field(default="", max_length=10_000, pattern=NO_NUL)
    # Readable by every user (a preset may bind it): an admin's only.
    shared: bool = False


class FileId(BaseModel):
    model_config = ConfigDict(extra="ignore")

    file_id: str = Field(min_length=1, max_length=128, pattern=NO_NUL)


def _knowledge(request: web.Request) -> FileKnowledge:
    return services(request).knowledge


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"file too large (limit {limit} bytes)", code="file_too_large")


async def _read_limited(part: BodyPartReader, limit: int) -> bytes:
    data = bytearray()
    while chunk := await part.read_chunk(_READ):
        if len(data) + len(chunk) > limit:
            raise _too_large(limit)
        data += chunk
    return bytes(data)


# ------------------------------------------------------------------- files


def upload_name(raw: str | None) -> str:
    """The base name of an upload's filename: a client's path (``../../x``,
    ``C:\\Users\\me\\x.pdf``) is never stored; nothing left is ``upload``."""
    name = (raw or "").replace("\x00", "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    return name if name not in ("", ".", "..") else "upload"


async def upload_file(request: web.Request) -> web.Response:
    limit = services(request).settings.max_file_bytes
    if not request.content_type.startswith("multipart/"):
        raise ApiError(400, "expected a multipart/form-data body with a 'file' field", code="invalid_content_type")
    if request.content_length is not None and request.content_length > limit + MULTIPART_SLACK:
        raise _too_large(limit)
    upload: tuple[str, str, bytes] | None = None
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if isinstance(part, BodyPartReader) and part.name == "file" and upload is None:
                filename = upload_name(part.filename)
                content_type = content_type_for(part.headers.get(CONTENT_TYPE), filename)
                if content_type is None:
                    declared = part.headers.get(CONTENT_TYPE) or "none"
                    raise ApiError(
                        415,
                        f"unsupported file type ({declared}, {filename!r}); supported: {', '.join(SUPPORTED_TYPES)}",
                        code="unsupported_file_type",
                    )
                upload = (filename, content_type, await _read_limited(part, limit))
            else:
                await part.release()  # ``purpose`` and anything else: read and dropped
    except (ValueError, BadHttpMessage) as exc:  # aiohttp's multipart parser on a malformed body (or part headers)
        raise ApiError(400, f"malformed multipart body: {exc}", code="invalid_multipart") from exc
    if upload is None:
        raise ApiError(400, "missing required field 'file'", code="missing_field", param="file")
    filename, content_type, data = upload
    record = await _knowledge(request).add_file(request[USER], filename, content_type, data)
    body = record.public()
    return web.json_response({key: body[key] for key in ("id", "object", "filename", "bytes", "content_type", "status", "created_at")})


async def get_file(request: web.Request) -> web.Response:
    try:
        record = await _knowledge(request).get_file(request[USER], request.match_info["file_id"])
    except NotFound:
        raise not_found("file") from None
    return web.json_response(record.public())


async def list_files(request: web.Request) -> web.Response:
    records = await _knowledge(request).list_files(request[USER])
    return web.json_response({"object": "list", "data": [r.public() for r in records]})


async def delete_file(request: web.Request) -> web.Response:
    file_id = request.match_info["file_id"]
    try:
        await _knowledge(request).delete_file(request[USER], file_id)
    except NotFound:
        raise not_found("file") from None
    return web.json_response({"id": file_id, "object": "file", "deleted": True})


# -------------------------------------------------------------- knowledge


async def create_collection(request: web.Request) -> web.Response:
    body: NewCollection = await read_body(request, NewCollection)
    if body.shared:
        require_admin(request)
    collection = await _knowledge(request).create_collection(request[USER], body.name, body.description, shared=body.shared)
    return web.json_response(collection.public())


async def get_collection(request: web.Request) -> web.Response:
    try:
        collection = await _knowledge(request).get_collection(request[USER], request.match_info["knowledge_id"])
    except NotFound as exc:
        raise not_found(exc.what) from None
    return web.json_response(collection.public())


async def list_collections(request: web.Request) -> web.Response:
    collections = await _knowledge(request).list_collections(request[USER])
    return web.json_response({"object": "list", "data": [c.public() for c in collections]})


async def add_collection_file(request: web.Request) -> web.Response:
    body: FileId = await read_body(request, FileId)
    try:
        collection = await _knowledge(request).add_to_collection(request[USER], request.match_info["knowledge_id"], body.file_id)
    except NotFound as exc:
        raise not_found(exc.what) from None
    return web.json_response(collection.public())


async def remove_collection_file(request: web.Request) -> web.Response:
    try:
        collection = await _knowledge(request).remove_from_collection(request[USER], request.match_info["knowledge_id"], request.match_info["file_id"])
    except NotFound as exc:
        raise not_found(exc.what) from None
    return web.json_response(collection.public())


async def delete_collection(request: web.Request) -> web.Response:
    collection_id = request.match_info["knowledge_id"]
    try:
        await _knowledge(request).delete_collection(request[USER], collection_id)
    except NotFound:
        raise not_found("collection") from None
    return web.json_response({"id": collection_id, "object": "knowledge", "deleted": True})


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/files", upload_file)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", get_file)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_post("/v1/knowledge", create_collection)
    app.router.add_get("/v1/knowledge", list_collections)
    app.router.add_get("/v1/knowledge/{knowledge_id}", get_collection)
    app.router.add_delete("/v1/knowledge/{knowledge_id}", delete_collection)
    app.router.add_post("/v1/knowledge/{knowledge_id}/files", add_collection_file)
    app.router.add_delete("/v1/knowledge/{knowledge_id}/files/{file_id}", remove_collection_file)
