"""Reconciling a chat's stored history with the messages a client sends (docs/history.md).

A client that names a ``chat_id`` may send only its new messages, or the whole
conversation it keeps itself (Open WebUI, OpenAI SDK apps). Its copy is not the
log's: it never saw the calls of server tools, it may have re-wrapped a text, or
kept only the last few messages. The model must still get each message once,
and each earlier turn's tool calls and results from the log, once.

The stored history is kept per turn: a turn's new messages are plain entries,
its answer is one ``Answer`` (the messages expanded from its log, and what a
client may hold of it: its texts, its tool-call ids). Reconciling:

1. the longest suffix of the stored entries that the sent messages start with
   is the overlap: it is not added again (a plain entry matches one sent message
   by ``id`` when both have one, else by role, whitespace-normalized text and
   tool-call ids; an ``Answer`` matches the run of sent messages that are copies
   of it: assistant messages with its text or with some of its tool-call ids,
   and the results of its server tools);
2. in the rest, an assistant message that is a copy of a stored answer stands
   for that answer (expanded from the log), or is dropped if the answer is
   already there; any other message is new, as sent.

With ``replace`` (the request's ``"history": "client"``) nothing stored is
prepended: the sent messages are the whole history, step 2 only.

Pure functions: the caller folds the turns and records the result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.json_types import JsonObject, JsonValue
from engine.protocols.shapes import Message, list_of


def normalized_text(content: object) -> str:
    """Text compared for equality: whitespace runs collapsed, ends stripped (a
    client may trim, re-wrap or pad what it shows). Non-text parts compare as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return " ".join(content.split())
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                pieces.append(normalized_text(part.get("text")))
            else:
                pieces.append(json.dumps(part, sort_keys=True, default=str))
        return " ".join(p for p in pieces if p)
    return json.dumps(content, sort_keys=True, default=str)


def tool_call_ids(message: Message) -> list[str]:
    return [str(c.get("id")) for c in list_of(message.get("tool_calls")) if isinstance(c, dict) and c.get("id")]


@dataclass(frozen=True)
class Answer:
    """One turn's answer as its log records it, and what a client may keep of it."""

    turn_id: str
    messages: tuple[Message, ...]  # upstream-ready: tool calls, server tool results, text
    texts: frozenset[str] = frozenset()  # normalized texts a client may hold of it
    call_ids: frozenset[str] = frozenset()  # every call it made (server and client tools)
    result_ids: frozenset[str] = frozenset()  # calls whose results are part of it (server tools)

    @classmethod
    def of(cls, turn_id: str, messages: Iterable[Message], content: str) -> Answer:
        """``content``: the whole text the client received (every round's text)."""
        messages = tuple(messages)
        texts = {normalized_text(content)}
        texts.update(normalized_text(m.get("content")) for m in messages if m.get("role") == "assistant")
        calls = {i for m in messages if m.get("role") == "assistant" for i in tool_call_ids(m)}
        results = {str(m.get("tool_call_id")) for m in messages if m.get("role") == "tool"}
        return cls(turn_id, messages, frozenset(texts - {""}), frozenset(calls), frozenset(results))

    def copied_by(self, message: Message) -> bool:
        """Whether ``message`` is (a piece of) the client's copy of this answer."""
        role = message.get("role")
        if role == "tool":
            return str(message.get("tool_call_id")) in self.result_ids
        if role != "assistant":
            return False
        ids = tool_call_ids(message)
        if ids:
            return set(ids) <= self.call_ids
        return normalized_text(message.get("content")) in self.texts


@dataclass(frozen=True)
class Matched:
    """A sent assistant message that stands for a stored answer."""

    answer: Answer
    sent: Message


Entry = Message | Answer | Matched


@dataclass(frozen=True)
class History:
    """A chat's stored history: ``entries`` oldest first, from where it last
    restarted; ``answers`` every answer of the chat a sent message may copy."""

    entries: tuple[Entry, ...] = ()
    answers: tuple[Answer, ...] = ()


@dataclass(frozen=True)
class Reconciled:
    """The whole conversation (system messages aside); ``entries[:history_len]``
    come from the stored history, the rest is what this turn adds."""

    entries: list[Entry]
    history_len: int
    replaced: bool = False

    @property
    def messages(self) -> list[Message]:
        return expand(self.entries)

    @property
    def new_entries(self) -> list[Entry]:
        return self.entries[self.history_len :]


def expand(entries: Iterable[Entry]) -> list[Message]:
    """Upstream-ready messages: answers expanded from the log."""
    out: list[Message] = []
    for entry in entries:
        if isinstance(entry, Answer):
            out.extend(entry.messages)
        elif isinstance(entry, Matched):
            out.extend(entry.answer.messages)
        else:
            out.append(entry)
    return out


def _key(message: Message) -> tuple[JsonValue, str, JsonValue, tuple[str, ...]]:
    return (
        message.get("role"),
        normalized_text(message.get("content")),
        message.get("tool_call_id"),
        tuple(tool_call_ids(message)),
    )


def same_message(stored: Message, sent: Message) -> bool:
    if stored.get("id") is not None and sent.get("id") is not None:
        return bool(stored["id"] == sent["id"])
    return _key(stored) == _key(sent)


def _copy_run(answer: Answer, sent: Sequence[Message], at: int) -> int:
    """The end of the run of sent messages, from ``at``, that copy ``answer``."""
    end = at
    while end < len(sent) and answer.copied_by(sent[end]):
        end += 1
    return end


def _repeats(stored: Sequence[Entry], sent: Sequence[Message]) -> int | None:
    """How many sent messages repeat all of ``stored``, or None if they do not."""
    at = 0
    for entry in stored:
        if at >= len(sent):
            return None
        if isinstance(entry, Answer | Matched):
            answer = entry if isinstance(entry, Answer) else entry.answer
            end = _copy_run(answer, sent, at)
            if end == at:
                return None
            at = end
        elif same_message(entry, sent[at]):
            at += 1
        else:
            return None
    return at


def overlap(stored: Sequence[Entry], sent: Sequence[Message]) -> tuple[int, int]:
    """(start, n): the longest suffix ``stored[start:]`` the sent messages start
    with, repeated by ``sent[:n]``; (len(stored), 0) when there is none."""
    for start in range(len(stored)):
        n = _repeats(stored[start:], sent)
        if n is not None:
            return start, n
    return len(stored), 0


def _answer_ids(entries: Iterable[Entry]) -> set[str]:
    out = set()
    for entry in entries:
        if isinstance(entry, Answer):
            out.add(entry.turn_id)
        elif isinstance(entry, Matched):
            out.add(entry.answer.turn_id)
    return out


def resolve(sent: Sequence[Message], answers: Sequence[Answer], present: set[str]) -> list[Entry]:
    """The sent messages with each copy of a stored answer replaced by that answer
    (the earliest one not ``present`` yet, else the copy is dropped: the answer is
    already there). A message that copies nothing is kept as sent."""
    present = set(present)
    out: list[Entry] = []
    at = 0
    while at < len(sent):
        message = sent[at]
        candidates = [a for a in answers if message.get("role") == "assistant" and a.copied_by(message)]
        if not candidates:
            out.append(message)
            at += 1
            continue
        fresh = [a for a in candidates if a.turn_id not in present]
        answer = fresh[0] if fresh else candidates[-1]
        if fresh:
            out.append(Matched(answer, message))
            present.add(answer.turn_id)
        at = _copy_run(answer, sent, at)
    return out


def reconcile(history: History, sent: Sequence[Message], *, replace: bool = False) -> Reconciled:
    """The conversation the model gets, from the stored history and the sent
    (non-system) messages."""
    if replace:
        return Reconciled(resolve(sent, history.answers, set()), 0, replaced=True)
    stored = list(history.entries)
    _start, n = overlap(stored, sent)
    tail = resolve(sent[n:], history.answers, _answer_ids(stored))
    return Reconciled([*stored, *tail], len(stored))


def recorded_new(entries: Sequence[Entry]) -> tuple[list[Message], list[JsonObject]]:
    """What a turn records of its new entries (``assembly.completed``): the messages
    as the client sent them, and ``{"index", "turn_id"}`` for each that stands for
    an earlier answer, so later histories expand that answer from its log."""
    messages: list[Message] = []
    refs: list[JsonObject] = []
    for entry in entries:
        if isinstance(entry, Matched):
            refs.append({"index": len(messages), "turn_id": entry.answer.turn_id})
            messages.append(entry.sent)
        elif isinstance(entry, dict):
            messages.append(entry)
    return messages, refs
