"""Chat Completions chunks that differ only in their text, parsed as such.

A fast upstream sends thousands of chunks that are byte for byte the same but
for the text of ``choices[0].delta.content``. Parsing each whole (a dict, a
list, five strings, then freeing them all) was most of turnlog's CPU per
relayed chunk. ``TemplateRuns`` learns the bytes around the text's JSON string
from one chunk it parsed whole (a one-choice chunk whose delta is only
``content``), and then, for every chunk that starts and ends with exactly
those bytes, parses only the string in between.

Why this is exact: JSON is a context-free grammar, so if ``head + S + tail``
parses (verified once, when the template is learned, against the whole
chunk's own parse, with another string in the text's place) and ``M`` alone
parses to a string, ``head + M + tail`` parses to the template with that
string as the text. A chunk whose middle is not one non-empty JSON string —
or not JSON at all — takes the ordinary path (``HTTPProvider._sse_items``),
which decides what it is and warns as before. A template that keeps failing to match (an upstream that changes
other bytes per chunk, such as a timestamp) stops the learning, so such a
stream pays at most a few lookups more than before.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

import orjson

from adapters.providers.sse import SSEEvent
from engine.ports import RawChunk, RawRun, RawWarning

__all__ = ["TemplateRuns"]

_DELTA: Final = b'"delta":'
_CONTENT: Final = re.compile(rb'\{\s*"content"\s*:\s*')
_PROBE: Final = b'"x"'
#: Attempts to learn a template since one last matched: then stop learning.
MAX_UNUSED: Final = 4
#: "}" tried as the end of the delta object.
MAX_BRACES: Final = 8
_BLANKS: Final = (b" ", b"\t", b"\n", b"\r")

Items = list[RawChunk | RawWarning | RawRun]


class TemplateRuns:
    """One stream's template (``items`` per read, in place of ``_sse_items``)."""

    __slots__ = ("_head", "_tail", "_template", "_unused", "_sse_items")

    def __init__(self, sse_items: Callable[[list[SSEEvent]], tuple[list[RawChunk | RawWarning], bool]]) -> None:
        self._head = b""
        self._tail = b""
        self._template: dict[str, Any] | None = None
        self._unused = 0  # templates learned since one last matched
        self._sse_items = sse_items

    def items(self, events: list[SSEEvent]) -> tuple[Items, bool]:
        """The payloads of ``events`` (runs of template chunks as ``RawRun``)
        and whether ``[DONE]`` came."""
        out: Items = []
        template = self._template
        head, tail = self._head, self._tail
        start, end = len(head), -len(tail)
        loads = orjson.loads
        run: list[str] | None = None
        for event in events:
            data = event[1]
            if template is not None and data.startswith(head) and data.endswith(tail):
                try:
                    text = loads(data[start:end])
                except ValueError:
                    text = None
                if type(text) is str and text:
                    if run is None:
                        run = []
                        out.append(RawRun(template, run))
                        self._unused = 0
                    run.append(text)
                    continue
            run = None
            got, done = self._sse_items([event])
            out.extend(got)
            if done:
                return out, True
            if got and self._unused < MAX_UNUSED:
                item = got[0]
                if type(item) is RawChunk and self._learn(data, item.data):
                    template = self._template
                    head, tail = self._head, self._tail
                    start, end = len(head), -len(tail)
        return out, False

    def _learn(self, data: bytes, obj: dict[str, Any]) -> bool:
        """Take ``data`` (parsed: ``obj``) as the template if it is a
        one-choice chunk whose delta is only a text, and the bytes around that
        text's string parse back to ``obj`` with another text in its place."""
        choices = obj.get("choices")
        if type(choices) is not list or len(choices) != 1:
            return False
        choice = choices[0]
        if type(choice) is not dict or choice.get("finish_reason"):
            return False
        delta = choice.get("delta")
        if type(delta) is not dict or len(delta) != 1 or type(delta.get("content")) is not str:
            return False
        self._unused += 1  # an attempt: a stream that never yields a template stops trying
        at = data.find(_DELTA)
        if at < 0:
            return False
        at += len(_DELTA)
        while data[at : at + 1] in _BLANKS:
            at += 1
        # The delta object ends at one of the first few "}" after it (the
        # others are inside its text): the first whose bytes parse to it.
        end = at
        for _ in range(MAX_BRACES):
            end = data.find(b"}", end) + 1
            if end <= 0:
                return False
            try:
                if orjson.loads(data[at:end]) == delta:
                    break
            except ValueError:
                continue
        else:
            return False
        # Within it, the text's string: after '{"content":', before '}'.
        key = _CONTENT.match(data, at, end)
        if key is None:
            return False
        first, last = key.end(), end - 1
        while data[last - 1 : last] in _BLANKS:
            last -= 1
        head, tail = data[:first], data[last:]
        expected = orjson.loads(orjson.dumps(obj))  # a deep copy of JSON data, ~6x cheaper than copy.deepcopy
        expected["choices"][0]["delta"] = {"content": "x"}
        try:
            if orjson.loads(head + _PROBE + tail) != expected:
                return False
        except ValueError:
            return False
        expected["choices"][0]["delta"] = {}
        self._head, self._tail, self._template = head, tail, expected
        return True
