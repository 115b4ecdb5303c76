"""JSON as the engine carries it: requests, messages, output items, tool
arguments and results are JSON from the wire or for the wire.

``JsonValue`` is any JSON value (pydantic's: a recursive union, which mypy
checks: a reader narrows a value with ``isinstance`` before using it as a
str, a list or an object). ``JsonObject`` is a JSON object.
"""

from __future__ import annotations

from typing import TypeAlias

from pydantic import JsonValue

JsonObject: TypeAlias = dict[str, JsonValue]

__all__ = ["JsonObject", "JsonValue"]
