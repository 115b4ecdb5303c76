"""Memories: ``/v1/memories`` over HTTP, and ``search`` (the ``MemorySearch`` port).

Everything real: the service on loopback (SQLite and PostgreSQL + pgvector),
and for embeddings an embedder that calls a real HTTP server on loopback
speaking OpenAI's ``POST /v1/embeddings``. That server's vectors count words
of a few concepts (synonyms share a dimension), so a query can be near a
memory it shares no word with: what only the vector path can find. The
expected scores come from the same concept function (the oracle), computed
here independently of the service.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from adapters.knowledge.memories import Memories, bm25_scores, collection_for
from adapters.store import SqlEventStore
from adapters.vectors import open_vector_store
from engine.ports import MemorySearch, RetrievalError
from engine.vectors import VectorItem
from tests.documents import HttpEmbedder
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import ScriptedUpstream

# -- a real /v1/embeddings server and a tiny Embedder that calls it -----------------

CONCEPTS = {
    "cat": 0, "cats": 0, "kitten": 0, "feline": 0,
    "car": 1, "automobile": 1, "vehicle": 1, "drive": 1,
    "coffee": 2, "espresso": 2, "latte": 2,
    "sister": 3, "brother": 3, "family": 3,
}  # fmt: skip
DIM = 5  # the last dimension: a constant, so no text is a zero vector


def concept_vector(text: str) -> list[float]:
    vector = [0.0] * DIM
    for word in re.findall(r"\w+", text.lower()):
        if word in CONCEPTS:
            vector[CONCEPTS[word]] += 1.0
    vector[-1] = 0.1
    return vector


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


class EmbeddingServer:
    """OpenAI's ``POST /v1/embeddings`` on loopback; ``fail`` makes it answer 503."""

    def __init__(self) -> None:
        self.inputs: list[list[str]] = []  # each request's texts
        self.fail = False
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.inputs.append(texts)
        if self.fail:
            return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=503)
        data = [{"object": "embedding", "index": i, "embedding": concept_vector(t)} for i, t in enumerate(texts)]
        # In reverse: the index, not the position, says which text a vector is for.
        return web.json_response({"object": "list", "model": body["model"], "data": data[::-1], "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/embeddings", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def embedded(self) -> list[str]:
        return [t for texts in self.inputs for t in texts]


@pytest.fixture
async def embeddings() -> AsyncIterator[EmbeddingServer]:
    server = EmbeddingServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def embedded_service(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embeddings: EmbeddingServer) -> AsyncIterator[Service]:
    embedder = HttpEmbedder(embeddings.url, "concepts-1")
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream, embedder=embedder)
    try:
        yield svc
    finally:
        await stop_service(svc)


@pytest.fixture
async def authed(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> AsyncIterator[tuple[Service, str, str]]:
    svc = await start_service(make_settings(tmp_path, upstream.url, auth="on", database_url=database_url), upstream)
    alice = await svc.services.store.create_api_key("alice")
    bob = await svc.services.store.create_api_key("bob")
    try:
        yield svc, alice, bob
    finally:
        await stop_service(svc)


async def add(svc: Service, content: str) -> dict[str, Any]:
    status, body, _ = await svc.post("/v1/memories", {"content": content})
    assert status == 200, body
    return body


async def query(svc: Service, content: str, k: int | None = None) -> list[dict[str, Any]]:
    status, body, _ = await svc.post("/v1/memories/query", {"content": content} if k is None else {"content": content, "k": k})
    assert status == 200, body
    return body["data"]


async def request(svc: Service, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with svc.http.request(method, svc.url + path, json=body, headers=svc.headers) as resp:
        return resp.status, await resp.json()


# -- CRUD --------------------------------------------------------------------------


async def test_create_list_get_update_delete(service: Service) -> None:
    first = await add(service, "I live in Lisbon")
    assert set(first) == {"id", "content", "created_at", "updated_at"}
    assert first["content"] == "I live in Lisbon" and first["created_at"] == first["updated_at"]
    second = await add(service, "I am allergic to peanuts")

    status, listed = await service.get("/v1/memories")
    assert status == 200 and listed == {"data": [second, first]}  # newest first
    assert await service.get(f"/v1/memories/{first['id']}") == (200, first)

    status, updated, _ = await service.post(f"/v1/memories/{first['id']}", {"content": "I live in Porto"})
    assert status == 200 and updated["content"] == "I live in Porto"
    assert updated["created_at"] == first["created_at"] and updated["updated_at"] >= first["updated_at"]
    status, patched = await request(service, "PATCH", f"/v1/memories/{first['id']}", {"content": "I live in Braga"})
    assert status == 200 and patched["content"] == "I live in Braga" and patched["id"] == first["id"]
    assert await service.get(f"/v1/memories/{first['id']}") == (200, patched)

    assert await request(service, "DELETE", f"/v1/memories/{first['id']}") == (200, {"id": first["id"], "deleted": True})
    status, body = await service.get(f"/v1/memories/{first['id']}")
    assert status == 404 and body["error"]["type"] == "not_found_error"
    assert (await request(service, "DELETE", f"/v1/memories/{first['id']}"))[0] == 404
    assert (await service.get("/v1/memories"))[1] == {"data": [second]}
    assert [h["id"] for h in await query(service, "Braga")] == []


async def test_users_see_only_their_own_memories(authed: tuple[Service, str, str]) -> None:
    svc, alice, bob = authed
    svc.headers = {}
    status, body = await svc.get("/v1/memories")
    assert status == 401

    svc.headers = {"Authorization": f"Bearer {alice}"}
    mine = await add(svc, "alice keeps bees")
    svc.headers = {"Authorization": f"Bearer {bob}"}
    await add(svc, "bob keeps bees too")
    path = f"/v1/memories/{mine['id']}"
    for method, body in [("GET", None), ("POST", {"content": "bob was here"}), ("PATCH", {"content": "bob was here"}), ("DELETE", None)]:
        status, answer = await request(svc, method, path, body)
        assert status == 404 and answer["error"]["code"] == "not_found", (method, answer)
    assert [m["content"] for m in (await svc.get("/v1/memories"))[1]["data"]] == ["bob keeps bees too"]
    assert [h["content"] for h in await query(svc, "bees")] == ["bob keeps bees too"]

    svc.headers = {"Authorization": f"Bearer {alice}"}
    assert await svc.get(path) == (200, mine)  # untouched
    assert [h["content"] for h in await query(svc, "bees")] == ["alice keeps bees"]


# -- lexical search (no embedder) ----------------------------------------------------


def test_bm25_by_hand() -> None:
    # N = 2, "a" in one: idf = ln(1 + 1.5/1.5) = ln 2; tf = 1, |d| = avgdl = 2:
    # ln 2 * 1 * (1.2 + 1) / (1 + 1.2) = ln 2.
    assert bm25_scores("a", ["a b", "b c"]) == pytest.approx([math.log(2), 0.0])
    # A term in every document still counts (Lucene's IDF is positive).
    assert all(s > 0 for s in bm25_scores("b", ["a b", "b c"]))
    assert bm25_scores("", ["a"]) == [0.0] and bm25_scores("a", []) == []


async def test_query_ranks_lexically(service: Service) -> None:
    lisbon = await add(service, "I live in Lisbon")
    sister = await add(service, "My sister lives in Porto and loves Lisbon in spring")
    allergy = await add(service, "I am allergic to peanuts")
    snacks = await add(service, "Peanuts and cashews are my favourite snacks")
    await add(service, "The meeting is on Monday")

    hits = await query(service, "LISBON?")
    # Same term frequency: the shorter memory is the closer one; the others share no term.
    assert [h["id"] for h in hits] == [lisbon["id"], sister["id"]]
    assert hits[0]["score"] > hits[1]["score"] > 0
    assert set(hits[0]) == {"id", "content", "created_at", "score"} and hits[0]["content"] == "I live in Lisbon"

    hits = await query(service, "allergic to peanuts?", k=10)
    assert [h["id"] for h in hits] == [allergy["id"], snacks["id"]]
    assert [h["id"] for h in await query(service, "peanuts allergic", k=1)] == [allergy["id"]]
    assert await query(service, "quantum chromodynamics") == []


async def test_query_k_defaults_to_memory_top_k(service: Service) -> None:
    for i in range(5):
        await add(service, f"note number {i}")
    assert service.settings.memory_top_k == 3
    assert len(await query(service, "note")) == 3
    assert len(await query(service, "note", k=100)) == 5


# -- vector search (an embedder) ---------------------------------------------------------


async def test_query_by_embeddings(embedded_service: Service, embeddings: EmbeddingServer) -> None:
    svc = embedded_service
    kitten = await add(svc, "I have a kitten named Tom")
    car = await add(svc, "I drive an old automobile")
    coffee = await add(svc, "Espresso every morning")
    # Embedded on write, one call each.
    assert embeddings.embedded() == ["I have a kitten named Tom", "I drive an old automobile", "Espresso every morning"]

    memories = {m["id"]: m["content"] for m in (kitten, car, coffee)}

    def expected(q: str, k: int) -> list[tuple[str, float]]:
        ranked = sorted(memories, key=lambda i: -cosine(concept_vector(q), concept_vector(memories[i])))
        return [(i, cosine(concept_vector(q), concept_vector(memories[i]))) for i in ranked[:k]]

    # "feline" shares no word with any memory: only the vectors find the kitten.
    hits = await query(svc, "feline", k=3)
    assert [(h["id"], pytest.approx(h["score"], abs=1e-5)) for h in hits] == expected("feline", 3)
    assert hits[0]["content"] == "I have a kitten named Tom"
    hits = await query(svc, "latte")
    assert [h["id"] for h in hits] == [i for i, _ in expected("latte", 3)] and hits[0]["id"] == coffee["id"]

    # Update re-embeds: the old vector no longer answers for the memory.
    status, _, _ = await svc.post(f"/v1/memories/{kitten['id']}", {"content": "My brother visits on Sundays"})
    assert status == 200 and embeddings.embedded()[-1] == "My brother visits on Sundays"
    memories[kitten["id"]] = "My brother visits on Sundays"
    hits = await query(svc, "family", k=1)
    assert [(h["id"], h["content"]) for h in hits] == [(kitten["id"], "My brother visits on Sundays")]
    assert hits[0]["score"] == pytest.approx(expected("family", 1)[0][1], abs=1e-5)

    # Delete takes the vector too.
    assert (await request(svc, "DELETE", f"/v1/memories/{car['id']}"))[0] == 200
    del memories[car["id"]]
    assert car["id"] not in [h["id"] for h in await query(svc, "vehicle", k=100)]
    vectors = svc.services.memories.vectors
    assert vectors is not None
    stored = await vectors.query(collection_for("concepts-1"), concept_vector("vehicle"), 100)
    assert sorted(h.id for h in stored) == sorted(memories)


async def test_vector_search_is_per_user(embedded_service: Service) -> None:
    """Through the port the engine calls: another user's vectors never come back."""
    memories: MemorySearch = embedded_service.services.memories
    mine = await add(embedded_service, "my cat sleeps all day")
    await embedded_service.services.memories.add("someone-else", "their cat sleeps too")
    hits = await memories.search("local", "kitten", 10)
    assert [h.id for h in hits] == [mine["id"]]
    assert [h.content for h in await memories.search("someone-else", "kitten", 10)] == ["their cat sleeps too"]
    assert await memories.search("nobody", "kitten", 10) == []


async def test_a_vector_of_other_content_is_made_again(embedded_service: Service, embeddings: EmbeddingServer) -> None:
    """A vector whose text is not the row's content (a crash after an update's
    vector was written and before its row was, or two updates racing) is
    embedded again when a search meets it: the ranking is the row's."""
    svc = embedded_service
    car = await add(svc, "I drive a car")
    coffee = await add(svc, "I like espresso")
    assert [h["id"] for h in await query(svc, "automobile", k=1)] == [car["id"]]
    vectors = svc.services.memories.vectors
    assert vectors is not None
    await vectors.upsert(collection_for("concepts-1"), [VectorItem(car["id"], concept_vector("my kitten"), "my kitten", {"user_id": "local"})])
    embeddings.inputs.clear()
    hits = await query(svc, "kitten", k=1)
    assert embeddings.inputs == [["kitten"], ["I drive a car"]]  # the query, then the stale memory
    assert [h["id"] for h in hits] == [coffee["id"]]
    assert hits[0]["score"] == pytest.approx(cosine(concept_vector("kitten"), concept_vector("I like espresso")), abs=1e-5)


async def test_embedding_failures(embedded_service: Service, embeddings: EmbeddingServer) -> None:
    svc = embedded_service
    kept = await add(svc, "I drive a vehicle")
    embeddings.fail = True
    # A write the model cannot embed stores nothing and changes nothing: 502.
    status, body, _ = await svc.post("/v1/memories", {"content": "my cat is grey"})
    assert status == 502 and body["error"]["code"] == "embedding_failed" and "503" in body["error"]["message"]
    status, body = await request(svc, "PATCH", f"/v1/memories/{kept['id']}", {"content": "my cat is grey"})
    assert status == 502 and body["error"]["code"] == "embedding_failed"
    assert (await svc.get("/v1/memories"))[1] == {"data": [kept]}
    # A search the model cannot embed: 502 over HTTP, RetrievalError through the port.
    status, body, _ = await svc.post("/v1/memories/query", {"content": "car"})
    assert status == 502 and body["error"]["code"] == "retrieval_failed" and "503" in body["error"]["message"]
    with pytest.raises(RetrievalError, match="embedding model failed"):
        await svc.services.memories.search("local", "car", 3)

    embeddings.fail = False
    assert [h["id"] for h in await query(svc, "car")] == [kept["id"]]
    status, body = await request(svc, "PATCH", f"/v1/memories/{kept['id']}", {"content": "my cat is grey"})
    assert status == 200 and [h["id"] for h in await query(svc, "kitten", k=1)] == [kept["id"]]


async def test_memories_without_vectors_are_embedded_at_first_search(service: Service, embeddings: EmbeddingServer, database_url: str) -> None:
    """Memories written with no embedder (or under another model) get their
    vectors when an embedder first searches them: no migration step."""
    old = [await add(service, text) for text in ("I have two cats", "I drive a car", "I like espresso")]
    vectors = await open_vector_store(database_url)
    try:
        for model in ("concepts-1", "concepts-2"):  # turning embeddings on, then changing the model
            embeddings.inputs.clear()
            store = service.services.store
            assert isinstance(store, SqlEventStore)
            memories = Memories(store.engine, embedder=HttpEmbedder(embeddings.url, model), vectors=vectors)
            hits = await memories.search("local", "kitten", 1)
            assert [h.id for h in hits] == [old[0]["id"]]
            # The query, then the user's memories in one batch; the next search embeds only the query.
            assert embeddings.inputs == [["kitten"], [m["content"] for m in reversed(old)]]
            assert [h.id for h in await memories.search("local", "automobile", 1)] == [old[1]["id"]]
            assert embeddings.inputs[2:] == [["automobile"]]
    finally:
        await vectors.close()


# -- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, raw, param",
    [
        ("/v1/memories", b"", None),
        ("/v1/memories", b"{not json", None),
        ("/v1/memories", b"[1, 2]", None),
        ("/v1/memories", b"{}", "content"),
        ("/v1/memories", b'{"content": ""}', "content"),
        ("/v1/memories", b'{"content": "  \\n "}', "content"),
        ("/v1/memories", b'{"content": 5}', "content"),
        ("/v1/memories", b'{"content": null}', "content"),
        ("/v1/memories", b'{"content": ["a"]}', "content"),
        ("/v1/memories/query", b'{"k": 3}', "content"),
        ("/v1/memories/query", b'{"content": ""}', "content"),
        ("/v1/memories/query", b'{"content": "x", "k": 0}', "k"),
        ("/v1/memories/query", b'{"content": "x", "k": -1}', "k"),
        ("/v1/memories/query", b'{"content": "x", "k": 101}', "k"),
        ("/v1/memories/query", b'{"content": "x", "k": 2.5}', "k"),
        ("/v1/memories/query", b'{"content": "x", "k": "3"}', "k"),
        ("/v1/memories/query", b'{"content": "x", "k": true}', "k"),
        ("/v1/memories/query", b"null", None),
    ],
)
async def test_bad_bodies_are_400(service: Service, path: str, raw: bytes, param: str | None) -> None:
    async with service.http.post(service.url + path, data=raw, headers={"Content-Type": "application/json"}) as resp:
        body = await resp.json()
    assert resp.status == 400, body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param, body
    if param:
        assert f"'{param}'" in body["error"]["message"], body


async def test_bad_updates_and_unknown_ids(service: Service) -> None:
    memory = await add(service, "I live in Lisbon")
    for method in ("POST", "PATCH"):
        for body in ({"content": ""}, {"content": 1}, {}):
            status, answer = await request(service, method, f"/v1/memories/{memory['id']}", body)
            assert status == 400 and answer["error"]["param"] == "content", (method, body, answer)
    assert await service.get(f"/v1/memories/{memory['id']}") == (200, memory)
    for method, payload in [("GET", None), ("POST", {"content": "x"}), ("PATCH", {"content": "x"}), ("DELETE", None)]:
        for memory_id in ("mem_unknown", "%20"):
            status, answer = await request(service, method, f"/v1/memories/{memory_id}", payload)
            assert status == 404, (method, memory_id, answer)
    status, answer = await request(service, "PUT", f"/v1/memories/{memory['id']}", {"content": "x"})
    assert status == 405 and "error" in answer
    status, answer = await request(service, "GET", "/v1/memories/query")
    assert status == 404  # a memory id like any other: there is none called "query"
