"""Oracles for "replay equals live": what a client was sent, and what the
turn's actor showed, against the fold of the stored log.

``GET /v1/turns/{id}`` and ``/replay`` are folds of the log, so comparing them
with ``fold(events)`` proves nothing. The independent sides are:

* the bytes a client was sent (``check_stream_against_log``): parsed here into
  the stream positions and what each of them added, while the position at
  which each durable event ends is computed here from the raw log (not with
  engine code); at the end position of *every* event, what the client had
  accumulated must equal ``replay?upto=SEQ``;
* the actor's own live view, as the non-streaming ``chat.completion`` reports
  it for a turn the actor ended itself (``check_completion_against_turn``);
  the engine-level snapshots of ``actor.view`` are in ``tests/test_live_view``.

The position rule, re-stated (docs and ``engine.fold.turn_view``): positions
start at 1; each upstream chunk of a ``model.delta`` takes one, the first at
its ``data.pos``; every other event takes the next one; ``turn.resumed``
takes ``epoch << 32``, and counting goes on from there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.harness import Service

# The states in which the answer is over and the finish reason was sent.
FINISHED_STATES = frozenset({"finalizing", "outlet", "background", "done"})
# Output items that reach clients as ``turnlog.item`` snapshots.
SNAPSHOT_TYPES = frozenset({"function_call", "function_call_output"})
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


@dataclass
class Step:
    """Everything a client was sent at one stream position (one SSE ``id``)."""

    pos: int
    content: str = ""
    reasoning: str = ""
    items: list[dict[str, Any]] = field(default_factory=list)
    finish: str | None = None
    status: str | None = None  # "cancelled" (turnlog.status) or "failed" (an error body)
    error: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    outlet: str | None = None  # the outlet filters' version of the content
    background: dict[str, Any] = field(default_factory=dict)  # task -> result (named events after [DONE])
    asked: list[str] = field(default_factory=list)  # call ids of approval requests (named events before [DONE])
    arguments: list[tuple[str, str]] = field(default_factory=list)  # (call_id, fragment) of calls being written


@dataclass
class ClientView:
    """What a client knows once it has read the stream up to some position."""

    content: str = ""
    reasoning: str = ""
    items: dict[str, dict[str, Any]] = field(default_factory=dict)  # latest snapshot per item id
    finish: str | None = None
    status: str | None = None
    error: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    background: dict[str, Any] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)


@dataclass
class ClientStream:
    steps: list[Step]
    done: bool  # ended with ``data: [DONE]``

    def upto(self, pos: int) -> ClientView:
        view = ClientView()
        for step in self.steps:
            if step.pos > pos:
                break
            view.content += step.content
            view.reasoning += step.reasoning
            for item in step.items:
                view.items[item["id"]] = item
            for call_id, fragment in step.arguments:
                # A client appends a fragment to the call it names.
                for key, item in view.items.items():
                    if item.get("call_id") == call_id and item.get("type") == "function_call":
                        view.items[key] = {**item, "arguments": item.get("arguments", "") + fragment}
            view.finish = step.finish or view.finish
            view.status = step.status or view.status
            view.error = step.error or view.error
            view.usage = step.usage or view.usage
            view.tool_calls.extend(step.tool_calls)
            if step.outlet is not None:
                view.content = step.outlet
            view.background.update(step.background)
            view.asked.extend(step.asked)
        return view

    @property
    def ids(self) -> list[int]:
        return [step.pos for step in self.steps]


def sse_events(raw: str) -> list[tuple[str | None, int | None, str]]:
    """(event name, id, data) of each SSE message of a body."""
    out: list[tuple[str | None, int | None, str]] = []
    for block in raw.split("\n\n"):
        name: str | None = None
        ident: int | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("id: "):
                ident = int(line[4:])
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((name, ident, "\n".join(data)))
    return out


def parse_stream(raw: str) -> ClientStream:
    """A ``chat.completion.chunk`` SSE body as positions: the messages without an
    ``id`` belong to the next message that has one (the renderer puts the id on
    the last message of a position); after ``[DONE]`` only named ``turnlog``
    events (background results), each at a position of its own, may come."""
    steps: list[Step] = []
    pending = Step(pos=-1)
    loose: list[str] = []
    done = False
    for name, ident, data in sse_events(raw):
        if done:
            assert name == "turnlog" and ident is not None, f"a chunk after [DONE]: {data[:200]}"
            background = json.loads(data)["background"]
            steps.append(Step(pos=ident, background={background["task"]: background.get("result")}))
            continue
        if name == "turnlog" and not loose:
            # A call waiting for approval: a named event at a position of its own.
            request = json.loads(data)["turnlog"]["approval_request"]
            assert ident is not None, "an approval request carries its position"
            steps.append(Step(pos=ident, asked=[request["call_id"]]))
            continue
        assert name is None, f"a named event before [DONE]: {name}"
        if data == "[DONE]":
            assert ident is None, "[DONE] carries no position"
            done = True
            continue
        _read_payload(pending, json.loads(data))
        loose.append(data)
        if ident is not None:
            pending.pos = ident
            steps.append(pending)
            pending = Step(pos=-1)
            loose = []
    assert not loose, f"messages after the last position: {loose}"
    return ClientStream(steps, done)


def _read_payload(step: Step, payload: dict[str, Any]) -> None:
    if "error" in payload and "choices" not in payload:
        step.status, step.error = "failed", payload["error"]
        return
    if payload.get("usage") and not payload.get("choices"):
        step.usage = payload["usage"]
    for choice in payload.get("choices") or []:
        delta = choice.get("delta") or {}
        step.content += delta.get("content") or ""
        step.reasoning += delta.get("reasoning_content") or ""
        step.tool_calls.extend(delta.get("tool_calls") or [])
        if choice.get("finish_reason") is not None:
            step.finish = choice["finish_reason"]
    ext = payload.get("turnlog") or {}
    if "outlet" in ext:
        step.outlet = ext["outlet"]["content"]
    if "item" in ext:
        step.items.append(ext["item"])
    if "tool_arguments" in ext:
        step.arguments.append((ext["tool_arguments"]["call_id"], ext["tool_arguments"]["delta"]))
    if "status" in ext:
        step.status = ext["status"]


@dataclass(frozen=True)
class Span:
    """The stream positions one durable event covers."""

    seq: int
    type: str
    first: int
    last: int


def event_spans(events: list[dict[str, Any]]) -> list[Span]:
    """The positions of each event of a log, by the rule in the module docstring."""
    spans: list[Span] = []
    next_pos = 1
    for event in events:
        t, data = event["type"], event["data"]
        if t == "model.delta":
            assert data["pos"] == next_pos, f"seq {event['seq']}: delta at {data['pos']}, expected {next_pos}"
            first, last = next_pos, next_pos + len(data["lens"]) - 1
        elif t == "turn.resumed":
            first = last = data["epoch"] << 32
        else:
            first = last = next_pos
        spans.append(Span(event["seq"], t, first, last))
        next_pos = last + 1
    return spans


async def read_stream(service: Service, turn_id: str, *, after: int = 0, include_usage: bool = False) -> str:
    """The SSE body a client reconnecting with ``Last-Event-ID: after`` gets."""
    query = "?include_usage=true" if include_usage else ""
    async with service.http.get(f"{service.v1}/turns/{turn_id}/stream{query}", headers={**service.headers, "Last-Event-ID": str(after)}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


async def check_stream_against_log(service: Service, turn_id: str, raw: str, *, include_usage: bool = False) -> ClientStream:
    """What the client was sent (``raw``, from the first position on) against the
    fold of every prefix of the log: at the position where event SEQ ends, the
    client's text, reasoning, item snapshots, finish and status are those of
    ``replay?upto=SEQ``."""
    stream = parse_stream(raw)
    events = await service.events(turn_id)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "the log has a gap"
    spans = event_spans(events)
    ids = stream.ids
    assert ids == sorted(set(ids)), f"positions not strictly increasing: {ids}"
    chunk_positions = {p for s in spans if s.type == "model.delta" for p in range(s.first, s.last + 1)}
    event_positions = {s.last for s in spans if s.type != "model.delta"}
    stray = [p for p in ids if p not in chunk_positions and p not in event_positions]
    assert not stray, f"the client was sent positions no event of the log has: {stray}"
    for span in spans:
        status, replay = await service.get(f"/v1/turns/{turn_id}/replay?upto={span.seq}")
        assert status == 200, replay
        assert replay["seq"] == span.seq
        shown = stream.upto(span.last)
        where = f"after seq {span.seq} ({span.type}, position {span.last})"
        assert shown.content == replay["content"], f"{where}: content differs"
        assert shown.reasoning == (replay["reasoning_content"] or ""), f"{where}: reasoning differs"
        expected_items = {i["id"]: i for i in replay["output"] if i["type"] in SNAPSHOT_TYPES}
        # A call shown while it streamed that never came whole (a glued call
        # became its pieces) was last shown ending ``incomplete``, out of the output.
        dropped = {k for k, i in shown.items.items() if k not in expected_items and i["type"] == "function_call" and i["status"] == "incomplete"}
        assert {k: i for k, i in shown.items.items() if k not in dropped} == expected_items, f"{where}: item snapshots differ"
        assert shown.finish == _expected_finish(replay), f"{where}: finish_reason differs"
        terminal = replay["status"] if replay["status"] in ("cancelled", "failed") else None
        assert shown.status == terminal, f"{where}: status differs"
        if terminal == "failed":
            assert shown.error is not None and shown.error["message"] == replay["error"]["message"]
        assert shown.asked == [a["call_id"] for a in replay.get("approvals", [])], f"{where}: approval requests differ"
        expected_background = {t: replay[t] for t in ("title", "tags", "follow_ups") if t in replay}
        shown_background = {t: r for t, r in shown.background.items() if r is not None}
        assert shown_background == expected_background, f"{where}: background results differ"
    final = await service.turn(turn_id)
    assert stream.done == (final["status"] in ("completed", "cancelled", "failed")), "[DONE] iff the turn ended"
    assert stream.done or not any(s.background for s in stream.steps)
    if include_usage and final["status"] == "completed" and final["usage"]:
        assert stream.upto(spans[-1].last).usage == _openai_usage(final["usage"])
    return stream


def _expected_finish(replay: dict[str, Any]) -> str | None:
    if replay["status"] == "cancelled":
        return "stop"
    if replay["state"] in FINISHED_STATES:
        return replay["finish_reason"] or "stop"
    return None


def _openai_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    return {k: usage[k] for k in USAGE_KEYS if k in usage} or None


def client_calls(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """The calls a turn that ended with ``tool_calls`` leaves to the client: its
    function calls that have no output."""
    answered = {i["call_id"] for i in turn["output"] if i["type"] == "function_call_output"}
    return [i for i in turn["output"] if i["type"] == "function_call" and i["call_id"] not in answered]


def check_completion_against_turn(body: dict[str, Any], turn: dict[str, Any]) -> None:
    """A non-streaming ``chat.completion`` (built from the live actor's view of
    the turn it ended) against ``GET /v1/turns/{id}`` (the fold of the log)."""
    assert body["id"] == f"chatcmpl-{turn['id']}"
    assert body["model"] == turn["model"] and body["created"] == int(turn["created_at"])
    (choice,) = body["choices"]
    finish = turn["finish_reason"] or "stop"
    assert choice["finish_reason"] == finish
    message = choice["message"]
    calls = client_calls(turn) if finish == "tool_calls" else []
    if calls:
        sent = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
        assert sent == [(c["call_id"], c["name"], c["arguments"]) for c in calls]
        assert message["content"] == (turn["content"] or None)
    else:
        assert "tool_calls" not in message
        assert message["content"] == turn["content"]
    assert message.get("reasoning_content") == turn["reasoning_content"]
    assert body["usage"] == _openai_usage(turn.get("answer_usage", turn["usage"]))
    extension = body.get("turnlog") or {}
    assert extension.get("status", "completed") == turn["status"]
    assert extension.get("warnings", []) == turn["warnings"]
