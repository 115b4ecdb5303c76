"""Plain text chunks as runs (CPU per relayed chunk): the same bytes.

The chat transport parses only the delta of chunks that match a learned
template (``adapters.providers.chat_runs``), and text chunks travel as runs
(lists of strings) to the SSE write. Two oracles, both independent of that
code:

* the ordinary parser (``HTTPProvider._sse_items``): any events, cut into
  reads anywhere, give the same payloads (a run expanded) and warnings;
* the bytes the previous version sent: for each recorded upstream stream in
  ``tests/data/recorded_chat`` (``*.sse``: text with escapes, unicode, tags,
  a code block, reasoning, comments, a non-JSON line, chunks that differ
  elsewhere, CRLF, Python-formatted JSON, tool calls, an in-stream error), the
  client's bytes — turn id and ``created`` blanked — equal ``*.expected``,
  written by the version before this change (commit 4596ed0) from the same
  stream with this module's ``client_bytes`` (the error chunk since made the
  whole OpenAI error object: ``code`` says how the upstream failed, and
  ``param``). A reconnect from the log gets the same bytes, and every turn
  verifies (``stop_service``).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from adapters.providers.chat_runs import TemplateRuns
from adapters.providers.openai_chat import OpenAIChatProvider
from adapters.providers.sse import SSEParser
from engine.ports import RawChunk, RawRun, RawWarning
from tests.harness import make_settings, start_service, stop_service

DATA = Path(__file__).parent / "data" / "recorded_chat"
STREAMS = ("text", "tools", "error", "spaced")
USER = [{"role": "user", "content": "go"}]
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
# Where the recorded upstream cuts its body into writes: a chunk split
# anywhere, several reads of many chunks.
CUTS = (7, 4093, 4100, 30011)


class RecordedUpstream:
    """An OpenAI-compatible upstream that answers every chat request with one
    recorded SSE body, written in pieces (``CUTS``)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "gpt-test", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        at = 0
        for end in [*CUTS, len(self.body)]:
            if end > at:
                await resp.write(self.body[at:end])
                at = end
        await resp.write_eof()
        return resp


def _blank(raw: str, turn_id: str) -> str:
    raw = re.sub(r'"(created|[a-z_]+_at)":\d+', r'"\1":0', raw.replace(turn_id, "TURN"))
    return re.sub(r"chat_[0-9a-f]{24}", "CHAT", raw)


async def client_bytes(tmp_path: Path, database_url: str, name: str, api: str = "chat", live_path: str = "fast") -> tuple[str, str]:
    """What a streaming client received for the recorded stream ``name`` (over
    Chat Completions, or the Responses API with ``api="responses"``), and what a
    client reading the turn from the log afterwards received (blanked)."""
    upstream = RecordedUpstream((DATA / f"{name}.sse").read_bytes())
    await upstream.start()
    try:
        settings = make_settings(tmp_path, upstream.url, database_url=database_url, live_fast_paths=live_path == "fast")
        svc = await start_service(settings, upstream)  # type: ignore[arg-type]
        try:
            if api == "responses":
                async with svc.http.post(svc.v1 + "/responses", json={"model": "gpt-test", "input": "go", "stream": True}) as resp:
                    assert resp.status == 200
                    turn_id = resp.headers["X-Turn-Id"]
                    live = await resp.text()
                again_url = f"{svc.v1}/responses/resp_{turn_id}?stream=true"
            else:
                body: dict[str, Any] = {"model": "gpt-test", "messages": USER, "stream": True, "stream_options": {"include_usage": True}}
                if name == "tools":
                    body["tools"] = TOOLS
                async with svc.http.post(svc.v1 + "/chat/completions", json=body) as resp:
                    assert resp.status == 200
                    turn_id = resp.headers["X-Turn-Id"]
                    live = await resp.text()
                again_url = f"{svc.v1}/turns/{turn_id}/stream?include_usage=true"
            async with svc.http.get(again_url) as again:
                assert again.status == 200
                replayed = await again.text()
        finally:
            await stop_service(svc)
    finally:
        await upstream.close()
    return _blank(live, turn_id), _blank(replayed, turn_id)


@pytest.mark.live_paths
async def test_recorded_streams_give_the_previous_versions_bytes(tmp_path: Path, database_url: str, live_path: str) -> None:
    for name in STREAMS:
        live, replayed = await client_bytes(tmp_path / name, database_url, name, live_path=live_path)
        assert live == (DATA / f"{name}.expected").read_text(encoding="utf-8"), name
        assert replayed == live, name
    live, replayed = await client_bytes(tmp_path / "responses", database_url, "text", api="responses", live_path=live_path)
    assert live == (DATA / "text.responses.expected").read_text(encoding="utf-8")
    assert replayed == live


# -- the transport's runs against the ordinary parser -------------------------------------------


def _provider() -> OpenAIChatProvider:
    return OpenAIChatProvider(base_url="http://127.0.0.1:9/v1", api_key="k")


def _expand(items: list[Any]) -> list[Any]:
    """Each payload as the ordinary parser gives it: a run's chunks as dicts."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, RawRun):
            for text in item.texts:
                obj = json.loads(json.dumps(item.template))
                obj["choices"][0]["delta"] = {"content": text}
                out.append(("chunk", obj))
        elif isinstance(item, RawChunk):
            out.append(("chunk", item.data))
        else:
            assert isinstance(item, RawWarning)
            out.append(("warning", item.message, item.raw))
    return out


def _both(body: bytes, cuts: list[int]) -> tuple[list[Any], list[Any], int]:
    """The payloads of ``body`` read in pieces ending at ``cuts``: through
    ``TemplateRuns`` and through ``_sse_items``; and how many chunks came in runs."""
    provider = _provider()
    runs = TemplateRuns(provider._sse_items)
    plain_parser, run_parser = SSEParser(), SSEParser()
    with_runs: list[Any] = []
    ordinary: list[Any] = []
    at, in_runs = 0, 0
    done_a = done_b = False
    for end in [*cuts, len(body)]:
        piece, at = body[at:end], end
        if not done_a:
            items, done_a = runs.items(run_parser.feed(piece))
            in_runs += sum(len(i.texts) for i in items if isinstance(i, RawRun))
            with_runs += _expand(items)
        if not done_b:
            got, done_b = provider._sse_items(plain_parser.feed(piece))
            ordinary += _expand(got)
    if not done_a:
        items, _ = runs.items(run_parser.close())
        with_runs += _expand(items)
    if not done_b:
        got, _ = provider._sse_items(plain_parser.close())
        ordinary += _expand(got)
    return with_runs, ordinary, in_runs


def test_recorded_streams_parse_to_the_ordinary_parsers_payloads() -> None:
    rng = random.Random(13)
    for name in STREAMS:
        body = (DATA / f"{name}.sse").read_bytes()
        for _ in range(20):
            cuts = sorted(rng.sample(range(1, len(body)), rng.randint(0, 40)))
            with_runs, ordinary, in_runs = _both(body, cuts)
            assert with_runs == ordinary, (name, cuts)
            assert in_runs > 0.8 * sum(1 for p in ordinary if p[0] == "chunk"), name  # most chunks took the run path


HEAD = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":'
TAIL = b',"logprobs":null,"finish_reason":null}]}\n\n'


def test_middles_that_are_not_a_text_delta_take_the_ordinary_path() -> None:
    """Between the template's bytes: anything but ``{"content": <non-empty
    string>}`` is parsed whole, and a chunk whose other bytes differ, or whose
    tail overrides the delta, never matches."""
    middles = [
        b'{"content":"a"}',
        b'{"content":""}',
        b'{"content":null}',
        b'{"content":1}',
        b'{"content":"a","role":"assistant"}',
        b'{"content":"x"} ',
        b'"text"',
        b"[1]",
        b"{not json}",
        b'{"content":"a\\u00e9\\n\\"}"}',
        b'{"content":"b"},"delta":{"content":"evil"}',  # a second "delta" key: the last wins
        b'{"content":"c"}',
        b'{"reasoning_content":"r"}',
        b'{"content":"d","content":"e"}',
    ]
    lines = [HEAD + m + TAIL for m in middles]
    lines.insert(3, HEAD.replace(b'"created":1', b'"created":2') + b'{"content":"other"}' + TAIL)
    lines.insert(5, HEAD + b'{"content":"f"}' + TAIL.replace(b'"finish_reason":null', b'"finish_reason":"stop"'))
    lines.insert(7, b": comment\n\n")
    body = b"".join(lines) + b"data: [DONE]\n\n"
    rng = random.Random(7)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(0, 12)))
        with_runs, ordinary, _ = _both(body, cuts)
        assert with_runs == ordinary


def test_a_stream_that_never_repeats_stops_learning() -> None:
    """Chunks that differ outside the delta each time (a per-chunk timestamp):
    a few templates are tried, then none; every payload is still the ordinary one."""
    lines = [HEAD.replace(b'"created":1', b'"created":%d' % i) + orjson.dumps({"content": f"t{i}"}) + TAIL for i in range(50)]
    body = b"".join(lines)
    provider = _provider()
    runs = TemplateRuns(provider._sse_items)
    for line in lines:
        runs.items(SSEParser().feed(line))
    with_runs, ordinary, in_runs = _both(body, [])
    assert with_runs == ordinary and in_runs == 0
    assert runs._unused == 4  # gave up after MAX_UNUSED attempts


async def test_a_run_reaches_the_normalizer_as_one_text_run() -> None:
    """The engine's side of a run: one ``TextRun`` for a read's plain chunks
    (with ``runs``), a ``TextDelta`` each without; a template that does not
    take the per-token path is fed chunk by chunk."""
    from engine.protocols.chat import ChatNormalizer
    from engine.protocols.model_events import Finished, TextDelta, TextRun, UsageReport

    template = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": None}]}
    run = RawRun(template, ["a", "b", "c"])
    n = ChatNormalizer(lambda kind: f"{kind}_1")
    assert n.feed_read([run, RawRun(template, ["d"])], runs=True) == [TextRun(["a", "b", "c", "d"])]
    assert n.finish() == [Finished(reason=None, response_id="c1")]
    n = ChatNormalizer(lambda kind: f"{kind}_1")
    assert n.feed_read([run]) == [TextDelta("a"), TextDelta("b"), TextDelta("c")]
    with_usage = {**template, "usage": {"total_tokens": 3}}
    n = ChatNormalizer(lambda kind: f"{kind}_1")
    events = n.feed_read([RawRun(with_usage, ["x", "y"])], runs=True)
    assert events == [TextDelta("x"), UsageReport({"total_tokens": 3}), TextDelta("y"), UsageReport({"total_tokens": 3})]


def _random_payload(rng: random.Random) -> RawChunk | RawRun | RawWarning:
    """A payload of one read: per-token text chunks and the chunks next to
    them that are not (role, refusal, reasoning, tool calls, usage, timings,
    a finish, an error, two choices, ``[DONE]``), a non-JSON line, or a run
    whose template takes the per-token path or not."""
    text = rng.choice(["x", "yz", "", None, 5])
    chunks: list[Any] = [
        {"id": rng.choice(["c1", "c2", None, 3]), "choices": [{"index": 0, "delta": {"content": text}}]},
        {"choices": [{"delta": {"role": "assistant", "content": rng.choice(["", "hi"])}}]},
        {"choices": [{"delta": {"content": "t", "refusal": None}, "finish_reason": rng.choice([None, "stop"])}]},
        {"choices": [{"delta": {"reasoning_content": "r", "content": rng.choice(["", "c"])}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "{}"}}]}}]},
        {"choices": [], "usage": {"total_tokens": 1}},
        {"choices": [{"delta": {"content": "u"}}], "usage": {"total_tokens": 2}},
        {"choices": [{"delta": {"content": "v"}}], "timings": {"predicted_n": 1}},
        {"error": {"message": "boom"}},
        {"choices": [{"delta": {"content": "w"}}, {"delta": {"content": "w2"}}]},
        "[DONE]",
    ]
    kind = rng.random()
    if kind < 0.6:
        return RawChunk(rng.choice(chunks))
    if kind < 0.75:
        return RawWarning("not JSON", "data: {")
    templates: list[dict[str, Any]] = [
        {"id": rng.choice(["c1", None]), "choices": [{"index": 0, "delta": {}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [{"index": 0, "delta": {}}], "usage": {"total_tokens": 3}},
        {"choices": [{"index": 0, "delta": {}}, {"index": 1, "delta": {}}]},
    ]
    return RawRun(rng.choice(templates), [rng.choice(["p", "q", "rs"]) for _ in range(rng.randint(1, 4))])


def test_a_read_normalizes_as_its_payloads_one_by_one() -> None:
    """``ChatNormalizer.feed_read`` (the per-token chunk taken inline, the rest
    handed on) gives what ``feed`` gives for each payload in turn (a run
    expanded, a non-JSON line a warning in its place), and leaves the same
    response id, finish reason and usage; with ``runs``, the same events once
    its text runs are spread into a delta each, no run empty. In the read
    that finishes the response, the calls that started in it have no live
    progress (they come whole)."""
    from engine.protocols.chat import ChatNormalizer
    from engine.protocols.model_events import ModelEvent, StreamWarning, TextDelta, TextRun, ToolArgumentsDelta, ToolCallStarted

    def ids() -> Any:
        n = iter(range(10**6))
        return lambda kind: f"{kind}_{next(n)}"

    def one_by_one(normalizer: ChatNormalizer, raws: list[Any]) -> list[ModelEvent]:
        events: list[ModelEvent] = []
        was_open = normalizer.finish_reason is None
        for raw in raws:
            if isinstance(raw, RawWarning):
                events.append(StreamWarning(raw.message, raw.raw))
            elif isinstance(raw, RawRun):
                for text in raw.texts:
                    chunk = json.loads(json.dumps(raw.template))
                    chunk["choices"][0]["delta"] = {"content": text}
                    events.extend(normalizer.feed(chunk))
            else:
                events.extend(normalizer.feed(raw.data))
        if was_open and normalizer.finish_reason is not None:
            # The read that finishes the response: a call started in it comes
            # whole with the finish, without live progress.
            started = {e.call_id for e in events if isinstance(e, ToolCallStarted)}
            events = [e for e in events if not (isinstance(e, ToolCallStarted | ToolArgumentsDelta) and e.call_id in started)]
        return events

    def spread(events: list[ModelEvent]) -> list[ModelEvent]:
        return [d for e in events for d in ([TextDelta(t) for t in e.texts] if isinstance(e, TextRun) else [e])]

    def state(normalizer: ChatNormalizer) -> tuple[Any, ...]:
        return normalizer.response_id, normalizer.finish_reason, normalizer.usage, normalizer.finish()

    rng = random.Random(33)
    for _ in range(3000):
        reads = [[_random_payload(rng) for _ in range(rng.randint(0, 8))] for _ in range(rng.randint(1, 3))]
        expected, by_read, by_run = ChatNormalizer(ids()), ChatNormalizer(ids()), ChatNormalizer(ids())
        for raws in reads:
            want = one_by_one(expected, raws)
            assert by_read.feed_read(raws) == want, raws
            with_runs = by_run.feed_read(raws, runs=True)
            assert spread(with_runs) == want, raws
            assert all(e.texts for e in with_runs if isinstance(e, TextRun)), raws
        assert state(by_read) == state(by_run) == state(expected)


def test_folding_a_run_in_one_step_is_folding_its_chunks_one_by_one() -> None:
    """``Accumulator.feed_plain`` either refuses (nothing folded) or leaves the
    accumulator as ``feed_text`` per chunk would, each chunk shown as itself."""
    from engine.fold.accumulator import Accumulator, Piece

    def ids() -> Any:
        n = iter(range(10**6))
        return lambda kind: f"{kind}_{next(n)}"

    rng = random.Random(5)
    words = ["a", "b c", " ", "\n", "<", "think>", "</think>", "x<y", "```", "py\n", "é", ""]
    for _ in range(300):
        one, batched = Accumulator(id_factory=ids(), code_interpreter=True), Accumulator(id_factory=ids(), code_interpreter=True)
        for _ in range(rng.randint(1, 8)):
            texts = [rng.choice(words) for _ in range(rng.randint(1, 6))]
            expected = [tuple(one.feed_text(t)) for t in texts]
            if batched.feed_plain(texts):
                assert expected == [(Piece("text", t),) for t in texts]
            else:
                assert [tuple(batched.feed_text(t)) for t in texts] == expected
            assert batched.text == one.text and batched.output == one.output
