"""The turn state machine, declared once as data.

Triggers are event types: an event either moves the turn to another state or is
an *internal* event that is only legal in some states (a ``model.delta`` outside
``streaming`` is a bug, and raises). The live engine and the projection both go
through ``TurnMachine.apply``, so the state a reader derives from the log is the
state the writer was in.

State-changing events are declared as a ``transitions.Machine``; internal
events are checked against a dict built from the same table, because a replay
folds thousands of deltas and must not pay the library's per-trigger cost for
them. The live actor's machine (``enforce``) follows the ``transitions.Machine``'s
own transition table, read out of it once (``_live_table``) rather than
triggered per event: a trigger cost ~14 µs (its event data, callbacks, logging),
a dict lookup ~0.2 µs, and a turn makes several at its start, where a burst of
turns serializes.
"""

from __future__ import annotations

import logging

from transitions import Machine

# transitions logs every state change at INFO: the log already has them.
logging.getLogger("transitions").setLevel(logging.WARNING)

ACTIVE = ["assembling", "streaming", "executing_tools", "reinjecting", "finalizing", "outlet", "background", "awaiting_approval"]
TERMINAL = ["done", "cancelled", "failed"]
STATES = ["new", *ACTIVE, *TERMINAL]

# (event type, sources, destination); destination None = internal (no state change).
TRANSITIONS: list[tuple[str, list[str], str | None]] = [
    # A fork's first event, before its copy of the parent's turn.started.
    ("turn.forked", ["new"], None),
    ("turn.started", ["new"], "assembling"),
    ("assembly.step", ["assembling"], None),
    ("assembly.completed", ["assembling"], None),
    # streaming -> streaming only after a resume re-requests the model.
    ("model.requested", ["assembling", "reinjecting", "streaming"], "streaming"),
    ("model.delta", ["streaming"], None),
    ("model.item", ["streaming"], None),
    ("model.warning", ["streaming"], None),
    ("model.completed", ["streaming"], None),
    ("model.fallback", ["streaming"], None),
    ("tools.batch", ["streaming"], "executing_tools"),
    ("tool.started", ["executing_tools"], None),
    ("tool.event", ["executing_tools"], None),
    ("tool.completed", ["executing_tools"], None),
    ("context.reinjected", ["executing_tools"], "reinjecting"),
    # Tool approval: the batch waits (no actor) until every asked call is decided.
    ("tool.approval_requested", ["executing_tools", "awaiting_approval"], "awaiting_approval"),
    ("tool.approval", ["awaiting_approval"], None),
    ("tools.decided", ["awaiting_approval"], "executing_tools"),
    ("turn.iteration_limit", ["streaming", "executing_tools", "reinjecting"], None),
    ("turn.finalized", ["streaming", "executing_tools", "reinjecting"], "finalizing"),
    ("outlet.applied", ["finalizing"], "outlet"),
    ("background.started", ["finalizing", "outlet"], "background"),
    ("background.result", ["background"], None),
    ("turn.completed", ["finalizing", "outlet", "background"], "done"),
    ("turn.cancel_requested", ACTIVE, None),
    ("turn.interrupted", ACTIVE, None),
    ("turn.resumed", ACTIVE, None),
    ("turn.cancelled", ACTIVE, "cancelled"),
    ("turn.failed", ACTIVE, "failed"),
]

# The turn's status is a function of its log: these events set it; nothing else does.
STATUS_AFTER: dict[str, str] = {
    "turn.completed": "completed",
    "turn.cancelled": "cancelled",
    "turn.failed": "failed",
    "turn.interrupted": "interrupted",
    "turn.resumed": "running",
    # A turn waiting for approval holds no actor; the fold keeps it ``waiting``
    # while a call is undecided (``TurnView.apply``).
    "tool.approval_requested": "waiting",
    "tool.approval": "running",
    "tools.decided": "running",
}
TERMINAL_STATUSES = frozenset({"completed", "cancelled", "failed"})

_INTERNAL: dict[str, frozenset[str]] = {t: frozenset(src) for t, src, dest in TRANSITIONS if dest is None}
_CHANGING = {t for t, _, dest in TRANSITIONS if dest is not None}
_DEST: dict[tuple[str, str], str] = {(source, t): dest for t, sources, dest in TRANSITIONS if dest is not None for source in sources}
_MACHINE_TRANSITIONS = [{"trigger": "on_" + t.replace(".", "_"), "source": src, "dest": dest} for t, src, dest in TRANSITIONS if dest is not None]


class IllegalTransition(Exception):
    """An event that the turn's current state does not allow."""


def _trigger_name(event_type: str) -> str:
    return "on_" + event_type.replace(".", "_")


_SHARED: Machine | None = None


def _shared_machine() -> Machine:
    """One ``transitions.Machine`` for every live turn.

    It holds no model: each actor's ``TurnMachine`` is passed to the event's
    ``trigger``, which reads and sets its ``state``. Building a machine per turn
    (its per-model trigger methods) cost ~0.2-1 ms and ~15 KB at every turn start.
    """
    global _SHARED
    if _SHARED is None:
        _SHARED = Machine(
            model=None,
            states=STATES,
            transitions=_MACHINE_TRANSITIONS,
            initial=None,
            auto_transitions=False,
            model_attribute="state",
        )
    return _SHARED


_LIVE: dict[tuple[str, str], str] | None = None


def _live_table() -> dict[tuple[str, str], str]:
    """(state, event type) -> next state, as the shared ``transitions.Machine``
    holds it (its events' transitions by source), built once."""
    global _LIVE
    if _LIVE is None:
        machine = _shared_machine()
        types = {_trigger_name(t): t for t, _, dest in TRANSITIONS if dest is not None}
        table: dict[tuple[str, str], str] = {}
        for trigger, event in machine.events.items():
            for source, moves in event.transitions.items():
                for move in moves:
                    if move.dest is not None:
                        table[(source, types[trigger])] = move.dest
        _LIVE = table
    return _LIVE


class TurnMachine:
    """Holds one turn's state; ``apply`` validates and performs one event's effect."""

    state: str

    def __init__(self, state: str = "new", *, enforce: bool = False) -> None:
        self.state = state
        # The live actor follows the ``transitions.Machine``'s table; readers
        # that only fold (replay, followers) check the declared table.
        self.enforce = enforce

    def apply(self, event_type: str) -> str:
        """Validate ``event_type`` in the current state and return the new state."""
        sources = _INTERNAL.get(event_type)
        if sources is not None:
            if self.state not in sources:
                raise IllegalTransition(f"{event_type} is not allowed in state {self.state}")
            return self.state
        if event_type not in _CHANGING:
            raise IllegalTransition(f"unknown event type {event_type!r}")
        if not self.enforce:
            dest = _DEST.get((self.state, event_type))
            if dest is None:
                raise IllegalTransition(f"{event_type} is not allowed in state {self.state}")
            self.state = dest
            return dest
        dest = _live_table().get((self.state, event_type))
        if dest is None:
            raise IllegalTransition(f"{event_type} is not allowed in state {self.state}")
        self.state = dest
        return dest

    def allows(self, event_type: str) -> bool:
        sources = _INTERNAL.get(event_type)
        if sources is not None:
            return self.state in sources
        return any(t == event_type and self.state in src for t, src, _ in TRANSITIONS)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL
