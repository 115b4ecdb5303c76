"""Tests for the history conversions: output items → Chat / Responses / Ollama inputs.

engine.protocols.history, and the input mappings of engine.protocols.responses
and engine.protocols.ollama.

Driven by the vectors recorded from Open WebUI 0.12.4 (copied into
tests/vectors/). Where turnlog deliberately differs (a quirk it fixes, or a part of
Open WebUI it leaves out) the test says so.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from engine.protocols.history import (
    TOOL_IMAGES_PROMPT,
    convert_output_to_messages,
    process_messages_with_output,
    replay_arguments,
    sanitize_tool_pairs,
)
from engine.protocols.ollama import ollama_messages
from engine.protocols.responses import responses_body, stateful_continuation_input, to_responses_input
from tests.vectors_util import load_vectors

CONVERT_VECTORS = load_vectors("convert_output_to_messages.json")
HISTORY_VECTORS = {v["name"]: v for v in load_vectors("history_preparation.json")}


# --------------------------------------------------------------------------
# Item builders
# --------------------------------------------------------------------------


def msg(text: str, id: str = "msg_1") -> dict[str, Any]:
    return {
        "type": "message",
        "id": id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text}],
    }


def call(call_id: str, name: str = "add", arguments: Any = '{"a": 1}', status: str | None = "completed", **extra: Any) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": extra.pop("id", call_id),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
        **extra,
    }


def result(call_id: str, *parts: dict[str, Any], text: str | None = "ok") -> dict[str, Any]:
    output = ([{"type": "input_text", "text": text}] if text is not None else []) + list(parts)
    return {
        "type": "function_call_output",
        "id": f"fco_{call_id}",
        "call_id": call_id,
        "output": output,
        "status": "completed",
    }


def reasoning(id: str = "r_1", text: str = "plan", **extra: Any) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": id,
        "status": "completed",
        "start_tag": "<think>",
        "end_tag": "</think>",
        "attributes": {},
        "content": [{"type": "output_text", "text": text}],
        "summary": None,
        **extra,
    }


# --------------------------------------------------------------------------
# Vectors
# --------------------------------------------------------------------------


@pytest.mark.parametrize("vector", CONVERT_VECTORS, ids=[v["name"] for v in CONVERT_VECTORS])
def test_convert_output_to_messages_vectors(vector: dict[str, Any]) -> None:
    output = copy.deepcopy(vector["input"]["output"])
    before = copy.deepcopy(output)
    got = convert_output_to_messages(output, **vector["input"].get("options", {}))
    assert got == vector["expected"]
    assert output == before


def test_process_messages_with_output_vector_without_file_context() -> None:
    # Deviation: turnlog does not implement include_file_context (the
    # <attached_files> prefix of history preparation); files come in through turnlog's own
    # assembly steps. Everything else matches the recording, and "files" is
    # still removed.
    vector = HISTORY_VECTORS["process_messages_with_output"]
    expected = copy.deepcopy(vector["expected"])
    assert expected[1]["content"].startswith("<attached_files>")
    expected[1]["content"] = "q"
    got = process_messages_with_output(copy.deepcopy(vector["input"]["messages"]), reasoning_format=vector["input"]["reasoning_format"])
    assert got == expected


def test_sanitize_tool_pairs_vector() -> None:
    vector = HISTORY_VECTORS["sanitize_tool_pairs"]
    messages = copy.deepcopy(vector["input"]["messages"])
    before = copy.deepcopy(messages)
    assert sanitize_tool_pairs(messages) == vector["expected"]
    assert messages == before


# --------------------------------------------------------------------------
# convert_output_to_messages beyond the vectors
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item_extra", "expected"),
    [
        ({"arguments": "{not json"}, "{}"),  # Open WebUI replays the invalid string
        ({"arguments": ""}, "{}"),
        ({"arguments": "[1, 2]"}, "{}"),  # valid JSON but not an object
        ({"arguments": '{"a":1}'}, '{"a":1}'),  # a valid object is kept verbatim
        ({"arguments": {"a": 1}}, '{"a": 1}'),
        ({"arguments": '{"a": 1, "junk": 2}', "arguments_ran": {"a": 1}}, '{"a": 1}'),  # what ran, not the unfiltered arguments
        ({"arguments": "{bad", "arguments_ran": '{"a": 2}'}, '{"a": 2}'),
        ({"arguments": '{"a": 3}', "arguments_ran": "nonsense"}, '{"a": 3}'),
    ],
)
def test_q22_replayed_arguments(item_extra: dict[str, Any], expected: str) -> None:
    item = {**call("c"), **item_extra}
    assert replay_arguments(item) == expected
    got: list[dict[str, Any]] = convert_output_to_messages([item, result("c")])
    assert got[0]["tool_calls"][0]["function"]["arguments"] == expected
    json.loads(got[0]["tool_calls"][0]["function"]["arguments"])


def test_q22_provider_function_with_invalid_arguments() -> None:
    item = call("c", provider_function={"name": "call_tool", "arguments": "{oops"})
    got: list[dict[str, Any]] = convert_output_to_messages([item, result("c")])
    assert got[0]["tool_calls"][0]["function"] == {"name": "call_tool", "arguments": "{}"}


@pytest.mark.parametrize("status", ["rejected", "failed", "completed"])
def test_terminal_statuses_replayed(status: str) -> None:
    got = convert_output_to_messages([call("c", status=status), result("c")])
    assert [m["role"] for m in got] == ["assistant", "tool"]


@pytest.mark.parametrize("status", ["pending", "queued", "requires_approval", "incomplete", "in_progress"])
def test_non_terminal_statuses_dropped(status: str) -> None:
    assert convert_output_to_messages([call("c", status=status), result("c"), msg("x")]) == [{"role": "assistant", "content": "x"}]


def test_turnlog_code_interpreter_type_and_outputs() -> None:
    got = convert_output_to_messages(
        [
            {
                "type": "code_interpreter",
                "id": "ci_1",
                "code": "1/0",
                "output": {"stdout": "", "stderr": "ZeroDivisionError"},
            },
            {"type": "open_webui:code_interpreter", "id": "ci_2", "code": "x", "output": None},
            {"type": "code_interpreter", "id": "ci_3", "code": "y", "output": "plain"},
            {"type": "code_interpreter", "id": "ci_4", "code": "z", "output": {"result": "42"}},
        ]
    )
    assert got == [
        {
            "role": "assistant",
            "content": "<code_interpreter>\n1/0\n</code_interpreter>\n"
            "<code_interpreter_output>\nZeroDivisionError\n</code_interpreter_output>\n"
            "<code_interpreter>\nx\n</code_interpreter>\n"
            "<code_interpreter>\ny\n</code_interpreter>\n<code_interpreter_output>\nplain\n</code_interpreter_output>\n"
            "<code_interpreter>\nz\n</code_interpreter>\n<code_interpreter_output>\n42\n</code_interpreter_output>",
        }
    ]


def test_flattened_images_of_a_run_follow_all_its_tool_messages() -> None:
    img = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    img2 = {"type": "input_image", "image_url": {"url": "https://x/2.png"}}
    output = [
        call("a"),
        call("b"),
        result("a", img),
        reasoning(),  # skipped (no reasoning format): must not split the run
        result("b", img2, text="B"),
        msg("done"),
    ]
    got = convert_output_to_messages(output, flatten_tool_images=True)
    assert [m["role"] for m in got] == ["assistant", "tool", "tool", "user", "assistant"]
    assert got[1]["content"] == "ok" and got[2]["content"] == "B"
    assert got[3]["content"] == [
        {"type": "text", "text": TOOL_IMAGES_PROMPT},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://x/2.png"}},
    ]


def test_duplicate_output_replayed_once_and_text_parts_joined() -> None:
    got = convert_output_to_messages([call("a"), result("a", {"type": "input_text", "text": "second"}, text="first"), result("a", text="again")])
    assert got == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "first\nsecond"},
    ]


def test_q7_text_typed_parts_are_read() -> None:
    item: dict[str, Any] = {
        "type": "message",
        "id": "m",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "text", "text": "hi"}],
    }
    assert convert_output_to_messages([item]) == [{"role": "assistant", "content": "hi"}]


def test_context_compaction_item_skipped() -> None:
    output: list[dict[str, Any]] = [{"type": "open_webui:context_compaction", "id": "cc_1", "call_id": "x", "summary": "S"}, msg("hi")]
    assert convert_output_to_messages(output) == [{"role": "assistant", "content": "hi"}]


def test_thinking_only_message_kept() -> None:
    assert convert_output_to_messages([reasoning()], reasoning_format="thinking") == [{"role": "assistant", "content": "", "thinking": "plan"}]


def test_reasoning_summary_used_when_no_content() -> None:
    item = reasoning(text="", summary=[{"type": "summary_text", "text": "S1"}, {"type": "summary_text", "text": "S2"}])
    assert convert_output_to_messages([item, msg("a")], reasoning_format="reasoning_content") == [
        {"role": "assistant", "content": "a", "reasoning_content": "S1\nS2"}
    ]


# --------------------------------------------------------------------------
# Provider reasoning replayed for the Responses API (Open WebUI drops it)
# --------------------------------------------------------------------------


def _responses_round() -> list[dict[str, Any]]:
    return [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Think"}],
            "encrypted_content": "ENC",
            "status": "completed",
        },
        msg("Let me add.", id="msg_p1"),
        call("call_1", arguments='{"a":1,"b":2}', id="fc_1"),
        result("call_1", text="3"),
    ]


def test_q10_responses_reasoning_kept_in_order_with_ids() -> None:
    got = convert_output_to_messages(_responses_round(), raw=True, reasoning_format="responses")
    assert got[0]["content"] == "Let me add."
    assert got[0]["responses_items"] == [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Think"}],
            "encrypted_content": "ENC",
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_p1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a":1,"b":2}', "id": "fc_1"},
    ]
    instructions, items = to_responses_input([{"role": "system", "content": "SYS"}, {"role": "user", "content": "hi"}, *got])
    assert instructions == "SYS"
    assert [i["type"] for i in items] == ["message", "reasoning", "message", "function_call", "function_call_output"]
    assert items[-1] == {"type": "function_call_output", "call_id": "call_1", "output": "3"}


def test_q10_open_webui_drops_the_reasoning() -> None:
    # What Open WebUI does (responses_api_stateless in agent_loop_e2e.json): no
    # reasoning format → the reasoning item disappears and nothing extra is kept.
    got = convert_output_to_messages(_responses_round(), raw=True)
    assert "responses_items" not in got[0]
    _, items = to_responses_input(got)
    assert [i["type"] for i in items] == ["message", "function_call", "function_call_output"]


def test_q10_store_false_strips_ids_and_unresolvable_reasoning() -> None:
    output = [
        {"type": "reasoning", "id": "rs_0", "summary": [], "status": "completed"},  # id only: needs the store
        call("c0", id="fc_0"),
        result("c0"),
        *_responses_round(),
    ]
    messages = convert_output_to_messages(output, reasoning_format="responses")
    _, stored = to_responses_input(messages)
    assert [(i["type"], i.get("id")) for i in stored] == [
        ("reasoning", "rs_0"),
        ("function_call", "fc_0"),
        ("function_call_output", None),
        ("reasoning", "rs_1"),
        ("message", "msg_p1"),
        ("function_call", "fc_1"),
        ("function_call_output", None),
    ]
    _, stateless = to_responses_input(messages, store=False)
    assert [i["type"] for i in stateless] == [
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
    ]
    assert all("id" not in i for i in stateless)
    assert stateless[2]["encrypted_content"] == "ENC"


def test_q10_reasoning_without_its_following_item_is_dropped() -> None:
    # The call after the reasoning never finished: the reasoning would have no
    # following item, which the Responses API rejects.
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E"},
        call("c", status="in_progress", id="fc_1"),
        msg("partial", id="msg_9"),
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "E2"},
    ]
    got = convert_output_to_messages(output, reasoning_format="responses")
    assert got == [{"role": "assistant", "content": "partial"}]


def test_q10_sanitized_call_removed_from_replayed_items() -> None:
    got = convert_output_to_messages(_responses_round(), reasoning_format="responses")
    # A later step drops the call (e.g. its tool message got lost).
    only_assistant = sanitize_tool_pairs([got[0]])
    assert "tool_calls" not in only_assistant[0]
    _, items = to_responses_input(only_assistant)
    assert [i["type"] for i in items] == ["reasoning", "message"]


def test_q10_turnlog_made_ids_are_not_replayed() -> None:
    local_msg, local_fc = "msg_" + "a" * 24, "fc_" + "0123456789abcdef01234567"
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E"},
        msg("text", id=local_msg),
        call("call_1", id=local_fc),
        result("call_1"),
    ]
    got: list[dict[str, Any]] = convert_output_to_messages(output, reasoning_format="responses")
    items = got[0]["responses_items"]
    assert [(i["type"], i.get("id")) for i in items] == [
        ("reasoning", "rs_1"),
        ("message", None),
        ("function_call", None),
    ]
    assert "status" not in items[1]


def test_duplicate_call_items_replayed_once() -> None:
    got: list[dict[str, Any]] = convert_output_to_messages([call("a"), call("a"), result("a")])
    assert len(got[0]["tool_calls"]) == 1


def test_q10_history_replay_through_process_messages() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "hi", "id": "u1"},
        {
            "role": "assistant",
            "id": "a1",
            "content": "ignored",
            "output": [*_responses_round(), msg("It is 3.", id="msg_p2")],
        },
        {"role": "user", "content": "and now?"},
    ]
    chat = process_messages_with_output(history, reasoning_format="responses")
    _, items = to_responses_input(chat)
    assert [i["type"] for i in items] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]


# --------------------------------------------------------------------------
# process_messages_with_output / sanitize_tool_pairs
# --------------------------------------------------------------------------


def test_process_messages_strips_bookkeeping_and_keeps_plain_assistants() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "q", "id": "u", "files": [], "meta": {}},
        {
            "role": "assistant",
            "content": "plain",
            "id": "a",
            "usage": {},
            "model": "m",
            "contextSummary": "x",
            "output": [],
        },
    ]
    assert process_messages_with_output(history) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "plain"},
    ]


def test_sanitize_tool_pairs_needs_adjacency() -> None:
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "x", "arguments": "{}"}}],
        },
        {"role": "user", "content": "interrupting"},
        {"role": "tool", "tool_call_id": "a", "content": "late"},
    ]
    assert sanitize_tool_pairs(messages) == [{"role": "user", "content": "interrupting"}]


# --------------------------------------------------------------------------
# Responses API mapping
# --------------------------------------------------------------------------


def test_to_responses_input_mapping() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "first"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://x/i.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{bad"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": [
                {"type": "input_text", "text": "see"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA"},
            ],
        },
        {"role": "assistant", "content": "Done."},
        {"role": "system", "content": [{"type": "text", "text": "last"}, {"type": "text", "text": "wins"}]},
    ]
    instructions, items = to_responses_input(messages)
    assert instructions == "last\nwins"
    assert items == [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "https://x/i.png", "detail": "auto"},
            ],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "r1"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [
                {"type": "input_text", "text": "see"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "auto"},
            ],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
    ]


def test_to_responses_input_no_system_and_empty_assistant() -> None:
    instructions, items = to_responses_input(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": ""},
            {"role": "assistant", "content": None, "tool_calls": []},
        ]
    )
    assert instructions is None
    assert items == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


def test_to_responses_input_keeps_image_detail_and_maps_files() -> None:
    _, items = to_responses_input(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "u", "detail": "high"}},
                    {"type": "file", "file": {"file_id": "file-1", "filename": None}},
                ],
            }
        ]
    )
    assert items[0]["content"] == [
        {"type": "input_image", "image_url": "u", "detail": "high"},
        {"type": "input_file", "file_id": "file-1"},
    ]


def test_stateless_continuation_matches_open_webui_payload() -> None:
    # The continuation Open WebUI sends in responses_api_stateless
    # (agent_loop_e2e.json), mapped by its adapter.
    chat: list[Any] = [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    body = responses_body({"model": "gpt", "messages": chat, "stream": True})
    assert body == {
        "model": "gpt",
        "stream": True,
        "instructions": "SYS",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me add."}]},
            {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "3"},
        ],
    }


def test_responses_body_mapping() -> None:
    chat_body: dict[str, Any] = {
        "model": "gpt",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.3,
        "max_tokens": 100,
        "logit_bias": {"1": 2},
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
        "stop": ["x"],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add",
                    "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
                },
            },
            {"type": "function", "function": {"name": "bare"}},
            {"type": "function", "function": {"name": "strict_one", "parameters": {"type": "object"}, "strict": True}},
            {"type": "web_search"},
        ],
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "S", "schema": {"type": "object"}, "strict": True},
        },
        "reasoning_effort": "high",
        "previous_response_id": "resp_1",
    }
    body = responses_body(chat_body)
    assert body == {
        "model": "gpt",
        "stream": True,
        "temperature": 0.3,
        "max_output_tokens": 100,
        "tools": [
            {
                "type": "function",
                "name": "add",
                "description": "Add",
                "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
                "strict": False,
            },
            {"type": "function", "name": "bare", "parameters": {"type": "object", "properties": {}}, "strict": False},
            {"type": "function", "name": "strict_one", "parameters": {"type": "object"}, "strict": True},
            {"type": "web_search"},
        ],
        "tool_choice": {"type": "function", "name": "add"},
        "text": {"format": {"type": "json_schema", "name": "S", "schema": {"type": "object"}, "strict": True}},
        "reasoning": {"effort": "high"},
        "previous_response_id": "resp_1",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    }
    assert "messages" in chat_body  # not mutated


@pytest.mark.parametrize(
    ("limits", "expected"),
    [({"max_completion_tokens": 5}, 5), ({"max_tokens": 7, "max_completion_tokens": 5}, 5), ({}, None)],
)
def test_responses_body_max_output_tokens(limits: dict[str, Any], expected: int | None) -> None:
    body = responses_body({"model": "m", **limits})
    assert body.get("max_output_tokens") == expected
    assert "max_tokens" not in body and "max_completion_tokens" not in body


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_responses_body_plain_tool_choice_kept(choice: str) -> None:
    assert responses_body({"model": "m", "tool_choice": choice})["tool_choice"] == choice


def test_responses_body_store_false_is_stateless() -> None:
    messages: list[Any] = convert_output_to_messages(_responses_round(), reasoning_format="responses")
    body: dict[str, Any] = responses_body({"model": "m", "store": False, "messages": messages})
    assert body["store"] is False
    assert all("id" not in item for item in body["input"])


def test_q9_stateful_continuation_sends_only_outputs() -> None:
    # Open WebUI (responses_api_stateful) re-sends the round's assistant text and
    # function_call items the server already stores under previous_response_id;
    # turnlog sends only the new outputs.
    round_output = [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Think"}]},
        msg("Let me add.", id="msg_1"),
        call("call_1", arguments='{"a":1,"b":2}', id="fc_1"),
        call("call_2", arguments="{}", id="fc_2"),
        result("call_1", text="3"),
        result("call_2", {"type": "input_image", "image_url": "data:image/png;base64,AA"}, text="pic"),
        result("ghost", text="orphan"),
    ]
    assert stateful_continuation_input(round_output) == [
        {"type": "function_call_output", "call_id": "call_1", "output": "3"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [
                {"type": "input_text", "text": "pic"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "auto"},
            ],
        },
    ]


def test_stateful_continuation_empty_round() -> None:
    assert stateful_continuation_input([msg("no calls")]) == []


# --------------------------------------------------------------------------
# Ollama
# --------------------------------------------------------------------------


def test_ollama_messages() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "S"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                {"type": "image_url", "image_url": {"url": "https://remote/x.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "thinking": "hmm",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
                {"id": "c2", "type": "function", "function": {"name": "echo", "arguments": "{bad"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": [
                {"type": "input_text", "text": "img"},
                {"type": "input_image", "image_url": "data:image/jpeg;base64,WFla"},
            ],
        },
        {"role": "tool", "tool_call_id": "unknown", "content": "?"},
        {"role": "assistant", "content": "It is 1.", "reasoning_content": "because"},
    ]
    assert ollama_messages(messages) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "what is this", "images": ["QUJD"]},
        {
            "role": "assistant",
            "content": "",
            "thinking": "hmm",
            "tool_calls": [
                {"function": {"name": "add", "arguments": {"a": 1}}},
                {"function": {"name": "echo", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": "1", "tool_name": "add"},
        {"role": "tool", "content": "img", "images": ["WFla"], "tool_name": "echo"},
        {"role": "tool", "content": "?"},
        {"role": "assistant", "content": "It is 1.", "thinking": "because"},
    ]


def test_ollama_from_converted_output() -> None:
    chat = convert_output_to_messages([reasoning(), call("c", arguments='{"a": 2}'), result("c", text="2"), msg("two")], reasoning_format="thinking")
    assert ollama_messages(chat) == [
        {
            "role": "assistant",
            "content": "",
            "thinking": "plan",
            "tool_calls": [{"function": {"name": "add", "arguments": {"a": 2}}}],
        },
        {"role": "tool", "content": "2", "tool_name": "add"},
        {"role": "assistant", "content": "two"},
    ]


def test_responses_request_body_honours_store_false() -> None:
    # With store: false the provider keeps nothing, so the input may not point
    # at stored items: the reasoning item without encrypted content is dropped
    # and item ids are removed (the body once recomputed the input as if store
    # were true).
    from engine.ports import ModelRequest, ResolvedModel
    from engine.protocols.responses import request_body

    assistant = {
        "role": "assistant",
        "content": "Done.",
        "responses_items": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]},
            {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        ],
    }
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}, assistant, {"role": "user", "content": "again"}]
    resolved = ResolvedModel(provider=None, upstream_model="m", api="responses")
    stored: dict[str, Any] = request_body(resolved, ModelRequest(messages=messages, params={}))
    unstored: dict[str, Any] = request_body(resolved, ModelRequest(messages=messages, params={"store": False}))
    assert any(i.get("type") == "reasoning" for i in stored["input"])
    assert not any(i.get("type") == "reasoning" for i in unstored["input"])
    assert not any("id" in i for i in unstored["input"])
    assert unstored["store"] is False


# --------------------------------------------------------------------------
# Shapes a client or a provider got wrong: read, not crashed on
# --------------------------------------------------------------------------


def test_malformed_shapes_are_read_not_crashed_on_in_the_responses_mapping() -> None:
    # A text part whose text is not a string, a call whose function is not an
    # object, and text/reasoning settings that are not objects each raised
    # (TypeError, AttributeError) before the readers narrowed them.
    chat: list[Any] = [
        {"role": "system", "content": [{"type": "text", "text": 5}, {"type": "text", "text": "S"}]},
        {"role": "assistant", "content": "a", "tool_calls": [{"id": "c1", "type": "function", "function": "oops"}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": 7}, {"type": "text", "text": "r"}]},
    ]
    body = responses_body({"model": "m", "messages": chat, "text": "x", "response_format": {"type": "json_object"}, "reasoning": 1, "reasoning_effort": "low"})
    assert body["instructions"] == "S"
    assert body["text"] == {"format": {"type": "json_object"}}
    assert body["reasoning"] == {"effort": "low"}
    assert body["input"] == [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "function_call", "call_id": "c1", "name": "", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "\nr"},
    ]


def test_a_tool_output_part_without_string_text_reads_as_empty() -> None:
    output = [call("c"), result("c", {"type": "input_text", "text": 3}, text="ok")]
    assert convert_output_to_messages(output)[1] == {"role": "tool", "tool_call_id": "c", "content": "ok\n"}


def test_ollama_options_and_functions_that_are_not_objects_are_ignored() -> None:
    from engine.ports import ModelRequest, ResolvedModel
    from engine.protocols.ollama import request_body as ollama_body

    messages: list[dict[str, Any]] = [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": "oops"}]}]
    body = ollama_body(ResolvedModel(provider=None, upstream_model="m", api="ollama"), ModelRequest(messages=messages, params={"options": "x", "top_k": 2}))
    assert body["options"] == {"top_k": 2}
    assert body["messages"] == [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "", "arguments": {}}}]}]
