"""JSON shapes the protocols and the context assembly pass around.

A chat message, a stored output item or a Responses API input item is a JSON
object (``JsonObject``); its values are ``JsonValue`` and a reader narrows one
with ``isinstance`` before using it (a client may send any shape). The helpers
here are the narrowings more than one module needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, TypeAlias

from engine.json_types import JsonObject, JsonValue

__all__ = ["EMPTY", "Item", "Message", "json_list", "json_object_of", "list_of", "mapping_of", "objects_of", "text_of"]

#: A Chat Completions message (the canonical transcript's unit).
Message: TypeAlias = JsonObject
#: A stored output item, or a Responses API input item.
Item: TypeAlias = JsonObject

#: The empty object a reader falls back to (read-only: shared).
EMPTY: Final[Mapping[str, JsonValue]] = MappingProxyType({})


def mapping_of(value: object) -> Mapping[str, JsonValue]:
    """``value`` when it is a JSON object (a dict, as JSON decodes), else the
    empty object."""
    return value if isinstance(value, dict) else EMPTY


def list_of(value: object) -> list[JsonValue]:
    """``value`` when it is a JSON array, else an empty list."""
    return value if isinstance(value, list) else []


def objects_of(value: object) -> list[JsonObject]:
    """The JSON objects of ``value`` when it is an array (other entries
    skipped), else an empty list."""
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def text_of(value: object) -> str:
    """``value`` when it is a string, else ``""``."""
    return value if isinstance(value, str) else ""


def json_list(values: Iterable[JsonValue]) -> list[JsonValue]:
    """``values`` as a JSON array (a list of objects typed as JSON values, to
    put it inside an object)."""
    return list(values)


def json_object_of(values: Mapping[str, JsonValue]) -> JsonObject:
    """``values`` as a JSON object (a copy: a ``dict[str, int]`` typed as
    JSON, to put it inside an object)."""
    return dict(values)
