"""A client reconnects after a kill -9 and must end with exactly the stored answer.

The dead process handed out text live that never became durable (its open
group-commit window died with it); the turn is resumed elsewhere and the model
re-generates from the durable end. A client that holds the lost text must be
told to drop it (docs/reconnecting.md): over SSE the ``turnlog.resumed`` notice
chunk, over the WebSocket the ``resumed`` message. Each crash test runs in both
resume modes: ``continue`` (the upstream continues the durable partial answer)
and ``restart`` (it answers afresh: the partial answer is superseded, and every
client shown any of it must drop all of it). The oracle here is a client
that applies only that documented rule to what it received, compared with the
stored answer (``GET /v1/turns/{id}``).

The crash is made deterministic, without timing: delta windows are sealed every
``WINDOW`` chunks (the flush timer is a minute), and the upstream pauses after
``FIRST_PAUSE`` chunks, so when the process is killed the first
``DURABLE_CHUNKS`` chunks are durable and the rest were only ever shown live.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai.types.chat import ChatCompletionChunk

from engine.json_types import JsonObject
from tests.harness import sse_messages
from tests.processes import ROOT, Server, cli, get_json, wait_for
from tests.upstream import Reply, ScriptedUpstream

WORDS = [f" w{i}" for i in range(120)]
TEXT = "".join(WORDS)
WINDOW = 10
FIRST_PAUSE = 45
DURABLE_CHUNKS = FIRST_PAUSE // WINDOW * WINDOW  # 40: four sealed windows
RESUMED_PAUSE = 5  # the resumed turn pauses after this many new chunks ("running")
ENV = {"TURNLOG_FLUSH_INTERVAL": "60", "TURNLOG_FLUSH_MAX_CHUNKS": str(WINDOW)}
USER: list[JsonObject] = [{"role": "user", "content": "count"}]
# Where the client's connection broke, relative to the durable end D and the
# last position L it received live: D-3, D, D+1 (the first lost chunk), L.
CURSORS = ("before", "at", "just_after", "after")
TIMEOUT = 20.0


@pytest.fixture(params=["continue", "restart"])
def resume(request: pytest.FixtureRequest, upstream: ScriptedUpstream) -> Iterator[dict[str, str]]:
    """The resume mode, of the upstream and of the service's OpenAI upstream
    setting: the environment the servers get (with ``ENV``)."""
    upstream.resume = request.param
    yield {**ENV, "TURNLOG_RESUME": json.dumps({"openai": request.param})}


def resumed_text(restart: bool, new_chunks: int) -> str:
    """What a client shows once the resumed turn streamed ``new_chunks`` chunks."""
    return "".join(WORDS[:new_chunks] if restart else WORDS[: DURABLE_CHUNKS + new_chunks])


def expected_notice(durable: int, restart: bool) -> dict[str, Any]:
    """A restart drops the whole cut-off round (here: the whole answer so far)."""
    kept = 0 if restart else len("".join(WORDS[:DURABLE_CHUNKS]))
    return {"from_pos": durable, "epoch": 1, "content_length": kept, "reasoning_length": 0, "mode": "restart" if restart else "continue"}


# -- the client oracle: the documented rule, nothing else --------------------------


@dataclass
class Shown:
    """What a client shows, built only from what it received."""

    content: str = ""
    reasoning: str = ""
    notices: list[dict[str, Any]] = field(default_factory=list)

    def resumed(self, notice: dict[str, Any]) -> None:
        """Keep the first N code points of what is shown; drop the rest."""
        self.notices.append(notice)
        self.content = self.content[: notice["content_length"]]
        self.reasoning = self.reasoning[: notice["reasoning_length"]]


def apply_sse(shown: Shown, messages: list[tuple[int | None, str]]) -> None:
    """An OpenAI SDK client: every chunk parsed as the SDK's ``ChatCompletionChunk``."""
    for _ident, data in messages:
        if data == "[DONE]":
            continue
        chunk = ChatCompletionChunk.model_validate_json(data)
        extension = (chunk.model_extra or {}).get("turnlog") or {}
        if "resumed" in extension:
            shown.resumed(extension["resumed"])
            continue
        for choice in chunk.choices:
            shown.content += choice.delta.content or ""


@dataclass
class WsShown:
    """A WebSocket client (docs/reconnecting.md): the durable text from
    ``model.delta`` events, then the live preview (``delta`` messages above the
    last event); an event drops the preview of its seq; a (re)subscription
    starts with no preview; ``resumed`` drops a dead owner's preview and keeps
    ``content_length`` of the durable text."""

    durable: str = ""
    preview: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0  # the last event received: the cursor to reconnect with
    notices: list[dict[str, Any]] = field(default_factory=list)
    mismatch: list[str] = field(default_factory=list)
    restart: bool = False  # a restart drops durable text too: no mismatch check

    @property
    def content(self) -> str:
        return self.durable + "".join(d["content"] for d in self.preview if d["kind"] == "text")

    def subscribe(self) -> WsShown:
        self.preview = []
        return self

    def apply(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "event":
            self.seq = message["seq"]
            self.preview = [d for d in self.preview if d["seq"] > self.seq]
            event = message["event"]
            if event["type"] == "model.delta" and event["data"]["kind"] == "text":
                self.durable += event["data"]["text"]
        elif kind == "delta":
            self.preview.append(message)
        elif kind == "resumed":
            self.notices.append(message)
            self.preview = [d for d in self.preview if d["pos"] >= message["epoch"] << 32]
            if not self.restart and len(self.durable) != message["content_length"]:
                self.mismatch.append(f"durable text {len(self.durable)} code points, resumed says {message['content_length']}")
            self.durable = self.durable[: message["content_length"]]


# -- the fold -----------------------------------------------------------------------


@pytest.mark.parametrize("interrupted", [True, False], ids=["interrupted", "resumed-directly"])
def test_the_resume_is_the_new_epochs_first_position_and_knows_the_durable_end(interrupted: bool) -> None:
    from engine.events import AssemblyCompleted, ModelRequested, TurnInterrupted, TurnResumed, TurnStarted, delta_event, make_event
    from engine.fold.turn_view import epoch_base, fold

    events = [
        make_event("t", 1, TurnStarted(chat_id="c", user_id="u", model="m", request={})),
        make_event("t", 2, AssemblyCompleted(messages=USER)),
        make_event("t", 3, ModelRequested()),
        delta_event("t", 4, "text", 4, [" w0", " wé", " w✓"]),  # positions 4, 5, 6
    ]
    if interrupted:
        events.append(make_event("t", len(events) + 1, TurnInterrupted()))  # position 7
    view = fold("t", events)
    events.append(make_event("t", len(events) + 1, TurnResumed(from_seq=view.last_seq, from_pos=view.last_event_pos, epoch=1)))
    view = fold("t", events)
    point = view.resume_point
    assert point is not None
    assert (point.pos, view.last_event_pos, view.next_pos) == (epoch_base(1), epoch_base(1), epoch_base(1) + 1)
    assert point.notice() == {"from_pos": 6, "epoch": 1, "content_length": 9, "reasoning_length": 0, "mode": "continue"}


def _cut_off_round(reasoning: bool = False) -> list[Any]:
    """A turn whose second model round was cut off by a crash: the first round
    answered "Done. " (positions 4, 5), the second streamed " w0 wé w✓"."""
    from engine.events import AssemblyCompleted, ModelCompleted, ModelItem, ModelRequested, TurnInterrupted, TurnStarted, delta_event, make_event

    events = [
        make_event("t", 1, TurnStarted(chat_id="c", user_id="u", model="m", request={})),
        make_event("t", 2, AssemblyCompleted(messages=USER)),
        make_event("t", 3, ModelRequested()),  # position 3
        delta_event("t", 4, "text", 4, ["Done", ". "]),  # positions 4, 5
        make_event("t", 5, ModelCompleted(finish_reason="stop")),  # position 6
        make_event("t", 6, ModelRequested(iteration=1)),  # position 7: the round's start
    ]
    if reasoning:
        events.append(delta_event("t", len(events) + 1, "reasoning", 8, ["hmm"]))
    n = len(events)
    pos = 8 + int(reasoning)
    events.append(delta_event("t", n + 1, "text", pos, [" w0", " wé", " w✓"]))
    call: JsonObject = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}", "status": "completed"}
    events.append(make_event("t", n + 2, ModelItem(item=call)))
    events.append(make_event("t", n + 3, TurnInterrupted()))
    return events


@pytest.mark.parametrize("reasoning", [False, True], ids=["text", "reasoning-and-text"])
def test_a_restart_supersedes_the_cut_off_round_and_the_notice_goes_back_to_its_start(reasoning: bool) -> None:
    from engine.events import TurnResumed, make_event
    from engine.fold.output_items import item_text
    from engine.fold.turn_view import fold
    from engine.run.loop_state import LoopState

    events = _cut_off_round(reasoning)
    before = fold("t", events)
    assert before.content == "Done.  w0 wé w✓"
    resumed = TurnResumed(from_seq=before.last_seq, from_pos=before.last_event_pos, epoch=1, mode="restart")
    events.append(make_event("t", len(events) + 1, resumed))
    view = fold("t", events)
    point = view.resume_point
    assert point is not None
    # The answer is the first round's; the cut-off round is kept aside, incomplete.
    assert (view.content, view.reasoning_content) == ("Done. ", "")
    assert point.notice() == {"from_pos": before.last_event_pos - 1, "epoch": 1, "content_length": 6, "reasoning_length": 0, "mode": "restart"}
    assert [i["type"] for i in view.output] == ["message"] and item_text(view.output[0]) == "Done. "
    kinds = ["reasoning", "message", "function_call"] if reasoning else ["message", "function_call"]
    assert [i["type"] for i in view.superseded] == kinds
    assert all(i["status"] == "incomplete" for i in view.superseded)
    assert "call_1" not in view.calls
    # Anyone shown output after the round's model.requested (position 7) holds superseded text.
    assert (point.drops(7), point.drops(8)) == (False, True)
    state = LoopState()
    for event in events:
        state.apply(event)
    assert state.model_open and state.round_calls == []


def test_a_resume_recorded_before_modes_existed_continues() -> None:
    from engine.events import Event, TurnResumed
    from engine.fold.turn_view import fold

    events = _cut_off_round()
    before = fold("t", events)
    data = TurnResumed(from_seq=before.last_seq, from_pos=before.last_event_pos, epoch=1).model_dump()
    del data["mode"]  # an old log's turn.resumed
    events.append(Event(turn_id="t", seq=len(events) + 1, type="turn.resumed", at=0.0, data=data))
    view = fold("t", events)
    assert view.content == "Done.  w0 wé w✓" and not view.superseded
    point = view.resume_point
    assert point is not None and point.notice()["mode"] == "continue" and point.content_length == len("Done.  w0 wé w✓")


# -- the crash ----------------------------------------------------------------------


def durable_end(db: Path, turn_id: str) -> int:
    """The last durable stream position of text, read from the SQLite log."""
    listing = cli(db, "turns", "events", turn_id)
    assert listing.returncode == 0, listing.stderr
    events = [json.loads(line) for line in listing.stdout.splitlines()]
    deltas = [e["data"] for e in events if e["type"] == "model.delta"]
    assert deltas, "some text was durable before the crash"
    return max(d["pos"] + len(d["lens"]) - 1 for d in deltas)


async def kill_when_paused(http: aiohttp.ClientSession, first: Server, upstream: ScriptedUpstream, turn_id: str) -> None:
    """Once the upstream paused and the sealed windows are durable, kill -9 the owner."""
    await asyncio.wait_for(upstream.paused.wait(), TIMEOUT)
    await wait_for(http, f"{first.url}/v1/turns/{turn_id}", lambda v: v["content"] == "".join(WORDS[:DURABLE_CHUNKS]))
    first.kill9()
    upstream.release()  # the dead process's upstream stream ends; ``paused`` is clear again


async def start_second(http: aiohttp.ClientSession, db: Path, upstream: ScriptedUpstream, turn_id: str, mode: str, env: dict[str, str]) -> Server:
    """The next process adopts the turn and resumes it; ``running``: it is paused
    mid-answer, ``completed``: it has finished."""
    second = Server(db, upstream.url, auto_resume=True, env=env)
    await second.ready(http)
    if mode == "running":
        await asyncio.wait_for(upstream.paused.wait(), TIMEOUT)
        assert (await get_json(http, f"{second.url}/v1/turns/{turn_id}"))["status"] == "running"
    else:
        await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
    return second


def second_reply(mode: str) -> Reply:
    return Reply(chunks=WORDS, pause_after=RESUMED_PAUSE if mode == "running" else None)


def cursor_position(name: str, durable: int, last_live: int) -> int:
    return {"before": durable - 3, "at": durable, "just_after": durable + 1, "after": last_live}[name]


def expected_notices(name: str, restart: bool) -> int:
    return 1 if restart or name in ("just_after", "after") else 0


async def read_until(resp: aiohttp.ClientResponse, buf: str, done: Any) -> str:
    """Read SSE until ``done(complete messages)``."""

    async def go(buf: str) -> str:
        while not done(sse_messages(buf[: buf.rfind("\n\n") + 2])):
            chunk = await resp.content.readany()
            assert chunk, "the stream ended early"
            buf += chunk.decode()
        return buf

    return await asyncio.wait_for(go(buf), TIMEOUT)


def text_of(messages: list[tuple[int | None, str]]) -> str:
    shown = Shown()
    apply_sse(shown, messages)
    return shown.content


def describe(shown: str) -> str:
    """How a client's text differs from TEXT, word by word."""
    words = shown.split()
    duplicated = sorted({w for w in words if words.count(w) > 1}, key=lambda w: int(w[1:]))
    missing = [w.strip() for w in WORDS if w.strip() not in words]
    return f"duplicated {duplicated}, missing {missing}"


def doc_snippet(base_url: str, blocks: int = 1) -> dict[str, Any]:
    """The first ``blocks`` Python blocks of docs/reconnecting.md, run against
    ``base_url`` (and the scripted upstream's model)."""
    doc = (ROOT / "docs" / "reconnecting.md").read_text()
    namespace: dict[str, Any] = {}
    for code in [part.split("```", 1)[0] for part in doc.split("```python\n")[1:]][:blocks]:
        code = code.replace("http://127.0.0.1:8080/v1", base_url).replace("gpt-4o-mini", "gpt-test")
        exec(compile(code, "docs/reconnecting.md", "exec"), namespace)
    return namespace


def ids_of(messages: list[tuple[int | None, str]]) -> list[int]:
    return [i for i, _ in messages if i is not None]


# -- SSE -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["running", "completed"])
async def test_sse_reconnect_after_kill9_shows_exactly_the_stored_answer(
    http: aiohttp.ClientSession, tmp_path: Path, upstream: ScriptedUpstream, mode: str, resume: dict[str, str]
) -> None:
    restart = upstream.resume == "restart"
    upstream.enqueue(Reply(chunks=WORDS, delay=0.002, pause_after=FIRST_PAUSE), second_reply(mode))
    db = tmp_path / "turnlog.db"
    first = Server(db, upstream.url, auto_resume=False, env=resume)
    try:
        await first.ready(http)
        resp = await http.post(first.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
        turn_id = resp.headers["X-Turn-Id"]
        live = await read_until(resp, "", lambda m: text_of(m) == "".join(WORDS[:FIRST_PAUSE]))
        await kill_when_paused(http, first, upstream, turn_id)
        resp.close()
    finally:
        first.stop()
    live_messages = sse_messages(live[: live.rfind("\n\n") + 2])
    chunk_ids = [i for i, data in live_messages if i is not None and '"content":" w' in data]
    durable = durable_end(db, turn_id)
    assert durable == chunk_ids[DURABLE_CHUNKS - 1], "live positions are the log's positions"
    last_live = chunk_ids[-1]
    assert last_live > durable, "the client holds text that was never durable"

    second = await start_second(http, db, upstream, turn_id, mode, resume)
    try:
        stream_url = f"{second.url}/v1/turns/{turn_id}/stream"
        responses = {}
        for name in CURSORS:
            cursor = cursor_position(name, durable, last_live)
            responses[name] = (cursor, await http.get(stream_url, headers={"Last-Event-ID": str(cursor)}))
        bodies = {}
        for name, (cursor, again) in responses.items():
            assert again.status == 200
            # The client got everything up to its cursor on the first connection.
            before = [m for m in live_messages if m[0] is None or m[0] <= cursor]
            before = before[: max(i for i, m in enumerate(before) if m[0] == cursor) + 1]
            if mode == "running":
                # While the resumed turn is still running (paused mid-answer),
                # the client already shows the re-generated text live.
                body = await read_until(again, "", lambda m, b=before: text_of(b + m) == resumed_text(restart, RESUMED_PAUSE) and bool(m))
                bodies[name] = (cursor, before, body)
            else:
                bodies[name] = (cursor, before, "")
        if mode == "running":
            upstream.release()
        done = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
        assert done["content"] == TEXT
        problems: list[str] = []
        for name, (cursor, before, body) in bodies.items():
            again = responses[name][1]
            body += (await again.read()).decode()
            again.close()
            after = sse_messages(body)
            shown = Shown()
            apply_sse(shown, before)
            apply_sse(shown, after)
            where = f"{name} (Last-Event-ID {cursor}, durable end {durable})"
            if shown.content != done["content"]:
                problems.append(f"{where}: {describe(shown.content)}")
            if shown.notices != [expected_notice(durable, restart)] * expected_notices(name, restart):
                problems.append(f"{where}: notices {shown.notices}")
            ids = ids_of(before) + ids_of(after)
            if ids != sorted(set(ids)):
                problems.append(f"{where}: positions not strictly increasing: {ids_of(after)[:4]}")
            assert after[-1][1] == "[DONE]"
        assert not problems, "\n".join(problems)

        if mode == "completed":
            # The snippet of docs/reconnecting.md, with the real openai SDK, does the same.
            sdk = doc_snippet(second.url + "/v1")
            for name, (cursor, before, _body) in bodies.items():
                answer = sdk["Answer"]()
                answer.content, answer.last_event_id = text_of(before), cursor
                await asyncio.to_thread(sdk["reconnect"], turn_id, answer)
                assert answer.content == TEXT, f"docs snippet, {name}: {describe(answer.content)}"
            upstream.enqueue(Reply(text="Hello from the docs."))
            started = await asyncio.to_thread(doc_snippet, second.url + "/v1", 2)
            assert started["answer"].content == "Hello from the docs." and started["answer"].last_event_id > 0

        # A fresh client (no Last-Event-ID) gets exactly the stored text: with
        # no notice, or after a restart the superseded partial answer (the log
        # keeps it) and the notice to drop it.
        async with http.get(stream_url) as fresh:
            messages = sse_messages(await fresh.text())
        shown = Shown()
        apply_sse(shown, messages)
        assert shown.content == TEXT and shown.notices == ([expected_notice(durable, True)] if restart else [])
        assert ids_of(messages) == sorted(set(ids_of(messages)))
    finally:
        second.stop()


# -- WebSocket -----------------------------------------------------------------------


async def ws_messages_until(ws: aiohttp.ClientWebSocketResponse, done: Any) -> list[dict[str, Any]]:
    """Receive until ``done(messages so far)``."""
    out: list[dict[str, Any]] = []

    async def go() -> None:
        while not done(out):
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            out.append(json.loads(msg.data))

    await asyncio.wait_for(go(), TIMEOUT)
    return out


def ws_text(messages: list[dict[str, Any]], shown: WsShown | None = None) -> WsShown:
    shown = shown or WsShown()
    for message in messages:
        shown.apply(message)
    return shown


def ws_completed(messages: list[dict[str, Any]]) -> bool:
    return any(m["type"] == "event" and m["event"]["type"] == "turn.completed" for m in messages)


@pytest.mark.parametrize("mode", ["running", "completed"])
async def test_websocket_resubscribe_after_kill9_shows_exactly_the_stored_answer(
    http: aiohttp.ClientSession, tmp_path: Path, upstream: ScriptedUpstream, mode: str, resume: dict[str, str]
) -> None:
    restart = upstream.resume == "restart"
    upstream.enqueue(Reply(chunks=WORDS, delay=0.002, pause_after=FIRST_PAUSE), second_reply(mode))
    db = tmp_path / "turnlog.db"
    first = Server(db, upstream.url, auto_resume=False, env=resume)
    try:
        await first.ready(http)
        async with http.ws_connect(first.url + "/v1/ws") as ws:
            await ws.send_json({"type": "chat", "request": {"model": "gpt-test", "messages": USER}})
            received = await ws_messages_until(ws, lambda ms: ws_text(ms).content == "".join(WORDS[:FIRST_PAUSE]))
            turn_id = received[0]["turn_id"]
            await kill_when_paused(http, first, upstream, turn_id)
    finally:
        first.stop()
    durable = durable_end(db, turn_id)
    deltas = [m for m in received if m["type"] == "delta"]
    assert deltas[DURABLE_CHUNKS - 1]["pos"] == durable, "live positions are the log's positions"
    last_live = deltas[-1]["pos"]
    assert last_live > durable, "the client holds text that was never durable"

    second = await start_second(http, db, upstream, turn_id, mode, resume)
    try:
        clients: dict[str, tuple[int, WsShown, aiohttp.ClientWebSocketResponse, list[dict[str, Any]]]] = {}
        for name in CURSORS:
            cursor = cursor_position(name, durable, last_live)
            # The client's connection broke right after the delta at ``cursor``.
            cut = next(i for i, m in enumerate(received) if m["type"] == "delta" and m["pos"] == cursor)
            shown = ws_text(received[: cut + 1], WsShown(restart=restart))
            assert shown.content == "".join(WORDS[: cursor - durable + DURABLE_CHUNKS])
            shown.subscribe()
            ws = await http.ws_connect(second.url + "/v1/ws")
            await ws.send_json({"type": "subscribe", "turn_id": turn_id, "after": shown.seq})
            clients[name] = (cursor, shown, ws, [])
        if mode == "running":
            # While the resumed turn is paused mid-answer, the client already
            # shows the re-generated text live.
            target = resumed_text(restart, RESUMED_PAUSE)
            for _cursor, shown, ws, got in clients.values():
                got.extend(await ws_messages_until(ws, lambda ms, s=shown: ws_text(ms, WsShown(durable=s.durable, seq=s.seq)).content == target and bool(ms)))
            upstream.release()
        done = await wait_for(http, f"{second.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
        assert done["content"] == TEXT
        problems: list[str] = []
        for name, (cursor, shown, ws, got) in clients.items():
            if not ws_completed(got):
                got.extend(await ws_messages_until(ws, lambda ms, g=got: ws_completed(g + ms)))
            await ws.close()
            seqs = [m["seq"] for m in got if m["type"] == "event"]
            assert seqs == list(range(shown.seq + 1, shown.seq + 1 + len(seqs))), f"{name}: every event after the cursor once"
            after_seq = shown.seq
            ws_text(got, shown)
            where = f"{name} (last delta {cursor}, after={after_seq}, durable end {durable})"
            if shown.content != done["content"]:
                problems.append(f"{where}: {describe(shown.content)}")
            keys = ("turn_id", "from_pos", "epoch", "content_length", "reasoning_length", "mode")
            resumed = [{k: m.get(k) for k in keys} for m in got if m["type"] == "resumed"]
            notice = {"turn_id": turn_id, **expected_notice(durable, restart)}
            if resumed != [notice]:
                problems.append(f"{where}: resumed messages {resumed}")
            problems.extend(f"{where}: {m}" for m in shown.mismatch)
        assert not problems, "\n".join(problems)
    finally:
        second.stop()


# -- a client still connected while its turn moves to another owner -------------------


async def test_sse_client_of_a_frozen_owner_gets_the_notice_live(
    http: aiohttp.ClientSession, tmp_path: Path, upstream: ScriptedUpstream, pg_url: str, resume: dict[str, str]
) -> None:
    # No reconnect: owner A freezes (SIGSTOP) after showing text it never made
    # durable; B adopts and finishes the turn; when A wakes up, fenced off, its
    # still-open SSE stream follows the log: the client's live position is past
    # the durable end, so it must get the notice before B's text.
    import os
    import signal

    upstream.enqueue(Reply(chunks=WORDS, delay=0.002, pause_after=FIRST_PAUSE), Reply(chunks=WORDS))
    a = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path, env=resume)
    b: Server | None = None
    try:
        await a.ready(http)
        resp = await http.post(a.url + "/v1/chat/completions", json={"model": "gpt-test", "messages": USER, "stream": True})
        turn_id = resp.headers["X-Turn-Id"]
        live = await read_until(resp, "", lambda m: text_of(m) == "".join(WORDS[:FIRST_PAUSE]))
        await asyncio.wait_for(upstream.paused.wait(), TIMEOUT)
        await wait_for(http, f"{a.url}/v1/turns/{turn_id}", lambda v: v["content"] == "".join(WORDS[:DURABLE_CHUNKS]))
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            b = Server(pg_url, upstream.url, auto_resume=True, log_dir=tmp_path, env=resume)
            await b.ready(http)
            done = await wait_for(http, f"{b.url}/v1/turns/{turn_id}", lambda v: v["status"] == "completed")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        body = live + (await asyncio.wait_for(resp.read(), TIMEOUT)).decode()
        resp.close()
        messages = sse_messages(body)
        shown = Shown()
        apply_sse(shown, messages)
        assert done["content"] == TEXT
        assert shown.content == TEXT, describe(shown.content)
        chunk_ids = [i for i, data in messages if i is not None and '"content":" w' in data]
        durable = chunk_ids[DURABLE_CHUNKS - 1]
        assert shown.notices == [expected_notice(durable, upstream.resume == "restart")]
        assert ids_of(messages) == sorted(set(ids_of(messages)))
    finally:
        upstream.release()
        for server in (a, b):
            if server is not None:
                server.stop()
