"""Reads of a turn's log that check it first, for every reader that shows a turn.

The CLI (``turnlog turns show``, ``replay``, ``verify``, ``export``) and the
HTTP routes (``GET /v1/turns/{id}``, ``/replay``, ``/verify``, the inspector)
read a turn the same way: its hash chain is checked before anything is
derived from it, and a log that does not fold is damage too. Each front end
words the verdict its own way (an exit status, a 409): both start from
:class:`DamagedTurn`, raised here.
"""

from __future__ import annotations

from typing import Any

from engine.chain import ChainResult, Damage, StoredEvent, check
from engine.events import Event
from engine.fold.turn_view import TurnView, fold


class DamagedTurn(Exception):
    """A turn's log does not hold: ``what`` says how (``damage`` names the seq
    when the chain broke; None for a log that does not fold)."""

    def __init__(self, turn_id: str, what: str, damage: Damage | None = None) -> None:
        super().__init__(f"turn {turn_id}: damaged log: {what}")
        self.turn_id = turn_id
        self.what = what
        self.damage = damage


async def checked_chain(store: Any, turn_id: str) -> tuple[list[StoredEvent], ChainResult]:
    """The turn's stored events and the verdict of its chain."""
    stored = await store.read_chain(turn_id)
    return stored, check(turn_id, stored)


async def checked_events(store: Any, turn_id: str) -> list[Event]:
    """The turn's events once its chain is checked; :class:`DamagedTurn` if it does not hold."""
    stored, result = await checked_chain(store, turn_id)
    if result.damage is not None:
        raise DamagedTurn(turn_id, result.damage.message, result.damage)
    return [e.event() for e in stored]


def checked_fold(turn_id: str, events: list[Event], upto: int | None = None) -> TurnView:
    """The fold (up to ``upto``); a log it cannot fold, whatever its chain
    says, is :class:`DamagedTurn`."""
    try:
        return fold(turn_id, events, upto=upto)
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedTurn(turn_id, f"the log cannot be folded: {exc}") from None
