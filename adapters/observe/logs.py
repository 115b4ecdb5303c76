"""The service's log lines: text for people (the default) or one JSON object a line.

``TURNLOG_LOG_FORMAT=json`` gives each line ``time`` (UTC, ISO 8601), ``level``,
``logger``, ``message`` — plus ``turn_id`` on every line written while working
on a turn (the actor's task and everything it spawns: ``engine.run.log_context``)
and ``exception`` with the traceback when there is one. A log shipper (Loki,
Elasticsearch, CloudWatch) then filters one turn's lines without parsing text.
"""

from __future__ import annotations

import logging
import re
import sys
from datetime import UTC, datetime
from typing import Literal

import orjson

from engine.run.log_context import current_turn

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


TURN_ID = re.compile(r"turn_[0-9a-f]{24}")


def turn_of(record: logging.LogRecord) -> str | None:
    """The turn a record is about: the one being worked on (``current_turn``), else
    the turn id a line written elsewhere names first (``"turn %s: …"`` lines of a
    request handler, a follower or the supervisor)."""
    turn_id = current_turn.get()
    if turn_id is None and isinstance(record.args, tuple) and record.args:
        first = record.args[0]
        if isinstance(first, str) and TURN_ID.fullmatch(first):
            turn_id = first
    return turn_id


class TurnIdFilter(logging.Filter):
    """Puts the record's turn (if any) on it as ``turn_id``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "turn_id", None) is None:
            record.turn_id = turn_of(record)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        turn_id = getattr(record, "turn_id", None) or turn_of(record)
        if turn_id is not None:
            line["turn_id"] = turn_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=str).decode()


class NoRequestBytes(logging.Filter):
    """aiohttp logs a request it cannot parse (a header over 8 KB, a bad
    request line) at ERROR with the exception, whose message quotes the
    offending bytes: a header's value, such as the caller's key. Keep the
    line, the exception's type and status; never the bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {type(exc).__name__} ({exc.code}; the request's bytes are not logged)"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def configure_logging(fmt: Literal["text", "json"] = "text", level: int = logging.INFO) -> None:
    """The root logger of ``turnlog serve``: one handler on stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TurnIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, NoRequestBytes) for f in server.filters):
        server.addFilter(NoRequestBytes())
