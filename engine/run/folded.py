"""A turn's two folds together: what an actor continues and a decision checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.events import Event
from engine.fold.turn_view import TurnView
from engine.run.loop_state import LoopState


@dataclass(frozen=True)
class Folded:
    """A turn's two folds, as a live actor continues them."""

    view: TurnView
    state: LoopState

    @classmethod
    def of(cls, turn_id: str, events: Sequence[Event]) -> Folded:
        view, state = TurnView(turn_id, enforce=True), LoopState()
        for event in events:
            view.apply(event)
            state.apply(event)
        return cls(view, state)

    def apply(self, event: Event) -> None:
        self.view.apply(event)
        self.state.apply(event)
