"""Large base64 payloads are stored as blobs and referenced (``engine.blobs``).

* ``Blobs.externalize`` against a real store on every store backend
  (``tests/backends.py``: memory, SQLite with both write paths, PostgreSQL);
* the store's ``put_blob``/``get_blob``: round trip, dedupe, owner isolation,
  interleaving with appends on the group-commit writer;
* ``GET /v1/blobs/{id}`` on the real service (auth on, two users).

The HTTP tests need ``adapters.http.blob_routes.setup(app)`` in
``create_app``; until that line is there, ``_with_blob_routes`` registers the
route on the app the harness builds (and does nothing once it is wired).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import func, select, text

from adapters.store import MemoryEventStore, SqlEventStore, migrate, sqlite_engine
from adapters.store.migrate import alembic_config
from adapters.store.schema import blobs as blobs_table
from adapters.store.schema import metadata
from engine.blobs import BLOB_KEY, Blobs, blob_id, decode_base64, is_blob_ref, parse_data_uri
from engine.events import Event
from engine.ports import TurnRecord
from tests.backends import SERVICE_BACKENDS, STORE_BACKENDS, Backend, Store
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import ScriptedUpstream

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8  # 2056 bytes, a PNG by its magic
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(200, 256)) * 40
RANDOM = hashlib.sha256(b"seed").digest() * 100  # unknown format, 3200 bytes


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


# ------------------------------------------------------------------ fixtures


#: The store-level tests here run on every store backend (the HTTP ones on the service's).
pytestmark = pytest.mark.backends(*STORE_BACKENDS)


@pytest.fixture
async def store(store_backend: Backend) -> AsyncIterator[Store]:
    s = await store_backend.open(time.time)
    yield s
    await s.close()


@pytest.fixture
def user() -> str:
    """A fresh user per test (a shared PostgreSQL database works too)."""
    return f"u-{uuid.uuid4().hex[:10]}"


async def blob_rows(store: Store, user_id: str) -> int:
    """How many blobs of ``user_id`` the backend holds."""
    if isinstance(store, MemoryEventStore):
        return sum(row.user_id == user_id for row in store.database.blobs.values())
    async with store.engine.connect() as conn:
        stmt = select(func.count()).select_from(blobs_table).where(blobs_table.c.user_id == user_id)
        return (await conn.execute(stmt)).scalar_one()


# ------------------------------------------------------------ pure helpers


def test_blob_id_is_sha256_of_user_nul_data() -> None:
    assert blob_id("alice", b"xyz") == hashlib.sha256(b"alice\0xyz").hexdigest()
    assert blob_id("alice", b"xyz") != blob_id("bob", b"xyz")
    # The NUL separates: ("a", "bc") and ("ab", "c") are different.
    assert blob_id("a", b"bc") != blob_id("ab", b"c")


def test_parse_data_uri() -> None:
    assert parse_data_uri(data_uri(PNG)) == ("image/png", PNG)
    assert parse_data_uri("data:Image/PNG;name=x.png;base64," + b64(PNG)) == ("image/png", PNG)
    assert parse_data_uri("data:text/plain,hello") is None  # not base64
    assert parse_data_uri("data:image/png;base64,not*base64!") is None
    assert parse_data_uri("data:;base64," + b64(PNG)) is None  # no mime
    assert parse_data_uri("see data:image/png;base64," + b64(PNG)) is None  # not the whole string
    assert parse_data_uri("https://example.com/x.png") is None


def test_decode_base64_is_strict() -> None:
    assert decode_base64(b64(RANDOM)) == RANDOM
    assert decode_base64(b64(b"ab").rstrip("=")) == b"ab"  # missing padding tolerated
    wrapped = "\n".join(b64(RANDOM)[i : i + 76] for i in range(0, len(b64(RANDOM)), 76))
    assert decode_base64(wrapped) == RANDOM  # MIME line breaks
    assert decode_base64("abc-def_") is None  # url-safe alphabet is not ours
    assert decode_base64("hello world, this is text") is None
    assert decode_base64("A") is None
    assert decode_base64("") is None


# ----------------------------------------------------------- externalize


async def test_files_event_image_is_externalized(store: Store, user: str) -> None:
    uri = data_uri(PNG)
    event: dict[str, Any] = {"type": "files", "data": {"files": [{"type": "image", "url": uri}]}}
    out = await Blobs(store, user).externalize(event, limit=1024)

    ident = blob_id(user, PNG)
    assert out == {
        "type": "files",
        "data": {
            "files": [
                {
                    "type": "image",
                    "url": {BLOB_KEY: ident, "mime": "image/png", "bytes": len(PNG), "url": f"/v1/blobs/{ident}"},
                }
            ]
        },
    }
    assert event["data"]["files"][0]["url"] == uri  # the input is not changed
    assert await store.get_blob(user, ident) == ("image/png", PNG)


async def test_nested_dicts_and_lists(store: Store, user: str) -> None:
    payload = {
        "a": [1, 2.5, None, True, "short", [data_uri(PNG), {"deep": {"deeper": [data_uri(JPEG, "image/jpeg")]}}]],
        "b": ("tuple", data_uri(RANDOM, "application/octet-stream")),
        "n": 3,
    }
    out = await Blobs(store, user).externalize(payload, limit=100)
    assert out["a"][:5] == [1, 2.5, None, True, "short"]
    assert out["a"][5][0]["$blob"] == blob_id(user, PNG)
    assert out["a"][5][1]["deep"]["deeper"][0] == {
        "$blob": blob_id(user, JPEG),
        "mime": "image/jpeg",
        "bytes": len(JPEG),
        "url": f"/v1/blobs/{blob_id(user, JPEG)}",
    }
    assert out["b"][0] == "tuple" and out["b"][1]["mime"] == "application/octet-stream"
    assert out["n"] == 3
    assert await store.get_blob(user, blob_id(user, JPEG)) == ("image/jpeg", JPEG)
    assert await store.get_blob(user, blob_id(user, RANDOM)) == ("application/octet-stream", RANDOM)


async def test_limit_is_on_the_string_length(store: Store, user: str) -> None:
    uri = data_uri(PNG)
    blobs = Blobs(store, user)
    assert await blobs.externalize({"u": uri}, limit=len(uri)) == {"u": uri}  # not longer than limit
    out = await blobs.externalize({"u": uri}, limit=len(uri) - 1)
    assert is_blob_ref(out["u"])
    # Small images stay inline when the limit is above them.
    assert await blobs.externalize([data_uri(b"tiny")], limit=1000) == [data_uri(b"tiny")]
    assert await blob_rows(store, user) == 1


async def test_other_strings_are_untouched(store: Store, user: str) -> None:
    long_text = "lorem ipsum dolor sit amet " * 100
    looks_b64 = "A" * 3000  # valid base64, but under a key that does not say so
    payload = {
        "content": long_text,
        "text": looks_b64,
        "markdown": f"here: ![img]({data_uri(PNG)})",  # contains a data URI, is not one
        "plain_uri": "data:text/plain," + "x" * 3000,  # a data URI, not base64
        "broken": "data:image/png;base64," + "!!" * 2000,  # base64 that does not decode
        "url": "https://example.com/" + "p" * 3000,
        "data": long_text,  # the generic key, but text
        "b64_json": "not base64 at all, " * 200,
    }
    out = await Blobs(store, user).externalize(payload, limit=100)
    assert out == payload
    assert await blob_rows(store, user) == 0


async def test_bare_base64_under_named_keys(store: Store, user: str) -> None:
    payload = {
        # OpenAI images: {"data": [{"b64_json": ...}]}
        "images": {"data": [{"b64_json": b64(PNG)}]},
        # MCP image content: the mime next to it
        "mcp": {"type": "image", "data": b64(RANDOM), "mimeType": "image/webp"},
        # Anthropic-style source
        "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(JPEG)},
        # OpenAI input_audio
        "audio": {"data": b64(RANDOM[:2000]), "format": "wav"},
        "thumb_b64": b64(PNG),
        "unknown": {"payload_base64": b64(RANDOM[:1000])},
        # "data" without a declared or recognizable type stays
        "opaque": {"data": b64(RANDOM[:1500])},
    }
    out = await Blobs(store, user).externalize(payload, limit=200)
    assert out["images"]["data"][0]["b64_json"]["mime"] == "image/png"  # sniffed
    assert out["mcp"]["data"]["mime"] == "image/webp" and out["mcp"]["mimeType"] == "image/webp"
    assert out["source"]["data"]["mime"] == "image/jpeg"
    assert out["source"]["type"] == "base64"  # short strings never change
    assert out["audio"]["data"]["mime"] == "audio/wav"
    assert out["thumb_b64"]["$blob"] == out["images"]["data"][0]["b64_json"]["$blob"]  # same bytes
    assert out["unknown"]["payload_base64"]["mime"] == "application/octet-stream"
    assert out["opaque"] == payload["opaque"]
    assert await store.get_blob(user, out["mcp"]["data"]["$blob"]) == ("image/webp", RANDOM)


async def test_deterministic_and_deduplicated(store: Store, user: str) -> None:
    uri = data_uri(PNG)
    payload = {"files": [{"url": uri}, {"url": uri}], "again": {"image_url": {"url": uri}}}
    original = copy.deepcopy(payload)
    blobs = Blobs(store, user)
    first = await blobs.externalize(payload, limit=64)
    second = await blobs.externalize(payload, limit=64)
    third = await Blobs(store, user).externalize(copy.deepcopy(payload), limit=64)
    assert first == second == third
    assert payload == original
    refs = [first["files"][0]["url"], first["files"][1]["url"], first["again"]["image_url"]["url"]]
    assert len({r["$blob"] for r in refs}) == 1
    assert refs[0] is not refs[1]  # independent copies: callers may mutate one
    assert await blob_rows(store, user) == 1


async def test_users_never_share_blobs(store: Store, user: str) -> None:
    other = user + "-other"
    payload = {"url": data_uri(PNG)}
    mine = (await Blobs(store, user).externalize(payload, limit=10))["url"]["$blob"]
    theirs = (await Blobs(store, other).externalize(payload, limit=10))["url"]["$blob"]
    assert mine != theirs
    assert await store.get_blob(user, mine) == ("image/png", PNG)
    assert await store.get_blob(user, theirs) is None
    assert await store.get_blob(other, mine) is None
    assert await store.get_blob(other, theirs) == ("image/png", PNG)


async def test_non_container_values_pass_through(store: Store, user: str) -> None:
    blobs = Blobs(store, user)
    assert await blobs.externalize(None, limit=0) is None
    assert await blobs.externalize(42, limit=0) == 42
    assert await blobs.externalize("plain", limit=0) == "plain"
    assert (await blobs.externalize(data_uri(b"x"), limit=0))["bytes"] == 1  # a bare top-level URI
    with pytest.raises(ValueError):
        await blobs.externalize({}, limit=-1)


# ------------------------------------------------------------------ store


async def test_store_round_trip_dedupe_and_isolation(store: Store, user: str) -> None:
    data = bytes(range(256)) * 4 + b"\x00\x00"  # NULs, every byte value
    ident = await store.put_blob(user, data, "application/x-test")
    assert ident == blob_id(user, data)
    assert await store.get_blob(user, ident) == ("application/x-test", data)
    # Idempotent: the same id, still one row, the first mime stays.
    assert await store.put_blob(user, data, "image/png") == ident
    assert await blob_rows(store, user) == 1
    assert await store.get_blob(user, ident) == ("application/x-test", data)
    # Someone else's id, an unknown id: None.
    assert await store.get_blob(user + "-other", ident) is None
    assert await store.get_blob(user, "0" * 64) is None
    # Empty bytes are a blob like any other.
    empty = await store.put_blob(user, b"", "text/plain")
    assert await store.get_blob(user, empty) == ("text/plain", b"")


async def test_concurrent_puts_and_appends(store: Store, user: str) -> None:
    """Blob writes share the group-commit writer with appends: nothing is
    locked out, nothing lost, duplicates collapse."""
    turn_id = f"t-{uuid.uuid4().hex[:10]}"
    now = 1_800_000_000.0
    record = TurnRecord(
        id=turn_id,
        chat_id=f"c-{turn_id}",
        user_id=user,
        model="m",
        status="running",
        created_at=now,
        updated_at=now,
        owner="w1",
    )
    fencing = await store.start_turn(record, [Event(turn_id=turn_id, seq=1, type="turn.started", at=now, data={})], lease_seconds=30)
    payloads = [os.urandom(5000) for _ in range(20)]

    async def put(i: int) -> str:
        return await store.put_blob(user, payloads[i % 10], "application/octet-stream")

    async def append(seq: int) -> None:
        await store.append(
            [Event(turn_id=turn_id, seq=seq, type="test.event", at=now + seq, data={"i": seq})],
            fencing=fencing,
        )

    results = await asyncio.gather(*(put(i) for i in range(20)), *(append(s) for s in range(2, 32)))
    ids = [r for r in results[:20] if isinstance(r, str)]
    assert len(ids) == 20
    assert ids[:10] == ids[10:]
    assert await blob_rows(store, user) == 10
    assert [e.seq for e in await store.read(turn_id)] == list(range(1, 32))
    for i in range(10):
        assert await store.get_blob(user, ids[i]) == ("application/octet-stream", payloads[i])


def _blobs_only(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
    return table == "blobs"


def _reflect_blobs_only(name: str | None, type_: str, parent_names: Any) -> bool:
    # Other revisions' tables are not even reflected (e.g. pgvector columns).
    return type_ != "table" or name == "blobs"


@pytest.mark.backends(*SERVICE_BACKENDS)
async def test_migration_0002_matches_schema(store: Store) -> None:
    """The ``blobs`` table the migrations create is the one ``schema`` describes
    (the whole schema is ``test_store_contract``'s business). SQL's alone: the
    in-memory store has no schema."""
    assert isinstance(store, SqlEventStore)
    scripts = ScriptDirectory.from_config(alembic_config(""))
    assert scripts.get_revision("0002").down_revision == "0001"
    assert "0002" in {rev.revision for rev in scripts.iterate_revisions(scripts.get_current_head(), "base")}
    async with store.engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
        diff = await conn.run_sync(
            lambda sync: compare_metadata(
                MigrationContext.configure(
                    sync,
                    opts={
                        "compare_type": True,
                        "include_name": _reflect_blobs_only,
                        "include_object": _blobs_only,
                    },
                ),
                metadata,
            )
        )
        await conn.execute(select(blobs_table.c.id).limit(1))  # the table is there
    assert version == [(scripts.get_current_head(),)]
    assert diff == []


async def test_migration_0002_downgrades(tmp_path: Path) -> None:
    from alembic import command

    url = f"sqlite+aiosqlite:///{tmp_path / 'down.db'}"
    await migrate(url, "0002")  # not head: later revisions are not this test's
    engine = sqlite_engine(url)
    try:
        cfg = alembic_config(url)
        async with engine.begin() as conn:

            def down(sync: Any) -> None:
                cfg.attributes["connection"] = sync
                command.downgrade(cfg, "0001")

            await conn.run_sync(down)
        async with engine.connect() as conn:
            tables = {r[0] for r in (await conn.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))).all()}
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
        assert "blobs" not in tables and "events" in tables
        assert version == [("0001",)]
    finally:
        await engine.dispose()
    await migrate(url, "0002")  # and up again


# ------------------------------------------------------------------- HTTP


def _with_blob_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Have the harness's app serve ``/v1/blobs/{blob_id}`` even before
    ``create_app`` calls ``blob_routes.setup`` (a no-op once it does)."""
    import tests.harness as harness
    from adapters.http import blob_routes

    original = harness.create_app

    def create_app(settings: Any, **kw: Any) -> Any:
        app = original(settings, **kw)
        wired = any(r.canonical == blob_routes.ROUTE for r in app.router.resources())
        if not wired:
            blob_routes.setup(app)
        return app

    monkeypatch.setattr(harness, "create_app", create_app)


@pytest.fixture
async def authed(tmp_path: Path, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Service, dict[str, str], dict[str, str]]]:
    _with_blob_routes(monkeypatch)
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on"), upstream)
    try:
        store = svc.services.store
        alice = {"Authorization": f"Bearer {await store.create_api_key('alice')}"}
        bob = {"Authorization": f"Bearer {await store.create_api_key('bob')}"}
        yield svc, alice, bob
    finally:
        await stop_service(svc)


async def test_http_get_blob(authed: tuple[Service, dict[str, str], dict[str, str]]) -> None:
    svc, alice, bob = authed
    store: Any = svc.services.store
    out = await Blobs(store, "alice").externalize({"url": data_uri(PNG)}, limit=100)
    ref = out["url"]

    async with svc.http.get(svc.url + ref["url"], headers=alice) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "image/png"
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert "sandbox" in resp.headers["Content-Security-Policy"]
        assert await resp.read() == PNG
        etag = resp.headers["ETag"]
    async with svc.http.get(svc.url + ref["url"], headers={**alice, "If-None-Match": etag}) as resp:
        assert resp.status == 304

    # Bob, an unknown id, a malformed id: the same 404 in the OpenAI shape.
    for headers, path in (
        (bob, ref["url"]),
        (alice, "/v1/blobs/" + "0" * 64),
        (alice, "/v1/blobs/not-an-id"),
    ):
        async with svc.http.get(svc.url + path, headers=headers) as resp:
            assert resp.status == 404
            body = await resp.json()
            assert body["error"]["type"] == "not_found_error"
            assert body["error"]["code"] == "not_found"
            assert body["error"]["message"] == "blob not found"

    async with svc.http.get(svc.url + ref["url"]) as resp:  # no key
        assert resp.status == 401


async def test_http_untrusted_mime(authed: tuple[Service, dict[str, str], dict[str, str]]) -> None:
    svc, alice, _ = authed
    store: Any = svc.services.store
    html = b"<script>alert(1)</script>"
    ident = await store.put_blob("alice", html, "text/html")
    async with svc.http.get(f"{svc.url}/v1/blobs/{ident}", headers=alice) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/html")
        assert "sandbox" in resp.headers["Content-Security-Policy"]
        assert await resp.read() == html
    odd = await store.put_blob("alice", b"x", "not a mime\r\nX-Evil: 1")
    async with svc.http.get(f"{svc.url}/v1/blobs/{odd}", headers=alice) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/octet-stream"
        assert "X-Evil" not in resp.headers
