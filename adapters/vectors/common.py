"""What both vector adapters share: JSON equality for filters, input checks."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from engine.vectors import DimensionMismatch, VectorItem

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


def canonical(value: Any) -> str:
    """A string that two JSON values share exactly when ``json_equal`` holds
    (integral floats written as integers, object keys sorted), so equality
    filters can be answered from a dict keyed by it."""
    if value is None or isinstance(value, (bool, str)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, list):
        return "[" + ",".join(canonical(x) for x in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(value[k]) for k in sorted(value)) + "}"
    return json.dumps(value, ensure_ascii=False)


def matches(metadata: dict[str, Any], filter: dict[str, Any]) -> bool:
    missing = object()
    return all((value := metadata.get(key, missing)) is not missing and json_equal(value, want) for key, want in filter.items())


def prepare(items: list[VectorItem]) -> tuple[int, list[VectorItem], np.ndarray]:
    """(dimension, items with one item per id, the last one winning, their
    vectors as a float64 matrix), every vector checked as
    ``engine.vectors.check_vector`` does, in numpy (a 1,000-chunk upsert of
    384-d vectors is 384,000 components)."""
    unique = list({item.id: item for item in items}.values())
    for item in unique:
        if not isinstance(item.id, str) or not item.id:
            raise ValueError("item ids must be non-empty strings")
    dims = {len(item.vector) for item in unique}
    if len(dims) != 1:
        raise DimensionMismatch(f"one upsert must have one dimension, got {sorted(dims)}")
    dim = dims.pop()
    if dim == 0:
        raise ValueError("empty vector")
    try:
        matrix = np.array([item.vector for item in unique], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"vector components must be numbers: {exc}") from None
    if not np.isfinite(matrix).all():
        raise ValueError("vector components must be finite")
    norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix))
    if not (norms > 0).all():
        raise ValueError("zero vector: cosine similarity is undefined")
    if not np.isfinite(norms).all():
        raise ValueError("vector too large: its norm overflows")
    return dim, unique, matrix
