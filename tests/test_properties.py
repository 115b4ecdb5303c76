"""Property-based tests (hypothesis) of the pure parts, and of the WebSocket handler.

* the stream fold: any split of a valid upstream stream's bytes into network
  reads, and any cut of its text into chunks, gives the same items;
* the tool-call argument parser and splitters never raise, whatever the string;
* the projection: every prefix of a real turn's log folds, to what ``upto`` says;
* the WebSocket: any frame, text or binary, gets a clear ``error`` message and
  the connection stays usable.

Every property runs a bounded, derandomized number of examples (the same on
every run).
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.providers.sse import SSEParser
from engine.events import Event
from engine.fold.accumulator import Accumulator
from engine.fold.turn_view import fold
from engine.protocols.chat import ChatNormalizer
from engine.protocols.common import split_json_values, split_tool_calls
from engine.protocols.model_events import ReasoningDelta, TextDelta, ToolCall
from engine.tools.calls import ArgumentError, parse_arguments
from engine.tools.legacy import first_json_object, parse_selection
from tests.harness import make_settings, start_service, stop_service
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

BOUNDED = settings(max_examples=80, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))


def counter_ids() -> Callable[[str], str]:
    counters: dict[str, int] = defaultdict(int)

    def make(prefix: str) -> str:
        counters[prefix] += 1
        return f"{prefix}_{counters[prefix]}"

    return make


# --------------------------------------------------------------- stream fold

#: Text that exercises the tag detection: whole and partial tags, attributes,
#: whitespace after closing tags, multi-byte characters.
PIECES = st.sampled_from(
    ["<think>", "</think>", "<reasoning>", "</reasoning>", "<solution>", "</solution>", '<think type="x">', "<thi", "nk>", "</thi",
     "<", ">", "</", "\n", " ", "  ", "hello", "wörld", "😀", "a<b", "x"]
)  # fmt: skip
TEXT = st.lists(st.one_of(PIECES, st.text(max_size=4)), max_size=25).map("".join)


def _cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _fold_pieces(reasoning: list[str], content: list[str]) -> tuple[list[dict[str, Any]], str, list[str]]:
    """Items, content and shown text of a response whose native reasoning and
    content arrive as these chunks."""
    acc = Accumulator(id_factory=counter_ids())
    shown: list[str] = []
    for piece in reasoning:
        shown += [p.text for p in acc.feed_reasoning(piece)]
    for piece in content:
        shown += [p.text for p in acc.feed_text(piece)]
    shown += [p.text for p in acc.flush()]
    acc.finish()
    return acc.output, acc.content, shown


@BOUNDED
@given(reasoning=TEXT, content=TEXT, cuts_a=st.lists(st.integers(0, 200), max_size=12), cuts_b=st.lists(st.integers(0, 200), max_size=12))
def test_any_cut_of_the_text_folds_to_the_same_items(reasoning: str, content: str, cuts_a: list[int], cuts_b: list[int]) -> None:
    a = _fold_pieces(_cut(reasoning, cuts_a), _cut(content, cuts_a))
    b = _fold_pieces(_cut(reasoning, cuts_b), _cut(content, cuts_b))
    assert a[0] == b[0]
    assert a[1] == b[1]
    # What a live client is shown adds up to the same text however it was cut.
    assert "".join(a[2]) == "".join(b[2])


def _chat_stream(reasoning: list[str], content: list[str], calls: list[tuple[str, list[str]]], newline: bytes) -> bytes:
    """A Chat Completions SSE body as OpenAI sends it."""
    out: list[bytes] = []

    def send(delta: dict[str, Any], finish: str | None = None) -> None:
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
        out.append(b"data: " + orjson.dumps(chunk) + newline + newline)

    send({"role": "assistant", "content": ""})
    for piece in reasoning:
        send({"reasoning_content": piece})
    for piece in content:
        send({"content": piece})
    for index, (name, fragments) in enumerate(calls):
        send({"tool_calls": [{"index": index, "id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": ""}}]})
        for fragment in fragments:
            send({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
    send({}, "tool_calls" if calls else "stop")
    out.append(b": keep-alive" + newline + newline + b"data: [DONE]" + newline + newline)
    return b"".join(out)


def _fold_bytes(reads: list[bytes]) -> tuple[list[dict[str, Any]], list[ToolCall], str | None]:
    """What the engine makes of a body arriving in these reads."""
    parser, normalizer = SSEParser(), ChatNormalizer(counter_ids())
    acc = Accumulator(id_factory=counter_ids())
    calls: list[ToolCall] = []
    events = [e for read in reads for e in parser.feed(read)] + parser.close()
    for _kind, data, _raw in events:
        if data == b"[DONE]":
            continue
        for event in normalizer.feed(orjson.loads(data)):
            if isinstance(event, TextDelta):
                acc.feed_text(event.text)
            elif isinstance(event, ReasoningDelta):
                acc.feed_reasoning(event.text)
    for event in normalizer.finish():
        if isinstance(event, ToolCall):
            calls.append(event)
    acc.flush()
    acc.finish()
    return acc.output, calls, normalizer.finish_reason


@BOUNDED
@given(
    reasoning=st.lists(TEXT, max_size=4),
    content=st.lists(TEXT, max_size=6),
    calls=st.lists(st.tuples(st.sampled_from(["add", "get_weather"]), st.lists(st.text(max_size=6), max_size=4)), max_size=2),
    newline=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(0, 5000), max_size=40),
)
def test_any_split_of_the_stream_bytes_gives_the_same_items(
    reasoning: list[str], content: list[str], calls: list[tuple[str, list[str]]], newline: bytes, cuts: list[int]
) -> None:
    body = _chat_stream(reasoning, content, calls, newline)
    points = sorted({c % (len(body) + 1) for c in cuts})
    bounds = [0, *points, len(body)]
    reads = [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]  # empty reads too
    whole = _fold_bytes([body])
    assert _fold_bytes(reads) == whole
    # Against what was sent: the calls' arguments joined (unless they glue
    # several JSON values, which the engine splits into calls of their own).
    _output, got_calls, reason = whole
    if all(len(split_json_values("".join(f)) or []) < 2 for _n, f in calls):
        assert [(c.name, c.arguments) for c in got_calls] == [(n, "".join(f)) for n, f in calls]
    assert reason == ("tool_calls" if calls else "stop")


# --------------------------------------------------------- tool-call parsing

JSONISH = st.text(alphabet=st.sampled_from(list("{}[]\":,0123456789.-+eE truefalsnl\\'()u\n") + ["\x00", "é"]), max_size=60)
ANY_TEXT = st.one_of(st.text(max_size=80), JSONISH)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@BOUNDED
@given(raw=ANY_TEXT)
def test_argument_parser_never_raises(raw: str) -> None:
    parsed = parse_arguments(raw, "tool")
    assert isinstance(parsed, (dict, ArgumentError))
    if isinstance(parsed, dict):  # what the tool gets is plain JSON
        assert json.loads(json.dumps(parsed)) == parsed


@BOUNDED
@given(value=st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=5))
def test_argument_parser_reads_every_json_object(value: dict[str, Any]) -> None:
    assert parse_arguments(json.dumps(value)) == json.loads(json.dumps(value))


@BOUNDED
@given(raw=ANY_TEXT, values=st.lists(JSON_VALUES, max_size=4), gap=st.sampled_from(["", " ", "\n"]))
def test_tool_call_splitter_never_raises_and_splits_glued_values(raw: str, values: list[Any], gap: str) -> None:
    split_json_values(raw)  # any string: no exception
    glued = gap.join(json.dumps(v) for v in values)
    pieces = split_json_values(glued)
    if gap:  # (without one, 1 and 2 glue into 12)
        assert pieces is not None and [json.loads(p) for p in pieces] == [json.loads(json.dumps(v)) for v in values]
    calls = [ToolCall(call_id="c1", name="f", arguments=raw), ToolCall(call_id="c2", name="g", arguments=glued)]
    out = split_tool_calls(calls, counter_ids())
    assert all(isinstance(c, ToolCall) for c in out) and len(out) >= 2


@BOUNDED
@given(raw=ANY_TEXT)
def test_legacy_tool_selection_never_raises(raw: str) -> None:
    found = first_json_object(raw)
    assert found is None or isinstance(found, dict)
    for name, params in parse_selection(raw, {"add", "get_weather"}):
        assert name in {"add", "get_weather"} and isinstance(params, dict)


@BOUNDED
@given(
    fragments=st.lists(st.fixed_dictionaries({}, optional={"index": JSON_VALUES, "id": JSON_VALUES, "type": JSON_VALUES, "function": JSON_VALUES}), max_size=5)
)
def test_chat_tool_call_fragments_never_raise(fragments: list[dict[str, Any]]) -> None:
    normalizer = ChatNormalizer(counter_ids())
    normalizer.feed({"choices": [{"index": 0, "delta": {"tool_calls": fragments}}]})
    normalizer.finish()


# ---------------------------------------------------------------- projection


async def test_every_prefix_of_a_real_log_folds(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    """Logs recorded by running turns of several shapes (reasoning and tags,
    a server tool round, a client tool call, an upstream failure, a
    cancel): every prefix folds, and to what ``replay?upto`` answers."""
    tools = write_tools(tmp_path / "tools")
    svc = await start_service(make_settings(tmp_path, upstream.url, tools_dir=str(tools)), upstream)
    try:
        user = [{"role": "user", "content": "go"}]
        upstream.enqueue(
            Reply(reasoning=["hmm", " so"], chunks=["<think>a</think>", " Hi ", "<solution>42</solution>"]),
            Reply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_a"}], finish_reason="tool_calls"),
            Reply(text="It is 5."),
            Reply(tool_calls=[{"name": "client_fn", "arguments": '{"x": 1}', "id": "call_c"}], finish_reason="tool_calls"),
            Reply(status=500),
            Reply(text="a slow answer " * 8, delay=0.05),
        )
        client_tool = [{"type": "function", "function": {"name": "client_fn", "parameters": {"type": "object"}}}]
        turn_ids = []
        for body in (
            {"messages": user, "chat_id": "props"},
            {"messages": user, "tool_ids": ["weather"]},
            {"messages": user, "tools": client_tool},
            {"messages": user},
        ):
            _status, _body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", **body})
            turn_ids.append(headers["X-Turn-Id"])
        _status, _body, headers = await svc.post("/v1/chat/completions", {"model": "gpt-test", "messages": user, "stream": True})
        turn_ids.append(headers["X-Turn-Id"])
        status, _body, _headers = await svc.post(f"/v1/turns/{turn_ids[-1]}/cancel")
        assert status in (202, 409)
        for turn_id in turn_ids:
            await svc.wait_status(turn_id, "completed", "failed", "cancelled")
        statuses = set()
        for turn_id in turn_ids:
            events = [Event(turn_id=turn_id, **e) for e in await svc.events(turn_id)]
            assert len(events) > 3
            for k in range(len(events) + 1):
                view = fold(turn_id, events[:k])
                assert fold(turn_id, events, upto=k).public() == view.public()
            statuses.add(view.status)
            status, replayed = await svc.get(f"/v1/turns/{turn_id}/replay?upto={len(events) // 2}")
            assert status == 200 and replayed == fold(turn_id, events[: len(events) // 2]).public()
        assert {"completed", "failed"} <= statuses
    finally:
        await stop_service(svc)


# ----------------------------------------------------------------- WebSocket

FRAMES = st.one_of(
    # What no store can hold: lone surrogates, NUL characters (PostgreSQL).
    st.sampled_from(
        [
            '{"type": "subscribe", "chat_id": "\\ud800"}',
            '{"type": "cancel", "turn_id": "\\udfff"}',
            '{"type": "subscribe", "turn_id": "a\\u0000b"}',
            '{"type": "subscribe", "chat_id": "a\\u0000"}',
            '{"type": "tool_result", "turn_id": "\\u0000", "call_id": "c", "result": 1}',
            '{"type": "chat", "request": {"model": "gpt-test", "chat_id": "\\u0000", "messages": []}}',
            '{"type": "subscribe", "after": 1e400}',
        ]
    ),  # fmt: skip
    st.binary(max_size=64),
    st.text(max_size=64),
    JSONISH,
    JSON_VALUES.map(json.dumps),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["chat", "subscribe", "cancel", "tool_result", "approval", "", "CHAT"]) | st.text(max_size=8)},
        optional={"turn_id": JSON_VALUES, "chat_id": JSON_VALUES, "after": JSON_VALUES, "call_id": JSON_VALUES, "result": JSON_VALUES, "request": JSON_VALUES},
    ).map(json.dumps),
)


async def test_any_websocket_frame_gets_an_error_and_the_connection_stays_usable(tmp_path: Path, upstream: ScriptedUpstream, database_url: str) -> None:
    svc = await start_service(make_settings(tmp_path, upstream.url, database_url=database_url), upstream)
    loop = asyncio.get_running_loop()
    try:
        async with svc.http.ws_connect(svc.v1 + "/ws") as ws:

            async def exchange(frame: str | bytes) -> dict[str, Any]:
                if isinstance(frame, bytes):
                    await ws.send_bytes(frame)
                else:
                    await ws.send_str(frame)
                message = await ws.receive(timeout=10)
                assert message.type == aiohttp.WSMsgType.TEXT, (frame, message)
                return json.loads(message.data)

            def run(frame: str | bytes) -> None:
                reply = asyncio.run_coroutine_threadsafe(exchange(frame), loop).result(20)
                assert reply["type"] == "error", (frame, reply)
                assert isinstance(reply["message"], str) and reply["message"], (frame, reply)
                assert isinstance(reply["code"], str) and reply["code"], (frame, reply)
                # Still usable: a well-formed message gets its answer.
                probe = asyncio.run_coroutine_threadsafe(exchange('{"type": "cancel", "turn_id": "turn_probe"}'), loop).result(20)
                assert probe["type"] == "error" and probe["code"] == "not_found", probe

            @settings(max_examples=80, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
            @given(frame=FRAMES)
            def frames(frame: str | bytes) -> None:
                run(frame)

            await asyncio.to_thread(frames)
            # And it still runs a turn.
            await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}})
            first = await ws.receive_json(timeout=10)
            assert first["type"] == "turn", first
    finally:
        await stop_service(svc)
