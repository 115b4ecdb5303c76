"""OpenAIImages against an OpenAI-Images-compatible server on loopback.

The server speaks the API's wire format: ``POST /v1/images/generations`` (JSON)
and ``POST /v1/images/edits`` (multipart, ``image[]`` parts), answering
``{"created", "data": [{"b64_json", "revised_prompt"?}], "usage"?}`` with real
PNG files it encodes itself, and the API's error bodies - including the 400 the
GPT Image models give a ``response_format`` field.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import BodyPartReader, web

from adapters.config import load_settings
from adapters.images import OpenAIImages, open_images
from adapters.images.openai import image_mime
from engine.ports import GeneratedImage, WebError

KEY = "sk-images-test"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid RGB PNG of one colour (signature, IHDR, IDAT, IEND with their CRCs)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width  # filter type 0, then the pixels
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return PNG_MAGIC + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b"")


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, first pixel) of a PNG, checking every chunk's CRC on the way."""
    assert data[:8] == PNG_MAGIC
    pos, width, height, idat = 8, 0, 0, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)[1:4]


@dataclass
class ImagesServer:
    base: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)


def _error(status: int, message: str, type_: str, code: str | None, param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "param": param, "code": code}}, status=status)


@pytest.fixture
async def images() -> AsyncIterator[ImagesServer]:
    state = ImagesServer()

    def check_key(request: web.Request) -> web.Response | None:
        auth = request.headers.get("Authorization", "")
        if auth != f"Bearer {KEY}":
            shown = auth.removeprefix("Bearer ") or "(none)"
            return _error(
                401,
                f"Incorrect API key provided: {shown}. You can find your API key at https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                "invalid_api_key",
            )
        return None

    def answer(model: str, n: int, size: str, rgb: tuple[int, int, int], prompt: str) -> web.Response:
        w, h = (int(x) for x in size.split("x")) if size and size != "auto" else (4, 4)
        png = make_png(min(w, 16), min(h, 16), rgb)  # small, but the size the client asked for shows in the ratio
        item: dict[str, Any] = {"b64_json": base64.b64encode(png).decode()}
        if model == "dall-e-3":
            item["revised_prompt"] = f"A detailed picture of {prompt}"
        body: dict[str, Any] = {"created": int(time.time()), "data": [dict(item) for _ in range(n)]}
        if model.startswith("gpt-image"):
            body["usage"] = {"total_tokens": 100, "input_tokens": 10, "output_tokens": 90, "input_tokens_details": {"text_tokens": 10, "image_tokens": 0}}
        return web.json_response(body)

    def model_errors(model: str, fields: dict[str, Any], prompt: str) -> web.Response | None:
        if model.startswith("gpt-image") and "response_format" in fields:
            return _error(400, "Unknown parameter: 'response_format'.", "invalid_request_error", "unknown_parameter", "response_format")
        if not model.startswith("gpt-image") and fields.get("response_format") != "b64_json":
            return None  # would answer with URLs; see the "url" prompt below
        if prompt == "refuse":
            return _error(400, "Your request was rejected as a result of our safety system.", "image_generation_user_error", "moderation_blocked")
        return None

    async def generations(request: web.Request) -> web.StreamResponse:
        if (denied := check_key(request)) is not None:
            return denied
        body = await request.json()
        state.requests.append({"path": request.path, "json": body, "auth": request.headers.get("Authorization")})
        model, prompt = body.get("model", "dall-e-2"), body["prompt"]
        if (err := model_errors(model, body, prompt)) is not None:
            return err
        if prompt == "slow":
            await state.release.wait()
        if prompt == "url" or (not model.startswith("gpt-image") and body.get("response_format") != "b64_json"):
            return web.json_response({"created": 1, "data": [{"url": "https://files.example/img.png"}]})
        if prompt == "not-an-image":
            return web.json_response({"created": 1, "data": [{"b64_json": base64.b64encode(b"hello").decode()}]})
        if prompt == "broken":
            return web.Response(status=502, text="<html>Bad gateway</html>", content_type="text/html")
        return answer(model, int(body.get("n", 1)), body.get("size", "1024x1024"), (255, 0, 0), prompt)

    async def edits(request: web.Request) -> web.StreamResponse:
        if (denied := check_key(request)) is not None:
            return denied
        fields: dict[str, Any] = {}
        files: list[dict[str, Any]] = []
        reader = await request.multipart()
        async for part in reader:
            assert isinstance(part, BodyPartReader)
            data = await part.read()
            if part.filename:
                files.append({"field": part.name, "filename": part.filename, "content_type": part.headers.get("Content-Type"), "data": bytes(data)})
            else:
                fields[part.name or ""] = bytes(data).decode()
        state.requests.append({"path": request.path, "fields": fields, "files": files})
        if not files:
            return _error(400, "Missing required parameter: 'image'.", "invalid_request_error", "missing_required_parameter", "image")
        if (err := model_errors(fields.get("model", "dall-e-2"), fields, fields["prompt"])) is not None:
            return err
        return answer(fields.get("model", "dall-e-2"), int(fields.get("n", 1)), fields.get("size", "1024x1024"), (0, 0, 255), fields["prompt"])

    app = web.Application()
    app.router.add_post("/v1/images/generations", generations)
    app.router.add_post("/v1/images/edits", edits)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.base = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        yield state
    finally:
        state.release.set()
        await runner.cleanup()


@pytest.fixture
async def client(images: ImagesServer) -> AsyncIterator[OpenAIImages]:
    c = OpenAIImages(images.base + "/", api_key=KEY, model="gpt-image-1", size="1024x1024")
    yield c
    await c.close()


async def test_generate_returns_real_png_bytes(images: ImagesServer, client: OpenAIImages) -> None:
    out = await client.generate("a red square", n=2, size="16x8")
    assert len(out) == 2
    for img in out:
        assert isinstance(img, GeneratedImage) and img.mime == "image/png" and img.revised_prompt is None
        assert img.data.startswith(PNG_MAGIC)
        assert read_png(img.data) == (16, 8, bytes((255, 0, 0)))
    sent = images.requests[0]
    assert sent["path"] == "/v1/images/generations" and sent["auth"] == f"Bearer {KEY}"
    # gpt-image models answer in base64 always and reject response_format
    assert sent["json"] == {"model": "gpt-image-1", "prompt": "a red square", "n": 2, "size": "16x8"}
    await client.generate("default size")
    assert images.requests[-1]["json"]["size"] == "1024x1024"


async def test_dall_e_gets_response_format_and_revises_the_prompt(images: ImagesServer) -> None:
    c = OpenAIImages(images.base, api_key=KEY, model="dall-e-3", size="1024x1024")
    try:
        (img,) = await c.generate("a cat")
    finally:
        await c.close()
    assert images.requests[0]["json"] == {"model": "dall-e-3", "prompt": "a cat", "n": 1, "size": "1024x1024", "response_format": "b64_json"}
    assert img.revised_prompt == "A detailed picture of a cat" and img.mime == "image/png"


async def test_edit_sends_every_image_as_multipart(images: ImagesServer, client: OpenAIImages) -> None:
    first, second = make_png(2, 2, (1, 2, 3)), make_png(3, 3, (4, 5, 6))
    (img,) = await client.edit("make it blue", [(first, "image/png"), (second, "image/png")], size="8x8")
    assert read_png(img.data) == (8, 8, bytes((0, 0, 255)))
    sent = images.requests[0]
    assert sent["path"] == "/v1/images/edits"
    assert sent["fields"] == {"prompt": "make it blue", "model": "gpt-image-1", "n": "1", "size": "8x8"}
    assert [(f["field"], f["content_type"], f["data"]) for f in sent["files"]] == [("image[]", "image/png", first), ("image[]", "image/png", second)]
    assert [f["filename"] for f in sent["files"]] == ["image-0.png", "image-1.png"]
    with pytest.raises(WebError, match="needs at least one image"):
        await client.edit("nothing", [])


async def test_api_errors_become_web_errors(images: ImagesServer, client: OpenAIImages) -> None:
    with pytest.raises(WebError, match="image generation failed: HTTP 400: Your request was rejected as a result of our safety system"):
        await client.generate("refuse")
    with pytest.raises(WebError, match="HTTP 502: <html>Bad gateway</html>"):
        await client.generate("broken")
    with pytest.raises(WebError, match="came as a URL, not as base64 bytes"):
        await client.generate("url")
    with pytest.raises(WebError, match="not a PNG, JPEG, WebP or GIF image"):
        await client.generate("not-an-image")
    wrong = OpenAIImages(images.base, api_key="sk-wrong-key", model="gpt-image-1")
    try:
        with pytest.raises(WebError, match=r"HTTP 401: Incorrect API key provided: \*\*\*\.") as info:
            await wrong.generate("x")
        assert "sk-wrong-key" not in str(info.value)
    finally:
        await wrong.close()


@pytest.mark.parametrize(("model", "sends_format"), [("gpt-image-1", False), ("gpt-image-1-mini", False), ("dall-e-2", True), ("dall-e-3", True)])
async def test_response_format_only_where_the_model_takes_it(images: ImagesServer, model: str, sends_format: bool) -> None:
    """The server answers 400 as the API does when a GPT Image model gets the field,
    and with URLs when another model lacks it: both ways fail unless the client chooses right."""
    c = OpenAIImages(images.base, api_key=KEY, model=model)
    try:
        (img,) = await c.generate("fine")
        (edited,) = await c.edit("fine", [(make_png(1, 1, (0, 0, 0)), "image/png")])
    finally:
        await c.close()
    assert img.mime == edited.mime == "image/png"
    assert ("response_format" in images.requests[0]["json"]) is sends_format
    assert ("response_format" in images.requests[1]["fields"]) is sends_format


async def test_timeout_and_unreachable(images: ImagesServer) -> None:
    slow = OpenAIImages(images.base, api_key=KEY, timeout=0.3)
    try:
        with pytest.raises(WebError, match="image generation did not finish within 0.3 s"):
            await slow.generate("slow")
    finally:
        await slow.close()
    gone = OpenAIImages("http://127.0.0.1:1/v1", api_key=KEY)
    try:
        with pytest.raises(WebError, match="the images API is unreachable"):
            await gone.edit("x", [(make_png(1, 1, (0, 0, 0)), "image/png")])
    finally:
        await gone.close()


def test_image_mime() -> None:
    assert image_mime(make_png(1, 1, (0, 0, 0))) == "image/png"
    assert image_mime(b"\xff\xd8\xff\xe0\x00\x10JFIF") == "image/jpeg"
    assert image_mime(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert image_mime(b"GIF89a....") == "image/gif"
    assert image_mime(b"hello") is None


def test_open_images(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TURNLOG_OPENAI_BASE_URL", "TURNLOG_OPENAI_API_KEY", "TURNLOG_IMAGES_BASE_URL", "TURNLOG_IMAGES_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert open_images(load_settings()) is None
    monkeypatch.setenv("TURNLOG_OPENAI_BASE_URL", "https://upstream.example/v1")
    monkeypatch.setenv("TURNLOG_OPENAI_API_KEY", "sk-upstream")
    g = open_images(load_settings())
    assert g is not None and (g.base_url, g._key, g.model, g.size) == ("https://upstream.example/v1", "sk-upstream", "gpt-image-1", "1024x1024")
    # an images API of its own never gets the upstream's key
    monkeypatch.setenv("TURNLOG_IMAGES_BASE_URL", "https://images.example/v1")
    monkeypatch.setenv("TURNLOG_IMAGES_MODEL", "dall-e-3")
    monkeypatch.setenv("TURNLOG_IMAGES_SIZE", "1792x1024")
    g = open_images(load_settings())
    assert g is not None and (g.base_url, g._key, g.model, g.size) == ("https://images.example/v1", None, "dall-e-3", "1792x1024")
    monkeypatch.setenv("TURNLOG_IMAGES_API_KEY", "sk-images")
    g = open_images(load_settings())
    assert g is not None and g._key == "sk-images"


async def test_no_key_sends_no_authorization(images: ImagesServer) -> None:
    c = OpenAIImages(images.base)
    try:
        with pytest.raises(WebError, match=r"HTTP 401: Incorrect API key provided: \(none\)"):
            await c.generate("x")
    finally:
        await c.close()
