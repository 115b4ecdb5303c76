"""Real documents and a real embedding server for the files and knowledge tests.

* :func:`pdf` writes a small but real PDF by hand (Helvetica text, one
  content stream per page, a correct cross-reference table): pypdf reads its
  text layer back. :func:`pdf_without_text` is a page with only a drawn
  rectangle (what a scan without OCR looks like to a text extractor).
* :class:`EmbeddingServer` is an OpenAI-compatible ``POST /v1/embeddings`` on
  loopback whose vectors mean something: words of one *concept* (``car``,
  ``automobile``, ``vehicle``...) share a dimension, so a query finds a chunk
  by meaning with no word in common (what BM25 cannot); other words hash into
  the remaining dimensions. It can hold requests (``hold``) and fail those
  whose text contains a marker (``fail_on``).
* :class:`HttpEmbedder` implements ``engine.ports.Embedder`` over it.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import zlib
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from engine.ports import EmbeddingError

DIM = 64
CONCEPTS = {
    "car": 0,
    "cars": 0,
    "automobile": 0,
    "automobiles": 0,
    "vehicle": 0,
    "vehicles": 0,
    "sedan": 0,
    "banana": 1,
    "bananas": 1,
    "fruit": 1,
    "fruits": 1,
    "mango": 1,
    "apple": 1,
    "ocean": 2,
    "sea": 2,
    "marine": 2,
    "waves": 2,
    "tide": 2,
    "violin": 3,
    "music": 3,
    "orchestra": 3,
    "symphony": 3,
}
_WORD = re.compile(r"[a-z0-9]+")


def embed_text(text: str) -> list[float]:
    """The server's vector of ``text``: concept words weigh 3, others 1 (hashed)."""
    v = [0.0] * DIM
    v[DIM - 1] = 0.05  # never a zero vector
    for word in _WORD.findall(text.lower()):
        if word in CONCEPTS:
            v[CONCEPTS[word]] += 3.0
        else:
            v[8 + zlib.crc32(word.encode()) % (DIM - 9)] += 1.0
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


class EmbeddingServer:
    """``POST /v1/embeddings`` on a free loopback port."""

    def __init__(self, model: str = "concept-embed") -> None:
        self.model = model
        self.calls = 0
        self.texts = 0
        self.fail_on: str | None = None
        self.hold: asyncio.Event | None = None  # when set to an unset event, requests wait on it
        self.hold_only: str | None = None  # ... only those with a text containing this
        self.waiting = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self.url

    async def close(self) -> None:
        if self.hold is not None:
            self.hold.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.calls += 1
        self.texts += len(texts)
        if self.hold is not None and (self.hold_only is None or any(self.hold_only in t for t in texts)):
            self.waiting += 1
            try:
                await self.hold.wait()
            finally:
                self.waiting -= 1
        if self.fail_on is not None and any(self.fail_on in t for t in texts):
            return web.json_response({"error": {"message": "the model is overloaded", "type": "server_error"}}, status=500)
        data = [{"object": "embedding", "index": i, "embedding": embed_text(t)} for i, t in enumerate(texts)]
        return web.json_response({"object": "list", "data": data, "model": body.get("model", self.model), "usage": {"prompt_tokens": 0, "total_tokens": 0}})


class HttpEmbedder:
    """``engine.ports.Embedder`` over an OpenAI-compatible ``/v1/embeddings``."""

    def __init__(self, base_url: str, model: str = "concept-embed") -> None:
        self.base_url = base_url.rstrip("/")
        self._model = model

    @property
    def model(self) -> str:
        return self._model

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{self.base_url}/embeddings", json={"model": self._model, "input": list(texts)}) as resp:
                    if resp.status != 200:
                        raise EmbeddingError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                    body = await resp.json()
        except aiohttp.ClientError as exc:
            raise EmbeddingError(f"{type(exc).__name__}: {exc}") from exc
        return [item["embedding"] for item in sorted(body["data"], key=lambda d: d["index"])]


# ----------------------------------------------------------------------- PDFs


def _pdf_string(text: str) -> str:
    return "(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"


def _assemble(objects: list[bytes]) -> bytes:
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def _stream(content: str) -> bytes:
    data = content.encode("latin-1")
    return f"<< /Length {len(data)} >>\nstream\n".encode() + data + b"\nendstream"


def pdf(pages: Sequence[Sequence[str]]) -> bytes:
    """A PDF whose page i shows the lines ``pages[i]`` (ASCII) in Helvetica."""
    n = len(pages)
    # 1 catalog, 2 pages, 3 font, then per page: the page and its content stream.
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, lines in enumerate(pages):
        ops = ["BT", "/F1 11 Tf", "14 TL", "72 740 Td"]
        for line in lines:
            ops += [f"{_pdf_string(line)} Tj", "T*"]
        ops.append("ET")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode())
        objects.append(_stream("\n".join(ops)))
    return _assemble(objects)


def pdf_without_text() -> bytes:
    """One page with a filled rectangle and no text (a scan without OCR)."""
    return _assemble(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << >> /Contents 4 0 R >>",
            _stream("0.5 g 72 72 468 648 re f"),
        ]
    )


# ------------------------------------------------------------------ the API


def form(filename: str, data: bytes, content_type: str | None, *, purpose: str | None = "assistants") -> aiohttp.FormData:
    """A ``POST /v1/files`` body as the OpenAI SDK sends it."""
    body = aiohttp.FormData()
    if purpose is not None:
        body.add_field("purpose", purpose)
    body.add_field("file", data, filename=filename, content_type=content_type or "application/octet-stream")
    return body


async def upload(
    http: aiohttp.ClientSession, base: str, filename: str, data: bytes, content_type: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with http.post(f"{base}/v1/files", data=form(filename, data, content_type), headers=headers or {}) as resp:
        return resp.status, await resp.json()


async def wait_file(http: aiohttp.ClientSession, base: str, file_id: str, *, timeout: float = 30.0, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The file once it is no longer ``processing`` (polling its status)."""
    deadline = time.monotonic() + timeout
    while True:
        async with http.get(f"{base}/v1/files/{file_id}", headers=headers or {}) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.json()
        if body["status"] != "processing":
            return body
        assert time.monotonic() < deadline, f"file {file_id} still processing after {timeout} s"
        await asyncio.sleep(0.05)


WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud ember lantern "
    "meadow harbor quartz signal timber velvet willow"
).split()


def prose(n_words: int, seed: int = 1) -> str:
    """Sentences and paragraphs of filler words (deterministic)."""
    import random

    rnd = random.Random(seed)
    words = rnd.choices(WORDS, k=n_words)
    out: list[str] = []
    i = 0
    while i < len(words):
        length = rnd.randint(6, 18)
        sentence = " ".join(words[i : i + length])
        out.append(sentence[:1].upper() + sentence[1:] + ".")
        i += length
        out.append("\n\n" if rnd.random() < 0.15 else " ")
    return "".join(out).strip() + "\n"
