"""Tests for engine.tools.legacy (prompt-based tool selection).

The table-driven part runs the vectors recorded from Open WebUI 0.12.4 (copied
into tests/vectors/). Each vector is checked end to end: the task-model
messages (with the vector's own template the system message is byte-equal;
with turnlog's default template only its structure is compared, the wording is
ours by design), the calls parsed from the reply, and the sources made from
running them. Where a vector records a quirk that turnlog fixes (``{"tool_calls": []}``
read as one call named ``None``), the test asserts turnlog's fixed behaviour.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from engine.json_types import JsonObject
from engine.tools.calls import ToolSpec, filter_arguments, normalize_result
from engine.tools.legacy import (
    DEFAULT_TOOLS_TEMPLATE,
    HISTORY_WINDOW,
    TASK,
    TOOLS_PLACEHOLDER,
    build_selection_request,
    first_json_object,
    parse_selection,
    tool_source,
)
from tests.vectors_util import load_vectors

# --------------------------------------------------------------------------
# Vector loading
# --------------------------------------------------------------------------


VECTORS = load_vectors("legacy_tool_calling.json")

# The recorder's tools (the vector records them only inside the rendered prompt;
# test_fixture_matches_the_recording checks they are the same).
SPECS: list[dict[str, Any]] = [
    {
        "name": "add",
        "description": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "echo",
        "description": "echo",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": []},
    },
]
TOOL_SPECS = {s["name"]: ToolSpec(tool_id=f"builtin:{s['name']}", kind="builtin", **s) for s in SPECS}
KNOWN = set(TOOL_SPECS)


def _add(a: int, b: int) -> int:
    return a + b


def _echo(**kwargs: Any) -> dict[str, Any]:
    return kwargs


TOOL_FUNCTIONS: dict[str, Callable[..., Any]] = {"add": _add, "echo": _echo}


def run_selection(reply: str) -> list[dict[str, Any]]:
    """What the engine does with a reply: parse, filter, run, normalize, make sources."""
    sources = []
    for name, parameters in parse_selection(reply, KNOWN):
        spec = TOOL_SPECS[name]
        ran_with = filter_arguments(spec, parameters)
        text = normalize_result(TOOL_FUNCTIONS[name](**ran_with), name).text
        if text:
            sources.append(tool_source(spec.tool_id, name, ran_with, text))
    return sources


# --------------------------------------------------------------------------
# Vectors
# --------------------------------------------------------------------------


def test_fixture_matches_the_recording() -> None:
    content = VECTORS[0]["expected"]["task_model_request"]["messages"][0]["content"]
    assert content.startswith("TOOLS=")
    assert json.loads(content.removeprefix("TOOLS=")) == SPECS


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector_request_with_recorded_template(v: dict[str, Any]) -> None:
    expected = v["expected"]["task_model_request"]
    messages = build_selection_request(SPECS, v["input"]["messages"], v["input"]["tools_prompt_template"])
    assert messages == expected["messages"]
    assert expected["stream"] is False
    assert expected["metadata"] == {"task": TASK}


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector_request_with_default_template(v: dict[str, Any]) -> None:
    expected = v["expected"]["task_model_request"]["messages"]
    messages = build_selection_request(SPECS, v["input"]["messages"])
    assert [m["role"] for m in messages] == [m["role"] for m in expected]
    # Our wording, the same tool list.
    system = messages[0]["content"]
    assert isinstance(system, str)
    assert TOOLS_PLACEHOLDER not in system
    assert json.dumps(SPECS) in system
    assert system == DEFAULT_TOOLS_TEMPLATE.replace(TOOLS_PLACEHOLDER, json.dumps(SPECS))
    # The user message does not depend on the template.
    assert messages[1] == expected[1]


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector_sources(v: dict[str, Any]) -> None:
    assert run_selection(v["input"]["task_model_reply"]) == v["expected"]["sources"]
    assert v["expected"]["events"] == []


def test_vector_two_calls_parsed() -> None:
    reply = next(v for v in VECTORS if v["name"] == "legacy_two_calls")["input"]["task_model_reply"]
    # Unfiltered: filtering by spec properties is the caller's step.
    assert parse_selection(reply, KNOWN) == [("add", {"a": 2, "b": 3, "zz": 1}), ("echo", {"q": "hi"})]


def test_vector_no_tools_is_q27_fixed() -> None:
    # Open WebUI turns {"tool_calls": []} into one call named None (then ignores it).
    reply = next(v for v in VECTORS if v["name"] == "legacy_no_tools")["input"]["task_model_reply"]
    assert parse_selection(reply, KNOWN) == []
    known_and_none: set[Any] = KNOWN | {None}  # even a tool "named" None is not called
    assert parse_selection(reply, known_and_none) == []


# --------------------------------------------------------------------------
# The request
# --------------------------------------------------------------------------


def test_default_template_asks_for_the_json_shape() -> None:
    assert DEFAULT_TOOLS_TEMPLATE.count(TOOLS_PLACEHOLDER) == 1
    assert '{"tool_calls": []}' in DEFAULT_TOOLS_TEMPLATE
    assert '"tool_calls"' in DEFAULT_TOOLS_TEMPLATE and '"parameters"' in DEFAULT_TOOLS_TEMPLATE


def test_empty_template_falls_back_to_default() -> None:
    assert build_selection_request(SPECS, [{"role": "user", "content": "x"}], "") == build_selection_request(SPECS, [{"role": "user", "content": "x"}])


def test_openai_tool_wrapper_is_unwrapped() -> None:
    wrapped = [spec.openai_tool() for spec in TOOL_SPECS.values()]
    assert build_selection_request(wrapped, [], "T={{TOOLS}}")[0]["content"] == "T=" + json.dumps(SPECS)


def test_non_ascii_specs_are_kept_readable() -> None:
    spec = {"name": "météo", "description": "Wetter für heute", "parameters": {"type": "object"}}
    content = build_selection_request([spec], [], "{{TOOLS}}")[0]["content"]
    assert isinstance(content, str) and "météo" in content and json.loads(content) == [spec]


@pytest.mark.parametrize(
    ("messages", "prompt"),
    [
        pytest.param([{"role": "user", "content": "hi"}], "Query: hi", id="no_history"),
        pytest.param([], "Query: ", id="empty_chat"),
        pytest.param(
            [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}],
            'History:\nSYSTEM: """S"""\nQuery: q',
            id="system_only",
        ),
        pytest.param(
            [{"role": "user", "content": str(i)} for i in range(7)],
            'History:\nUSER: """2"""\nUSER: """3"""\nUSER: """4"""\nUSER: """5"""\nQuery: 6',
            id="window_of_four",
        ),
        pytest.param(
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "partial"},
            ],
            'History:\nUSER: """a"""\nASSISTANT: """b"""\nQuery: c',
            id="after_last_user_not_shown",
        ),
        pytest.param(
            [
                {"role": "assistant", "content": None, "tool_calls": []},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                        {"type": "text", "text": "here"},
                    ],
                },
            ],
            'History:\nASSISTANT: """"""\nQuery: look\nhere',
            id="list_and_null_content",
        ),
        pytest.param(
            [{"role": "assistant", "content": "x"}],
            'History:\nASSISTANT: """x"""\nQuery: ',
            id="no_user_message",
        ),
    ],
)
def test_selection_prompt(messages: list[dict[str, Any]], prompt: str) -> None:
    out = build_selection_request(SPECS, messages, "{{TOOLS}}")
    assert out[1] == {"role": "user", "content": prompt}


def test_history_window_is_four() -> None:
    assert HISTORY_WINDOW == 4


def test_inputs_not_mutated() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    specs = [dict(s) for s in SPECS]
    before = json.dumps([messages, specs])
    build_selection_request(specs, messages)
    assert json.dumps([messages, specs]) == before


# --------------------------------------------------------------------------
# The reply
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "calls"),
    [
        # The first complete object, not first "{" to last "}".
        pytest.param(
            '{"tool_calls": [{"name": "add", "parameters": {"a": 1, "b": 2}}]} and also {"note": {}}',
            [("add", {"a": 1, "b": 2})],
            id="q18_trailing_object",
        ),
        pytest.param(
            'Answer: {"name": "echo", "parameters": {"q": "}"}} (brace } after)',
            [("echo", {"q": "}"})],
            id="q18_stray_braces",
        ),
        pytest.param(
            '{"name": "echo", "parameters": {"q": "a"}}\n{"name": "add", "parameters": {"a": 1, "b": 1}}',
            [("echo", {"q": "a"})],
            id="q18_two_objects_first_wins",
        ),
        pytest.param(
            'use {braces} then {"tool_calls": [{"name": "echo", "parameters": {"q": "x"}}]}',
            [("echo", {"q": "x"})],
            id="q18_retry_at_later_brace",
        ),
        pytest.param(
            '```json\n{"tool_calls": [{"name": "add", "parameters": {"a": 1, "b": 2}}]}\n```',
            [("add", {"a": 1, "b": 2})],
            id="code_fence",
        ),
        pytest.param(
            '{"tool_calls": [{"name": "add", "parameters": {"a": 1, "b": 2}}, {"name": "add", "parameters": {}}]}',
            [("add", {"a": 1, "b": 2}), ("add", {})],
            id="same_tool_twice",
        ),
        # An empty list means no tools, never a call named None.
        pytest.param('{"tool_calls": []}', [], id="q27_empty_list"),
        pytest.param('{"tool_calls": [], "name": "add"}', [], id="q27_empty_list_wins_over_name"),
        pytest.param('{"tool_calls": null}', [], id="tool_calls_null"),
        pytest.param('{"tool_calls": {"name": "echo", "parameters": {"q": "1"}}}', [("echo", {"q": "1"})], id="tool_calls_object"),
        # Names and parameters
        pytest.param(
            '{"tool_calls": [{"name": "rm", "parameters": {}}, {"name": "echo", "parameters": {"q": "y"}}]}',
            [("echo", {"q": "y"})],
            id="unknown_name_ignored",
        ),
        pytest.param('{"name": null, "parameters": {}}', [], id="null_name"),
        pytest.param('{"name": ["add"], "parameters": {}}', [], id="non_string_name"),
        pytest.param('{"parameters": {"a": 1}}', [], id="no_name"),
        pytest.param('{"name": "echo"}', [("echo", {})], id="missing_parameters"),
        pytest.param('{"name": "echo", "parameters": "{\\"q\\": 1}"}', [("echo", {})], id="string_parameters"),
        pytest.param('{"name": "echo", "parameters": [1, 2]}', [("echo", {})], id="list_parameters"),
        pytest.param(
            '{"tool_calls": ["add", 3, null, {"name": "echo", "parameters": {"q": "z"}}]}',
            [("echo", {"q": "z"})],
            id="non_object_entries_skipped",
        ),
        # Garbage
        pytest.param("I cannot help", [], id="no_json"),
        pytest.param("", [], id="empty"),
        pytest.param('{"tool_calls": [{"name": "add", "parameters": {"a": 1', [], id="truncated"),
        pytest.param('["add"]', [], id="top_level_list"),
        pytest.param('{"name": "add", "parameters": {"a": NaN, "b": 1}}', [], id="nan_rejected"),
        pytest.param("{" * 5000, [], id="deep_braces"),
    ],
)
def test_parse_selection(reply: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    assert parse_selection(reply, KNOWN) == calls


def test_parse_selection_non_string_reply() -> None:
    assert parse_selection(None, KNOWN) == []  # type: ignore[arg-type]


def test_parse_selection_nothing_known() -> None:
    assert parse_selection('{"name": "add", "parameters": {"a": 1}}', set()) == []


def test_parse_selection_parameters_are_copies() -> None:
    calls = parse_selection('{"tool_calls": [{"name": "add", "parameters": {"a": 1}}]}', KNOWN)
    calls[0][1]["a"] = 9
    assert calls == [("add", {"a": 9})]


def test_first_json_object() -> None:
    assert first_json_object('x {"a": {"b": 1}} {"c": 2}') == {"a": {"b": 1}}
    assert first_json_object('{bad} {"ok": true}') == {"ok": True}
    assert first_json_object("no object") is None


# --------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------


def test_tool_source_shape() -> None:
    parameters: JsonObject = {"q": "hi"}
    source = tool_source("server:1", "echo", parameters, "result")
    assert source == {
        "source": {"name": "server:1/echo"},
        "document": ["result"],
        "metadata": [{"source": "server:1/echo", "parameters": {"q": "hi"}}],
        "tool_result": True,
    }
    parameters["q"] = "changed"
    assert source["metadata"] == [{"source": "server:1/echo", "parameters": {"q": "hi"}}]
    json.dumps(source)  # recordable as is
