"""Tests for engine.context.tasks: task-model prompts and the parsing of their replies.

No vectors were recorded for the background tasks; the cases are hand-written
from Open WebUI's documented behaviour, each expectation written out.
Open WebUI takes the query JSON from the LAST ``{``, so a nested object breaks
it; turnlog parses the first complete JSON object that has the key.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from engine.context.tasks import (
    DEFAULT_FOLLOW_UPS_TEMPLATE,
    DEFAULT_QUERY_TEMPLATE,
    DEFAULT_TAGS_TEMPLATE,
    DEFAULT_TITLE_TEMPLATE,
    Queries,
    TaskFailure,
    clean_text,
    fallback_title,
    json_objects,
    parse_follow_ups,
    parse_queries,
    parse_tags,
    parse_title,
    render_task_template,
    retrieval_queries,
    task_messages,
    task_request,
    web_search_queries,
)

NOW = datetime(2025, 3, 14, 15, 9, 26, tzinfo=UTC)


def chat(*texts: str) -> list[dict[str, Any]]:
    """Alternating user/assistant messages."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


# --------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('Before <details type="tool_calls" done="true">\n<summary>x</summary>\nargs\n</details>\nAfter', "Before \nAfter"),
        ("<details><summary>a</summary><details>inner</details>outer</details>Answer", "Answer"),
        ("<DETAILS open>x</DETAILS>ok", "ok"),
        ("See ![a chart](https://x/c.png) and ![](data:image/png;base64,AAAA) here", "See  and  here"),
        ('Title ![alt](u "t")', "Title"),
        ("a [link](https://x) stays", "a [link](https://x) stays"),
        ("<details>unclosed", "<details>unclosed"),
    ],
    ids=["details_block", "nested_details", "case_and_attributes", "images", "image_with_title", "links_kept", "unclosed_kept"],
)
def test_clean_text(text: str, expected: str) -> None:
    assert clean_text(text) == expected


def test_task_messages_keep_user_and_assistant_text_only() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "here"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
        {"role": "tool", "tool_call_id": "c", "content": "result"},
        {"role": "assistant", "content": '<details type="reasoning">thinking</details>\nIt is a cat.'},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
        {"role": "user", "content": "![x](y)"},
    ]
    assert task_messages(messages) == [
        {"role": "user", "content": "look\nhere"},
        {"role": "assistant", "content": "It is a cat."},
    ]


# --------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------

SIX = chat("u1", "a1", "u2", "a2", "u3", "a3")


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{MESSAGES}}", "USER: u1\nASSISTANT: a1\nUSER: u2\nASSISTANT: a2\nUSER: u3\nASSISTANT: a3"),
        ("{{MESSAGES:START:2}}", "USER: u1\nASSISTANT: a1"),
        ("{{MESSAGES:END:2}}", "USER: u3\nASSISTANT: a3"),
        ("{{MESSAGES:END:10}}", "USER: u1\nASSISTANT: a1\nUSER: u2\nASSISTANT: a2\nUSER: u3\nASSISTANT: a3"),
        ("[{{MESSAGES:END:0}}]", "[]"),
        ("{{MESSAGES:MIDDLETRUNCATE:3}}", "USER: u1\nASSISTANT: a1\nASSISTANT: a3"),
        ("{{MESSAGES:MIDDLETRUNCATE:4}}", "USER: u1\nASSISTANT: a1\nUSER: u3\nASSISTANT: a3"),
        ("{{MESSAGES:MIDDLETRUNCATE:6}}", "USER: u1\nASSISTANT: a1\nUSER: u2\nASSISTANT: a2\nUSER: u3\nASSISTANT: a3"),
        ("{{prompt}} / {{PROMPT}}", "u3 / u3"),
    ],
)
def test_message_variables(template: str, expected: str) -> None:
    assert render_task_template(template, SIX, now=NOW) == expected


def test_content_filters() -> None:
    messages = chat("abcdefghij", "0123456789")
    assert render_task_template("{{MESSAGES|start:3}}", messages, now=NOW) == "USER: abc\nASSISTANT: 012"
    assert render_task_template("{{MESSAGES:END:1|end:4}}", messages, now=NOW) == "ASSISTANT: 6789"
    assert render_task_template("{{MESSAGES:START:1|middletruncate:5}}", messages, now=NOW) == "USER: abc...ij"
    assert render_task_template("{{MESSAGES|middletruncate:10}}", messages, now=NOW) == "USER: abcdefghij\nASSISTANT: 0123456789"


def test_prompt_variables() -> None:
    messages = chat("abcdefghij")
    assert render_task_template("{{prompt:start:4}}|{{prompt:end:3}}|{{prompt:middletruncate:4}}|{{prompt:end:0}}", messages, now=NOW) == "abcd|hij|ab...ij|"
    assert render_task_template("{{prompt}}", messages, now=NOW, prompt="given") == "given"
    assert render_task_template("[{{prompt}}]", chat(), now=NOW) == "[]"


def test_date_and_user_variables() -> None:
    got = render_task_template("{{CURRENT_DATE}} {{CURRENT_WEEKDAY}} {{USER_NAME}}", [], now=NOW, user_name="Ada")
    assert got == "2025-03-14 Friday Ada"


def test_chat_text_is_never_substituted_again() -> None:
    messages = chat("what is {{CURRENT_DATE}}? {{MESSAGES}} {{prompt}}")
    assert render_task_template("{{MESSAGES}} | {{prompt}}", messages, now=NOW) == (
        "USER: what is {{CURRENT_DATE}}? {{MESSAGES}} {{prompt}} | what is {{CURRENT_DATE}}? {{MESSAGES}} {{prompt}}"
    )


def test_task_request_is_one_user_message_with_the_default_template() -> None:
    messages = chat("Tell me about <b>cats</b>", '<details type="reasoning">hmm</details>Cats are ![cat](c.png) small felines.')
    [request] = task_request("title", messages, now=NOW)
    assert request["role"] == "user"
    content = request["content"]
    assert isinstance(content, str)
    assert content.endswith("<chat_history>\nUSER: Tell me about <b>cats</b>\nASSISTANT: Cats are  small felines.\n</chat_history>")
    [custom] = task_request("title", messages, now=NOW, template="T: {{MESSAGES:END:1}}")
    assert custom == {"role": "user", "content": "T: ASSISTANT: Cats are  small felines."}


def test_default_templates_use_the_spec_windows_and_ask_for_json() -> None:
    assert "{{MESSAGES:END:2}}" in DEFAULT_TITLE_TEMPLATE and '{"title":' in DEFAULT_TITLE_TEMPLATE
    assert "{{MESSAGES:END:6}}" in DEFAULT_TAGS_TEMPLATE and '{"tags":' in DEFAULT_TAGS_TEMPLATE and '["General"]' in DEFAULT_TAGS_TEMPLATE
    assert "{{MESSAGES:END:5}}" in DEFAULT_FOLLOW_UPS_TEMPLATE and '{"follow_ups":' in DEFAULT_FOLLOW_UPS_TEMPLATE
    assert "400 characters" in DEFAULT_FOLLOW_UPS_TEMPLATE
    assert "{{MESSAGES:END:6}}" in DEFAULT_QUERY_TEMPLATE and "{{CURRENT_DATE}}" in DEFAULT_QUERY_TEMPLATE and '{"queries":' in DEFAULT_QUERY_TEMPLATE
    [query_request] = task_request("queries", chat("q"), now=NOW)
    query_content = query_request["content"]
    assert isinstance(query_content, str) and "Today's date is 2025-03-14;" in query_content


# --------------------------------------------------------------------------
# JSON extraction
# --------------------------------------------------------------------------


def test_json_objects_in_order_skipping_broken_starts() -> None:
    text = 'x {broken {"a": {"n": 1}} y {"b": 2} {"c": [1, 2'
    assert list(json_objects(text)) == [{"a": {"n": 1}}, {"b": 2}]
    assert list(json_objects("no json [1]")) == []


# --------------------------------------------------------------------------
# Title
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"title": "Cat Care Basics"}', "Cat Care Basics"),
        ('```json\n{"title": "  Cat\\n Care "}\n```', "Cat Care"),
        ('Sure! {"title": "Cats"} Hope it helps {"other": 1}', "Cats"),
        ('{"note": {}} {"title": "Second Object"}', "Second Object"),
        ("Cat Care", TaskFailure('no JSON object with "title"')),
        ('{"title": ""}', TaskFailure("empty title")),
        ('{"title": 3}', TaskFailure("title is not a string")),
        ('{"name": "x"}', TaskFailure('no JSON object with "title"')),
    ],
)
def test_parse_title(reply: str, expected: str | TaskFailure) -> None:
    assert parse_title(reply) == expected


def test_fallback_title() -> None:
    assert (
        fallback_title([{"role": "system", "content": "S"}, *chat("  How do\ncats  purr?", "a"), {"role": "user", "content": "later"}]) == "How do cats purr?"
    )
    assert fallback_title([{"role": "assistant", "content": "a"}]) is None
    words = "Please summarise the attached quarterly report and list every risk it names " * 5
    title = fallback_title(chat(words, "a"))
    assert title == "Please summarise the attached quarterly report and list every risk it names…"
    assert len(title) <= 80 and words.startswith(title[:-1])
    assert fallback_title(chat("x" * 200, "a")) == "x" * 79 + "…"  # no space to cut at


# --------------------------------------------------------------------------
# Tags
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"tags": ["Science", "Biology", "Cats"]}', ["Science", "Biology", "Cats"]),
        ('{"tags": [" Science ", "science", 3, null, "", "Cat  Care"]}', ["Science", "Cat Care"]),
        ('Here: {"tags": ["General"], "x": {}}', ["General"]),
        ('{"tags": []}', TaskFailure("no tags")),
        ('{"tags": "Science"}', TaskFailure("tags is not a list")),
        ("Science, Biology", TaskFailure('no JSON object with "tags"')),
    ],
)
def test_parse_tags(reply: str, expected: list[str] | TaskFailure) -> None:
    assert parse_tags(reply) == expected


# --------------------------------------------------------------------------
# Follow-ups
# --------------------------------------------------------------------------

LONG = "x" * 401
EDGE = "y" * 400


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"follow_ups": ["How old?", "Why?"]}', ["How old?", "Why?"]),
        ('{"follow_ups": [" a ", "a", "", "  ", "b"]}', ["a", "b"]),
        ('{"follow_ups": ["1", "2", "3", "4", "5", "6", "7"]}', ["1", "2", "3", "4", "5"]),
        ('{"follow_ups": ["1", "1", "2", "3", "4", "5", "6"]}', ["1", "2", "3", "4", "5"]),
        (json.dumps({"follow_ups": [LONG, EDGE, "ok"]}), [EDGE, "ok"]),
        ('{"follow_ups": ["a", 2, "b"]}', TaskFailure("a follow-up is not a string")),
        ('{"follow_ups": ["a", null]}', TaskFailure("a follow-up is not a string")),
        ('{"follow_ups": []}', []),
        ('{"follow_ups": "a"}', TaskFailure("follow_ups is not a list")),
        ('{"suggestions": ["a"]}', TaskFailure('no JSON object with "follow_ups"')),
        ("", TaskFailure('no JSON object with "follow_ups"')),
    ],
    ids=[
        "plain",
        "trim_dedupe_blank",
        "cap_5",
        "cap_after_dedupe",
        "length_limit",
        "non_string",
        "null_entry",
        "empty_list",
        "not_a_list",
        "wrong_key",
        "empty_reply",
    ],
)
def test_parse_follow_ups(reply: str, expected: list[str] | TaskFailure) -> None:
    assert parse_follow_ups(reply) == expected


# --------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"queries": ["cat lifespan", "cat diet"]}', Queries(["cat lifespan", "cat diet"])),
        # Open WebUI reads from the LAST "{" ('{}') and finds no queries.
        ('{"queries": ["cat lifespan"], "x": {}}', Queries(["cat lifespan"])),
        ('Thinking... {"reason": "needs data"} then {"queries": ["a"]}', Queries(["a"])),
        ('{"queries": [" a ", "a", "", 5, "b"]}', Queries(["a", "b"])),
        ('{"queries": "single"}', Queries(["single"])),
        ('{"queries": []}', Queries([])),
        ('{"queries": [""]}', TaskFailure("only blank queries")),
        ('{"queries": {"q": 1}}', TaskFailure("queries is not a list")),
        ('{"query": "a"}', TaskFailure('no JSON object with "queries"')),
        ("  cat lifespan in years \n", Queries(["cat lifespan in years"], from_json=False)),
        ('{"queries": ["unterminated"', Queries(['{"queries": ["unterminated"'], from_json=False)),
        ("   ", TaskFailure("empty reply")),
        ('{"queries": ["query1", "query2"]}', TaskFailure('the reply repeats the template\'s example queries ["query1", "query2"]')),
        ('{"queries": ["query1", "cat food"]}', Queries(["query1", "cat food"])),
    ],
    ids=[
        "plain",
        "q18_nested_object_after",
        "first_object_with_the_key",
        "trim_dedupe_non_strings",
        "string_value",
        "empty_list_no_search",
        "single_blank",
        "not_a_list",
        "json_without_queries",
        "no_json_whole_reply",
        "broken_json_whole_reply",
        "blank_reply",
        "template_example_echoed",
        "one_real_query_among_them",
    ],
)
def test_parse_queries(reply: str, expected: Queries | TaskFailure) -> None:
    assert parse_queries(reply) == expected


@pytest.mark.parametrize(
    ("result", "retrieval", "web"),
    [
        (Queries(["a", "b"]), ["a", "b"], ["a", "b"]),
        (Queries([]), ["user text"], []),
        (TaskFailure("x"), ["user text"], ["user text"]),
        (Queries(["whole"], from_json=False), ["whole"], ["whole"]),
    ],
)
def test_query_policies(result: Queries | TaskFailure, retrieval: list[str], web: list[str]) -> None:
    assert retrieval_queries(result, "user text") == retrieval
    assert web_search_queries(result, "user text") == web


def test_query_policies_without_user_text() -> None:
    assert retrieval_queries(TaskFailure("x"), "  ") == []
    assert web_search_queries(TaskFailure("x"), None) == []
