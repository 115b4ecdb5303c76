"""JSON as the engine carries it: requests, messages, output items, tool
arguments and results are JSON from the wire or for the wire.

``JsonValue`` is any JSON value (pydantic's: a recursive union, which mypy
checks: a reader narrows a value with ``isinstance`` before using it as a
str, a list or an object). ``JsonObject`` is a JSON object.

``JsonObjectField`` is a ``JsonObject`` as a pydantic field (an event's
payload): pydantic checks that it is an object with string keys and takes the
values as they are, as it would a ``dict`` of anything. Validating the values
as ``JsonValue`` would walk every payload on every read, and serializing them
through that union is several times slower and warns on a tuple.
"""

from __future__ import annotations

from typing import Annotated, TypeAlias

from pydantic import GetCoreSchemaHandler, GetPydanticSchema, JsonValue
from pydantic_core import CoreSchema, core_schema

JsonObject: TypeAlias = dict[str, JsonValue]

_OBJECT_SCHEMA = core_schema.dict_schema(keys_schema=core_schema.str_schema(), values_schema=core_schema.any_schema())


def _object_schema(_source: object, _handler: GetCoreSchemaHandler) -> CoreSchema:
    return _OBJECT_SCHEMA


JsonObjectField: TypeAlias = Annotated[JsonObject, GetPydanticSchema(_object_schema)]


__all__ = ["JsonObject", "JsonObjectField", "JsonValue"]
