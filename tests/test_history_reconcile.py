"""``engine.context.history.reconcile``: the pure join of a stored history and sent messages."""

from __future__ import annotations

from typing import Any

from engine.context.assemble import ModelProfile, assemble
from engine.context.history import Answer, History, Matched, normalized_text, reconcile
from engine.json_types import JsonObject, JsonValue


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


def assistant(text: str | None, *call_ids: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if call_ids:
        message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in call_ids]
    return message


def tool(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def plain(turn_id: str, text: str) -> Answer:
    return Answer.of(turn_id, [assistant(text)], text)


# A server-tool answer: call s1, its result, then the text.
TOOLED = Answer.of("t1", [assistant("", "s1"), tool("s1", "3"), assistant("It is 3.")], "It is 3.")
# A mixed answer: client call c1 (answered by the client next turn) and server call s2.
MIXED = Answer.of("t2", [assistant("", "c1", "s2"), tool("s2", "ok")], "")


def test_answer_keeps_what_a_client_may_hold() -> None:
    assert TOOLED.texts == {"It is 3."}
    assert TOOLED.call_ids == {"s1"} and TOOLED.result_ids == {"s1"}
    assert MIXED.call_ids == {"c1", "s2"} and MIXED.result_ids == {"s2"}
    assert MIXED.copied_by(assistant(None, "c1"))
    assert not MIXED.copied_by(tool("c1", "42"))  # the client's own answer is a new message
    assert not MIXED.copied_by(assistant(None, "c1", "zz"))
    assert TOOLED.copied_by(assistant(" It is\n3. "))
    assert not TOOLED.copied_by(assistant(""))


def test_normalized_text() -> None:
    assert normalized_text("  a \n\n b\t") == "a b"
    assert normalized_text(None) == ""
    parts = [{"type": "text", "text": " hi  there"}, {"type": "image_url", "image_url": {"url": "x"}}]
    assert normalized_text(parts) == 'hi there {"image_url": {"url": "x"}, "type": "image_url"}'


def test_new_messages_only_are_appended() -> None:
    history = History((user("q1"), TOOLED), (TOOLED,))
    result = reconcile(history, [user("q2")])
    assert result.messages == [user("q1"), *TOOLED.messages, user("q2")]
    assert result.history_len == 2 and result.new_entries == [user("q2")]


def test_the_clients_copy_of_a_tool_turn_is_not_added_twice() -> None:
    history = History((user("q1"), TOOLED), (TOOLED,))
    result = reconcile(history, [user("q1 "), assistant("It is 3.\n"), user("q2")])
    assert result.messages == [user("q1"), *TOOLED.messages, user("q2")]
    assert result.new_entries == [user("q2")]
    # the log's own expansion, resent as is, is recognized too
    again = reconcile(history, [user("q1"), *TOOLED.messages, user("q2")])
    assert again.messages == result.messages


def test_the_longest_overlap_wins() -> None:
    yes, ok = user("yes"), plain("a", "ok")
    ok2 = plain("b", "ok")
    history = History((yes, ok, yes, ok2), (ok, ok2))
    full = reconcile(history, [yes, assistant("ok"), yes, assistant("ok"), user("next")])
    assert full.messages == [yes, assistant("ok"), yes, assistant("ok"), user("next")]
    window = reconcile(history, [yes, assistant("ok"), user("next")])
    assert window.messages == full.messages
    # no overlap: the same words again are a new message
    assert reconcile(history, [yes]).messages == [yes, assistant("ok"), yes, assistant("ok"), yes]


def test_ids_decide_when_both_messages_have_one() -> None:
    history = History((user("draft", id="m1"), plain("a", "A")), (plain("a", "A"),))
    by_id = reconcile(history, [user("draft, reworded", id="m1"), assistant("A"), user("q2")])
    assert by_id.new_entries == [user("q2")]
    other = reconcile(history, [user("draft", id="m2"), assistant("A"), user("q2")])
    assert other.history_len == 2 and other.new_entries[0] == user("draft", id="m2")


def test_mixed_turn_subset_and_the_client_answer() -> None:
    history = History((user("q"), MIXED), (MIXED,))
    result = reconcile(history, [user("q"), assistant(None, "c1"), tool("c1", "42")])
    assert result.messages == [user("q"), *MIXED.messages, tool("c1", "42")]
    assert result.new_entries == [tool("c1", "42")]


def test_copies_outside_the_overlap() -> None:
    a, b = plain("a", "first"), plain("b", "second")
    history = History((user("q1"), a, user("q2"), b), (a, b))
    # a copy of an answer already in the history is not added again
    dropped = reconcile(history, [user("other"), assistant("first"), user("q3")])
    assert dropped.new_entries == [user("other"), user("q3")]
    # a made-up (or edited) assistant message is kept as sent
    kept = reconcile(history, [assistant("invented"), user("q3")])
    assert kept.new_entries == [assistant("invented"), user("q3")]


def test_replace_makes_the_sent_messages_the_whole_history() -> None:
    ok1, ok2 = plain("a", "OK"), plain("b", "OK")
    history = History((user("q1"), TOOLED, user("q2"), ok1, user("q3"), ok2), (TOOLED, ok1, ok2))
    sent = [user("q1"), assistant("It is 3."), user("q2"), assistant("OK"), user("q3 edited")]
    result = reconcile(history, sent, replace=True)
    assert result.replaced and result.history_len == 0
    assert result.entries == [user("q1"), Matched(TOOLED, sent[1]), user("q2"), Matched(ok1, sent[3]), user("q3 edited")]
    assert result.messages == [user("q1"), *TOOLED.messages, user("q2"), assistant("OK"), user("q3 edited")]
    # equal texts: each copy stands for the earliest answer not used yet
    twice = reconcile(history, [assistant("OK"), user("x"), assistant("OK")], replace=True)
    assert [e.answer.turn_id for e in twice.entries if isinstance(e, Matched)] == ["a", "b"]


def test_assemble_records_refs_and_keeps_system_messages_per_request() -> None:
    history = History((user("q1"), TOOLED), (TOOLED,))
    system: JsonObject = {"role": "system", "content": "Be brief."}
    request: JsonObject = {"messages": [system, user("q1"), assistant("It is 3."), user("q2")]}
    assembled = assemble(request, history, ModelProfile())
    assert assembled.messages == [system, user("q1"), *TOOLED.messages, user("q2")]
    assert assembled.history_len == 4 and assembled.new_messages == [user("q2")]
    assert not assembled.history_reset and assembled.turn_refs == []
    replaced = assemble({**request, "history": "client"}, history, ModelProfile())
    assert replaced.history_reset and replaced.history_len == 0
    assert replaced.new_messages == [user("q1"), assistant("It is 3."), user("q2")]
    assert replaced.turn_refs == [{"index": 1, "turn_id": "t1"}]
    # without a stored history the request goes as sent, system messages in place
    odd: list[JsonValue] = [user("a"), system, user("b")]
    assert assemble({"messages": odd}, History(), ModelProfile()).messages == odd


def test_messages_that_are_not_objects_are_skipped() -> None:
    # A message that is not a JSON object has no role to read (it raised
    # AttributeError); the ones that are go on as sent.
    request: JsonObject = {"messages": ["stray", user("q"), 3], "params": {"system": "Be brief."}}
    assembled = assemble(request, History(), ModelProfile())
    assert assembled.messages == [{"role": "system", "content": "Be brief."}, user("q")]
    assert assembled.new_messages == [user("q")]
