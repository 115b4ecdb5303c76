"""``/v1/files``: uploads of real documents, their ingestion, failures and deletion.

The service is the real one (SQLite and PostgreSQL through ``database_url``);
documents are generated here (a hand-written PDF, HTML, Markdown); the vector
path uses a real embedding server on loopback (``tests.documents``). A crash
mid-ingestion is a real ``turnlog serve`` killed with SIGKILL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import func, select

from adapters.knowledge.chunking import chunk_text, stitch
from adapters.knowledge.extract import ExtractionError, content_type_for, extract_text
from adapters.knowledge.files import vector_collection
from adapters.knowledge.schema import file_chunks, files
from adapters.store import create_engine
from tests.documents import EmbeddingServer, HttpEmbedder, embed_text, pdf, pdf_without_text, prose, upload, wait_file
from tests.harness import Service, make_settings, start_service, stop_service
from tests.processes import Server
from tests.upstream import ScriptedUpstream

MARKDOWN = """# Field notes

The lighthouse keeper logs the tide every morning.

## Storms

When the barometer falls below 990 hPa the keeper lights the second lamp.
"""

HTML = """<!doctype html><html><head><title>Recipe</title><style>body { color: red }</style>
<script>var secret = "do not index me";</script></head>
<body><h1>Plum cake</h1><p>Bake the plums at 180 degrees for forty minutes.</p>
<ul><li>flour</li><li>sugar</li></ul><table><tr><td>serves</td><td>six</td></tr></table></body></html>"""


@pytest.fixture
async def embedded(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embedding_server: EmbeddingServer) -> AsyncIterator[Service]:
    """The service with an embedder (vectors in the service's database)."""
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, chunk_tokens=64, chunk_overlap_tokens=8)
    svc = await start_service(settings, upstream, embedder=HttpEmbedder(embedding_server.url))
    try:
        yield svc
    finally:
        await stop_service(svc)


async def chunk_rows(database_url: str, file_id: str) -> int:
    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(file_chunks).where(file_chunks.c.file_id == file_id))).scalar_one())
    finally:
        await engine.dispose()


# ------------------------------------------------------------------ pure parts


def test_extraction_of_each_type() -> None:
    text = extract_text(pdf([["Hello from page one."], ["Page two says goodbye."]]), "application/pdf")
    assert "Hello from page one." in text and "Page two says goodbye." in text
    html = extract_text(HTML.encode(), "text/html")
    assert "Bake the plums at 180 degrees" in html and "flour" in html
    assert "do not index me" not in html and "color: red" not in html
    assert extract_text(b"\xef\xbb\xbfplain\r\ntext\x00", "text/plain") == "plain\ntext"
    with pytest.raises(ExtractionError, match="not UTF-8 text .*offset 2"):
        extract_text(b"ab\xff\xfe", "text/markdown")
    with pytest.raises(ExtractionError, match="^no text could be extracted$"):
        extract_text(pdf_without_text(), "application/pdf")
    with pytest.raises(ExtractionError, match="^the PDF could not be read: "):
        extract_text(b"%PDF-1.7\nthis is not a PDF body at all", "application/pdf")
    latin1 = '<html><head><meta charset="iso-8859-1"></head><body>Caf\xe9 cr\xe8me</body></html>'.encode("latin-1")
    assert "Café crème" in extract_text(latin1, "text/html")


def test_content_type_from_header_or_extension() -> None:
    assert content_type_for("text/markdown; charset=utf-8", "x.bin") == "text/markdown"
    assert content_type_for("application/octet-stream", "notes.MD") == "text/markdown"
    assert content_type_for(None, "page.htm") == "text/html"
    assert content_type_for("text/x-markdown", "a") == "text/markdown"
    assert content_type_for("image/png", "photo.png") is None
    assert content_type_for("application/octet-stream", "archive") is None


def test_chunks_respect_the_size_overlap_and_boundaries() -> None:
    text = prose(6000, seed=7)
    chunks, total = chunk_text(text, 120, 20)
    assert total > 6000 and len(chunks) > total // 120
    assert stitch([(c.start, c.text) for c in chunks]) == text  # nothing lost, nothing repeated
    for prev, c in zip(chunks, chunks[1:]):
        assert c.tokens <= 120 and text[c.start : c.start + len(c.text)] == c.text
        overlap = prev.start + len(prev.text) - c.start
        assert 0 < overlap < len(prev.text) // 2, "consecutive chunks share a little text"
        # Boundaries fall between words: never inside one.
        assert not (text[c.start - 1].isalnum() and text[c.start].isalnum())
        end = c.start + len(c.text)
        assert end == len(text) or not (text[end - 1].isalnum() and text[end].isalnum())
    # Most chunks end at a sentence or paragraph.
    endings = [c.text.rstrip()[-1] for c in chunks]
    assert sum(e == "." for e in endings) >= 0.9 * len(endings)


# --------------------------------------------------------------- the service


async def test_upload_each_type_until_ready(service: Service) -> None:
    http, base = service.http, service.url
    documents = [
        ("notes.md", MARKDOWN.encode(), "text/markdown", "text/markdown"),
        ("page.html", HTML.encode(), "text/html", "text/html"),
        ("report.pdf", pdf([["Quarterly revenue grew by 12 percent."], ["Costs were flat."]]), "application/pdf", "application/pdf"),
        ("plain.txt", "Un café, s'il vous plaît.".encode(), None, "text/plain"),  # octet-stream: by extension
    ]
    ids = []
    for filename, data, sent_type, expected_type in documents:
        status, body = await upload(http, base, filename, data, sent_type)
        assert status == 200, body
        assert body["object"] == "file" and body["status"] == "processing" and body["id"].startswith("file-")
        assert (body["filename"], body["bytes"], body["content_type"]) == (filename, len(data), expected_type)
        assert isinstance(body["created_at"], int)
        ids.append(body["id"])
    for file_id in ids:
        done = await wait_file(http, base, file_id)
        assert done["status"] == "ready" and done["error"] is None, done
        assert done["chunks"] >= 1 and done["tokens"] >= 5 and done["chars"] > 10
        assert done["chunks"] == await chunk_rows(service.settings.database_url, file_id)
    status, listing = await service.get("/v1/files")
    assert status == 200 and {f["id"] for f in listing["data"]} == set(ids)


async def test_failed_documents_say_why(service: Service) -> None:
    http, base = service.http, service.url
    cases = {
        "scan.pdf": (pdf_without_text(), "no text could be extracted"),
        "broken.pdf": (b"%PDF-1.4\n1 0 obj << /Type /Catalog >> garbage", "the PDF could not be read: "),
        "latin1.txt": ("déjà vu".encode("latin-1"), "not UTF-8 text"),
        "empty.md": (b"  \n\n ", "no text could be extracted"),
    }
    for filename, (data, reason) in cases.items():
        status, body = await upload(http, base, filename, data)
        assert status == 200, body
        done = await wait_file(http, base, body["id"])
        assert done["status"] == "failed" and reason in done["error"], (filename, done)
        assert done["chunks"] is None


async def test_bad_uploads(service: Service) -> None:
    http, base = service.http, service.url
    status, body = await upload(http, base, "photo.png", b"\x89PNG\r\n\x1a\n....", "image/png")
    assert status == 415 and body["error"]["code"] == "unsupported_file_type", body
    formdata = aiohttp.FormData()
    formdata.add_field("purpose", "assistants")
    async with http.post(f"{base}/v1/files", data=formdata) as resp:
        body = await resp.json()
        assert resp.status == 400 and "'file'" in body["error"]["message"], body
    status, body, _ = await service.post("/v1/files", {"file": "not multipart"})
    assert status == 400 and body["error"]["code"] == "invalid_content_type"
    status, body = await service.get("/v1/files/file-doesnotexist")
    assert status == 404 and body["error"]["type"] == "not_found_error"
    async with http.delete(f"{base}/v1/files/file-doesnotexist") as resp:
        assert resp.status == 404


async def test_file_over_the_limit_is_413(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, max_file_bytes=4096), upstream)
    try:
        status, body = await upload(svc.http, svc.url, "big.txt", b"a" * 4097, "text/plain")
        assert status == 413 and body["error"]["code"] == "file_too_large", body
        # Far over the limit: refused from the declared length, before reading.
        status, body = await upload(svc.http, svc.url, "huge.txt", b"b" * 300_000, "text/plain")
        assert status == 413
        status, body = await upload(svc.http, svc.url, "fits.txt", b"c " * 2048, "text/plain")
        assert status == 200 and (await wait_file(svc.http, svc.url, body["id"]))["status"] == "ready"
        _, listing = await svc.get("/v1/files")
        assert [f["filename"] for f in listing["data"]] == ["fits.txt"]
    finally:
        await stop_service(svc)


async def test_someone_elses_file_is_404(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url, auth="on"), upstream)
    try:
        alice = {"Authorization": f"Bearer {await svc.services.store.create_api_key('alice')}"}
        bob = {"Authorization": f"Bearer {await svc.services.store.create_api_key('bob')}"}
        status, body = await upload(svc.http, svc.url, "alice.md", MARKDOWN.encode(), headers=alice)
        assert status == 200
        file_id = body["id"]
        await wait_file(svc.http, svc.url, file_id, headers=alice)
        async with svc.http.get(f"{svc.url}/v1/files/{file_id}", headers=bob) as resp:
            assert resp.status == 404
        async with svc.http.delete(f"{svc.url}/v1/files/{file_id}", headers=bob) as resp:
            assert resp.status == 404
        async with svc.http.get(f"{svc.url}/v1/files", headers=bob) as resp:
            assert (await resp.json())["data"] == []
        async with svc.http.get(f"{svc.url}/v1/files/{file_id}", headers=alice) as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ready"
        async with svc.http.post(f"{svc.url}/v1/files", data=b"x") as resp:
            assert resp.status == 401
    finally:
        await stop_service(svc)


async def test_delete_removes_chunks_and_vectors(embedded: Service, embedding_server: EmbeddingServer) -> None:
    svc = embedded
    text = prose(800, seed=3)
    status, body = await upload(svc.http, svc.url, "long.md", text.encode(), "text/markdown")
    assert status == 200
    done = await wait_file(svc.http, svc.url, body["id"])
    assert done["status"] == "ready" and done["embedding_model"] == "concept-embed" and done["chunks"] > 3
    assert embedding_server.texts == done["chunks"]
    vectors = svc.services.knowledge.vectors
    assert vectors is not None
    collection = vector_collection("concept-embed")
    hits = await vectors.query(collection, embed_text(text[:200]), 100, filter={"file_id": done["id"]})
    assert len(hits) == done["chunks"] and {h.metadata["user_id"] for h in hits} == {"local"}
    async with svc.http.delete(f"{svc.url}/v1/files/{done['id']}") as resp:
        assert resp.status == 200 and (await resp.json())["deleted"] is True
    assert await chunk_rows(svc.settings.database_url, done["id"]) == 0
    assert await vectors.query(collection, embed_text(text[:200]), 100, filter={"file_id": done["id"]}) == []
    status, _ = await svc.get(f"/v1/files/{done['id']}")
    assert status == 404


async def test_embedding_failure_fails_the_file(embedded: Service, embedding_server: EmbeddingServer) -> None:
    embedding_server.fail_on = "POISON"
    status, body = await upload(embedded.http, embedded.url, "bad.txt", b"This chunk carries POISON for the model.", "text/plain")
    assert status == 200
    done = await wait_file(embedded.http, embedded.url, body["id"])
    assert done["status"] == "failed" and done["error"].startswith("embedding failed: HTTP 500"), done
    assert await chunk_rows(embedded.settings.database_url, body["id"]) == 0


async def test_deleting_a_file_while_it_is_embedded(embedded: Service, embedding_server: EmbeddingServer) -> None:
    """The ingestion stops; no chunk, vector or row is left behind."""
    import asyncio

    embedding_server.hold = asyncio.Event()
    status, body = await upload(embedded.http, embedded.url, "slow.md", prose(300).encode(), "text/markdown")
    assert status == 200
    await _until(lambda: embedding_server.waiting > 0)
    async with embedded.http.delete(f"{embedded.url}/v1/files/{body['id']}") as resp:
        assert resp.status == 200
    embedding_server.hold.set()
    await embedded.services.knowledge.idle()
    assert await chunk_rows(embedded.settings.database_url, body["id"]) == 0
    vectors = embedded.services.knowledge.vectors
    assert vectors is not None
    assert await vectors.query(vector_collection("concept-embed"), embed_text("alpha"), 50, filter={"file_id": body["id"]}) == []


async def _until(predicate, timeout: float = 10.0) -> None:
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_a_crash_mid_ingestion_is_resumed(tmp_path: Path, database_url: str) -> None:
    """A real ``turnlog serve`` killed (SIGKILL) while a big file is ingested:
    the file stays ``processing`` with no chunks; the restarted service
    finishes it, with the chunks a fresh upload of the same bytes gets."""
    text = prose(1_400_000, seed=11)  # ~8 MB: seconds of tokenizing and chunking
    data = text.encode()
    assert len(data) < 10 * 1024 * 1024
    big = {"TURNLOG_FILE_MAX_TEXT_BYTES": str(10 * 1024 * 1024), "TURNLOG_FILE_MAX_CHUNKS": "100000"}  # over the defaults
    async with aiohttp.ClientSession() as http:
        first = Server(database_url, None, auto_resume=False, log_dir=tmp_path, env=big)
        try:
            await first.ready(http)
            status, body = await upload(http, first.url, "big.md", data, "text/markdown")
            assert status == 200, body
            first.kill9()
        finally:
            first.stop()
        file_id = body["id"]
        engine = create_engine(database_url)
        try:
            async with engine.connect() as conn:
                row = (await conn.execute(select(files.c.status, files.c.chunks).where(files.c.id == file_id))).one()
        finally:
            await engine.dispose()
        assert row.status == "processing", "the kill came after the ingestion ended: no crash was tested"
        assert await chunk_rows(database_url, file_id) == 0

        second = Server(database_url, None, auto_resume=False, log_dir=tmp_path, env=big)
        try:
            await second.ready(http)
            done = await wait_file(http, second.url, file_id, timeout=120)
            assert done["status"] == "ready", done
            status, again = await upload(http, second.url, "again.md", data, "text/markdown")
            assert status == 200
            fresh = await wait_file(http, second.url, again["id"], timeout=120)
        finally:
            second.stop()
    assert (done["chunks"], done["tokens"], done["chars"]) == (fresh["chunks"], fresh["tokens"], fresh["chars"])
    assert done["chunks"] > 1000 and done["chars"] == len(text)
    assert await chunk_rows(database_url, file_id) == done["chunks"]
