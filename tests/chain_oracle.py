"""The hash chain computed the way docs/guides/forks.md ("Receipts and the hash chain") documents it, with hashlib and
the standard library's json alone: the oracle the chain tests hold every
store, the migration and the exports to (it imports nothing of turnlog's).

``hash = sha256(previous hash (32 bytes) || canonical event)``, from 32 zero
bytes; the canonical event is the compact JSON of ``[turn_id, seq, type, at,
data]`` with sorted keys, UTF-8. (The documented form writes floats as orjson
does; the tests' data has none that Python's json writes differently.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any


def canonical(turn_id: str, seq: int, type_: str, at: float, data: Any) -> bytes:
    return json.dumps([turn_id, seq, type_, float(at), data], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def chain(rows: Iterable[tuple[str, int, str, float, Any]]) -> list[str]:
    """The hex hashes of one turn's rows ``(turn_id, seq, type, at, data)``, in order."""
    prev = bytes(32)
    out = []
    for turn_id, seq, type_, at, data in rows:
        prev = hashlib.sha256(prev + canonical(turn_id, seq, type_, at, data)).digest()
        out.append(prev.hex())
    return out
