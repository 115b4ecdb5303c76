"""Tests for engine.context.sources: <source> tags, the RAG template, numbering.

Driven by the vectors recorded from Open WebUI 0.12.4 (tests/vectors/
source_context.json and rag_template.json). Where a vector records a quirk
that turnlog fixes (placeholders inside inserted text substituted), the table gives turnlog's result and the test
checks that it differs from the recording. Two vectors record Open WebUI's own
default template text; turnlog's ``DEFAULT_RAG_TEMPLATE`` says the same things
in its own words, so for those the test checks the structure the spec fixes
(the context inside ``<context>…</context>`` at the end, no query placeholder,
the user's question after the block) instead of the exact text.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from engine.context.sources import (
    DEFAULT_RAG_TEMPLATE,
    apply_source_context,
    numbered_sources,
    rag_template,
    source_context,
)
from engine.json_types import JsonObject
from tests.vectors_util import load_vectors

SOURCE_VECTORS = load_vectors("source_context.json")
RAG_VECTORS = load_vectors("rag_template.json")
NOW = datetime(2025, 3, 14, 15, 9, 26, tzinfo=UTC)

# rag_template vectors recording an Open WebUI quirk: name → (quirk label, turnlog's result).
RAG_FIXES: dict[str, tuple[str, str]] = {
    # Open WebUI leaves the template's own [query] literal and puts the
    # question into the [query] found inside the context; turnlog does the reverse.
    "query_placeholder_inside_context_INVERTED_BUG": ("Q12", "Q=REAL\n<context>doc says [query] literally</context>"),
    # Open WebUI substitutes the {{CONTEXT}} found inside the inserted
    # context again (the context nests in itself); turnlog substitutes once.
    "context_placeholder_inside_context_BUG": ("Q13", "A x {{CONTEXT}} y B x {{CONTEXT}} y"),
}
# Vectors whose expectation is Open WebUI's default template wording.
DEFAULT_TEMPLATE_VECTORS = {"empty_template_uses_default", "apply_default_template"}

RENDER_VECTORS = [v for v in SOURCE_VECTORS if "messages" not in v["input"]]
APPLY_VECTORS = [v for v in SOURCE_VECTORS if "messages" in v["input"]]


# --------------------------------------------------------------------------
# Vectors
# --------------------------------------------------------------------------


def test_vector_tables_are_complete() -> None:
    names = {v["name"] for v in SOURCE_VECTORS} | {v["name"] for v in RAG_VECTORS}
    assert set(RAG_FIXES) | DEFAULT_TEMPLATE_VECTORS <= names
    assert len(RENDER_VECTORS) == 7 and len(APPLY_VECTORS) == 4


@pytest.mark.parametrize("vector", RENDER_VECTORS, ids=[v["name"] for v in RENDER_VECTORS])
def test_source_context_vectors(vector: dict[str, Any]) -> None:
    given = vector["input"]
    ids_before = copy.deepcopy(given["source_ids"])
    text, ids = source_context(
        given["sources"],
        source_ids=given["source_ids"],
        include_content=given.get("include_content", True),
    )
    assert text == vector["expected"]["context"]
    assert ids == vector["expected"]["source_ids_after"]
    assert given["source_ids"] == ids_before, "the caller's numbering is not modified"


@pytest.mark.parametrize("vector", APPLY_VECTORS, ids=[v["name"] for v in APPLY_VECTORS])
def test_apply_source_context_vectors(vector: dict[str, Any]) -> None:
    given = vector["input"]
    messages = copy.deepcopy(given["messages"])
    template = "" if vector["name"] == "apply_default_template" else given.get("rag_template", "")
    got, ids = apply_source_context(
        messages,
        given["sources"],
        template=template,
        system_context=given.get("RAG_SYSTEM_CONTEXT", False),
        query=given["user_message"],
        now=NOW,
    )
    assert messages == given["messages"], "the input messages are not mutated"
    if vector["name"] == "apply_default_template":
        # Open WebUI's wording is not reproduced: check the structure instead.
        tag = '<source id="1" name="a.pdf" resource-type="file" resource-id="f1">Paris is the capital.</source>'
        expected_tail = f"\n\n<context>\n{tag}\n</context>\n\nQ?"
        assert vector["expected"][0]["content"].endswith(expected_tail)
        content = got[0]["content"]
        assert isinstance(content, str) and content.endswith(expected_tail)
        assert got[0]["content"] == DEFAULT_RAG_TEMPLATE.replace("{{CONTEXT}}", tag) + "\nQ?"
        assert ids == {"a.pdf": 1}
    else:
        assert got == vector["expected"]
        assert ids == ({} if vector["name"] == "apply_noop_without_user_message" else {"a.pdf": 1})


@pytest.mark.parametrize("vector", RAG_VECTORS, ids=[v["name"] for v in RAG_VECTORS])
def test_rag_template_vectors(vector: dict[str, Any]) -> None:
    given = vector["input"]
    got = rag_template(given["template"], given["context"], given["query"], now=NOW)
    if vector["name"] in RAG_FIXES:
        _quirk, expected = RAG_FIXES[vector["name"]]
        assert got == expected
        assert got != vector["expected"]
    elif vector["name"] in DEFAULT_TEMPLATE_VECTORS:
        assert vector["expected"].endswith("\n\n<context>\nCTX\n</context>\n")
        assert got.endswith("\n\n<context>\nCTX\n</context>\n")
        assert got == DEFAULT_RAG_TEMPLATE.replace("{{CONTEXT}}", "CTX")
    else:
        assert got == vector["expected"]


# --------------------------------------------------------------------------
# The default template
# --------------------------------------------------------------------------


def test_default_template_gives_the_spec_instructions() -> None:
    text = DEFAULT_RAG_TEMPLATE
    for phrase in (
        "[id]",
        "explicit id attribute",
        "do not know the answer",
        "language of the user's query",
        "Do not put XML tags",
        "from your own knowledge",
        "ask the user to clarify",
    ):
        assert phrase in text, phrase
    assert text.endswith("<context>\n{{CONTEXT}}\n</context>\n")
    assert "[query]" not in text and "{{QUERY}}" not in text


# --------------------------------------------------------------------------
# rag_template: hand-written cases
# --------------------------------------------------------------------------


def test_rag_template_date_and_user_variables() -> None:
    template = "{{CURRENT_DATE}}|{{CURRENT_TIME}}|{{CURRENT_DATETIME}}|{{CURRENT_WEEKDAY}}|{{CURRENT_TIMEZONE}}|{{USER_NAME}}|{{QUERY}}"
    assert rag_template(template, "c", "q", now=NOW, user_name="Ada") == "2025-03-14|03:09:26 PM|2025-03-14 03:09:26 PM|Friday|UTC|Ada|q"
    assert rag_template("{{USER_NAME}}", "c", "q", now=NOW) == "Unknown"


def test_rag_template_inserted_text_is_never_substituted_again() -> None:
    got = rag_template("[context] / [query]", "ctx {{USER_NAME}} [query]", "q {{CONTEXT}} {{CURRENT_DATE}}", now=NOW, user_name="Ada")
    assert got == "ctx {{USER_NAME}} [query] / q {{CONTEXT}} {{CURRENT_DATE}}"


def test_rag_template_none_template_is_the_default() -> None:
    assert rag_template(None, "C", "q", now=NOW) == rag_template("", "C", "q", now=NOW)


# --------------------------------------------------------------------------
# source_context: hand-written cases
# --------------------------------------------------------------------------


def _src(ident: str | None, name: str | None, docs: list[str], metas: list[dict[str, Any]], **info: Any) -> dict[str, Any]:
    source: dict[str, Any] = {k: v for k, v in (("id", ident), ("name", name)) if v is not None}
    source.update(info)
    return {"source": source, "document": docs, "metadata": metas}


def test_metadata_keys_are_escaped_attributes_in_the_given_order() -> None:
    sources = [_src("f1", "a.pdf", ["d"], [{"source": "a.pdf", "page": 3, "title": 'A "B" <C>', "empty": ""}], type="file")]
    text, _ids = source_context(sources, metadata_keys=("title", "page", "missing", "empty"))
    assert text == '<source id="1" name="a.pdf" resource-type="file" resource-id="f1" title="A &quot;B&quot; &lt;C&gt;" page="3">d</source>\n'


def test_numbering_continues_after_the_highest_number_given() -> None:
    _text, ids = source_context([_src("x", "x", ["d"], [{"source": "new"}])], source_ids={"a": 1, "b": 5})
    assert ids == {"a": 1, "b": 5, "new": 6}


def test_missing_metadata_renders_nothing() -> None:
    assert source_context([{"source": {"id": "s"}, "document": ["d"]}]) == ("", {})


# --------------------------------------------------------------------------
# apply_source_context: hand-written cases
# --------------------------------------------------------------------------

PARIS = [_src("f1", "a.pdf", ["Paris."], [{"source": "a.pdf"}], type="file")]
PARIS_TAG = '<source id="1" name="a.pdf" resource-type="file" resource-id="f1">Paris.</source>'


def test_apply_finds_the_last_user_message_when_it_is_not_last() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "old"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "Capital?"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    got, ids = apply_source_context(messages, PARIS, template="[context] Q: [query]", system_context=False, now=NOW)
    assert got[2] == {"role": "user", "content": f"{PARIS_TAG} Q: Capital?\nCapital?"}
    assert got[:2] == messages[:2] and got[3:] == messages[3:]
    assert ids == {"a.pdf": 1}


def test_apply_query_argument_overrides_the_user_text() -> None:
    messages: list[JsonObject] = [{"role": "user", "content": "augmented text"}]
    got, _ids = apply_source_context(messages, PARIS, template="Q: {{QUERY}}", system_context=False, query="original", now=NOW)
    assert got == [{"role": "user", "content": "Q: original\naugmented text"}]


def test_apply_list_content_edits_the_first_text_part_only() -> None:
    image: JsonObject = {"type": "image_url", "image_url": {"url": "u"}}
    messages: list[JsonObject] = [{"role": "user", "content": [image, {"type": "text", "text": "Q1"}, {"type": "text", "text": "Q2"}]}]
    got, _ids = apply_source_context(messages, PARIS, template="[context]", system_context=False, now=NOW)
    assert got == [{"role": "user", "content": [image, {"type": "text", "text": f"{PARIS_TAG}\nQ1"}, {"type": "text", "text": "Q2"}]}]


def test_apply_system_context_without_system_message_inserts_one() -> None:
    got, _ids = apply_source_context([{"role": "user", "content": "Q"}], PARIS, template="[context]", system_context=True, now=NOW)
    assert got == [{"role": "system", "content": PARIS_TAG}, {"role": "user", "content": "Q"}]


def test_apply_continues_the_given_numbering() -> None:
    got, ids = apply_source_context([{"role": "user", "content": "Q"}], PARIS, template="[context]", system_context=False, source_ids={"b.pdf": 1}, now=NOW)
    assert got == [{"role": "user", "content": PARIS_TAG.replace('id="1"', 'id="2"') + "\nQ"}]
    assert ids == {"b.pdf": 1, "a.pdf": 2}


@pytest.mark.parametrize(
    ("messages", "sources"),
    [
        ([{"role": "user", "content": "Q"}], []),
        ([{"role": "system", "content": "S"}], PARIS),
        ([{"role": "user", "content": ""}], PARIS),
        ([{"role": "user", "content": "Q"}], [{"source": {"id": "s"}, "document": [], "metadata": []}]),
    ],
    ids=["no_sources", "no_user_message", "empty_user_text", "no_documents"],
)
def test_apply_noops(messages: list[dict[str, Any]], sources: list[dict[str, Any]]) -> None:
    got, ids = apply_source_context(messages, sources, template=None, system_context=False, source_ids={"k": 1}, now=NOW)
    assert got == messages
    assert ids == {"k": 1}


# --------------------------------------------------------------------------
# numbered_sources
# --------------------------------------------------------------------------


def test_numbered_sources_match_the_tag_numbers() -> None:
    sources = [
        _src("f1", "a.pdf", ["d1", "d2"], [{"source": "a.pdf", "name": "a.pdf"}, {"source": "a.pdf"}], type="file"),
        {
            "source": {"name": "search_web", "id": "search_web"},
            "document": ["T1\nS1", "T2\nS2"],
            "metadata": [{"source": "https://a", "name": "T1", "url": "https://a"}, {"source": "https://b", "name": "T2", "url": "https://b"}],
        },
        {"source": {"name": "https://x/p", "id": "https://x/p"}, "document": ["page"], "metadata": [{"source": "https://x/p"}]},
        {"source": {"name": "tools/calc"}, "document": ["42"], "metadata": [{"source": "tools/calc"}], "tool_result": True},
        {"source": {}, "document": ["y"], "metadata": [{}]},
        _src("n1", "Note", ["n"], [{"source": "Note"}], type="note"),
    ]
    assert numbered_sources(sources) == [
        {"id": 1, "name": "a.pdf", "type": "file"},
        {"id": 2, "name": "T1", "type": "web", "url": "https://a"},
        {"id": 3, "name": "T2", "type": "web", "url": "https://b"},
        {"id": 4, "name": "https://x/p", "type": "web", "url": "https://x/p"},
        {"id": 5, "name": "tools/calc", "type": "tool"},
        {"id": 6, "name": "N/A", "type": "document"},
        {"id": 7, "name": "Note", "type": "note"},
    ]
    _text, ids = source_context(sources)
    assert ids == {"a.pdf": 1, "https://a": 2, "https://b": 3, "https://x/p": 4, "tools/calc": 5, "N/A": 6, "Note": 7}


def test_numbered_sources_with_earlier_numbering_lists_only_these_sources() -> None:
    assert numbered_sources(PARIS, source_ids={"x": 1, "a.pdf": 2}) == [{"id": 2, "name": "a.pdf", "type": "file"}]
    assert numbered_sources(PARIS, source_ids={"x": 1}) == [{"id": 2, "name": "a.pdf", "type": "file"}]
