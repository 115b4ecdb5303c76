"""Assembly steps one at a time (engine.context.steps): each takes a draft and
leaves it changed, and returns what it did (what the turn records). The
expectations are written out by hand; the end-to-end tests check the same
steps through the real service and the exact messages the upstream receives.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from adapters.filters import DirFilters
from engine.context.assemble import CODE_INTERPRETER_PROMPT, ModelProfile
from engine.context.history import History
from engine.context.steps import (
    ChatHistory,
    CodeInterpreterPrompt,
    Draft,
    Files,
    InletFilters,
    Params,
    SourceContext,
    StepFailed,
    SystemMessages,
    Unsupported,
    attached_knowledge,
    request_refs,
)
from engine.json_types import JsonObject
from engine.ports import FileRef, TurnInput

T0 = 1_800_000_000.0  # 2027-01-15


def draft(request: dict[str, Any], profile: ModelProfile | None = None) -> Draft:
    turn = TurnInput(id="turn_1", chat_id="chat_1", user_id="ada", model="m", request=request, created_at=T0)
    return Draft(turn=turn, profile=profile or ModelProfile(), request=dict(request))


async def test_params_profile_then_request_params_then_body_and_never_turnlog_keys() -> None:
    d = draft(
        {"model": "m", "messages": [], "temperature": 0.1, "params": {"top_p": 0.5, "temperature": 0.9, "function_calling": "native", "system": "x"}},
        ModelProfile(params={"top_p": 0.1, "seed": 7}),
    )
    assert await Params().run(d) == {"params": {"top_p": 0.5, "seed": 7, "temperature": 0.1}}
    assert d.params == {"top_p": 0.5, "seed": 7, "temperature": 0.1}


async def test_history_puts_the_model_system_prompt_first() -> None:
    d = draft({"messages": [{"role": "user", "content": "hi"}]}, ModelProfile(system="You are terse."))
    detail = await ChatHistory(History(), 0).run(d)
    assert d.messages == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    assert d.new_messages == [{"role": "user", "content": "hi"}]
    assert detail == {"chat_turns": 0, "history_len": 0, "reset": False}


async def test_history_with_nothing_to_say_records_nothing() -> None:
    d = draft({"messages": [{"role": "user", "content": "hi"}]})
    assert await ChatHistory(History(), 0).run(d) is None


def write_filter(folder: Path, name: str, source: str) -> DirFilters:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return DirFilters(str(folder), {})


async def test_inlet_filters_rewrite_messages_and_params(tmp_path: Path) -> None:
    filters = write_filter(
        tmp_path,
        "f",
        """
        class Filter:
            file_handler = True
            def inlet(self, body):
                body["messages"].append({"role": "user", "content": "and more"})
                body["max_tokens"] = 5
                return body
        """,
    )
    d = draft({"model": "m", "messages": [], "files": [{"type": "file", "id": "f1"}]})
    d.messages = [{"role": "user", "content": "hi"}]
    detail = await InletFilters(filters).run(d)
    assert d.messages == [{"role": "user", "content": "hi"}, {"role": "user", "content": "and more"}]
    assert d.params == {"max_tokens": 5}
    assert "files" not in d.request  # a file-handling filter takes the files
    assert detail == {"runs": [{"filter": "f", "changed": True, "file_handler": True}], "changed": ["max_tokens", "messages"]}


async def test_an_inlet_that_raises_stops_assembly(tmp_path: Path) -> None:
    filters = write_filter(tmp_path, "bad", "class Filter:\n    def inlet(self, body):\n        raise ValueError('nope')\n")
    d = draft({"model": "m", "messages": []})
    with pytest.raises(StepFailed) as failed:
        await InletFilters(filters).run(d)
    assert failed.value.type == "filter_error" and "nope" in failed.value.message


async def test_code_interpreter_prompt_only_in_legacy_mode_with_the_feature() -> None:
    native = draft({"features": {"code_interpreter": True}})
    native.messages = [{"role": "user", "content": "run"}]
    assert await CodeInterpreterPrompt().run(native) is None
    legacy = draft({"features": {"code_interpreter": True}, "params": {"function_calling": "default"}})
    legacy.messages = [{"role": "user", "content": "run"}]
    assert await CodeInterpreterPrompt().run(legacy) is not None
    assert legacy.messages == [{"role": "user", "content": "run\n" + CODE_INTERPRETER_PROMPT}]


async def test_unsupported_names_what_is_not_configured_or_not_possible() -> None:
    everything = {"memory": True, "web_search": True, "image_generation": True, "code_interpreter": True}
    assert await Unsupported(everything).run(draft({"features": {"memory": True, "web_search": True}})) is None
    missing = await Unsupported({**everything, "web_search": False}).run(draft({"features": {"memory": True, "web_search": True}}))
    assert missing == {"ignored": [{"field": "features.web_search", "reason": "no web search engine is configured (TURNLOG_WEB_SEARCH_ENGINE)"}]}
    no_tools = draft({"features": {"memory": True}}, ModelProfile(capabilities={"builtin_tools": False}))
    native = await Unsupported(everything).run(no_tools)
    assert native is not None
    ignored = native["ignored"]
    assert isinstance(ignored, list) and [i["field"] for i in ignored if isinstance(i, dict)] == ["features.memory"]
    legacy = draft({"features": {"memory": True}, "params": {"function_calling": "default"}}, ModelProfile(capabilities={"builtin_tools": False}))
    assert await Unsupported(everything).run(legacy) is None  # injected, not a tool


def test_request_refs_and_the_attached_knowledge_listing() -> None:
    refs = request_refs(
        {"files": [{"type": "file", "id": "a"}, {"type": "collection", "id": "k", "context": "full"}, {"id": 3}, "x", {"type": "file", "id": "a"}]}
    )
    assert refs == [FileRef("file", "a"), FileRef("collection", "k", full=True)]
    assert attached_knowledge([FileRef("collection", "k1")]) == '<attached_knowledge>\n<knowledge type="collection" id="k1"/>\n</attached_knowledge>'


async def test_native_mode_lists_model_knowledge_instead_of_retrieving_it() -> None:
    d = draft({"messages": []}, ModelProfile(knowledge=("k1",)))
    d.messages = [{"role": "system", "content": "Base."}, {"role": "user", "content": "q"}]
    detail = await Files(None, _NoTaskModel(), 0).run(d)
    assert detail == {"attached_knowledge": ["k1"]}
    assert d.messages[0]["content"] == 'Base.\n<attached_knowledge>\n<knowledge type="collection" id="k1"/>\n</attached_knowledge>'


async def test_files_without_a_knowledge_store_are_reported_not_dropped() -> None:
    d = draft({"files": [{"type": "file", "id": "f1"}]})
    d.messages = [{"role": "user", "content": "q"}]
    detail = await Files(None, _NoTaskModel(), 0).run(d)
    assert detail is not None and detail["files"] == [{"type": "file", "id": "f1"}] and "no knowledge store" in str(detail["error"])


SOURCE: JsonObject = {
    "source": {"id": "file_1", "name": "guide.md", "type": "file"},
    "document": ["Proof the dough for 12 hours."],
    "metadata": [{"source": "guide.md", "name": "guide.md", "file_id": "file_1"}],
}


async def test_source_context_goes_into_the_last_user_message_with_a_snapshot() -> None:
    d = draft({})
    d.messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "How long do I proof?"}]
    d.sources = [SOURCE]
    detail = await SourceContext("Context:\n{{CONTEXT}}\n", system_context=False).run(d)
    assert detail == {"where": "user", "sources": [{"id": 1, "name": "guide.md", "type": "file"}]}
    content = d.messages[1]["content"]
    assert isinstance(content, str) and content.startswith('Context:\n<source id="1" name="guide.md"')
    assert content.endswith("How long do I proof?")
    assert d.rag == {"role": "user", "index": 1, "message": {"role": "user", "content": "How long do I proof?"}, "source_ids": {"guide.md": 1}}


async def test_source_context_in_the_system_message() -> None:
    d = draft({})
    d.messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]
    d.sources = [SOURCE]
    await SourceContext("C: {{CONTEXT}}", system_context=True).run(d)
    assert d.messages[1] == {"role": "user", "content": "q"}
    content = d.messages[0]["content"]
    assert isinstance(content, str) and content.startswith('S\nC: <source id="1"')


async def test_system_messages_merged_first_and_empty_blocks_stripped() -> None:
    d = draft({})
    d.messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "  "}]},
        {"role": "system", "content": "A"},
        {"role": "system", "content": "B"},
    ]
    assert await SystemMessages().run(d) == {"merged_system_messages": 2, "dropped_empty_parts": 1}
    assert d.messages == [{"role": "system", "content": "A\nB"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]


class _NoTaskModel:
    async def ask(self, task: str, prompt: str) -> str:
        raise AssertionError("no task model call expected")


async def test_the_system_step_records_what_it_normalized() -> None:
    d = draft({})
    d.messages = [
        {"role": "system", "content": "A."},
        {"role": "user", "content": [{"type": "text", "text": "  "}, {"type": "text", "text": "hi"}]},
        {"role": "system", "content": "B."},
    ]
    assert await SystemMessages().run(d) == {"merged_system_messages": 2, "dropped_empty_parts": 1}
    assert d.messages[1] == {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    d.messages = [{"role": "system", "content": "A."}, {"role": "user", "content": "hi"}]
    assert await SystemMessages().run(d) is None  # nothing to do, nothing recorded
