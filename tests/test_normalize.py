"""Tests for the normalizers: wire protocols → engine.protocols.model_events.

engine.protocols.chat, responses and ollama, and the shared tool-call helpers
of engine.protocols.common.

Tool-call accumulation and splitting are driven by the vectors recorded from
Open WebUI 0.12.4 (tests/vectors/chat_tool_call_accumulation.json,
split_tool_calls.json). Where a vector records a quirk turnlog fixes (a
fragment without an index dropped, a later name overwriting the first, a
glued call kept beside its pieces), the test asserts turnlog's behaviour,
checks that it differs from the recording, and names the quirk. The Responses API vectors
(responses_stream_fold.json, Open WebUI's fold of events into output items)
are replayed through ResponsesNormalizer, the production path.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from engine.json_types import JsonObject
from engine.ports import RawChunk, RawRun, RawWarning
from engine.protocols.chat import ChatNormalizer, ChatToolCalls
from engine.protocols.common import arguments_text, split_json_values, split_tool_calls
from engine.protocols.model_events import (
    Finished,
    ProviderItem,
    ReasoningDelta,
    ResponseStarted,
    StreamFailed,
    StreamWarning,
    TextDelta,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallStarted,
    UsageReport,
)
from engine.protocols.ollama import OllamaNormalizer
from engine.protocols.responses import ResponsesNormalizer
from tests.responses_events import FULL_STREAM, MSG_ITEM_DONE, USAGE
from tests.vectors_util import load_vectors

# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def counter_ids() -> Callable[[str], str]:
    """The placeholder ids the vectors use: <call_1>, <call_2>, ..."""
    counters: dict[str, int] = defaultdict(int)

    def make(prefix: str) -> str:
        counters[prefix] += 1
        return f"<{prefix}_{counters[prefix]}>"

    return make


def call(call_id: str, name: str, arguments: str, provider_id: str | None = None) -> ToolCall:
    return ToolCall(call_id=call_id, name=name, arguments=arguments, item_id=call_id, provider_id=provider_id)


def chunk(delta: dict[str, Any] | None = None, finish_reason: str | None = None, **top: Any) -> dict[str, Any]:
    return {
        "id": top.pop("id", "chatcmpl-1"),
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}],
        **top,
    }


def fragments(*frags: dict[str, Any]) -> dict[str, Any]:
    return chunk({"tool_calls": list(frags)})


def run_chat(chunks: Iterable[Any], *, arguments: bool = False, **kwargs: Any) -> list[Any]:
    """The events of a stream; without ``arguments``, less the live argument
    fragments (their own tests below)."""
    normalizer = ChatNormalizer(counter_ids(), **kwargs)
    events: list[Any] = []
    for c in chunks:
        events += normalizer.feed(c)
    return _without_fragments(events + normalizer.finish(), arguments)


def _without_fragments(events: list[Any], keep: bool) -> list[Any]:
    return events if keep else [e for e in events if not isinstance(e, ToolArgumentsDelta)]


def tool_calls_of(events: list[Any]) -> list[ToolCall]:
    return [e for e in events if isinstance(e, ToolCall)]


# --------------------------------------------------------------------------
# split_tool_calls.json
# --------------------------------------------------------------------------

SPLIT_VECTORS = load_vectors("split_tool_calls.json")


def _from_vector(d: dict[str, Any]) -> ToolCall:
    """A vector's Chat-Completions call dict as a ToolCall. The vectors'
    in-place serialization of non-string arguments is what
    :func:`arguments_text` does when calls are accumulated."""
    function = d.get("function") or {}
    return call(d["id"], function.get("name") or "", arguments_text(function.get("arguments")))


@pytest.mark.parametrize("vector", SPLIT_VECTORS, ids=lambda v: v["name"])
def test_split_vector(vector: dict[str, Any]) -> None:
    calls = [_from_vector(d) for d in vector["input"]["tool_calls"]]
    result = split_tool_calls(calls, counter_ids())
    assert result == [_from_vector(d) for d in vector["expected"]["tool_calls"]]
    # Calls that are not split are returned as they are.
    unsplit_ids = {c.call_id for c in result} & {c.call_id for c in calls}
    for original in calls:
        if original.call_id in unsplit_ids:
            assert any(r is original for r in result)


def test_split_keeps_item_id_equal_to_the_new_call_id() -> None:
    glued = ToolCall(call_id="call_x", name="search", arguments='{"q":1} {"q":2}', item_id="fc_provider")
    result = split_tool_calls([glued], counter_ids())
    assert result == [
        ToolCall("<call_1>", "search", '{"q":1}', item_id="<call_1>"),
        ToolCall("<call_2>", "search", '{"q":2}', item_id="<call_2>"),
    ]


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("", []),
        ("   ", []),
        ('{"a":1}', ['{"a":1}']),
        ('{"a":1}\n\t{"b":[1,2]}  ', ['{"a":1}', '{"b":[1,2]}']),
        ('"s" 1 null', ['"s"', "1", "null"]),
        ('{"a":1', None),
        ('{"a":1} x', None),
        ("[" * 100_000, None),  # recursion is a failure, not a crash
    ],
)
def test_split_json_values(text: str, pieces: list[str] | None) -> None:
    assert split_json_values(text) == pieces


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, ""), ("", ""), ('{"a": 1', '{"a": 1'), ({"a": 1, "b": [2]}, '{"a": 1, "b": [2]}'), (3, "3")],
)
def test_arguments_text(value: Any, text: str) -> None:
    assert arguments_text(value) == text


# --------------------------------------------------------------------------
# chat_tool_call_accumulation.json
# --------------------------------------------------------------------------

ACC_VECTORS = load_vectors("chat_tool_call_accumulation.json")
ACC_BY_NAME = {v["name"]: v for v in ACC_VECTORS}

#: Vectors where turnlog deliberately differs from the recording.
ACC_DIFFERENT = {
    "missing_id_generated": "ids: id_factory('call') instead of a random fc_<hex>",
    "missing_index_dropped": "Q1",
    "name_repeated_overwrites": "Q2",
    "same_index_two_calls_BUG": "Q2 (+Q4)",
}


def test_every_accumulation_bug_vector_is_decided() -> None:
    quirky = {v["name"] for v in ACC_VECTORS if v["name"].endswith("_BUG") or "QUIRK" in v["note"]}
    assert quirky <= set(ACC_DIFFERENT)


def _expected_calls(vector: dict[str, Any]) -> list[ToolCall]:
    items = vector["expected"]["function_call_items"]
    return [call(i["call_id"], i["name"], i["arguments"]) for i in items if i["type"] == "function_call"]


def _announced(vector: dict[str, Any]) -> list[ToolCallStarted]:
    """The response.output_item.added events Open WebUI sent for the calls."""
    started = []
    for event in vector["expected"].get("events", []):
        data = event["data"]
        if event["type"] == "response:completion" and data.get("type") == "response.output_item.added":
            started.append(ToolCallStarted(data["item"]["call_id"], data["item"]["name"]))
    return started


@pytest.mark.parametrize("vector", ACC_VECTORS, ids=lambda v: v["name"])
def test_accumulation_vector(vector: dict[str, Any]) -> None:
    name = vector["name"]
    events = run_chat(vector["input"]["sse_data_chunks"])
    calls = tool_calls_of(events)
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert events[-1] == Finished(reason="tool_calls", response_id="chatcmpl-1", usage=None)

    if name not in ACC_DIFFERENT:
        assert calls == _expected_calls(vector)
        assert started == _announced(vector)
        return

    if name == "missing_id_generated":
        # Same call; the made-up id comes from id_factory("call").
        assert _expected_calls(vector) == [call("<fc_1>", "add", "{}")]
        assert calls == [call("<call_1>", "add", "{}")]
    elif name == "missing_index_dropped":
        # Open WebUI dropped the fragment (no call at all).
        assert _expected_calls(vector) == []
        assert calls == [call("call_A", "add", "{}")]
        assert started == [ToolCallStarted("call_A", "add")]
    elif name == "name_repeated_overwrites":
        # A later name never replaces the first one.
        assert _expected_calls(vector) == [call("call_A", "add", "{}")]
        assert calls == [call("call_A", "ad", "{}")]
    elif name == "same_index_two_calls_BUG":
        # The second id + name at index 0 starts a second call, so add's
        # arguments stay with add. Open WebUI merged them, renamed the call to
        # echo and split it into two echo calls (and kept the glued one).
        recorded = vector["expected"]["final_output_after_loop"]
        assert [i["name"] for i in recorded if i["type"] == "function_call"] == ["echo", "echo", "echo"]
        assert calls == [call("call_A", "add", '{"a":1,"b":2}'), call("call_B", "echo", '{"q":"x"}')]
        assert started == [ToolCallStarted("call_A", "add"), ToolCallStarted("call_B", "echo")]
    else:  # pragma: no cover
        pytest.fail(f"no decision for {name}")


def test_content_then_tool_call_keeps_order() -> None:
    events = run_chat(ACC_BY_NAME["content_then_tool_call"]["input"]["sse_data_chunks"])
    assert events == [
        TextDelta("Let me check."),
        ToolCallStarted("call_A", "add"),
        call("call_A", "add", '{"a":1,"b":1}'),
        Finished(reason="tool_calls", response_id="chatcmpl-1"),
    ]


# --------------------------------------------------------------------------
# ChatToolCalls: fragments without an index, repeated indexes, ids
# --------------------------------------------------------------------------


def accumulate(*chunks_of_fragments: list[dict[str, Any]], **kwargs: Any) -> tuple[list[ToolCall], list[Any]]:
    acc = ChatToolCalls(counter_ids(), **kwargs)
    started: list[Any] = []
    for frags in chunks_of_fragments:
        started += [e for e in acc.feed(frags) if isinstance(e, ToolCallStarted)]
    return acc.finish(), started


def fed(*chunks_of_fragments: list[dict[str, Any]]) -> list[list[Any]]:
    """What ``ChatToolCalls.feed`` returns for each chunk of fragments."""
    acc = ChatToolCalls(counter_ids())
    return [acc.feed(frags) for frags in chunks_of_fragments]


def test_argument_fragments_stream_as_they_arrive() -> None:
    """Each argument fragment of a named call is a live delta when its chunk
    comes, parallel calls apart by call id; together they are the call's
    arguments."""
    out = fed(
        [{"index": 0, "id": "call_A", "function": fn("add", "")}],
        [{"index": 0, "function": fn(arguments='{"a"')}],
        [{"index": 1, "id": "call_B", "function": fn("echo", '{"t"')}, {"index": 0, "function": fn(arguments=":1}")}],
        [{"index": 1, "function": fn(arguments=':"x"}')}],
    )
    assert out == [
        [ToolCallStarted("call_A", "add")],
        [ToolArgumentsDelta("call_A", '{"a"')],
        [ToolCallStarted("call_B", "echo"), ToolArgumentsDelta("call_B", '{"t"'), ToolArgumentsDelta("call_A", ":1}")],
        [ToolArgumentsDelta("call_B", ':"x"}')],
    ]


def test_a_call_whole_in_the_read_that_finishes_is_not_announced() -> None:
    """Started and finished in one network read (a tool round answered at
    once): no live progress for it, the call comes whole; one that started in
    an earlier read keeps its progress."""
    normalizer = ChatNormalizer(counter_ids())
    first = normalizer.feed_read([RawChunk(fragments({"index": 0, "id": "call_A", "function": fn("add", '{"a"')}))])
    last = normalizer.feed_read(
        [
            RawChunk(fragments({"index": 0, "function": fn(arguments=":1}")}, {"index": 1, "id": "call_B", "function": fn("echo", "{}")})),
            RawChunk(chunk(finish_reason="tool_calls")),
        ]
    )
    assert first == [ToolCallStarted("call_A", "add"), ToolArgumentsDelta("call_A", '{"a"')]
    assert last == [ToolArgumentsDelta("call_A", ":1}")]
    assert [c.call_id for c in tool_calls_of(normalizer.finish())] == ["call_A", "call_B"]


def test_arguments_before_the_name_come_right_after_the_start() -> None:
    out = fed([{"index": 0, "id": "call_A", "function": fn(arguments='{"a"')}], [{"index": 0, "function": fn("add", ":1}")}])
    assert out == [[], [ToolCallStarted("call_A", "add"), ToolArgumentsDelta("call_A", '{"a":1}')]]


def fn(name: str | None = None, arguments: Any = None) -> dict[str, Any]:
    f: dict[str, Any] = {}
    if name is not None:
        f["name"] = name
    if arguments is not None:
        f["arguments"] = arguments
    return f


def test_q1_fragment_without_index_or_id_continues_the_last_call() -> None:
    calls, _ = accumulate(
        [{"index": 0, "id": "call_A", "function": fn("add", '{"a":')}],
        [{"function": fn(arguments="1}")}],
    )
    assert calls == [call("call_A", "add", '{"a":1}')]


def test_q1_fragment_without_index_finds_its_call_by_id() -> None:
    calls, _ = accumulate(
        [{"id": "call_A", "function": fn("add", "{")}, {"id": "call_B", "function": fn("echo", "{")}],
        [{"id": "call_A", "function": fn(arguments="}")}, {"id": "call_B", "function": fn(arguments='"q":1}')}],
    )
    assert calls == [call("call_A", "add", "{}"), call("call_B", "echo", '{"q":1}')]


def test_q1_first_fragment_without_anything_starts_a_call() -> None:
    calls, started = accumulate([{"function": fn("add", "{}")}])
    assert calls == [call("<call_1>", "add", "{}")]
    assert started == [ToolCallStarted("<call_1>", "add")]


def test_q1_call_started_without_index_is_continued_by_indexed_fragments() -> None:
    calls, _ = accumulate(
        [{"id": "call_A", "function": fn("add", '{"a"')}],
        [{"index": 0, "function": fn(arguments=":1}")}],
    )
    assert calls == [call("call_A", "add", '{"a":1}')]


def test_q2_same_id_repeated_in_every_fragment_is_one_call() -> None:
    calls, started = accumulate(
        [{"index": 0, "id": "call_A", "function": fn("add", '{"a"')}],
        [{"index": 0, "id": "call_A", "function": fn("add", ":1}")}],
    )
    assert calls == [call("call_A", "add", '{"a":1}')]
    assert started == [ToolCallStarted("call_A", "add")]


def test_q2_different_id_without_name_is_a_continuation() -> None:
    # Recorded as "later_id_ignored"; a fragment without a name cannot start
    # a usable call.
    calls, _ = accumulate(
        [{"index": 0, "id": "call_A", "function": fn("add", "{")}],
        [{"index": 0, "id": "call_OTHER", "function": fn(arguments="}")}],
    )
    assert calls == [call("call_A", "add", "{}")]


def test_q2_second_call_at_index_zero_then_continues_the_new_call() -> None:
    calls, _ = accumulate(
        [{"index": 0, "id": "call_A", "function": fn("add", "{}")}],
        [{"index": 0, "id": "call_B", "function": fn("echo", '{"q"')}],
        [{"index": 0, "function": fn(arguments=':"x"}')}],
    )
    assert calls == [call("call_A", "add", "{}"), call("call_B", "echo", '{"q":"x"}')]


def test_name_arriving_after_the_first_fragment_is_taken() -> None:
    calls, started = accumulate(
        [{"index": 0, "id": "call_A", "function": fn(arguments="{")}],
        [{"index": 0, "function": fn("add", "}")}],
    )
    assert calls == [call("call_A", "add", "{}")]
    assert started == [ToolCallStarted("call_A", "add")]


def test_parallel_calls_sharing_a_provider_id_get_distinct_ids() -> None:
    calls, _ = accumulate(
        [
            {"index": 0, "id": "call_0", "function": fn("a", "{}")},
            {"index": 1, "id": "call_0", "function": fn("b", "{}")},
        ],
    )
    assert calls == [call("call_0", "a", "{}"), call("<call_1>", "b", "{}", provider_id="call_0")]


def test_reserved_ids_are_not_reused() -> None:
    """Providers that restart ids every round: an id used earlier in the turn is replaced."""
    calls, started = accumulate([{"index": 0, "id": "call_0", "function": fn("a", "{}")}], reserved_ids=["call_0"])
    assert calls == [call("<call_1>", "a", "{}", provider_id="call_0")]
    assert started == [ToolCallStarted("<call_1>", "a")]


def test_object_arguments_in_several_fragments_are_serialized_and_joined() -> None:
    calls, _ = accumulate(
        [{"index": 0, "id": "c", "function": fn("f", None)}],
        [{"index": 0, "function": {"arguments": None}}],
        [{"index": 0, "function": fn(arguments={"a": 1})}],
    )
    assert calls == [call("c", "f", '{"a": 1}')]


def test_malformed_fragments_do_not_crash() -> None:
    malformed: list[Any] = ["x", None, {"index": 0, "function": "nope"}, {"index": True, "id": 5}]  # what a broken upstream sends
    calls, _ = accumulate(malformed)
    # Both dict fragments are kept: one call at index 0, and the bool "index"
    # counts as no index, so it continues the last call. It never got a name,
    # so it is dropped (with a warning: test_a_call_without_a_name_*).
    assert calls == []


def test_q4_glued_call_is_replaced_by_its_pieces() -> None:
    calls, started = accumulate([{"index": 0, "id": "call_A", "function": fn("search", '{"q":"A"}{"q":"B"}')}])
    assert calls == [call("<call_1>", "search", '{"q":"A"}'), call("<call_2>", "search", '{"q":"B"}')]
    assert all(c.call_id != "call_A" for c in calls)
    assert started == [ToolCallStarted("call_A", "search")]  # live progress only


def test_finish_is_stable() -> None:
    acc = ChatToolCalls(counter_ids())
    acc.feed([{"index": 0, "function": fn("f", "1 2")}])
    first = acc.finish()
    assert acc.finish() == first == [call("<call_2>", "f", "1"), call("<call_3>", "f", "2")]
    with pytest.raises(RuntimeError):
        acc.feed([])


# --------------------------------------------------------------------------
# ChatNormalizer
# --------------------------------------------------------------------------


def test_chat_reasoning_then_text_in_one_chunk() -> None:
    events = ChatNormalizer(counter_ids()).feed(chunk({"reasoning_content": "hmm", "content": "Hi"}))
    assert events == [ReasoningDelta("hmm"), TextDelta("Hi")]


def test_chat_full_stream() -> None:
    chunks = [
        chunk({"role": "assistant", "content": ""}, id="chatcmpl-9"),
        chunk({"reasoning": "Let me think."}, id="chatcmpl-9"),
        chunk({"content": "Sure"}, id="chatcmpl-9"),
        chunk({"content": "."}, id="chatcmpl-9"),
        chunk(None, "stop", id="chatcmpl-9"),
        {"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}},
        "[DONE]",
    ]
    assert run_chat(chunks) == [
        ReasoningDelta("Let me think."),
        TextDelta("Sure"),
        TextDelta("."),
        UsageReport({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}),
        Finished(
            reason="stop",
            response_id="chatcmpl-9",
            usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        ),
    ]


def test_chat_error_chunk_is_a_warning_and_the_stream_goes_on() -> None:
    error = {"message": "upstream hiccup", "code": 500}
    events = run_chat([chunk({"content": "a"}), {"error": error}, chunk({"content": "b"}, "stop")])
    assert events == [
        TextDelta("a"),
        StreamWarning("upstream hiccup", raw=error),
        TextDelta("b"),
        Finished(reason="stop", response_id="chatcmpl-1"),
    ]


def test_chat_tool_calls_reason_without_calls_is_kept() -> None:
    assert run_chat([chunk(None, "tool_calls")]) == [Finished(reason="tool_calls", response_id="chatcmpl-1")]


def test_chat_without_finish_reason() -> None:
    assert run_chat([chunk({"content": "x"})]) == [TextDelta("x"), Finished(reason=None, response_id="chatcmpl-1")]


def test_chat_llama_cpp_timings_become_usage() -> None:
    events = run_chat([{**chunk(None, "stop"), "timings": {"prompt_n": 4, "predicted_n": 2}}])
    assert events[0] == UsageReport({"prompt_n": 4, "predicted_n": 2})
    assert events[-1].usage == {"prompt_n": 4, "predicted_n": 2}


def test_chat_started_ids_match_final_ids() -> None:
    chunks = [
        fragments({"index": 0, "function": fn("a", "{}")}, {"index": 1, "id": "call_B", "function": fn("b", "")}),
        fragments({"index": 1, "function": fn(arguments="{}")}),
        chunk(None, "tool_calls"),
    ]
    events = run_chat(chunks)
    started = [(e.call_id, e.name) for e in events if isinstance(e, ToolCallStarted)]
    assert started == [(c.call_id, c.name) for c in tool_calls_of(events)] == [("<call_1>", "a"), ("call_B", "b")]


def test_chat_is_deterministic() -> None:
    vector = ACC_BY_NAME["same_index_two_calls_BUG"]["input"]["sse_data_chunks"]
    assert run_chat(vector) == run_chat(vector)


def test_chat_does_not_modify_its_input() -> None:
    chunks = [copy.deepcopy(c) for c in ACC_BY_NAME["non_string_arguments"]["input"]["sse_data_chunks"]]
    before = copy.deepcopy(chunks)
    run_chat(chunks)
    assert chunks == before


def test_chat_feed_after_finish_raises() -> None:
    normalizer = ChatNormalizer(counter_ids())
    normalizer.finish()
    assert normalizer.finish() == []
    with pytest.raises(RuntimeError):
        normalizer.feed(chunk({"content": "x"}))


# --------------------------------------------------------------------------
# ResponsesNormalizer
# --------------------------------------------------------------------------


def run_responses(events: Iterable[Any], *, arguments: bool = False) -> list[Any]:
    normalizer = ResponsesNormalizer(counter_ids())
    out: list[Any] = []
    for event in events:
        out += normalizer.feed(event)
    return _without_fragments(out + normalizer.finish(), arguments)


def test_responses_argument_deltas_stream_between_start_and_call() -> None:
    events = run_responses(FULL_STREAM, arguments=True)
    started = events.index(ToolCallStarted("call_Kx1", "get_weather", "fc_68a1"))
    done = next(i for i, e in enumerate(events) if isinstance(e, ToolCall))
    fragments = [e for e in events if isinstance(e, ToolArgumentsDelta)]
    assert len(fragments) > 1 and all(f.call_id == "call_Kx1" for f in fragments)
    assert "".join(f.text for f in fragments) == events[done].arguments
    assert events[started + 1 : done] == fragments


def test_responses_full_stream() -> None:
    assert run_responses(FULL_STREAM) == [
        ResponseStarted("resp_68a"),
        TextDelta("Let"),
        TextDelta(" me"),
        TextDelta(" check"),
        TextDelta(" the"),
        TextDelta(" weather"),
        TextDelta("."),
        ToolCallStarted("call_Kx1", "get_weather", "fc_68a1"),
        ToolCall("call_Kx1", "get_weather", '{"city":"Paris"}', item_id="fc_68a1"),
        Finished(reason="tool_calls", response_id="resp_68a", usage=USAGE, status="completed"),
    ]


def test_responses_text_only_finishes_with_stop() -> None:
    events = run_responses(
        [
            {"type": "response.created", "response": {"id": "resp_1"}},
            {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "Hi"},
            {"type": "response.completed", "response": {"id": "resp_1", "output": [], "usage": None}},
        ]
    )
    assert events == [
        ResponseStarted("resp_1"),
        TextDelta("Hi"),
        Finished(reason="stop", response_id="resp_1", usage=None, status="completed"),
    ]


REASONING_ITEM: JsonObject = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "**Plan**"}, {"type": "summary_text", "text": "**Check**"}],
    "encrypted_content": "gAAAAB-opaque",
    "status": "completed",
}


def test_responses_reasoning_summary_parts_and_provider_item() -> None:
    def summary_delta(index: int, delta: str) -> dict[str, Any]:
        return {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": index,
            "delta": delta,
        }

    summary = [
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1"}},
        {"type": "response.reasoning_summary_part.added", "output_index": 0, "summary_index": 0, "part": {}},
        summary_delta(0, "**Pl"),
        summary_delta(0, "an**"),
        summary_delta(1, "**Check**"),
        {"type": "response.output_item.done", "output_index": 0, "item": REASONING_ITEM},
    ]
    events = run_responses(summary)
    assert events[:-1] == [
        ReasoningDelta("**Pl"),
        ReasoningDelta("an**"),
        ReasoningDelta("\n\n**Check**"),
        ProviderItem(REASONING_ITEM),
    ]
    assert events[-1] == Finished(reason=None, response_id=None, usage=None, status=None)
    assert events[3].item is not REASONING_ITEM


def test_responses_reasoning_text_delta() -> None:
    event = {"type": "response.reasoning_text.delta", "item_id": "rs_1", "output_index": 0, "delta": "x"}
    assert ResponsesNormalizer(counter_ids()).feed(event) == [ReasoningDelta("x")]


def test_responses_refusal_is_visible_text() -> None:
    event = {"type": "response.refusal.delta", "output_index": 0, "content_index": 0, "delta": "I can't help."}
    assert ResponsesNormalizer(counter_ids()).feed(event) == [TextDelta("I can't help.")]


def test_responses_started_once() -> None:
    normalizer = ResponsesNormalizer(counter_ids())
    assert normalizer.feed({"type": "response.created", "response": {"id": "r"}}) == [ResponseStarted("r")]
    assert normalizer.feed({"type": "response.in_progress", "response": {"id": "r"}}) == []


def _fc_added(index: int, item_id: str, call_id: str, name: str) -> dict[str, Any]:
    item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": ""}
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def _args_delta(index: int, item_id: str | None, delta: str) -> dict[str, Any]:
    event = {"type": "response.function_call_arguments.delta", "output_index": index, "delta": delta}
    if item_id:
        event["item_id"] = item_id
    return event


def test_responses_calls_without_output_item_done_are_emitted_by_finish() -> None:
    events = run_responses(
        [
            _fc_added(0, "fc_1", "call_1", "add"),
            _args_delta(0, "fc_1", '{"a":'),
            _args_delta(0, "fc_1", "1}"),
            _fc_added(1, "fc_2", "call_2", "echo"),
            _args_delta(1, None, '{"q":'),  # addressed by output_index only
            {"type": "response.function_call_arguments.done", "output_index": 1, "arguments": '{"q":"x"}'},
        ]
    )
    assert events == [
        ToolCallStarted("call_1", "add", "fc_1"),
        ToolCallStarted("call_2", "echo", "fc_2"),
        ToolCall("call_1", "add", '{"a":1}', item_id="fc_1"),
        ToolCall("call_2", "echo", '{"q":"x"}', item_id="fc_2"),
        Finished(reason="tool_calls", response_id=None, usage=None, status=None),
    ]


def test_responses_completed_flushes_pending_calls_before_finished() -> None:
    events = run_responses(
        [
            {"type": "response.created", "response": {"id": "resp_1"}},
            _fc_added(0, "fc_1", "call_1", "add"),
            _args_delta(0, "fc_1", "{}"),
            {"type": "response.completed", "response": {"id": "resp_1", "output": []}},
        ]
    )
    assert events == [
        ResponseStarted("resp_1"),
        ToolCallStarted("call_1", "add", "fc_1"),
        ToolCall("call_1", "add", "{}", item_id="fc_1"),
        Finished(reason="tool_calls", response_id="resp_1", usage=None, status="completed"),
    ]


def test_responses_completed_emits_calls_only_in_the_final_output() -> None:
    final_call = {"type": "function_call", "id": "fc_7", "call_id": "call_7", "name": "f", "arguments": {"x": 1}}
    events = run_responses([{"type": "response.completed", "response": {"id": "r", "output": [final_call], "usage": {"input_tokens": 1}}}])
    assert events == [
        ToolCall("call_7", "f", '{"x": 1}', item_id="fc_7"),
        Finished(reason="tool_calls", response_id="r", usage={"input_tokens": 1}, status="completed"),
    ]


def test_responses_each_call_is_emitted_once() -> None:
    done = {"type": "response.output_item.done", "output_index": 0, "item": {**FULL_STREAM[-2]["item"]}}
    events = run_responses([done, done, FULL_STREAM[-1]])
    assert tool_calls_of(events) == [ToolCall("call_Kx1", "get_weather", '{"city":"Paris"}', item_id="fc_68a1")]


def test_responses_incomplete() -> None:
    events = run_responses(
        [
            {"type": "response.created", "response": {"id": "resp_2"}},
            _fc_added(0, "fc_1", "call_1", "add"),
            _args_delta(0, "fc_1", '{"a":'),
            {
                "type": "response.incomplete",
                "response": {
                    "id": "resp_2",
                    "incomplete_details": {"reason": "max_output_tokens"},
                    "usage": {"input_tokens": 3, "output_tokens": 16},
                },
            },
        ]
    )
    # The cut-off call is not emitted: its arguments are truncated.
    assert events == [
        ResponseStarted("resp_2"),
        ToolCallStarted("call_1", "add", "fc_1"),
        Finished(
            reason="length",
            response_id="resp_2",
            usage={"input_tokens": 3, "output_tokens": 16},
            status="incomplete",
        ),
    ]


@pytest.mark.parametrize(
    ("details", "reason"),
    [({"reason": "content_filter"}, "content_filter"), ({"reason": "other"}, "other"), (None, "length")],
)
def test_responses_incomplete_reasons(details: Any, reason: str) -> None:
    events = run_responses([{"type": "response.incomplete", "response": {"incomplete_details": details}}])
    assert events == [Finished(reason=reason, status="incomplete")]


def test_responses_failed() -> None:
    error: JsonObject = {"code": "server_error", "message": "boom"}
    events = run_responses(
        [
            {"type": "response.output_text.delta", "output_index": 0, "delta": "Hel"},
            {"type": "response.failed", "response": {"id": "r", "error": error}},
            {"type": "response.output_text.delta", "output_index": 0, "delta": "ignored"},
        ]
    )
    assert events == [TextDelta("Hel"), StreamFailed("boom", code="server_error", details=error)]


def test_responses_failed_without_error() -> None:
    assert run_responses([{"type": "response.failed", "response": {}}]) == [StreamFailed("The response failed.")]


def test_responses_error_event() -> None:
    event: JsonObject = {"type": "error", "code": "rate_limit", "message": "slow", "sequence_number": 3}
    assert run_responses([event]) == [StreamFailed("slow", code="rate_limit", details=event)]


@pytest.mark.parametrize(
    "event",
    [
        {"type": "response.web_search_call.searching", "output_index": 0},
        {"type": "response.output_text.annotation.added", "output_index": 0},
        {"type": "response.content_part.added", "output_index": 0, "part": {}},
        {"type": "response.output_text.done", "output_index": 0, "text": "x"},
        {"type": "response.output_item.done", "output_index": 0, "item": {"type": "message", "id": "m"}},
        {"type": "response.brand_new_event"},
        {"type": None},
        "not an event",
    ],
)
def test_responses_unknown_and_structural_events_emit_nothing(event: Any) -> None:
    assert ResponsesNormalizer(counter_ids()).feed(event) == []


def test_responses_call_without_call_id_gets_a_factory_id() -> None:
    item = {"type": "function_call", "id": "fc_1", "name": "f", "arguments": "{}"}
    events = run_responses([{"type": "response.output_item.done", "output_index": 0, "item": item}])
    assert events[0] == ToolCall("<call_1>", "f", "{}", item_id="fc_1")


def test_responses_is_deterministic_and_pure() -> None:
    stream = copy.deepcopy(FULL_STREAM)
    assert run_responses(stream) == run_responses(stream)
    assert stream == FULL_STREAM


@pytest.mark.parametrize("event", [None, "x", {}, {"type": 3}, {"type": "response.output_item.added", "item": {}}])
def test_responses_malformed_events_are_ignored(event: Any) -> None:
    assert ResponsesNormalizer(counter_ids()).feed(event) == []


# --------------------------------------------------------------------------
# responses_stream_fold.json through the production path
# --------------------------------------------------------------------------
# Open WebUI builds its output items by folding every Responses event; the vectors record that fold. turnlog's production path is
# ResponsesNormalizer → model events → the turn's fold, so each vector is
# replayed here as events: what the recorded output says about text, reasoning,
# calls, outcome, usage and the response id must come out as model events.
# ``prelude`` rebuilds the vector's ``current_output`` from events; ``after``
# continues the stream where the fold's answer shows only at the end.

FOLD_VECTORS = load_vectors("responses_stream_fold.json")
END = Finished(reason=None, response_id=None, usage=None, status=None)  # a stream with no terminal event


def _text_delta(delta: str, index: int = 0) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "output_index": index, "content_index": 0, "delta": delta}


def _message(text: str, item_id: str = "msg_1") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": item_id, "status": "completed", "role": "assistant", "content": [part]}


def _completed_with(output: list[dict[str, Any]], **response: Any) -> dict[str, Any]:
    return {"type": "response.completed", "response": {"id": "resp_1", "output": output, **response}}


_FC_PARTIAL = [_fc_added(0, "fc_1", "call_1", "add"), _args_delta(0, "fc_1", '{"a":')]
_FC_DONE = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add", "arguments": "{}"}

#: vector name → (prelude, after, the events of the vector's event(s) + after + finish()).
FOLD_PORTS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]]] = {
    # Structure events say nothing by themselves: text comes from deltas,
    # reasoning items and calls from their done events.
    "output_item_added_appends": ([], [], [END]),
    "output_item_added_inserts_at_index": ([], [], [END]),
    "output_item_added_empty_item_ignored": ([], [], [END]),
    "content_part_added": ([], [], [END]),
    "content_part_added_ignored_for_reasoning": ([], [], [END]),
    # The same item announced again is the same call, not a second one.
    "output_item_added_replaces_same_id": (
        [{"type": "response.output_item.added", "output_index": 0, "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "arguments": "x"}}],
        [{"type": "response.output_item.done", "output_index": 0, "item": _FC_DONE}],
        [ToolCall("call_1", "add", "{}", item_id="fc_1"), Finished(reason="tool_calls", status=None)],
    ),
    "output_text_delta_appends": ([_text_delta("Hel")], [], [TextDelta("lo"), END]),
    # Open WebUI's padding parts typed "text" (lost on replay) cannot happen: text is
    # never stored in a part here, so the text is simply kept.
    "output_text_delta_without_part_creates_text_part": ([], [], [TextDelta("Hi"), END]),
    "delta_beyond_end_creates_item": ([], [], [TextDelta("x"), END]),
    "reasoning_text_delta_on_reasoning": ([], [], [ReasoningDelta("think"), END]),
    "reasoning_summary_text_delta": ([], [], [ReasoningDelta("Sum"), END]),
    # Deliberately different: Open WebUI drops a delta aimed at an item of the
    # other kind; the delta's own type says what it is, so it is kept.
    "reasoning_delta_on_message_ignored": ([_text_delta("Hel")], [], [ReasoningDelta("x"), END]),
    "text_delta_on_reasoning_ignored": ([], [], [TextDelta("x"), END]),
    "function_call_arguments_delta": (_FC_PARTIAL, [], [ToolCall("call_1", "add", '{"a":1}', item_id="fc_1"), Finished(reason="tool_calls", status=None)]),
    "function_call_arguments_done": (_FC_PARTIAL, [], [ToolCall("call_1", "add", '{"a":1}', item_id="fc_1"), Finished(reason="tool_calls", status=None)]),
    "output_item_done_replaces": (_FC_PARTIAL, [], [ToolCall("call_1", "add", '{"a":1}', item_id="fc_1"), Finished(reason="tool_calls", status=None)]),
    # The final text wins: the part of it never streamed arrives with the final output.
    "output_text_done_overwrites_part": (
        [_text_delta("Hel")],
        [_completed_with([_message("Hello")])],
        [TextDelta("lo"), Finished(reason="stop", response_id="resp_1", status="completed")],
    ),
    # The final reasoning text is not copied: the streamed text stands.
    "reasoning_text_done_marks_completed": ([{"type": "response.reasoning_text.delta", "output_index": 0, "content_index": 0, "delta": "a"}], [], [END]),
    "output_item_done_out_of_range_appends": ([], [], [END]),  # a message without text
    # The provider's final output wins: its reasoning item is kept for replay.
    "completed_with_output_replaces_all": (
        [],
        [],
        [
            ProviderItem({"type": "reasoning", "id": "r"}),
            Finished(reason="stop", response_id="resp_1", usage={"input_tokens": 3, "output_tokens": 2}, status="completed"),
        ],
    ),
    "completed_with_empty_output_keeps_streamed": ([_text_delta("x")], [], [Finished(reason="stop", response_id="resp_2", usage=None, status="completed")]),
    # The failure is reported as one (Open WebUI: meta without a status).
    "failed": ([_text_delta("Hel")], [], [StreamFailed("boom", code="server_error", details={"code": "server_error", "message": "boom"})]),
    "error_event": ([], [], [StreamFailed("slow", code="rate_limit", details={"type": "error", "code": "rate_limit", "message": "slow"})]),
    "in_progress_and_unknown_ignored": ([_text_delta("Hel")], [], [END]),
    # response.incomplete ends the response with its reason (Open WebUI ignored it).
    "incomplete_not_handled": ([_text_delta("Hel")], [], [Finished(reason="length", status="incomplete")]),
    "sequence_reasoning_message_function_call": (
        [],
        [],
        [
            ResponseStarted("resp_1"),
            ReasoningDelta("Thi"),
            ReasoningDelta("nk"),
            TextDelta("Let me "),
            TextDelta("add."),
            ToolCallStarted("call_1", "add", "fc_1"),
            ToolCall("call_1", "add", '{"a":1,"b":2}', item_id="fc_1"),
            Finished(reason="tool_calls", response_id="resp_1", status=None),
        ],
    ),
}


def test_every_fold_vector_is_ported() -> None:
    assert set(FOLD_PORTS) == {v["name"] for v in FOLD_VECTORS}


@pytest.mark.parametrize("vector", FOLD_VECTORS, ids=lambda v: v["name"])
def test_fold_vector_through_the_normalizer(vector: dict[str, Any]) -> None:
    prelude, after, expected = FOLD_PORTS[vector["name"]]
    given = vector["input"]
    stream = given["events"] if "events" in given else [given["event"]]
    normalizer = ResponsesNormalizer(counter_ids())
    for event in prelude:
        normalizer.feed(event)
    events: list[Any] = []
    for event in [*copy.deepcopy(stream), *after]:
        events += normalizer.feed(event)
    assert _without_fragments(events + normalizer.finish(), False) == expected


# -- the final output against the stream ---------------------------------------------


def test_responses_text_only_in_the_final_output() -> None:
    """A server that streams no text deltas: the answer is in the final output
    (before, the turn completed with an empty answer)."""
    events = run_responses([_completed_with([_message("Hel"), _message("lo", "msg_2")], usage={"input_tokens": 1})])
    assert events == [
        TextDelta("Hello"),
        Finished(reason="stop", response_id="resp_1", usage={"input_tokens": 1}, status="completed"),
    ]


def test_responses_text_only_in_done_events_is_taken_from_the_final_output() -> None:
    events = run_responses(
        [
            {"type": "response.output_text.done", "output_index": 0, "content_index": 0, "text": "Hi!"},
            {"type": "response.output_item.done", "output_index": 0, "item": _message("Hi!")},
            _completed_with([_message("Hi!")]),
        ]
    )
    assert events == [TextDelta("Hi!"), Finished(reason="stop", response_id="resp_1", status="completed")]


def test_responses_refusal_in_the_final_output() -> None:
    refusal = {"type": "message", "id": "m", "content": [{"type": "refusal", "refusal": "I can't help."}]}
    events = run_responses([{"type": "response.refusal.delta", "output_index": 0, "delta": "I can"}, _completed_with([refusal])])
    assert events[:2] == [TextDelta("I can"), TextDelta("'t help.")]


def test_responses_final_text_equal_to_the_stream_adds_nothing() -> None:
    events = run_responses([_text_delta("Hel"), _text_delta("lo"), _completed_with([_message("Hello")])])
    assert events == [TextDelta("Hel"), TextDelta("lo"), Finished(reason="stop", response_id="resp_1", status="completed")]


def test_responses_final_text_that_contradicts_the_stream_is_a_warning() -> None:
    events = run_responses([_text_delta("Hello"), _completed_with([_message("Goodbye")])])
    assert events[0] == TextDelta("Hello")
    assert isinstance(events[1], StreamWarning) and events[1].raw == "Goodbye"
    assert events[2] == Finished(reason="stop", response_id="resp_1", status="completed")


def test_responses_incomplete_takes_the_rest_of_the_text_from_its_output() -> None:
    event = {
        "type": "response.incomplete",
        "response": {
            "id": "resp_9",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{**_message("Hello"), "status": "incomplete"}],
            "usage": {"input_tokens": 5, "output_tokens": 16},
        },
    }
    assert run_responses([_text_delta("Hel"), event]) == [
        TextDelta("Hel"),
        TextDelta("lo"),
        Finished(reason="length", response_id="resp_9", usage={"input_tokens": 5, "output_tokens": 16}, status="incomplete"),
    ]


def test_responses_reasoning_item_is_sent_once_even_when_renumbered() -> None:
    """Sent at its done event; the final output lists it again (same id, or a
    provider that renumbers ids: same position): not sent twice."""
    first: JsonObject = {"type": "reasoning", "id": "rs_a", "summary": []}
    done = {"type": "response.output_item.done", "output_index": 0, "item": first}
    for again in (first, {**first, "id": "rs_b"}):
        events = run_responses([done, _completed_with([again, _message("x")])])
        assert [e for e in events if isinstance(e, ProviderItem)] == [ProviderItem(first)]


def test_responses_reasoning_item_only_in_the_final_output_is_kept() -> None:
    item: JsonObject = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
    events = run_responses([_text_delta("x", 1), _completed_with([item, _message("x")])])
    assert events == [
        TextDelta("x"),
        ProviderItem(item),
        Finished(reason="stop", response_id="resp_1", status="completed"),
    ]


def test_responses_final_output_call_found_by_call_id() -> None:
    """A call streamed without an item id is the final output's call with the
    same call_id (one ToolCall, with the final item id and arguments)."""
    added = {"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}}
    final_call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"}
    events = run_responses([_text_delta("x"), added, _args_delta(1, None, "{"), _completed_with([_message("x"), final_call])])
    assert events == [
        TextDelta("x"),
        ToolCallStarted("call_1", "f"),
        ToolCall("call_1", "f", "{}", item_id="fc_1"),
        Finished(reason="tool_calls", response_id="resp_1", status="completed"),
    ]


def test_responses_full_stream_with_empty_final_output_gives_the_same_events() -> None:
    stream = copy.deepcopy(FULL_STREAM)
    stream[-1]["response"]["output"] = []
    assert run_responses(stream) == run_responses(FULL_STREAM)


def test_responses_full_stream_final_message_matches_the_stream() -> None:
    text = "".join(e.text for e in run_responses(FULL_STREAM) if isinstance(e, TextDelta))
    assert text == MSG_ITEM_DONE["content"][0]["text"]


# --------------------------------------------------------------------------
# OllamaNormalizer
# --------------------------------------------------------------------------


def _ollama_line(created_at: str, **message: Any) -> dict[str, Any]:
    return {
        "model": "qwen3:8b",
        "created_at": created_at,
        "message": {"role": "assistant", "content": "", **message},
        "done": False,
    }


OLLAMA_STREAM: list[dict[str, Any]] = [
    _ollama_line("2025-06-01T10:00:00Z", thinking="The user"),
    _ollama_line("2025-06-01T10:00:00Z", thinking=" wants weather."),
    _ollama_line("2025-06-01T10:00:01Z", content="Checking."),
    {
        "model": "qwen3:8b",
        "created_at": "2025-06-01T10:00:01Z",
        "message": {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
                {"function": {"index": 1, "name": "get_time", "arguments": {"tz": "Europe/Paris"}}},
            ],
        },
        "done": False,
    },
    {
        "model": "qwen3:8b",
        "created_at": "2025-06-01T10:00:02Z",
        "message": {"role": "assistant", "content": ""},
        "done_reason": "stop",
        "done": True,
        "total_duration": 4883583458,
        "load_duration": 1334875,
        "prompt_eval_count": 26,
        "prompt_eval_duration": 342546000,
        "eval_count": 28,
        "eval_duration": 4535599000,
    },
]


def run_ollama(lines: Iterable[Any], **kwargs: Any) -> list[Any]:
    normalizer = OllamaNormalizer(counter_ids(), **kwargs)
    out: list[Any] = []
    for line in lines:
        out += normalizer.feed(line)
    return out + normalizer.finish()


@pytest.mark.parametrize("api", ["responses", "ollama"])
def test_a_read_fed_whole_means_its_payloads_fed_one_by_one_with_warnings_in_place(api: str) -> None:
    """``feed_read`` of the normalizers that take one payload at a time: the
    same events as ``feed`` per payload, a line that was not JSON as a
    ``StreamWarning`` where it stood; a run of Chat Completions chunks is
    refused, not misread."""
    make = ResponsesNormalizer if api == "responses" else OllamaNormalizer
    payloads = [copy.deepcopy(p) for p in (FULL_STREAM if api == "responses" else OLLAMA_STREAM)]
    one, whole = make(counter_ids()), make(counter_ids())
    expected: list[Any] = []
    for payload in payloads[:2]:
        expected += one.feed(payload)
    expected.append(StreamWarning("not JSON", "data: {"))
    for payload in payloads[2:]:
        expected += one.feed(payload)
    read: list[RawChunk | RawWarning | RawRun] = [RawChunk(p) for p in payloads]
    read.insert(2, RawWarning("not JSON", "data: {"))
    assert whole.feed_read(read) == expected
    assert whole.finish() == one.finish()
    assert any(isinstance(e, StreamWarning) for e in expected) and len(expected) > 3
    with pytest.raises(TypeError, match="runs"):
        make(counter_ids()).feed_read([RawRun({"choices": [{"index": 0, "delta": {}}]}, ["a"])])


def test_ollama_stream_with_tool_calls() -> None:
    assert run_ollama(OLLAMA_STREAM) == [
        ReasoningDelta("The user"),
        ReasoningDelta(" wants weather."),
        TextDelta("Checking."),
        call("<call_1>", "get_weather", '{"city": "Paris", "unit": "celsius"}'),
        call("<call_2>", "get_time", '{"tz": "Europe/Paris"}'),
        Finished(reason="tool_calls", usage={"prompt_tokens": 26, "completion_tokens": 28, "total_tokens": 54}),
    ]


def test_ollama_text_only_done_reasons() -> None:
    lines = [
        {"message": {"role": "assistant", "content": "Hi"}, "done": False},
        {"message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "length", "eval_count": 4},
    ]
    assert run_ollama(lines) == [
        TextDelta("Hi"),
        Finished(reason="length", usage={"prompt_tokens": 0, "completion_tokens": 4, "total_tokens": 4}),
    ]
    assert run_ollama([{"done": True}]) == [Finished(reason="stop", usage=None)]


def test_ollama_provider_ids_are_used_when_new() -> None:
    line = {
        "message": {
            "tool_calls": [
                {"id": "call_x", "function": {"name": "a", "arguments": {}}},
                {"id": "call_x", "function": {"name": "b", "arguments": "{}"}},
            ]
        },
        "done": True,
    }
    assert tool_calls_of(run_ollama([line])) == [call("call_x", "a", "{}"), call("<call_1>", "b", "{}", provider_id="call_x")]


def test_ollama_error() -> None:
    lines = [{"message": {"content": "a"}}, {"error": "model 'x' not found"}, {"message": {"content": "b"}}]
    events = run_ollama(lines)
    assert events == [TextDelta("a"), StreamFailed("model 'x' not found", details={"error": "model 'x' not found"})]


def test_ollama_stream_that_never_says_done() -> None:
    assert run_ollama([{"message": {"content": "a"}}]) == [TextDelta("a"), Finished(reason=None, status=None)]


def test_ollama_feed_after_finish_raises() -> None:
    normalizer = OllamaNormalizer(counter_ids())
    normalizer.finish()
    with pytest.raises(RuntimeError):
        normalizer.feed({"done": True})


def test_ollama_call_without_a_name_is_dropped_with_a_warning() -> None:
    line = {"message": {"tool_calls": [{"function": {"name": "", "arguments": {"a": 1}}}]}, "done": True}
    events = run_ollama([line])
    assert tool_calls_of(events) == []
    warnings = [e for e in events if isinstance(e, StreamWarning)]
    assert len(warnings) == 1 and "without a function name" in warnings[0].message and warnings[0].raw == '{"a": 1}'
    assert events[-1] == Finished(reason="stop", usage=None)
