"""Server-Sent Events framing for the OpenAI transports (WHATWG HTML, "Parsing an
event stream").

One parser for both OpenAI transports, so that Chat Completions and the
Responses API read the same bytes the same way. It follows the WHATWG rules:

* a line ends with LF, CRLF or a lone CR, wherever the network splits the body
  (a CRLF split across two reads is one line end, not two);
* a blank line dispatches the event; an event is dispatched only if it had a
  ``data`` field, and the ``event`` type is reset by every blank line;
* ``data`` lines of one event are joined with ``"\\n"`` (a pretty-printed JSON
  payload spread over several ``data:`` lines is one payload);
* ``field: value`` loses exactly one space after the colon; a line with no
  colon is a field with an empty value (``data`` alone adds an empty line);
* lines starting with ``:`` (comments, keep-alives), ``id``, ``retry`` and
  unknown fields are ignored: turnlog never reconnects, so ``id``/``retry``
  have no use, and a transport fault must surface instead of being retried
  behind the engine's back (why ``aiohttp-sse-client`` was rejected);
* a UTF-8 byte order mark at the start of the stream is skipped.

One deliberate difference: at a clean end of body, the last line and the last
event count even without their terminators (the spec drops an event that was
not followed by a blank line). Servers do end streams on ``data: {...}`` with no
blank line; whether the stream ended *properly* is the transport's call, made
from the events themselves (finish reason, terminal event).

Why not a library: ``aiohttp-sse-client`` reconnects and buffers on its own
(see above). The pure decoders work on ``str`` (``httpx-sse``'s
``SSELineDecoder``/``SSEDecoder``; ``sseclient-py``, a sync generator), so every
read is decoded first, and they take up to twice the time per event or more on
the same body. This parser stays on ``bytes``,
splits a read with C-level ``split`` and hands ``data`` to ``orjson`` as is.

The hot path: a typical read holds many ``data: {json}\\n\\n`` events (see
``SSEParser`` for the per-line work); a read with no CR is never copied for
line endings.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SSEEvent", "SSEParser"]

#: ``(event type or None, data, raw)``: ``data`` is the joined ``data`` field
#: values, ``raw`` the ``data`` lines as received (for warnings). The type stays
#: undecoded bytes (rarely looked at). A plain tuple: built once per event on
#: the hot path.
SSEEvent = tuple[bytes | None, bytes, bytes]

_BOM: Final = b"\xef\xbb\xbf"


class SSEParser:
    """Incremental event-stream parser: ``feed`` each network read, ``close`` at
    the end of the body. Both return the events completed, in order.

    A read is split into lines with one C-level ``split``; per line the work is
    a truth test (blank line: dispatch) or a prefix test and a slice (``data:``).
    Other fields take the general path. Byte tests use ints (``10 in chunk``):
    CPython searches a one-byte ``bytes`` needle several times slower than an
    ``int`` one (memchr).
    """

    __slots__ = ("_pending", "_skip_lf", "_at_start", "_data", "_raw", "_more", "_type")

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # an unterminated line, in pieces
        self._skip_lf = False  # the previous read ended with CR: a leading LF here ends no line
        self._at_start = True  # no line seen yet (BOM check)
        self._data: bytes | None = None  # the first data value of the event being read
        self._raw = b""  # its line
        self._more: list[bytes] | None = None  # further data values and lines, alternating (rare)
        self._type: bytes | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events that ``chunk`` completes (often none, often many)."""
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if 13 in chunk:  # CR
            self._skip_lf = chunk[-1] == 13
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        pending = self._pending
        if pending:
            pending.append(chunk)
            if 10 not in chunk:  # LF
                return []  # a long line still arriving: no re-scan, no re-copy
            chunk = b"".join(pending)
            pending.clear()
        lines = chunk.split(b"\n")
        tail = lines.pop()  # waits for the rest of its line
        if tail:
            pending.append(tail)
        if not lines:
            return []
        return self._lines(lines)

    def close(self) -> list[SSEEvent]:
        """End of body: the unterminated last line and the last event count
        (see the module docstring)."""
        lines = [b"".join(self._pending), b""] if self._pending else [b""]
        self._pending.clear()
        return self._lines(lines)

    def _lines(self, lines: list[bytes]) -> list[SSEEvent]:
        if self._at_start:
            self._at_start = False
            if lines[0][:3] == _BOM:
                lines[0] = lines[0][3:]
        events: list[SSEEvent] = []
        data, raw, more, kind = self._data, self._raw, self._more, self._type
        for line in lines:
            if not line:  # dispatch
                if data is not None:
                    if more is not None:
                        data = b"\n".join([data, *more[0::2]])
                        raw = b"\n".join([raw, *more[1::2]])
                        more = None
                    events.append((kind, data, raw))
                    data = None
                kind = None
                continue
            if line[:6] == b"data: ":
                value = line[6:]
            elif line[:5] == b"data:":
                value = line[5:]
            elif line[:7] == b"event: ":  # the Responses API sends one per event
                kind = line[7:] or None
                continue
            else:
                colon = line.find(b":")
                if colon == 0:
                    continue  # a comment
                if colon < 0:
                    name, value = line, b""
                else:
                    name = line[:colon]
                    value = line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
                if name != b"data":
                    if name == b"event":
                        kind = value or None
                    continue  # id, retry and unknown fields
            if data is None:
                data, raw = value, line
            elif more is None:
                more = [value, line]
            else:
                more += (value, line)
        self._data, self._raw, self._more, self._type = data, raw, more, kind
        return events
