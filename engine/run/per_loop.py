"""One object per event loop, made on first use and gone with its loop.

The event-loop-wide helpers (the flush clock, the SSE burst ends) keep
shared state per loop. A weak map keyed by the loop does not free its entry
while the value refers to the loop, so a value holds its loop weakly
(``weakref.proxy``) or not at all: a process that runs many loops one after
another (the tests) must not keep each one alive.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """``get(loop)``: the ``T`` that ``factory(loop)`` made for that loop."""

    __slots__ = ("_factory", "_table")

    def __init__(self, factory: Callable[[asyncio.AbstractEventLoop], T]) -> None:
        self._factory = factory
        self._table: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get(self, loop: asyncio.AbstractEventLoop) -> T:
        value = self._table.get(loop)
        if value is None:
            value = self._table[loop] = self._factory(loop)
        return value
