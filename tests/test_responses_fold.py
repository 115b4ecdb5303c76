"""Tests for engine.responses_fold: the Responses API event fold (spec §6.4).

Driven by the vectors recorded from Open WebUI 0.12.4 (copied into
tests/vectors/). Where a vector records a quirk turnlog fixes (spec §15: Q7,
Q20), the test asserts turnlog's behaviour, checks that it differs from the
recording, and names the quirk.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from engine.responses_fold import fold_responses_event
from tests.vectors_util import load_vectors

VECTORS = load_vectors("responses_stream_fold.json")
BY_NAME = {v["name"]: v for v in VECTORS}


def fold(event: dict[str, Any], output: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Any]:
    """Fold, checking purity: neither the event nor the output is modified."""
    event_before, output_before = copy.deepcopy(event), copy.deepcopy(output)
    result = fold_responses_event(event, output)
    assert event == event_before, "the fold modified the event"
    assert output == output_before, "the fold modified the input output list"
    return result


def fold_all(events: list[dict[str, Any]], output: list[dict[str, Any]] | None = None) -> tuple[list, list]:
    current = output if output is not None else []
    metas = []
    for event in events:
        current, meta = fold(event, current)
        metas.append(meta)
    return current, metas


# --------------------------------------------------------------------------
# Vectors
# --------------------------------------------------------------------------

#: Vectors where turnlog deliberately differs from the recording, with why.
DIFFERENT = {
    # Q7: padding parts are output_text, not text.
    "output_text_delta_without_part_creates_text_part": "Q7",
    "delta_beyond_end_creates_item": "Q7",
    "reasoning_text_delta_on_reasoning": "Q7",
    # Q20: failed also says status=failed.
    "failed": "Q20",
    # Q20: incomplete is reported instead of ignored.
    "incomplete_not_handled": "Q20",
}


def _q7(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recording with Q7 fixed: every "text" part becomes "output_text"."""
    output = copy.deepcopy(output)
    for item in output:
        for part in item.get("content") or []:
            if part.get("type") == "text":
                part["type"] = "output_text"
    return output


def test_every_quirk_vector_is_decided() -> None:
    quirky = {v["name"] for v in VECTORS if "quirk" in v["note"].lower() or v["name"].endswith("_BUG")}
    assert quirky <= set(DIFFERENT)


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["name"])
def test_fold_vector(vector: dict[str, Any]) -> None:
    name, given, expected = vector["name"], vector["input"], vector["expected"]

    if "events" in given:  # a whole sequence
        output, metas = fold_all(given["events"])
        assert output == expected["output"]
        assert metas == expected["metadata_per_event"]
        return

    output, meta = fold(given["event"], given["current_output"])
    quirk = DIFFERENT.get(name)
    if quirk is None:
        assert output == expected["output"]
        assert meta == expected["metadata"]
        return

    if quirk == "Q7":
        assert output == _q7(expected["output"])
        assert output != expected["output"]
        assert meta == expected["metadata"]
    elif name == "failed":
        assert output == expected["output"]
        assert meta == {**expected["metadata"], "status": "failed"}
    elif name == "incomplete_not_handled":
        # Q20: Open WebUI ignored it (meta None).
        assert expected["metadata"] is None
        assert output == expected["output"]  # no in_progress items to mark
        assert meta == {
            "status": "incomplete",
            "reason": "max_output_tokens",
            "usage": None,
            "done": True,
            "response_id": None,
        }
    else:  # pragma: no cover - a new DIFFERENT entry needs a branch
        pytest.fail(f"no decision for {name}")


def test_completed_does_not_mutate_provider_output() -> None:
    """Q20: Open WebUI marked reasoning items completed in the event's own list."""
    vector = BY_NAME["completed_with_output_replaces_all"]
    event = copy.deepcopy(vector["input"]["event"])
    output, _ = fold(event, vector["input"]["current_output"])  # fold() checks the event is untouched
    assert event["response"]["output"][0] == {"type": "reasoning", "id": "r"}
    assert output[0] == {"type": "reasoning", "id": "r", "status": "completed"}
    assert output[0] is not event["response"]["output"][0]


# --------------------------------------------------------------------------
# Q20: response.completed keeps streamed items the provider's list lacks
# --------------------------------------------------------------------------


def _reasoning(item_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [{"type": "summary_text", "text": text}], **extra}


def _message(item_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
        **extra,
    }


def _completed(output: list[dict[str, Any]], **response: Any) -> dict[str, Any]:
    return {"type": "response.completed", "response": {"id": "resp_1", "output": output, **response}}


def test_completed_keeps_streamed_item_missing_from_final_list() -> None:
    streamed = [_reasoning("rs_1", "Thinking", status="in_progress"), _message("msg_1", "Hi", status="in_progress")]
    final = [_message("msg_1", "Hi!", status="completed")]
    output, meta = fold(_completed(final, usage={"input_tokens": 1}), streamed)
    assert output == [
        _reasoning("rs_1", "Thinking", status="completed"),
        _message("msg_1", "Hi!", status="completed"),
    ]
    assert meta == {"usage": {"input_tokens": 1}, "done": True, "response_id": "resp_1"}


def test_completed_keeps_streamed_order_around_listed_items() -> None:
    streamed = [
        _message("msg_1", "a"),
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"},
        _message("msg_2", "b"),
    ]
    final = [_message("msg_1", "A"), _message("msg_2", "B")]
    output, _ = fold(_completed(final), streamed)
    assert [item["id"] for item in output] == ["msg_1", "fc_1", "msg_2"]
    assert output[0]["content"][0]["text"] == "A"


def test_completed_matches_renumbered_ids_by_position_and_type() -> None:
    """A provider that renumbers ids in its final list must not get every item twice."""
    streamed = [_reasoning("rs_a", "t"), _message("msg_a", "x")]
    final = [_reasoning("rs_b", "t"), _message("msg_b", "x")]
    output, _ = fold(_completed(final), streamed)
    assert [item["id"] for item in output] == ["rs_b", "msg_b"]


def test_completed_matches_function_calls_by_call_id() -> None:
    streamed = [{"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{"}]
    final = [_message("msg_1", "x"), {"type": "function_call", "id": "fc_1", "call_id": "call_1", "arguments": "{}"}]
    output, _ = fold(_completed(final), streamed)
    assert output == final


def test_completed_drops_blank_unlisted_items() -> None:
    streamed = [{"type": "message", "status": "in_progress", "role": "assistant", "content": []}, _message("m", "x")]
    output, _ = fold(_completed([_message("m", "x")]), streamed)
    assert output == [_message("m", "x")]


def test_completed_marks_in_progress_items_completed() -> None:
    streamed = [_message("m", "x", status="in_progress"), _reasoning("r", "t")]
    output, _ = fold(_completed([]), streamed)
    assert [item["status"] for item in output] == ["completed", "completed"]


def test_completed_with_missing_output_keeps_streamed() -> None:
    streamed = [_message("m", "x")]
    output, meta = fold({"type": "response.completed", "response": {"id": "r"}}, streamed)
    assert output == streamed
    assert meta == {"usage": None, "done": True, "response_id": "r"}


# --------------------------------------------------------------------------
# Q20: incomplete / failed
# --------------------------------------------------------------------------


def test_incomplete_merges_final_output_and_marks_items_incomplete() -> None:
    streamed = [_message("msg_1", "Hel", status="in_progress")]
    event = {
        "type": "response.incomplete",
        "response": {
            "id": "resp_9",
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [_message("msg_1", "Hello", status="in_progress")],
            "usage": {"input_tokens": 5, "output_tokens": 16},
        },
    }
    output, meta = fold(event, streamed)
    assert output == [_message("msg_1", "Hello", status="incomplete")]
    assert meta == {
        "status": "incomplete",
        "reason": "max_output_tokens",
        "usage": {"input_tokens": 5, "output_tokens": 16},
        "done": True,
        "response_id": "resp_9",
    }


def test_failed_marks_in_progress_items_incomplete() -> None:
    streamed = [_message("msg_1", "Hel", status="in_progress"), _reasoning("r", "t", status="completed")]
    event = {
        "type": "response.failed",
        "response": {"id": "resp_3", "error": {"code": "server_error", "message": "boom"}},
    }
    output, meta = fold(event, streamed)
    assert [item["status"] for item in output] == ["incomplete", "completed"]
    assert meta == {"error": {"code": "server_error", "message": "boom"}, "status": "failed", "response_id": "resp_3"}


def test_failed_without_error_still_reports_one() -> None:
    _, meta = fold({"type": "response.failed", "response": {}}, [])
    assert meta == {"error": {"message": "The response failed."}, "status": "failed"}


# --------------------------------------------------------------------------
# Other behaviour
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event_type",
    [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_text.annotation.added",
        "response.web_search_call.searching",
        "response.image_generation_call.partial_image",
        "something.else",
    ],
)
def test_unknown_and_lifecycle_events_change_nothing(event_type: str) -> None:
    output = [_message("m", "x")]
    new, meta = fold({"type": event_type, "response": {"id": "r"}}, output)
    assert new is output
    assert meta is None


@pytest.mark.parametrize("event", [None, "x", {}, {"type": 3}])
def test_malformed_events_are_ignored(event: Any) -> None:
    output: list[dict[str, Any]] = []
    assert fold_responses_event(event, output) == (output, None)


def test_delta_without_output_index_goes_to_last_item_or_creates_one() -> None:
    output, _ = fold({"type": "response.output_text.delta", "delta": "a"}, [])
    part = {"type": "output_text", "text": "a"}
    assert output == [{"type": "message", "status": "in_progress", "role": "assistant", "content": [part]}]
    output, _ = fold({"type": "response.output_text.delta", "delta": "b"}, output)
    assert output[0]["content"][0]["text"] == "ab"


def test_delta_beyond_end_for_function_call_arguments_creates_a_function_call() -> None:
    event = {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "call_9", "delta": "{"}
    output, _ = fold(event, [])
    assert output == [{"type": "function_call", "status": "in_progress", "arguments": "{", "id": "call_9"}]


def test_function_call_arguments_delta_on_message_is_ignored() -> None:
    output = [_message("m", "x")]
    new, meta = fold({"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{"}, output)
    assert new == output
    assert meta is None


def test_output_text_done_creates_a_missing_part() -> None:
    output = [{"type": "message", "id": "m", "content": []}]
    event = {"type": "response.output_text.done", "output_index": 0, "content_index": 0, "text": "Hello"}
    new, meta = fold(event, output)
    assert new == [{"type": "message", "id": "m", "content": [{"type": "output_text", "text": "Hello"}]}]
    assert meta == {}


def test_content_part_done_replaces_the_part() -> None:
    output = [_message("m", "Hel")]
    part = {"type": "output_text", "text": "Hello", "annotations": []}
    event = {"type": "response.content_part.done", "output_index": 0, "content_index": 0, "part": part}
    new, meta = fold(event, output)
    assert new[0]["content"] == [part]
    assert meta == {}


def test_refusal_delta_goes_into_its_own_key() -> None:
    output = [{"type": "message", "id": "m", "content": [{"type": "refusal", "refusal": "I can"}]}]
    event = {"type": "response.refusal.delta", "output_index": 0, "content_index": 0, "delta": "'t."}
    new, _ = fold(event, output)
    assert new[0]["content"] == [{"type": "refusal", "refusal": "I can't."}]


def test_output_item_done_without_item_changes_nothing() -> None:
    output = [_message("m", "x")]
    assert fold({"type": "response.output_item.done", "output_index": 0}, output) == (output, None)


def test_unchanged_items_are_shared_and_changed_ones_copied() -> None:
    first, second = _message("a", "x"), _message("b", "y")
    output = [first, second]
    new, _ = fold({"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": "!"}, output)
    assert new[0] is first
    assert new[1] is not second
    assert second["content"][0]["text"] == "y"


# --------------------------------------------------------------------------
# A realistic full stream (shape of OpenAI's streaming events)
# --------------------------------------------------------------------------

FC_ITEM_DONE = {
    "type": "function_call",
    "id": "fc_68a1",
    "call_id": "call_Kx1",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
    "status": "completed",
}
MSG_ITEM_DONE = {
    "type": "message",
    "id": "msg_68a0",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Let me check the weather.", "annotations": [], "logprobs": []}],
}
USAGE = {
    "input_tokens": 61,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 24,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 85,
}

FULL_STREAM: list[dict[str, Any]] = [
    {
        "type": "response.created",
        "sequence_number": 0,
        "response": {"id": "resp_68a", "object": "response", "status": "in_progress", "output": [], "usage": None},
    },
    {
        "type": "response.in_progress",
        "sequence_number": 1,
        "response": {"id": "resp_68a", "object": "response", "status": "in_progress", "output": []},
    },
    {
        "type": "response.output_item.added",
        "sequence_number": 2,
        "output_index": 0,
        "item": {"type": "message", "id": "msg_68a0", "status": "in_progress", "role": "assistant", "content": []},
    },
    {
        "type": "response.content_part.added",
        "sequence_number": 3,
        "item_id": "msg_68a0",
        "output_index": 0,
        "content_index": 0,
        "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
    },
    *[
        {
            "type": "response.output_text.delta",
            "sequence_number": 4 + n,
            "item_id": "msg_68a0",
            "output_index": 0,
            "content_index": 0,
            "delta": delta,
            "logprobs": [],
        }
        for n, delta in enumerate(["Let", " me", " check", " the", " weather", "."])
    ],
    {
        "type": "response.output_text.done",
        "sequence_number": 10,
        "item_id": "msg_68a0",
        "output_index": 0,
        "content_index": 0,
        "text": "Let me check the weather.",
        "logprobs": [],
    },
    {
        "type": "response.content_part.done",
        "sequence_number": 11,
        "item_id": "msg_68a0",
        "output_index": 0,
        "content_index": 0,
        "part": {"type": "output_text", "text": "Let me check the weather.", "annotations": [], "logprobs": []},
    },
    {"type": "response.output_item.done", "sequence_number": 12, "output_index": 0, "item": MSG_ITEM_DONE},
    {
        "type": "response.output_item.added",
        "sequence_number": 13,
        "output_index": 1,
        "item": {
            "type": "function_call",
            "id": "fc_68a1",
            "call_id": "call_Kx1",
            "name": "get_weather",
            "arguments": "",
            "status": "in_progress",
        },
    },
    *[
        {
            "type": "response.function_call_arguments.delta",
            "sequence_number": 14 + n,
            "item_id": "fc_68a1",
            "output_index": 1,
            "delta": delta,
        }
        for n, delta in enumerate(['{"', "city", '":"', "Paris", '"}'])
    ],
    {
        "type": "response.function_call_arguments.done",
        "sequence_number": 19,
        "item_id": "fc_68a1",
        "output_index": 1,
        "arguments": '{"city":"Paris"}',
    },
    {"type": "response.output_item.done", "sequence_number": 20, "output_index": 1, "item": FC_ITEM_DONE},
    {
        "type": "response.completed",
        "sequence_number": 21,
        "response": {
            "id": "resp_68a",
            "object": "response",
            "status": "completed",
            "output": [MSG_ITEM_DONE, FC_ITEM_DONE],
            "usage": USAGE,
        },
    },
]


def test_full_stream_fold() -> None:
    output, metas = fold_all(FULL_STREAM)
    assert output == [MSG_ITEM_DONE, FC_ITEM_DONE]
    assert output[0] is not MSG_ITEM_DONE  # copies, never the event's own dicts
    assert metas[-1] == {"usage": USAGE, "done": True, "response_id": "resp_68a"}
    # Only *.done events report a change; deltas and lifecycle events do not.
    reported = [e["type"] for e, m in zip(FULL_STREAM, metas, strict=True) if m is not None]
    assert reported == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_full_stream_intermediate_state() -> None:
    """Just before the done events, the streamed text and arguments are there."""
    output, _ = fold_all(FULL_STREAM[:10])
    assert output[0]["content"][0]["text"] == "Let me check the weather."
    output, _ = fold_all(FULL_STREAM[:20])
    assert output[1]["arguments"] == '{"city":"Paris"}'
    assert output[1]["status"] == "in_progress"


def test_full_stream_with_empty_final_output_keeps_streamed() -> None:
    events = copy.deepcopy(FULL_STREAM)
    events[-1]["response"]["output"] = []
    output, _ = fold_all(events)
    assert output == [MSG_ITEM_DONE, FC_ITEM_DONE]


def test_function_call_arguments_done_on_message_is_ignored() -> None:
    output = [_message("m", "x")]
    event = {"type": "response.function_call_arguments.done", "output_index": 0, "arguments": "{}"}
    assert fold(event, output) == (output, None)
