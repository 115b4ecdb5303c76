"""What both vector adapters share: JSON equality for filters, input checks."""

from __future__ import annotations

import json
from typing import Any

from engine.vectors import VectorItem, batch_dimension

dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def json_equal(a: Any, b: Any) -> bool:
    """Equality of two JSON values as PostgreSQL's ``jsonb =`` sees it:
    numbers by value (1 == 1.0), but booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def matches(metadata: dict[str, Any], filter: dict[str, Any]) -> bool:
    missing = object()
    return all(
        (value := metadata.get(key, missing)) is not missing and json_equal(value, want)
        for key, want in filter.items()
    )


def prepare(items: list[VectorItem]) -> tuple[int, list[VectorItem]]:
    """(dimension, items with one item per id, the last one winning)."""
    unique = list({item.id: item for item in items}.values())
    for item in unique:
        if not isinstance(item.id, str) or not item.id:
            raise ValueError("item ids must be non-empty strings")
    return batch_dimension(unique), unique
