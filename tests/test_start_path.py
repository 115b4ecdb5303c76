"""The start of a turn: what its hot path relies on (issue 13)."""

from __future__ import annotations

from engine.machine import _DEST, TRANSITIONS, _live_table


def test_the_live_table_is_the_transitions_machine_s_and_the_declared_one() -> None:
    # The live actor follows the table read out of the transitions.Machine;
    # followers and replays the one built from TRANSITIONS. They must agree
    # on every (state, event) pair, changing ones only.
    live = _live_table()
    assert live == _DEST
    assert {t for _, t in live} == {t for t, _, dest in TRANSITIONS if dest is not None}
