"""Knowledge collections (``/v1/knowledge``) and retrieval (``engine.ports.Knowledge``).

Retrieval is called through the port the engine uses (``FileKnowledge`` as
the running service holds it), over files uploaded through the API: BM25 alone
(no embedder), and hybrid with a real embedding server on loopback whose
vectors relate words of one concept (``tests.documents``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from engine.ports import FileRef, Knowledge
from tests.documents import EmbeddingServer, HttpEmbedder, upload, wait_file
from tests.harness import Service, make_settings, start_service, stop_service
from tests.upstream import ScriptedUpstream

LIGHTHOUSE = """# The lighthouse

The keeper climbs one hundred and twelve steps every evening to light the lamp.

When the barometer falls below 990 hPa the keeper lights the second lamp and rings the storm bell.

Supplies arrive by boat on the first Monday of each month, weather permitting.
"""

GARAGE = """# The garage

The old sedan was parked in the garage all winter, under a grey canvas cover.

Its battery was disconnected so that it would not drain before the spring.
"""

KITCHEN = """# The kitchen

A mango smoothie needs two ripe mangos, a cup of yoghurt and a spoon of honey.

Blend for forty seconds, then pour into chilled glasses.
"""


async def started(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embedder: Any = None, **overrides: Any) -> Service:
    settings = make_settings(tmp_path, upstream.url, database_url=database_url, chunk_tokens=32, chunk_overlap_tokens=4, **overrides)
    return await start_service(settings, upstream, embedder=embedder)


async def add(svc: Service, filename: str, text: str, headers: dict[str, str] | None = None) -> str:
    status, body = await upload(svc.http, svc.url, filename, text.encode(), "text/markdown", headers=headers)
    assert status == 200, body
    done = await wait_file(svc.http, svc.url, body["id"], headers=headers)
    assert done["status"] == "ready", done
    return str(body["id"])


def knowledge(svc: Service) -> Knowledge:
    return svc.services.knowledge


def texts(sources: list[dict[str, Any]]) -> list[str]:
    return [doc for source in sources for doc in source["document"]]


# ---------------------------------------------------------------- collections


async def test_collections_api(service: Service) -> None:
    lighthouse = await add(service, "lighthouse.md", LIGHTHOUSE)
    garage = await add(service, "garage.md", GARAGE)
    status, body, _ = await service.post("/v1/knowledge", {"name": "Coast", "description": "places by the sea"})
    assert status == 200 and body["object"] == "knowledge" and body["files"] == []
    kid = body["id"]
    for file_id in (lighthouse, garage, lighthouse):  # adding twice is harmless
        status, body, _ = await service.post(f"/v1/knowledge/{kid}/files", {"file_id": file_id})
        assert status == 200, body
    status, body = await service.get(f"/v1/knowledge/{kid}")
    assert status == 200 and body["name"] == "Coast" and body["description"] == "places by the sea"
    assert [(f["id"], f["status"]) for f in body["files"]] == [(lighthouse, "ready"), (garage, "ready")]
    assert body["files"][0]["chunks"] >= 1
    status, listing = await service.get("/v1/knowledge")
    assert status == 200 and [c["id"] for c in listing["data"]] == [kid]

    async with service.http.delete(f"{service.url}/v1/knowledge/{kid}/files/{garage}") as resp:
        assert resp.status == 200 and [f["id"] for f in (await resp.json())["files"]] == [lighthouse]
    async with service.http.delete(f"{service.url}/v1/knowledge/{kid}/files/{garage}") as resp:
        assert resp.status == 404
    # Deleting a file takes it out of its collections.
    async with service.http.delete(f"{service.url}/v1/files/{lighthouse}") as resp:
        assert resp.status == 200
    status, body = await service.get(f"/v1/knowledge/{kid}")
    assert body["files"] == []
    async with service.http.delete(f"{service.url}/v1/knowledge/{kid}") as resp:
        assert resp.status == 200
    status, body = await service.get(f"/v1/knowledge/{kid}")
    assert status == 404
    status, body = await service.get(f"/v1/files/{garage}")
    assert status == 200, "deleting a collection keeps its files"


async def test_bad_collection_requests(service: Service) -> None:
    status, body, _ = await service.post("/v1/knowledge", {"description": "no name"})
    assert status == 400 and "name" in body["error"]["message"]
    status, body, _ = await service.post("/v1/knowledge", ["not", "an", "object"])
    assert status == 400
    status, body, _ = await service.post("/v1/knowledge", {"name": "k"})
    kid = body["id"]
    status, body, _ = await service.post(f"/v1/knowledge/{kid}/files", {"file_id": "file-nope"})
    assert status == 404 and body["error"]["message"] == "file not found"
    status, body, _ = await service.post(f"/v1/knowledge/{kid}/files", {})
    assert status == 400 and "file_id" in body["error"]["message"]
    status, body, _ = await service.post("/v1/knowledge/kb-nope/files", {"file_id": "file-nope"})
    assert status == 404 and body["error"]["message"] == "collection not found"


async def test_someone_elses_collection_is_404(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await started(tmp_path, upstream, database_url, auth="on")
    try:
        alice = {"Authorization": f"Bearer {await svc.services.store.create_api_key('alice')}"}
        bob = {"Authorization": f"Bearer {await svc.services.store.create_api_key('bob')}"}
        alice_file = await add(svc, "a.md", LIGHTHOUSE, headers=alice)
        bob_file = await add(svc, "b.md", GARAGE, headers=bob)
        async with svc.http.post(f"{svc.url}/v1/knowledge", json={"name": "mine"}, headers=alice) as resp:
            kid = (await resp.json())["id"]
        for method, path, body in [
            ("GET", f"/v1/knowledge/{kid}", None),
            ("DELETE", f"/v1/knowledge/{kid}", None),
            ("POST", f"/v1/knowledge/{kid}/files", {"file_id": bob_file}),
            ("DELETE", f"/v1/knowledge/{kid}/files/{alice_file}", None),
        ]:
            async with svc.http.request(method, svc.url + path, json=body, headers=bob) as resp:
                assert resp.status == 404, (method, path)
        # Alice cannot put Bob's file in her collection either.
        async with svc.http.post(f"{svc.url}/v1/knowledge/{kid}/files", json={"file_id": bob_file}, headers=alice) as resp:
            assert resp.status == 404
        async with svc.http.get(f"{svc.url}/v1/knowledge", headers=bob) as resp:
            assert (await resp.json())["data"] == []
        # Nor retrieve from it, nor see it described.
        refs = [FileRef("file", bob_file), FileRef("collection", kid)]
        infos = await knowledge(svc).describe("bob", refs, wait=0)
        assert [i.status for i in infos] == ["ready", "missing"]
        assert await knowledge(svc).retrieve("alice", [FileRef("file", bob_file)], ["sedan garage"]) == []
    finally:
        await stop_service(svc)


# ------------------------------------------------------------------ retrieval


async def test_lexical_retrieval_finds_the_right_chunk(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await started(tmp_path, upstream, database_url)
    try:
        ids = {name: await add(svc, f"{name}.md", text) for name, text in [("lighthouse", LIGHTHOUSE), ("garage", GARAGE), ("kitchen", KITCHEN)]}
        status, body, _ = await svc.post("/v1/knowledge", {"name": "all"})
        kid = body["id"]
        for file_id in ids.values():
            await svc.post(f"/v1/knowledge/{kid}/files", {"file_id": file_id})
        sources = await knowledge(svc).retrieve("local", [FileRef("collection", kid)], ["when does the keeper ring the storm bell?"])
        best = sources[0]
        assert best["source"] == {"id": ids["lighthouse"], "name": "lighthouse.md", "type": "file"}
        assert "storm bell" in best["document"][0]
        meta = best["metadata"][0]
        assert meta["source"] == meta["name"] == "lighthouse.md" and meta["file_id"] == ids["lighthouse"]
        assert isinstance(meta["chunk"], int) and 0 < meta["score"] < 1 and best["distances"][0] == meta["score"]
        assert all(len(s["document"]) == len(s["metadata"]) == len(s["distances"]) for s in sources)
        scores = [m["score"] for s in sources for m in s["metadata"]]
        assert max(scores) == scores[0], "best file first, best chunk first"
        # Words nowhere in the files: nothing (BM25 alone has no notion of meaning).
        assert await knowledge(svc).retrieve("local", [FileRef("collection", kid)], ["automobile"]) == []
        # Several queries: each finds its own.
        both = await knowledge(svc).retrieve("local", [FileRef("file", ids["garage"]), FileRef("file", ids["kitchen"])], ["sedan canvas", "mango yoghurt"])
        assert {s["source"]["name"] for s in both} == {"garage.md", "kitchen.md"}

        # The index follows the file set: a new file in the collection is found...
        extra = await add(svc, "bells.md", "The storm bell of the harbour was cast in 1887 and rings in any storm.")
        await svc.post(f"/v1/knowledge/{kid}/files", {"file_id": extra})
        sources = await knowledge(svc).retrieve("local", [FileRef("collection", kid)], ["storm bell"])
        assert extra in {s["source"]["id"] for s in sources}
        # ...and a deleted one is not.
        async with svc.http.delete(f"{svc.url}/v1/files/{ids['lighthouse']}") as resp:
            assert resp.status == 200
        sources = await knowledge(svc).retrieve("local", [FileRef("collection", kid)], ["storm bell keeper"])
        assert ids["lighthouse"] not in {s["source"]["id"] for s in sources}
    finally:
        await stop_service(svc)


async def test_hybrid_retrieval_finds_by_meaning(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embedding_server: EmbeddingServer) -> None:
    svc = await started(tmp_path, upstream, database_url, embedder=HttpEmbedder(embedding_server.url))
    try:
        garage = await add(svc, "garage.md", GARAGE)
        kitchen = await add(svc, "kitchen.md", KITCHEN)
        lighthouse = await add(svc, "lighthouse.md", LIGHTHOUSE)
        refs = [FileRef("file", garage), FileRef("file", kitchen), FileRef("file", lighthouse)]
        # No word in common with "sedan": only the vectors can find it.
        sources = await knowledge(svc).retrieve("local", refs, ["automobile"])
        assert sources and sources[0]["source"]["id"] == garage and "sedan" in sources[0]["document"][0]
        assert 0 < sources[0]["metadata"][0]["score"] <= 0.5, "hybrid: the cosine's half only"
        sources = await knowledge(svc).retrieve("local", refs, ["fruit"])
        assert sources[0]["source"]["id"] == kitchen
        # Words and meaning together rank above either alone.
        sources = await knowledge(svc).retrieve("local", refs, ["sedan parked garage winter"])
        assert sources[0]["source"]["id"] == garage and sources[0]["metadata"][0]["score"] > 0.5
        # One file: the vector search is filtered to it.
        only = await knowledge(svc).retrieve("local", [FileRef("file", kitchen)], ["automobile"])
        assert garage not in {s["source"]["id"] for s in only}
    finally:
        await stop_service(svc)


async def test_vector_search_stays_inside_the_file_set(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embedding_server: EmbeddingServer
) -> None:
    """Another file of the user's with hundreds of closer chunks does not
    crowd the set's own out (the port filters by equality only: the user's
    nearest are not enough, and each file of the set is searched)."""
    svc = await started(tmp_path, upstream, database_url, embedder=HttpEmbedder(embedding_server.url))
    try:
        fleet = await add(svc, "fleet.md", "\n\n".join(f"Automobile number {i} is a car." for i in range(300)))
        garage = await add(svc, "garage.md", GARAGE)
        kitchen = await add(svc, "kitchen.md", KITCHEN)
        refs = [FileRef("file", garage), FileRef("file", kitchen)]
        sources = await knowledge(svc).retrieve("local", refs, ["automobile"])
        assert fleet not in {s["source"]["id"] for s in sources}
        assert sources[0]["source"]["id"] == garage and "sedan" in sources[0]["document"][0]
    finally:
        await stop_service(svc)


async def test_vectors_only_when_hybrid_is_off(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embedding_server: EmbeddingServer) -> None:
    svc = await started(tmp_path, upstream, database_url, embedder=HttpEmbedder(embedding_server.url), rag_hybrid=False)
    try:
        garage = await add(svc, "garage.md", GARAGE)
        sources = await knowledge(svc).retrieve("local", [FileRef("file", garage)], ["automobile"])
        assert sources[0]["metadata"][0]["score"] > 0.5, "the cosine alone"
    finally:
        await stop_service(svc)


async def test_full_context_is_the_whole_text(service: Service) -> None:
    long_text = LIGHTHOUSE + "\n" + "\n\n".join(f"Paragraph {i} tells of the keeper's log, entry {i}." for i in range(200))
    lighthouse = await add(service, "lighthouse.md", long_text)
    garage = await add(service, "garage.md", GARAGE)
    done = await wait_file(service.http, service.url, lighthouse)
    assert done["chunks"] > 5
    status, body, _ = await service.post("/v1/knowledge", {"name": "k"})
    await service.post(f"/v1/knowledge/{body['id']}/files", {"file_id": garage})
    sources = await knowledge(service).retrieve(
        "local", [FileRef("file", lighthouse, full=True), FileRef("collection", body["id"], full=True)], ["anything at all"]
    )
    assert [s["source"]["id"] for s in sources] == [lighthouse, garage]
    assert sources[0]["document"] == [long_text.strip()] and sources[1]["document"] == [GARAGE.strip()]
    assert sources[0]["metadata"] == [{"source": "lighthouse.md", "name": "lighthouse.md", "file_id": lighthouse}]
    # Full and searched together: the full file is not searched again.
    mixed = await knowledge(service).retrieve("local", [FileRef("file", lighthouse, full=True), FileRef("file", garage)], ["sedan", "keeper"])
    assert [s["source"]["id"] for s in mixed] == [lighthouse, garage]


async def test_top_k_and_threshold(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await started(tmp_path, upstream, database_url, rag_top_k=2)
    try:
        text = "\n\n".join(f"Entry {i}: the lamp was lit at dusk and the lamp burned until dawn." for i in range(30))
        file_id = await add(svc, "log.md", text)
        sources = await knowledge(svc).retrieve("local", [FileRef("file", file_id)], ["lamp dusk dawn"])
        assert len(sources) == 1 and len(sources[0]["document"]) == 2
    finally:
        await stop_service(svc)
    svc = await started(tmp_path / "strict", upstream, database_url, rag_relevance_threshold=0.3)
    try:
        file_id = await add(svc, "mixed.md", LIGHTHOUSE + "\n\n" + GARAGE)
        refs = [FileRef("file", file_id)]
        weak = await knowledge(svc).retrieve("local", refs, ["keeper weather lamp canvas spring unrelated words here"])
        assert weak == [], "partial matches stay below the threshold"
        strong = await knowledge(svc).retrieve("local", refs, ["barometer"])
        assert strong and all(m["score"] >= 0.3 for s in strong for m in s["metadata"])
    finally:
        await stop_service(svc)


async def test_describe_waits_for_processing_files(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embedding_server: EmbeddingServer) -> None:
    svc = await started(tmp_path, upstream, database_url, embedder=HttpEmbedder(embedding_server.url))
    try:
        embedding_server.hold = asyncio.Event()
        status, body = await upload(svc.http, svc.url, "held.md", LIGHTHOUSE.encode(), "text/markdown")
        file_id = body["id"]
        status, coll, _ = await svc.post("/v1/knowledge", {"name": "waiting room"})
        await svc.post(f"/v1/knowledge/{coll['id']}/files", {"file_id": file_id})
        refs = [FileRef("file", file_id), FileRef("collection", coll["id"]), FileRef("file", "file-gone"), FileRef("collection", "kb-gone")]
        infos = await knowledge(svc).describe("local", refs, wait=0.2)
        assert [(i.status, i.name) for i in infos] == [
            ("processing", "held.md"),
            ("processing", "waiting room"),
            ("missing", "file-gone"),
            ("missing", "kb-gone"),
        ]
        # Released while describe waits: it returns on the ingestion's notification, not at its deadline.
        waiter = asyncio.create_task(knowledge(svc).describe("local", refs[:2], wait=30))
        t0 = time.monotonic()
        embedding_server.hold.set()
        infos = await asyncio.wait_for(waiter, 30)
        assert [i.status for i in infos] == ["ready", "ready"]
        assert time.monotonic() - t0 < 5
        assert await knowledge(svc).retrieve("local", refs, ["storm bell"]) != []
    finally:
        await stop_service(svc)


async def test_a_collection_is_used_without_its_files_still_processing_once_the_wait_is_over(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embedding_server: EmbeddingServer
) -> None:
    svc = await started(tmp_path, upstream, database_url, embedder=HttpEmbedder(embedding_server.url))
    try:
        ready = await add(svc, "garage.md", GARAGE)
        embedding_server.hold, embedding_server.hold_only = asyncio.Event(), "barometer"  # the lighthouse file's ingestion waits
        status, body = await upload(svc.http, svc.url, "held.md", LIGHTHOUSE.encode(), "text/markdown")
        status, coll, _ = await svc.post("/v1/knowledge", {"name": "half there"})
        for file_id in (ready, body["id"]):
            await svc.post(f"/v1/knowledge/{coll['id']}/files", {"file_id": file_id})
        refs = [FileRef("collection", coll["id"])]
        [info] = await knowledge(svc).describe("local", refs, wait=0.1)
        assert (info.status, info.reason) == ("ready", "1 of its 2 files were still being processed and were left out")
        sources = await knowledge(svc).retrieve("local", refs, ["sedan garage"])
        assert [s["source"]["id"] for s in sources] == [ready]
        embedding_server.hold.set()
    finally:
        await stop_service(svc)


async def test_failed_and_empty_collections_are_described(service: Service) -> None:
    from tests.documents import pdf_without_text

    status, body = await upload(service.http, service.url, "scan.pdf", pdf_without_text(), "application/pdf")
    failed = await wait_file(service.http, service.url, body["id"])
    status, empty, _ = await service.post("/v1/knowledge", {"name": "empty"})
    status, broken, _ = await service.post("/v1/knowledge", {"name": "broken"})
    await service.post(f"/v1/knowledge/{broken['id']}/files", {"file_id": failed["id"]})
    refs = [FileRef("file", failed["id"]), FileRef("collection", empty["id"]), FileRef("collection", broken["id"])]
    infos = await knowledge(service).describe("local", refs, wait=1)
    assert [(i.status, i.reason) for i in infos] == [
        ("failed", "no text could be extracted"),
        ("ready", None),
        ("failed", "every file failed (no text could be extracted)"),
    ]
    assert await knowledge(service).retrieve("local", refs, ["anything"]) == []


def test_building_a_bm25_index_writes_nothing_to_the_service_log() -> None:
    """bm25s sets its own logger to DEBUG on import; the service's log (a
    handler on the root logger, which takes what every logger passes on) must
    not get a line per index built."""
    import logging

    from adapters.knowledge.lexical import LexicalIndex

    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Collect()  # level NOTSET, as the service's handler
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        index = LexicalIndex([("f", 0), ("f", 1)], ["proof the dough overnight", "feed the starter twice"])
        assert index.search("dough", 1)[0].doc == 0
    finally:
        root.removeHandler(handler)
    assert [r.getMessage() for r in seen if r.name.startswith("bm25s")] == []


async def test_passages_of_texts_that_are_not_stored(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embedding_server: EmbeddingServer) -> None:
    """Fetched web pages are searched as files are: chunked, BM25 and vectors fused."""
    svc = await started(tmp_path, upstream, database_url, embedder=HttpEmbedder(embedding_server.url), rag_top_k=1)
    try:
        chosen = await knowledge(svc).passages([KITCHEN, LIGHTHOUSE + "\n\n" + GARAGE], ["automobile"])
        # No word in common with "sedan": the vectors find it, in the second text only.
        assert chosen[0] == [] and len(chosen[1]) == 1
        text, score = chosen[1][0]
        assert "sedan" in text and "keeper" not in text and 0 < score <= 0.5
        assert await knowledge(svc).passages([KITCHEN], ["  "]) == [[]], "no query: nothing chosen"
    finally:
        await stop_service(svc)


async def test_passages_of_a_long_text_embed_a_bounded_number_of_chunks(
    tmp_path: Path, upstream: ScriptedUpstream, database_url: str, embedding_server: EmbeddingServer
) -> None:
    svc = await started(tmp_path, upstream, database_url, embedder=HttpEmbedder(embedding_server.url), rag_top_k=1)
    try:
        filler = "\n\n".join(f"Entry {i}: the tide tables were copied again." for i in range(400))
        page = filler + "\n\nThe keeper rings the storm bell when the barometer falls.\n\n" + filler
        before = embedding_server.texts
        chosen = await knowledge(svc).passages([page], ["storm bell"])
        # The page is hundreds of chunks; its first 64 are searched, and of those
        # at most 32 are embedded (the query is one more text).
        assert embedding_server.texts - before <= 32 + 1
        assert all("storm bell" not in text for text, _ in chosen[0]), "the answer lies past the chunks searched"
        short = filler[:2000] + "\n\nThe keeper rings the storm bell when the barometer falls."
        before = embedding_server.texts
        first, second = await knowledge(svc).passages([short, page], ["storm bell"])
        [(text, _)] = first + second
        assert "storm bell" in text and embedding_server.texts - before <= 32 + 1, "BM25's best is among the embedded"
    finally:
        await stop_service(svc)
