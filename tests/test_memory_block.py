"""Tests for engine.context.memory: the ``User Context:`` block (Open WebUI's ≤0.8.x format).

No vectors exist for it (the 0.8.x handler was not recorded); the cases are
hand-written. Open WebUI 0.8.x appended ``User Context:\\n\\n`` even when
nothing matched; turnlog injects nothing.
"""

from __future__ import annotations

import copy

import pytest

from engine.context.memory import memory_block, memory_date, with_memory
from engine.json_types import JsonObject
from engine.ports import MemoryHit

MAY_1_2024 = 1714521600.0  # 2024-05-01T00:00:00Z
DEC_31_2023_2330 = 1704065400.0  # 2023-12-31T23:30:00Z (already 2024 east of UTC)


def hit(content: str, created_at: float, score: float = 0.5, ident: str = "m") -> MemoryHit:
    return MemoryHit(id=ident, content=content, created_at=created_at, score=score)


def test_block_numbers_hits_in_the_given_order() -> None:
    hits = [hit("Likes green tea", MAY_1_2024, 0.9), hit("Lives in Lyon", DEC_31_2023_2330, 0.4)]
    assert memory_block(hits) == "User Context:\n1. [2024-05-01] Likes green tea\n2. [2023-12-31] Lives in Lyon"


def test_q25_nothing_matched_gives_no_block() -> None:
    assert memory_block([]) is None


def test_blank_memories_are_skipped_and_not_numbered() -> None:
    hits = [hit("  ", MAY_1_2024), hit(" A \n", MAY_1_2024), hit("", MAY_1_2024), hit("B", MAY_1_2024)]
    assert memory_block(hits) == "User Context:\n1. [2024-05-01] A\n2. [2024-05-01] B"
    assert memory_block([hit(" ", MAY_1_2024)]) is None


@pytest.mark.parametrize(
    ("created_at", "expected"),
    [
        (MAY_1_2024, "2024-05-01"),
        (MAY_1_2024 - 1, "2024-04-30"),
        (0.0, "Unknown Date"),
        (None, "Unknown Date"),
        (float("nan"), "Unknown Date"),
        (float("inf"), "Unknown Date"),
        (1e20, "Unknown Date"),
    ],
)
def test_memory_date(created_at: float | None, expected: str) -> None:
    assert memory_date(created_at) == expected


def test_unknown_date_in_the_block() -> None:
    assert memory_block([hit("X", 0.0)]) == "User Context:\n1. [Unknown Date] X"


def test_with_memory_appends_to_the_system_message() -> None:
    messages: list[JsonObject] = [{"role": "system", "content": "You help."}, {"role": "user", "content": "hi"}]
    before = copy.deepcopy(messages)
    got = with_memory(messages, "User Context:\n1. [2024-05-01] A")
    assert got == [{"role": "system", "content": "You help.\nUser Context:\n1. [2024-05-01] A"}, {"role": "user", "content": "hi"}]
    assert messages == before


def test_with_memory_finds_a_system_message_anywhere_and_inserts_one_otherwise() -> None:
    late: list[JsonObject] = [{"role": "user", "content": "hi"}, {"role": "system", "content": "S"}]
    assert with_memory(late, "M") == [{"role": "user", "content": "hi"}, {"role": "system", "content": "S\nM"}]
    assert with_memory([{"role": "user", "content": "hi"}], "M") == [{"role": "system", "content": "M"}, {"role": "user", "content": "hi"}]


def test_with_memory_none_changes_nothing() -> None:
    messages: list[JsonObject] = [{"role": "user", "content": "hi"}]
    assert with_memory(messages, None) == [{"role": "user", "content": "hi"}]
    assert with_memory(messages, memory_block([])) == [{"role": "user", "content": "hi"}]
