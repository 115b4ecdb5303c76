"""Reranking: the API client against a strict reranking server on loopback
(``tests.rerank_server``), and retrieval reordered by it in a running service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.config import Settings
from adapters.rerank import ApiReranker, RerankError
from engine.ports import FileRef, RetrievalError
from tests.harness import make_settings, stop_service
from tests.rerank_server import RerankServer
from tests.test_knowledge import add, knowledge, started
from tests.upstream import ScriptedUpstream


@pytest.fixture
async def cohere() -> AsyncIterator[RerankServer]:
    server = RerankServer("cohere", {"storm bell": 0.9, "lamp": 0.5}, key="rk-secret-123")
    await server.start()
    yield server
    await server.close()


async def test_cohere_shape_scores_every_document_in_order(cohere: RerankServer) -> None:
    reranker = ApiReranker(cohere.url, "rerank-test", api_key="rk-secret-123")
    try:
        docs = ["the lamp is lit", "nothing here", "the storm bell rings"]
        scores = await reranker.rerank("storm bell?", docs)
        # The server answers best first; the client puts each score back at its document.
        assert scores == [0.5, 0.01, 0.9]
        assert cohere.requests[-1] == {"model": "rerank-test", "query": "storm bell?", "documents": docs, "top_n": 3}
        assert await reranker.rerank("q", []) == [] and len(cohere.requests) == 1, "nothing to rerank: no request"
    finally:
        await reranker.close()


async def test_tei_shape() -> None:
    server = RerankServer("tei", {"bell": 0.8})
    await server.start()
    reranker = ApiReranker(server.url + "/rerank", shape="tei")  # the endpoint itself is accepted too
    try:
        assert await reranker.rerank("bell", ["a bell", "a boat"]) == [0.8, 0.01]
        assert server.requests[-1] == {"query": "bell", "texts": ["a bell", "a boat"]}
    finally:
        await reranker.close()
        await server.close()


async def test_failures_say_why_and_never_show_the_key(cohere: RerankServer) -> None:
    reranker = ApiReranker(cohere.url, api_key="rk-secret-123")
    try:
        cohere.fail = (500, {"message": "model rk-secret-123 overloaded"})
        with pytest.raises(RerankError) as err:
            await reranker.rerank("q", ["a"])
        assert "HTTP 500" in str(err.value) and "overloaded" in str(err.value) and "rk-secret-123" not in str(err.value)
        cohere.fail = (200, {"results": [{"index": 5, "relevance_score": 0.3}]})
        with pytest.raises(RerankError, match="out-of-range index 5"):
            await reranker.rerank("q", ["a"])
        cohere.fail = (200, {"results": [{"index": 0, "relevance_score": "high"}]})
        with pytest.raises(RerankError, match="no finite"):
            await reranker.rerank("q", ["a"])
        cohere.fail = (200, b"<html>")
        with pytest.raises(RerankError, match="not JSON"):
            await reranker.rerank("q", ["a"])
    finally:
        await reranker.close()
    wrong = ApiReranker(cohere.url, api_key="not-the-key")
    try:
        cohere.fail = None
        with pytest.raises(RerankError, match="HTTP 401: invalid api token"):
            await wrong.rerank("q", ["a"])
    finally:
        await wrong.close()
    closed = ApiReranker("http://127.0.0.1:9/v1", connect_timeout=2)
    try:
        with pytest.raises(RerankError, match="127.0.0.1:9/v1/rerank"):
            await closed.rerank("q", ["a"])
    finally:
        await closed.close()


LEXICAL_FAVOURITE = "Bell bell bell. The bell and the bell, storm storm storm."
ANSWER = "Ring the storm bell when the barometer falls below 990 hPa."


async def test_retrieval_is_reordered_by_the_reranker(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    server = RerankServer("cohere", {"barometer": 0.95})
    await server.start()
    svc = await started(tmp_path, upstream, database_url, rerank_engine="api", rerank_url=server.url, rerank_model="rr", rag_top_k=1)
    try:
        noisy = await add(svc, "noisy.md", LEXICAL_FAVOURITE)
        answer = await add(svc, "answer.md", ANSWER)
        refs = [FileRef("file", noisy), FileRef("file", answer)]
        sources = await knowledge(svc).retrieve("local", refs, ["storm bell"])
        # BM25 alone puts the repetitive file first; the reranker's oracle picks the answer.
        assert [s["source"]["id"] for s in sources] == [answer]
        assert sources[0]["metadata"][0]["score"] == 0.95, "the score is the reranker's"
        sent = server.requests[-1]
        assert sent["query"] == "storm bell" and sorted(sent["documents"]) == sorted([LEXICAL_FAVOURITE, ANSWER])
        server.fail = (503, {"message": "busy"})
        with pytest.raises(RetrievalError, match="reranking failed: .*HTTP 503: busy"):
            await knowledge(svc).retrieve("local", refs, ["storm bell"])
    finally:
        await server.close()
        await stop_service(svc)


async def test_passages_of_fetched_pages_are_reranked_too(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    server = RerankServer("tei", {"barometer": 0.9})
    await server.start()
    svc = await started(tmp_path, upstream, database_url, rerank_engine="api", rerank_url=server.url, rerank_api_shape="tei", rag_top_k=1)
    try:
        chosen = await knowledge(svc).passages([LEXICAL_FAVOURITE, ANSWER], ["storm bell"])
        assert chosen == [[], [(ANSWER, 0.9)]]
        assert sorted(server.requests[-1]["texts"]) == sorted([LEXICAL_FAVOURITE, ANSWER])
    finally:
        await server.close()
        await stop_service(svc)


def test_a_local_reranker_is_refused_at_start(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, "http://127.0.0.1:9/v1", rerank_engine="local")
    with pytest.raises(ValueError, match="no cross-encoder ships its weights"):
        settings.check_startable()
    with pytest.raises(ValueError, match="TURNLOG_RERANK_URL"):
        Settings(rerank_engine="api").check_startable()
