"""A turn's two folds together: what an actor continues and a decision checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.events import Event, parse_data
from engine.fold.turn_view import TurnView
from engine.run.loop_state import LoopState


@dataclass(frozen=True)
class Folded:
    """A turn's two folds, as a live actor continues them."""

    view: TurnView
    state: LoopState

    @classmethod
    def of(cls, turn_id: str, events: Sequence[Event]) -> Folded:
        folded = cls(TurnView(turn_id, enforce=True), LoopState())
        for event in events:
            folded.apply(event)
        return folded

    def apply(self, event: Event) -> None:
        # One typed read for both folds (a delta's is only the view's, unparsed).
        data = None if event.type == "model.delta" else parse_data(event)
        self.view.apply(event, data=data)
        self.state.apply(event, data)
