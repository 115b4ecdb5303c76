"""Pure folding of an upstream Chat Completions stream into output items.

Open WebUI stores an assistant answer as a list of Responses-API-shaped output
items and builds that list while the provider streams, cutting
reasoning/solution blocks out of the text with tag detection. turnlog records the raw chunks durably and *re-runs this fold* on
replay, so everything here is deterministic and free of I/O, clocks and random
ids: item ids come from an injected ``id_factory`` and no timing fields
(``started_at``/``ended_at``/``duration``) are produced.

Three parts:

* :func:`parse_chat_chunk` — what one Chat Completions chunk says, tolerant of
  every malformed shape a provider can send.
* :class:`Accumulator` — the fold of ``delta.content`` / native reasoning text
  into items, plus the :class:`Piece` stream a live client should be shown.
* :func:`normalize_usage` / :func:`merge_usage` — the usage bookkeeping.

Deliberate differences from Open WebUI 0.12.4:

* After a block closes, the leftover text is parsed again in the same call
  and only the opening tag is removed, so two blocks in one chunk both work
  (Open WebUI leaks the second block into the answer; pinned by
  tests/test_stream.py::test_think_tag_vector).
* Every text part is ``output_text`` (Open WebUI pads with ``text`` parts,
  which its history replay then cannot read).
* Merging usage sums the ``prompt_tokens``/``completion_tokens`` aliases
  too, so they always agree with ``input_tokens``/``output_tokens`` (pinned by
  tests/test_stream.py::test_merge_usage_sums_aliases_across_rounds_q19).
* :meth:`Accumulator.mark_incomplete` marks interrupted items
  ``incomplete`` instead of pretending they completed (pinned by
  tests/test_stream.py::test_mark_incomplete_keeps_finished_items_completed).
* The fold does not depend on how the provider cut the text into chunks.
  Open WebUI shows a possible partial tag (``"<thi"``) and retracts it later,
  and it left-strips the text after a closing tag only when it arrives in the
  same chunk as the tag. Here a possible partial tag is held back until it is
  decided, and whitespace after a closing tag is dropped whatever the chunking.
  Consequence: no item (and no id) is ever created for text that turns out to
  be a tag, so ids can differ from a recording of Open WebUI that burnt an id
  on such a transient item.
* When several start tags occur in one text, the leftmost one wins (Open WebUI
  tries the tags in list order, so a later ``<think>`` could beat an earlier
  ``<reason>``).
* Inside an open block only its own end tag is looked for; other start tags in
  it are literal text (this is what "remove only the first start tag" means
  when the leftover is parsed again).
* Attribute text in a start tag (``<think type="x">``) is limited to
  :data:`ATTRIBUTE_LIMIT` characters on one line, so that a stray ``<think ``
  in prose holds back at most that much text from a live client.
* Legacy code-interpreter blocks (``code_interpreter=True``) are
  items of type ``code_interpreter`` (Open WebUI: ``open_webui:code_interpreter``;
  history conversion accepts both). Reading does not stop at
  ``</code_interpreter>``: text after it goes to a new message item, as
  after a reasoning block. The code is stripped like any closed block's text,
  and an empty block creates no item (Open WebUI removes it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from engine.json_types import JsonObject, JsonValue
from engine.pieces import Piece, PieceKind

__all__ = [
    "ATTRIBUTE_LIMIT",
    "CODE_INTERPRETER_TAGS",
    "DEFAULT_REASONING_TAGS",
    "SOLUTION_TAGS",
    "Accumulator",
    "ChunkParts",
    "Piece",
    "PieceKind",
    "TagKind",
    "TagSpec",
    "USAGE_ESTIMATED",
    "merge_usage",
    "normalize_usage",
    "parse_chat_chunk",
]


# --------------------------------------------------------------------------
# Chunk parsing
# --------------------------------------------------------------------------

#: Where providers put native reasoning text in a delta, in Open WebUI's order
#: of preference (llama.cpp/DeepSeek, OpenRouter, Ollama).
_REASONING_KEYS: Final[tuple[str, ...]] = ("reasoning_content", "reasoning", "thinking")


@dataclass(frozen=True)
class ChunkParts:
    """Everything the fold needs from one Chat Completions chunk.

    Parsing is separated from folding so that the fold never has to guess at
    provider shapes, and so that tests can state the tolerance rules in one
    place.
    """

    content: str | None = None
    reasoning: str | None = None
    #: Raw ``delta.tool_calls`` fragments, untouched: their accumulation by
    #: index/id is a separate concern (``ChatToolCalls`` in ``engine.protocols.chat``).
    tool_calls: list[JsonObject] = field(default_factory=list)
    finish_reason: str | None = None
    usage: JsonObject | None = None
    error: object = None  # a provider's error object, as sent
    response_id: str | None = None
    role: str | None = None


def _stringify(value: object) -> str | None:
    """Providers occasionally send numbers or objects as text; the spec says
    non-strings are stringified rather than dropped."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return str(value)


def parse_chat_chunk(chunk: object) -> ChunkParts:
    """Split one parsed Chat Completions chunk into its meaningful parts.

    Never raises, whatever the dict holds: a provider bug must not abort a turn
    (Open WebUI skips what it cannot read too). Only the first choice is
    read (turnlog always requests ``n=1``). A choice without a ``delta`` but
    with a ``message`` dict is read from the message, because some gateways
    send whole messages in stream chunks. ``usage`` also absorbs llama.cpp's
    top-level ``timings``, with ``usage`` keys winning.
    """
    if not isinstance(chunk, dict):
        return ChunkParts()

    choices = chunk.get("choices")
    has_choices = isinstance(choices, list) and len(choices) > 0
    choice: Mapping[str, object] = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}

    delta = choice.get("delta")
    if not isinstance(delta, dict):
        message = choice.get("message")
        delta = message if isinstance(message, dict) else {}

    reasoning: str | None = None
    for key in _REASONING_KEYS:
        value = delta.get(key)
        if value:  # Open WebUI chains these with ``or``: empty means absent.
            reasoning = _stringify(value)
            break

    raw_calls = delta.get("tool_calls")
    tool_calls = [c for c in raw_calls if isinstance(c, dict)] if isinstance(raw_calls, list) else []

    finish_reason = choice.get("finish_reason")
    usage = chunk.get("usage")
    timings = chunk.get("timings")
    merged_usage: JsonObject | None = None
    if isinstance(timings, dict) and timings:
        merged_usage = dict(timings)
    if isinstance(usage, dict) and usage:
        merged_usage = {**(merged_usage or {}), **usage}

    error = chunk.get("error") if not has_choices else None
    response_id = chunk.get("id")
    role = delta.get("role")

    return ChunkParts(
        content=_stringify(delta.get("content")),
        reasoning=reasoning,
        tool_calls=tool_calls,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        usage=merged_usage,
        error=error,
        response_id=response_id if isinstance(response_id, str) else None,
        role=role if isinstance(role, str) else None,
    )


# --------------------------------------------------------------------------
# Tag table
# --------------------------------------------------------------------------

#: What a tag block becomes. A new kind needs a builder in ``_KINDS`` and a
#: tag pair.
TagKind = Literal["reasoning", "solution", "code_interpreter"]

#: The default reasoning tag pairs (Open WebUI's set).
DEFAULT_REASONING_TAGS: Final[tuple[tuple[str, str], ...]] = (
    ("<think>", "</think>"),
    ("<thinking>", "</thinking>"),
    ("<reason>", "</reason>"),
    ("<reasoning>", "</reasoning>"),
    ("<thought>", "</thought>"),
    ("<Thought>", "</Thought>"),
    ("<|begin_of_thought|>", "<|end_of_thought|>"),
    ("◁think▷", "◁/think▷"),
)

#: Solution tags are always detected, whatever the reasoning tag setting.
SOLUTION_TAGS: Final[tuple[tuple[str, str], ...]] = (("<|begin_of_solution|>", "<|end_of_solution|>"),)

#: Detected only in legacy function calling with the code
#: interpreter feature on (``Accumulator(code_interpreter=True)``).
CODE_INTERPRETER_TAGS: Final[tuple[tuple[str, str], ...]] = (("<code_interpreter>", "</code_interpreter>"),)

#: Longest attribute text accepted inside a start tag such as
#: ``<think type="deep">``. It bounds how much text a live client may have to
#: wait for while an unfinished ``<think ...`` is undecided, and it keeps tag
#: detection independent of chunk boundaries (the same limit applies when the
#: whole tag arrives in one chunk).
ATTRIBUTE_LIMIT: Final[int] = 256

_ATTRIBUTE_PAIR = re.compile(r'(\w+)\s*=\s*"([^"]*)"')


@dataclass(frozen=True)
class TagSpec:
    """One start/end pair and what its block becomes."""

    kind: TagKind
    start: str
    end: str

    @property
    def takes_attributes(self) -> bool:
        """``<name>`` tags may carry ``key="value"`` attributes;
        other spellings (``◁think▷``) are matched literally."""
        return len(self.start) > 2 and self.start.startswith("<") and self.start.endswith(">")


@dataclass(frozen=True)
class _KindInfo:
    """How a block kind is stored and shown."""

    id_prefix: str
    piece_kind: PieceKind
    #: ``(item_id, spec, attributes) -> (item, buffer of the item's text)``.
    build: Callable[[str, TagSpec, JsonObject], tuple[JsonObject, _Buf]]


def _build_reasoning(item_id: str, spec: TagSpec, attributes: JsonObject, part: JsonObject) -> JsonObject:
    return {
        "type": "reasoning",
        "id": item_id,
        "status": "in_progress",
        "start_tag": spec.start,
        "end_tag": spec.end,
        "attributes": attributes,
        "content": [part],
        "summary": None,
    }


def _build_solution(item_id: str, spec: TagSpec, attributes: JsonObject, part: JsonObject) -> JsonObject:
    return {
        "type": "message",
        "id": item_id,
        "status": "in_progress",
        "role": "assistant",
        "content": [part],
        "_tag_type": "solution",
        "start_tag": spec.start,
        "end_tag": spec.end,
        "attributes": attributes,
    }


def _with_text_part(
    builder: Callable[[str, TagSpec, JsonObject, JsonObject], JsonObject],
) -> Callable[[str, TagSpec, JsonObject], tuple[JsonObject, _Buf]]:
    """A builder for an item whose text lives in one ``output_text`` part."""

    def build(item_id: str, spec: TagSpec, attributes: JsonObject) -> tuple[JsonObject, _Buf]:
        part: JsonObject = {"type": "output_text", "text": ""}
        return builder(item_id, spec, attributes, part), _Buf(part)

    return build


def _build_code_interpreter(item_id: str, spec: TagSpec, attributes: JsonObject) -> tuple[JsonObject, _Buf]:
    """Open WebUI's ``open_webui:code_interpreter`` item: the block's text is ``code``;
    ``output`` stays None until the engine has run it."""
    item: JsonObject = {
        "type": "code_interpreter",
        "id": item_id,
        "status": "in_progress",
        "start_tag": spec.start,
        "end_tag": spec.end,
        "attributes": attributes,
        "lang": attributes.get("lang", "python"),
        "code": "",
        "output": None,
    }
    return item, _Buf(item, "code")


def _reasoning_pairs(reasoning_tags: object) -> tuple[tuple[str, str], ...]:
    """``False`` disables, a 2-element list replaces the set (Open WebUI's setting).

    Anything else (``None``, ``True``, a malformed list) means the defaults,
    because the value comes from user-supplied request params and a bad value
    should not make reasoning leak into the answer.
    """
    if reasoning_tags is False:
        return ()
    if isinstance(reasoning_tags, (list, tuple)) and len(reasoning_tags) == 2 and all(isinstance(t, str) and t for t in reasoning_tags):
        return ((reasoning_tags[0], reasoning_tags[1]),)
    return DEFAULT_REASONING_TAGS


@functools.lru_cache(maxsize=64)
def _scanners(reasoning: tuple[tuple[str, str], ...], code_interpreter: bool) -> tuple[_StartScanner, _StartScanner]:
    """An accumulator's two scanners, built once per tag set (every view of
    every turn makes an accumulator: its specs and their hashes are not
    rebuilt each time). Once native reasoning exists, reasoning tags are
    literal text; solution and code-interpreter tags are still detected."""
    reasoning_specs = [TagSpec("reasoning", s, e) for s, e in reasoning]
    other_specs = [TagSpec("solution", s, e) for s, e in SOLUTION_TAGS]
    if code_interpreter:
        other_specs += [TagSpec("code_interpreter", s, e) for s, e in CODE_INTERPRETER_TAGS]
    return _scanner_for(tuple(reasoning_specs + other_specs)), _scanner_for(tuple(other_specs))


@functools.lru_cache(maxsize=64)
def _scanner_for(specs: tuple[TagSpec, ...]) -> _StartScanner:
    """Scanners are immutable: every accumulator with the same tags shares one."""
    return _StartScanner(specs)


class _StartScanner:
    """Finds start tags in text outside any block, and decides how much of the
    tail must be held back because it may still become a start tag."""

    def __init__(self, specs: Sequence[TagSpec]) -> None:
        self.specs: tuple[TagSpec, ...] = tuple(specs)
        self.triggers: frozenset[str] = frozenset(s.start[0] for s in self.specs)
        # The usual case, every tag starting with "<": a substring test (C
        # memchr) instead of a regex search, once per streamed chunk.
        self._trigger: str | None = next(iter(self.triggers)) if len(self.triggers) == 1 else None
        alternatives: list[str] = []
        for i, spec in enumerate(self.specs):
            if spec.takes_attributes:
                name = re.escape(spec.start[1:-1])
                alternatives.append(rf"(?P<t{i}><{name}(?:[^\S\n](?P<a{i}>[^>\n]{{0,{ATTRIBUTE_LIMIT}}}+))?>)")
            else:
                alternatives.append(rf"(?P<t{i}>{re.escape(spec.start)})")
        # One C-level scan instead of a Python loop over the trigger chars.
        self._trigger_re: re.Pattern[str] = re.compile("[" + "".join(re.escape(c) for c in sorted(self.triggers)) + "]" if self.triggers else "(?!)")
        self.start_re: re.Pattern[str] | None = re.compile("|".join(alternatives)) if alternatives else None
        # Every proper prefix of a start tag: a text ending in one of these
        # may be an unfinished tag.
        self.prefixes: frozenset[str] = frozenset(s.start[:n] for s in self.specs for n in range(1, len(s.start)))
        self.max_prefix: int = max((len(s.start) - 1 for s in self.specs), default=0)
        names = [re.escape(s.start[1:-1]) for s in self.specs if s.takes_attributes]
        # "<name" + one blank: the opening of an attribute-carrying tag.
        self.attr_open_re: re.Pattern[str] | None = re.compile(rf"<(?:{'|'.join(names)})[^\S\n]") if names else None
        self.attr_window: int = max((len(s.start) for s in self.specs if s.takes_attributes), default=0) + (ATTRIBUTE_LIMIT)

    def may_start(self, text: str) -> bool:
        """Cheap test for the hot path: no trigger char, no tag can start."""
        if self._trigger is not None:
            return self._trigger in text
        if len(text) == 1:
            return text in self.triggers
        return self._trigger_re.search(text) is not None

    def holdback(self, s: str) -> tuple[int, int]:
        """Where ``s`` (known to hold no complete start tag) could still be
        the beginning of one: ``(cut, max_len)``. ``s[cut:]`` must wait
        (``cut == len(s)`` if nothing must). If the waiting text is an opened
        attribute-carrying tag (``<think ty``), ``max_len`` is the length it
        may grow to before it stops being a candidate, else 0.

        Only the last few characters are examined (the longest tag, or the
        attribute window), which keeps the fold linear in the stream length.
        """
        n = len(s)
        cut = n
        max_len = 0
        for length in range(min(self.max_prefix, n), 0, -1):
            if s[n - length :] in self.prefixes:
                cut = n - length
                break
        if self.attr_open_re is not None:
            # An attribute-carrying tag is undecided until ">" or a newline.
            lo = max(s.rfind(">"), s.rfind("\n")) + 1
            lo = max(lo, n - self.attr_window)
            for m in self.attr_open_re.finditer(s, lo):
                if m.start() >= cut:
                    break
                if n - m.end() <= ATTRIBUTE_LIMIT:
                    cut = m.start()
                    max_len = m.end() - m.start() + ATTRIBUTE_LIMIT
                    break
        return cut, max_len


def _end_holdback(s: str, end: str) -> int:
    """Index from which ``s`` (holding no complete ``end``) may be the start of
    ``end``: the longest suffix that is a proper prefix of it."""
    n = len(s)
    for length in range(min(len(end) - 1, n), 0, -1):
        if end.startswith(s[n - length :]):
            return n - length
    return n


def _parse_attributes(text: str | None) -> JsonObject:
    if not text:
        return {}
    return {k: v for k, v in _ATTRIBUTE_PAIR.findall(text)}


# --------------------------------------------------------------------------
# Accumulator
# --------------------------------------------------------------------------

_KINDS: Final[dict[str, _KindInfo]] = {
    "reasoning": _KindInfo("r", "reasoning", _with_text_part(_build_reasoning)),
    "solution": _KindInfo("msg", "text", _with_text_part(_build_solution)),
    "code_interpreter": _KindInfo("ci", "code", _build_code_interpreter),
}


class _Buf:
    """Text of one item as a list of chunks, joined only when read, so that
    appending a token is O(1) however long the answer grows."""

    __slots__ = ("parts", "target", "key")

    def __init__(self, target: JsonObject, key: str = "text") -> None:
        self.parts: list[str] = []
        # Where the joined text is stored: ``target[key]``, e.g. the item's
        # {"type": "output_text", "text": ...} part, or a code item's "code".
        self.target = target
        self.key = key

    def join(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def store(self, text: str) -> None:
        self.target[self.key] = text


class _Block:
    """An open tag block. Its item is created only when the first non-blank
    text arrives, so an empty block never allocates an id or appears."""

    __slots__ = ("spec", "info", "attributes", "item", "buf", "ws_hold")

    def __init__(self, spec: TagSpec, attributes: JsonObject) -> None:
        self.spec = spec
        self.info = _KINDS[spec.kind]
        self.attributes = attributes
        self.item: JsonObject | None = None
        self.buf: _Buf | None = None
        # Trailing blanks: shown only once more text follows, because a block
        # is stripped when it closes.
        self.ws_hold: list[str] = []


_NATIVE_SPEC: Final[TagSpec] = TagSpec("reasoning", "<think>", "</think>")


class Accumulator:
    """Folds one model response (raw ``delta.content`` chunks and native
    reasoning text) into output items the way Open WebUI's streaming handler
    and tag parser do, minus the quirks listed in the module
    docstring.

    Use: call :meth:`feed_text` / :meth:`feed_reasoning` per chunk and show the
    returned pieces; at the end call :meth:`flush` (to show the held-back tail)
    and :meth:`finish`, or :meth:`mark_incomplete` if the stream was cut off.
    Feeding after any of these three raises ``RuntimeError``.

    With ``code_interpreter=True`` (legacy function calling with the code
    interpreter feature on) ``<code_interpreter ...>`` blocks become
    ``code_interpreter`` items; :attr:`pending_code` is a finished block the
    engine should run and :meth:`set_code_output` stores its result. With
    ``stop_after_code=True`` as well, the input ends at the first block's
    ``</code_interpreter>`` (Open WebUI stops reading the stream there): what
    follows it is dropped, from :attr:`content` too, and :attr:`code_closed`
    says so. A block with no code is dropped and the input goes on.

    Cost: each chunk costs time proportional to its own length plus a bounded
    look-back for split tags; item texts are kept as chunk lists and joined
    only when :attr:`output`, :attr:`text` or :attr:`reasoning_text` is read.
    """

    def __init__(
        self,
        *,
        id_factory: Callable[[str], str],
        reasoning_tags: object = None,  # as the request gave it: anything JSON
        code_interpreter: bool = False,
        stop_after_code: bool = False,
    ) -> None:
        self._id_factory = id_factory
        self._stop_after_code = code_interpreter and stop_after_code
        self.code_closed = False  # a code block ended the input (stop_after_code)
        self._full_scanner, self._after_native_scanner = _scanners(_reasoning_pairs(reasoning_tags), code_interpreter)
        self._scanner = self._full_scanner

        self._items: list[JsonObject] = []
        self._bufs: dict[int, _Buf] = {}  # id(item) -> its text buffer
        self._dirty: set[_Buf] = set()
        self._raw: list[str] = []

        self._pending = ""  # undecided tail: maybe the beginning of a tag
        # While the undecided tail is an opened attribute tag ("<think ty"),
        # the length it may reach; 0 otherwise. Lets a chunk without ">" or
        # a newline be appended without rescanning the tail.
        self._pending_max = 0
        self._block: _Block | None = None
        self._msg_buf: _Buf | None = None  # the open plain message item's text
        self._msg: JsonObject | None = None
        self._lead_ws: list[str] = []  # blanks that may start a message
        self._drop_lead_ws = False  # just after a closing tag
        self._native: JsonObject | None = None
        self._native_open = False
        self._state: Literal["open", "flushed", "done"] = "open"

    # -- feeding ---------------------------------------------------------------

    def feed_text(self, text: str) -> list[Piece]:
        """Fold one raw ``delta.content`` chunk; return what to show for it."""
        if self._state != "open":
            self._check_open()
        if not text or self.code_closed:
            return []
        self._raw.append(text)
        if self._native_open:
            # Content after native reasoning closes it; a new message follows.
            self._close_native()
        out: list[Piece] = []
        pending = self._pending
        if not pending:
            block = self._block
            if block is None:
                if not self._scanner.may_start(text):
                    buf = self._msg_buf
                    if buf is not None:
                        # The per-token case (``_emit_text`` into the open
                        # message), inlined: no tag, nothing held back.
                        buf.parts.append(text)
                        self._dirty.add(buf)
                        return [Piece("text", text)]
                    self._emit_text(text, out)
                    return out
            elif block.spec.end[0] not in text:
                self._emit_block(text, out)
                return out
        elif self._pending_max and len(pending) + len(text) <= self._pending_max and ">" not in text and "\n" not in text:
            self._pending = pending + text  # still undecided, nothing to show
            return out
        self._scan(pending + text, out)
        return out

    def feed_plain(self, texts: list[str]) -> bool:
        """Fold ``texts`` (all non-empty) in one step if each would take
        ``feed_text``'s per-token case (an open message, no tag possible,
        nothing held back): then every chunk's piece is ``Piece("text",
        text)``. False, with nothing folded, if any might not (feed them one
        by one then). One test of the joined text for a tag start stands for
        one per chunk: a character that could start a tag is in the whole
        iff it is in a part."""
        buf = self._msg_buf
        if (
            buf is None
            or self.code_closed
            or self._state != "open"
            or self._native_open
            or self._pending
            or self._block is not None
            or "" in texts  # (an empty chunk shows nothing: the per-chunk path)
            or self._scanner.may_start("".join(texts))
        ):
            return False
        self._raw.extend(texts)
        buf.parts.extend(texts)
        self._dirty.add(buf)
        return True

    def feed_reasoning(self, text: str) -> list[Piece]:
        """Fold native reasoning text (``reasoning_content`` & co.).

        The first native text creates a reasoning item marked
        ``attributes.type == "reasoning_content"``: appended and in progress
        if no message item exists yet, otherwise inserted before the first
        message item, already completed (late reasoning is hoisted). Later
        native text extends that same item. From then on reasoning tags in the
        content are literal text.
        """
        self._check_open()
        if not text or self.code_closed:
            return []
        item = self._native
        if item is None:
            part: JsonObject = {"type": "output_text", "text": ""}
            item = _build_reasoning(self._id_factory("r"), _NATIVE_SPEC, {"type": "reasoning_content"}, part)
            first_message = next((i for i, it in enumerate(self._items) if it.get("type") == "message"), None)
            if first_message is None:
                self._items.append(item)
                self._native_open = True
            else:
                item["status"] = "completed"
                self._items.insert(first_message, item)
            self._bufs[id(item)] = _Buf(part)
            self._native = item
            self._scanner = self._after_native_scanner
            self._pending_max = 0  # the held tail must be judged again
        self._append(self._bufs[id(item)], text)
        return [Piece("reasoning", text)]

    def flush(self) -> list[Piece]:
        """End of input: release the held-back tail and return what to show.

        An unfinished tag prefix (``"a <"``) is plain text after all; blanks
        held at the end of a block are kept, as Open WebUI does not strip an
        unclosed block. Blanks that were waiting to start a message are
        dropped: that message would be removed by the final strip anyway.
        Called by :meth:`finish` and :meth:`mark_incomplete` if not called
        before; idempotent.
        """
        if self._state != "open":
            return []
        out: list[Piece] = []
        pending, self._pending = self._pending, ""
        self._pending_max = 0
        if pending:
            if self._block is None:
                self._emit_text(pending, out)
            else:
                self._emit_block(pending, out)
        block = self._block
        if block is not None and block.ws_hold and block.buf is not None:
            tail = "".join(block.ws_hold)
            block.ws_hold.clear()
            self._append(block.buf, tail)
            out.append(Piece(block.info.piece_kind, tail))
        self._lead_ws.clear()
        self._state = "flushed"
        return out

    def finish(self, *, strip: bool = True) -> None:
        """Normal end of stream.

        The last message item is stripped and removed if that empties it; an
        empty output gets one empty message item back (so a turn always has
        an answer slot); an unclosed block is closed; every item still in
        progress becomes ``completed``.

        ``strip=False`` keeps the answer exactly as the model sent it (only an
        empty last message is removed): an OpenAI-compatible stream cannot take
        back whitespace it already delivered, so the stored answer must not
        differ from what live clients received.
        """
        if self._state == "done":
            return
        self.flush()
        self._block = None
        self._native_open = False
        self._msg = self._msg_buf = None
        self._sync()
        for index in range(len(self._items) - 1, -1, -1):
            item = self._items[index]
            if item.get("type") != "message":
                continue
            buf = self._bufs[id(item)]
            joined = buf.join()
            stripped = joined.strip()
            if stripped and not strip:
                pass
            elif stripped:
                buf.parts[:] = [stripped]
                buf.store(stripped)
            else:
                del self._items[index]
                del self._bufs[id(item)]
            break
        if not self._items:
            self._new_message()
            self._msg = self._msg_buf = None
        for item in self._items:
            if item.get("status") == "in_progress":
                item["status"] = "completed"
        self._state = "done"

    def mark_incomplete(self) -> None:
        """Cancellation or failure: keep everything received (held-back text
        included) and mark every item still in progress ``incomplete`` (an
        interrupted item must not look completed, unlike in Open WebUI). Items that had already
        ended stay ``completed``. Terminal, like :meth:`finish`."""
        if self._state == "done":
            return
        self.flush()
        self._block = None
        self._native_open = False
        self._msg = self._msg_buf = None
        for item in self._items:
            if item.get("status") == "in_progress":
                item["status"] = "incomplete"
        self._state = "done"

    # -- reading ---------------------------------------------------------------

    @property
    def output(self) -> list[JsonObject]:
        """The output items: the live list and live dicts, not copies.

        Texts are brought up to date on each read (cost: the length of the
        items that changed since the last read), so read it per flush window
        or at the end rather than per token; copy before keeping a snapshot.
        """
        self._sync()
        return self._items

    @property
    def content(self) -> str:
        """Every ``delta.content`` chunk joined raw, tags included: Open
        WebUI's ``content`` string. Native reasoning is not in it."""
        if len(self._raw) > 1:
            self._raw[:] = ["".join(self._raw)]
        return self._raw[0] if self._raw else ""

    @property
    def text(self) -> str:
        """The visible answer: the text of every message item (solution
        blocks included), joined without separator."""
        self._sync()
        return "".join(self._item_text(it) for it in self._items if it.get("type") == "message")

    @property
    def reasoning_text(self) -> str:
        """The text of every reasoning item (tag blocks and native), joined
        without separator."""
        self._sync()
        return "".join(self._item_text(it) for it in self._items if it.get("type") == "reasoning")

    @property
    def pending_code(self) -> JsonObject | None:
        """The code-interpreter block the engine should run now, or None: the
        last item, if it is a ``completed`` code block whose ``output`` is
        still None. A block followed by answer text is not pending, nor is an
        unclosed block before :meth:`finish` completes it (after
        :meth:`mark_incomplete` it is ``incomplete`` and never pending).
        Returns the live item (its ``code`` brought up to date)."""
        if not self._items:
            return None
        last = self._items[-1]
        if last.get("type") != "code_interpreter" or last.get("status") != "completed" or last.get("output") is not None:
            return None
        self._sync()
        return last

    def set_code_output(self, item_id: str, output: JsonObject | str) -> None:
        """Store the result of running code block ``item_id`` (a string, or
        ``{stdout, stderr, result}``-style dict, copied) as its ``output``.
        Allowed after :meth:`finish`; the item's status is left as it is.
        Raises ``KeyError`` if no code block has that id and ``TypeError`` for
        any other output type."""
        if not isinstance(output, (dict, str)):
            raise TypeError(f"code output must be a dict or a str, not {type(output).__name__}")
        for item in reversed(self._items):
            if item.get("id") == item_id and item.get("type") == "code_interpreter":
                item["output"] = dict(output) if isinstance(output, dict) else output
                return
        raise KeyError(item_id)

    # -- internals -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError("Accumulator is finished; no more input is accepted")

    def _item_text(self, item: JsonObject) -> str:
        buf = self._bufs.get(id(item))
        return buf.join() if buf is not None else ""

    def _append(self, buf: _Buf, text: str) -> None:
        buf.parts.append(text)
        self._dirty.add(buf)

    def _sync(self) -> None:
        for buf in self._dirty:
            buf.store(buf.join())
        self._dirty.clear()

    def _scan(self, s: str, out: list[Piece]) -> None:
        """Classify ``s`` (held-back tail + new chunk): text, tags, block text.

        Loops instead of stopping after a closing tag, so the leftover is
        parsed in the same call (two blocks in one chunk both work). Only ``s`` is scanned, never the text
        already stored in items.
        """
        self._pending = ""
        self._pending_max = 0
        while s:
            block = self._block
            if block is None:
                scanner = self._scanner
                m = scanner.start_re.search(s) if scanner.start_re is not None else None
                if m is not None:
                    if m.start():
                        self._emit_text(s[: m.start()], out)
                    self._open_block(scanner, m)
                    s = s[m.end() :]
                    continue
                cut, self._pending_max = scanner.holdback(s)
                if cut:
                    self._emit_text(s[:cut], out)
                self._pending = s[cut:]
                return
            end = block.spec.end
            at = s.find(end)
            if at >= 0:
                if at:
                    self._emit_block(s[:at], out)
                self._close_block()
                s = s[at + len(end) :]
                if self.code_closed:
                    self._cut(s)
                    return
                continue
            cut = _end_holdback(s, end)
            if cut:
                self._emit_block(s[:cut], out)
            self._pending = s[cut:]
            return

    def _open_block(self, scanner: _StartScanner, m: re.Match[str]) -> None:
        index = int((m.lastgroup or "t0")[1:])
        spec = scanner.specs[index]
        attributes = _parse_attributes(m.group(f"a{index}")) if spec.takes_attributes else {}
        # The message before the tag is done; blanks that were waiting to
        # start a message are dropped (Open WebUI removes a blank message).
        if self._msg is not None:
            self._msg["status"] = "completed"
        self._msg = self._msg_buf = None
        self._lead_ws.clear()
        self._drop_lead_ws = False
        self._block = _Block(spec, attributes)

    def _close_block(self) -> None:
        block = self._block
        assert block is not None
        self._block = None
        if block.item is not None:  # its text is already stripped
            block.item["status"] = "completed"
            if self._stop_after_code and block.spec.kind == "code_interpreter":
                self.code_closed = True
        # As in Open WebUI, the text after the end tag is left-stripped.
        self._drop_lead_ws = True

    def _cut(self, rest: str) -> None:
        """The input ends at a code block's end tag: ``rest``, the text after
        it in the last chunk, is dropped from the raw content too."""
        if rest:
            last = self._raw[-1]
            # ``rest`` lies within the last chunk: the end tag is never held back whole.
            self._raw[-1] = last[: len(last) - len(rest)] if last.endswith(rest) else last
        self._drop_lead_ws = False

    def _close_native(self) -> None:
        if self._native is not None:
            self._native["status"] = "completed"
        self._native_open = False
        # Open WebUI starts a fresh message here, whose text is not stripped.
        self._drop_lead_ws = False

    def _new_message(self) -> None:
        part: JsonObject = {"type": "output_text", "text": ""}
        item: JsonObject = {
            "type": "message",
            "id": self._id_factory("msg"),
            "status": "in_progress",
            "role": "assistant",
            "content": [part],
        }
        buf = _Buf(part)
        self._items.append(item)
        self._bufs[id(item)] = buf
        self._msg, self._msg_buf = item, buf

    def _emit_text(self, text: str, out: list[Piece]) -> None:
        """Visible text outside any block goes to the open message item,
        created on the first non-blank text (a blank message before a tag is
        removed by Open WebUI, so it is never created here)."""
        buf = self._msg_buf
        if buf is None:
            if self._drop_lead_ws:
                text = text.lstrip()
                if not text:
                    return
                self._drop_lead_ws = False
            elif text.isspace():
                self._lead_ws.append(text)
                return
            if self._lead_ws:
                text = "".join(self._lead_ws) + text
                self._lead_ws.clear()
            self._new_message()
            buf = self._msg_buf
            assert buf is not None
        self._append(buf, text)
        out.append(Piece("text", text))

    def _emit_block(self, text: str, out: list[Piece]) -> None:
        """Text inside a block. A closed block's text is stripped, so leading
        blanks are dropped and trailing blanks wait for more text: what is
        shown is exactly what the item ends up holding."""
        block = self._block
        assert block is not None
        if block.buf is None:
            text = text.lstrip()
            if not text:
                return
            item, buf = block.info.build(self._id_factory(block.info.id_prefix), block.spec, block.attributes)
            block.item, block.buf = item, buf
            self._items.append(item)
            self._bufs[id(item)] = block.buf
            body = text.rstrip()
        else:
            body = text.rstrip()
            if not body:
                block.ws_hold.append(text)
                return
            if block.ws_hold:
                body = "".join(block.ws_hold) + body
                block.ws_hold.clear()
        tail = text[len(text.rstrip()) :]
        if tail:
            block.ws_hold.append(tail)
        self._append(block.buf, body)
        out.append(Piece(block.info.piece_kind, body))


# --------------------------------------------------------------------------
# Usage
# --------------------------------------------------------------------------

_INPUT_KEYS: Final[tuple[str, ...]] = ("input_tokens", "prompt_tokens", "prompt_eval_count")
_OUTPUT_KEYS: Final[tuple[str, ...]] = ("output_tokens", "completion_tokens", "eval_count", "predicted_n")
_TOKEN_KEYS: Final[frozenset[str]] = frozenset({"input_tokens", "output_tokens", "total_tokens"})
_COST_KEYS: Final[frozenset[str]] = frozenset({"cost", "total_cost", "input_cost", "output_cost", "prompt_cost", "completion_cost"})
_SUMMABLE_KEYS: Final[frozenset[str]] = _TOKEN_KEYS | _COST_KEYS
_DETAIL_KEYS: Final[tuple[str, ...]] = (
    "prompt_tokens_details",
    "completion_tokens_details",
    "input_tokens_details",
    "output_tokens_details",
)


def _number(value: object) -> int | float | None:
    """A usage count, or None: providers send junk (None, "", bools) at times."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return None
    return None


def _first_count(usage: Mapping[str, object], keys: Sequence[str]) -> int | float | None:
    for key in keys:
        value = _number(usage.get(key))
        if value:
            return value
    return None


# Set (true) in a recorded usage that turnlog counted itself: the upstream
# reported none (engine.run.usage).
USAGE_ESTIMATED: Final = "usage_estimated"


def normalize_usage(usage: Mapping[str, JsonValue]) -> JsonObject:
    """Add the canonical ``input_tokens``/``output_tokens``/``total_tokens`` to
    a provider's usage dict, keeping the provider's own keys.

    Recognised spellings: Responses/Anthropic (``input_tokens``), OpenAI
    (``prompt_tokens``), Ollama (``prompt_eval_count``/``eval_count``) and
    llama.cpp timings, whose input is ``prompt_n + cache_n`` (cached prompt
    tokens are still prompt tokens). A provider ``total_tokens`` is kept.
    An empty usage stays empty, so "no usage reported" is not turned into a
    claim of zero tokens.
    """
    if not isinstance(usage, dict) or not usage:
        return {}
    input_tokens = _first_count(usage, _INPUT_KEYS)
    if input_tokens is None:
        prompt_n, cache_n = _number(usage.get("prompt_n")), _number(usage.get("cache_n"))
        input_tokens = (prompt_n or 0) + (cache_n or 0)
    output_tokens = _first_count(usage, _OUTPUT_KEYS) or 0
    total_tokens = _number(usage.get("total_tokens")) or (input_tokens + output_tokens)
    result = dict(usage)
    result["input_tokens"] = int(input_tokens)
    result["output_tokens"] = int(output_tokens)
    result["total_tokens"] = int(total_tokens)
    return result


def _add(a: object, b: object) -> int | float:
    return (_number(a) or 0) + (_number(b) or 0)


def _merge_counts(current: Mapping[str, JsonValue], incoming: Mapping[str, JsonValue]) -> JsonObject:
    """Key-by-key sum of two ``*_tokens_details`` maps (nested maps recurse,
    non-numbers: the incoming value wins)."""
    result: JsonObject = {**current, **incoming}
    for key in result:
        a, b = current.get(key), incoming.get(key)
        if isinstance(a, dict) or isinstance(b, dict):
            result[key] = _merge_counts(a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {})
        elif _number(a) is not None or _number(b) is not None:
            result[key] = _add(a, b)
    return result


def merge_usage(current: Mapping[str, JsonValue] | None, incoming: Mapping[str, JsonValue] | None) -> JsonObject:
    """Add one model call's usage to a turn's running total (tool rounds make
    several calls per turn).

    Canonical tokens, cost keys and ``*_tokens_details`` maps are summed;
    other provider keys take the latest value. Unlike Open WebUI,
    ``prompt_tokens``/``completion_tokens`` are set to the summed input/output
    so the aliases never disagree with the canonical fields.
    """
    cur = normalize_usage(current) if current else {}
    inc = normalize_usage(incoming) if incoming else {}
    if not inc:
        return cur
    if not cur:
        return inc
    result: JsonObject = {**cur, **inc}
    for key in _SUMMABLE_KEYS:
        if key in cur or key in inc:
            result[key] = _add(cur.get(key), inc.get(key))
    for key in _DETAIL_KEYS:
        a, b = cur.get(key), inc.get(key)
        if isinstance(a, dict) or isinstance(b, dict):
            result[key] = _merge_counts(a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {})
    result["prompt_tokens"] = result["input_tokens"]
    result["completion_tokens"] = result["output_tokens"]
    return result
