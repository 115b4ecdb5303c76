"""Tests for engine.context.messages: the message helpers and apply_params_to_form_data.

Driven by the vectors recorded from Open WebUI 0.12.4 (copied into
tests/vectors/). Where a vector records a quirk that turnlog fixes, the table
below gives turnlog's expected result and the test also checks that
it differs from the recording, naming the quirk.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from engine.context import messages as M
from engine.context.messages import (
    add_or_update_system_message,
    add_or_update_user_message,
    apply_params_to_form_data,
    convert_logit_bias,
    get_last_user_message,
    merge_system_messages,
    replace_system_message_content,
    set_last_user_message_content,
    strip_empty_content_blocks,
    update_message_content,
)
from engine.json_types import JsonObject
from tests.vectors_util import load_vectors

HELPER_VECTORS = load_vectors("message_helpers.json")
PARAM_VECTORS = load_vectors("apply_params_to_form_data.json")

# Vectors whose recorded behaviour is an Open WebUI quirk: name → (quirk label, turnlog's result).
HELPER_FIXES: dict[str, tuple[str, Any]] = {
    # Open WebUI checks only index 0 and inserts a duplicate system message;
    # turnlog updates the system message wherever it is.
    "sys_not_first_creates_duplicate": (
        "Q24",
        [{"role": "user", "content": "hi"}, {"role": "system", "content": "CTX\nlate"}],
    ),
    # Open WebUI adds the text to EVERY text part; turnlog edits the first only.
    "sys_list_content_every_text_part": (
        "Q16",
        [{"role": "system", "content": [{"type": "text", "text": "a\nCTX"}, {"type": "text", "text": "b"}]}],
    ),
    # The merge side of the duplicate system message: Open WebUI keeps only the first text part of
    # list-content system messages; turnlog keeps all of them.
    "merge_list_content_first_text_only": ("Q24", [{"role": "system", "content": "A\nA2\nB"}]),
    # Open WebUI raises AttributeError on text:null; turnlog treats it as
    # empty (and, as nothing else would remain, leaves the message unchanged).
    "strip_text_none_raises": ("Q15", [{"role": "user", "content": [{"type": "text", "text": None}]}]),
}

PARAM_FIXES: dict[str, tuple[str, Any]] = {
    # Open WebUI copies the raw string before converting, so the conversion
    # never runs; turnlog converts first and sends the OpenAI object.
    "logit_bias_string_converted": ("Q14", {"model": "m", "logit_bias": {"50256": -100, "11": 5}}),
}


def _call(fn_name: str, args: list[Any]) -> Any:
    try:
        return getattr(M, fn_name)(*args)
    except Exception as exc:  # pragma: no cover - only reached if a fix regresses
        return {"raises": type(exc).__name__}


@pytest.mark.parametrize("vector", HELPER_VECTORS, ids=[v["name"] for v in HELPER_VECTORS])
def test_message_helper_vectors(vector: dict[str, Any]) -> None:
    args = copy.deepcopy(vector["input"]["args"])
    before = copy.deepcopy(args)
    got = _call(vector["input"]["fn"], args)
    if vector["name"] in HELPER_FIXES:
        _quirk, expected = HELPER_FIXES[vector["name"]]
        assert got == expected
        assert got != vector["expected"]
    else:
        assert got == vector["expected"]
    assert args == before, "helpers must not mutate their input"


def test_every_fix_names_a_vector() -> None:
    names = {v["name"] for v in HELPER_VECTORS} | {v["name"] for v in PARAM_VECTORS}
    assert set(HELPER_FIXES) | set(PARAM_FIXES) <= names


@pytest.mark.parametrize("vector", PARAM_VECTORS, ids=[v["name"] for v in PARAM_VECTORS])
def test_apply_params_vectors(vector: dict[str, Any]) -> None:
    form_data = copy.deepcopy(vector["input"]["form_data"])
    before = copy.deepcopy(form_data)
    got = apply_params_to_form_data(form_data, vector["input"]["model"])
    if vector["name"] in PARAM_FIXES:
        _quirk, expected = PARAM_FIXES[vector["name"]]
        assert got == expected
        assert got != vector["expected"]
    else:
        assert got == vector["expected"]
    assert form_data == before


# --------------------------------------------------------------------------
# update_message_content and friends
# --------------------------------------------------------------------------


def test_update_message_content_string() -> None:
    assert update_message_content({"role": "user", "content": "old"}, "new")["content"] == "old\nnew"
    assert update_message_content({"role": "user", "content": "old"}, "new", append=False)["content"] == "new\nold"


def test_update_message_content_empty_has_no_dangling_newline() -> None:
    assert update_message_content({"role": "system", "content": ""}, "X")["content"] == "X"
    assert update_message_content({"role": "system", "content": None}, "X", append=False)["content"] == "X"
    assert update_message_content({"role": "system"}, "X")["content"] == "X"


def test_update_message_content_q16_prepend_edits_first_text_part_only() -> None:
    msg: dict[str, Any] = {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": "u"}},
            {"type": "text", "text": "a"},
            {"type": "text", "text": "b"},
        ],
    }
    out = update_message_content(msg, "CTX", append=False)
    assert out["content"] == [
        {"type": "image_url", "image_url": {"url": "u"}},
        {"type": "text", "text": "CTX\na"},
        {"type": "text", "text": "b"},
    ]
    assert msg["content"][1]["text"] == "a"


def test_update_message_content_list_without_text_gets_a_part() -> None:
    image: JsonObject = {"type": "image_url", "image_url": {"url": "u"}}
    assert update_message_content({"role": "user", "content": [image]}, "T")["content"] == [
        image,
        {"type": "text", "text": "T"},
    ]
    assert update_message_content({"role": "user", "content": [image]}, "T", append=False)["content"] == [
        {"type": "text", "text": "T"},
        image,
    ]


def test_add_or_update_system_message_q24_keeps_list_parts_at_any_index() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]},
    ]
    out = add_or_update_system_message("CTX", msgs)
    assert out == [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "CTX\nS1"}, {"type": "text", "text": "S2"}]},
    ]
    assert len([m for m in out if m["role"] == "system"]) == 1


def test_add_or_update_system_message_only_first_system_edited() -> None:
    msgs: list[JsonObject] = [{"role": "system", "content": "A"}, {"role": "system", "content": "B"}]
    assert add_or_update_system_message("X", msgs, append=True) == [
        {"role": "system", "content": "A\nX"},
        {"role": "system", "content": "B"},
    ]


def test_add_or_update_user_message_empty_list() -> None:
    assert add_or_update_user_message("CTX", []) == [{"role": "user", "content": "CTX"}]


def test_replace_system_message_content() -> None:
    msgs: list[JsonObject] = [{"role": "user", "content": "u"}, {"role": "system", "content": "old"}, {"role": "system", "content": "b"}]
    assert replace_system_message_content("new", msgs) == [
        {"role": "user", "content": "u"},
        {"role": "system", "content": "new"},
        {"role": "system", "content": "b"},
    ]
    assert replace_system_message_content("new", [{"role": "user", "content": "u"}]) == [{"role": "user", "content": "u"}]
    assert msgs[1]["content"] == "old"


def test_set_last_user_message_content_variants() -> None:
    assert set_last_user_message_content("N", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "N"},
    ]
    image: JsonObject = {"type": "image_url", "image_url": {"url": "u"}}
    assert set_last_user_message_content("N", [{"role": "user", "content": [image]}]) == [{"role": "user", "content": [{"type": "text", "text": "N"}, image]}]
    assert set_last_user_message_content("N", [{"role": "assistant", "content": "a"}]) == [{"role": "assistant", "content": "a"}]


def test_get_last_user_message_variants() -> None:
    assert get_last_user_message([]) is None
    assert get_last_user_message([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]) == "x"
    assert get_last_user_message([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]) is None


# --------------------------------------------------------------------------
# merge / strip
# --------------------------------------------------------------------------


def test_merge_system_messages_keeps_non_text_parts() -> None:
    image = {"type": "image_url", "image_url": {"url": "u"}}
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "u"},
        {"role": "system", "content": [{"type": "text", "text": "A"}, image]},
        {"role": "system", "content": "B"},
    ]
    assert merge_system_messages(msgs) == [
        {"role": "system", "content": [{"type": "text", "text": "A\nB"}, image]},
        {"role": "user", "content": "u"},
    ]


def test_merge_system_messages_single_string_system_moves_to_front() -> None:
    msgs: list[JsonObject] = [{"role": "user", "content": "u"}, {"role": "system", "content": "S"}]
    assert merge_system_messages(msgs) == [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}]


def test_strip_q15_null_text_removed_next_to_image() -> None:
    image: JsonObject = {"type": "image_url", "image_url": {"url": "u"}}
    msgs: list[JsonObject] = [{"role": "user", "content": [{"type": "text", "text": None}, image]}]
    assert strip_empty_content_blocks(msgs) == [{"role": "user", "content": [image]}]


def test_strip_leaves_non_text_and_other_messages_alone() -> None:
    msgs: list[dict[str, Any]] = [{"role": "assistant", "content": None}, {"role": "user", "content": [{"type": "text", "text": "x"}]}]
    out = strip_empty_content_blocks(msgs)
    assert out == msgs
    assert out[1] is msgs[1]


# --------------------------------------------------------------------------
# apply_params_to_form_data
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("50256:-100, 11:5", {"50256": -100, "11": 5}),
        ("1:150,2:-300", {"1": 100, "2": -100}),  # clamped to the API's range
        ({"7": 3}, {"7": 3}),
        ({7: "2.9"}, {"7": 2}),
        ('{"9": -1}', {"9": -1}),
        ("", None),
        ("nonsense", None),
        ("a:1", None),
        (42, None),
    ],
)
def test_convert_logit_bias(value: Any, expected: Any) -> None:
    assert convert_logit_bias(value) == expected


def test_logit_bias_unparseable_is_not_sent() -> None:
    got = apply_params_to_form_data({"model": "m", "params": {"logit_bias": "garbage"}}, {"id": "m"})
    assert got == {"model": "m"}


def test_logit_bias_body_wins() -> None:
    got = apply_params_to_form_data({"model": "m", "logit_bias": {"1": 1}, "params": {"logit_bias": "2:2"}}, {"id": "m"})
    assert got == {"model": "m", "logit_bias": {"1": 1}}


def test_custom_params_deep_merge_into_nested_param() -> None:
    got = apply_params_to_form_data(
        {
            "model": "m",
            "params": {
                "reasoning": {"effort": "low", "summary": "auto"},
                "custom_params": {"reasoning": '{"effort": "high"}'},
            },
        },
        {"id": "m"},
    )
    assert got == {"model": "m", "reasoning": {"effort": "high", "summary": "auto"}}


def test_turnlog_only_param_removed() -> None:
    got = apply_params_to_form_data({"model": "m", "params": {"max_tool_call_iterations": 3, "seed": 1}}, {"id": "m"})
    assert got == {"model": "m", "seed": 1}


def test_ollama_top_level_params_and_none_skipped() -> None:
    got = apply_params_to_form_data(
        {"model": "m", "params": {"temperature": 0.1, "think": True, "keep_alive": "5m", "top_k": None, "system": "S"}},
        {"id": "m", "owned_by": "ollama"},
    )
    assert got == {"model": "m", "think": True, "keep_alive": "5m", "options": {"temperature": 0.1}}


def test_ollama_without_params_adds_no_options() -> None:
    assert apply_params_to_form_data({"model": "m"}, {"id": "m", "owned_by": "ollama"}) == {"model": "m"}


def test_text_parts_without_string_text_are_read_not_crashed_on() -> None:
    # A client may send any JSON in a text part: a non-string text is no text
    # (merging the system messages raised TypeError; the last user message's
    # text was the number itself).
    msgs: list[JsonObject] = [
        {"role": "system", "content": [{"type": "text", "text": 5}, {"type": "text", "text": "S"}]},
        {"role": "user", "content": [{"type": "text", "text": 7}]},
    ]
    assert merge_system_messages(msgs) == [{"role": "system", "content": "S"}, msgs[1]]
    assert get_last_user_message(msgs) == ""
