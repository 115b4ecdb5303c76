"""What a node of a turn is given: a narrow context and the turn's ports.

A node (``engine.run.nodes``) reads the turn through two folds — the public
``view`` and the loop's ``state`` — and changes it only by recording events,
publishing live chunks, or failing the turn. Everything with I/O is in
``ports``, built once per turn: the live ones by the supervisor, recorded ones
by ``verify``; the nodes cannot tell them apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from engine.events import EventData
from engine.fold.turn_view import TurnView
from engine.json_types import JsonObject
from engine.ports import (
    Assembler,
    CodeExecutor,
    Filters,
    ModelCatalog,
    ModelClient,
    NoObserver,
    PayloadStore,
    TaskModel,
    TokenCounter,
    ToolRunner,
    TurnObserver,
)
from engine.run.loop_state import LoopState
from engine.settings import EngineSettings
from engine.tools.calls import ToolHandle


@dataclass(frozen=True)
class TurnPorts:
    """The side-effect ports of one turn."""

    models: ModelCatalog
    model_client: ModelClient
    assembler: Assembler
    tools: Mapping[str, ToolHandle]  # function name -> handle: server and direct tools
    tool_runner: ToolRunner
    code: CodeExecutor
    payloads: PayloadStore
    filters: Filters  # stream and outlet (inlet runs in assembly)
    task_model: TaskModel  # background tasks
    # Metrics and traces (engine.ports.TurnObserver); verify leaves it a no-op.
    observer: TurnObserver = field(default_factory=NoObserver)
    # Usage for model calls whose upstream reports none (engine.run.usage);
    # verify leaves it None: a re-run takes the recorded usage as it is.
    tokens: TokenCounter | None = None


class End:
    """The last node: the turn has a terminal event (or this actor stopped writing)."""

    def __repr__(self) -> str:
        return "End"


END = End()


class TurnContext(Protocol):
    """The turn as a node sees it (implemented by ``engine.run.actor.TurnActor``)."""

    @property
    def turn_id(self) -> str: ...

    @property
    def view(self) -> TurnView: ...

    @property
    def state(self) -> LoopState: ...

    @property
    def ports(self) -> TurnPorts: ...

    @property
    def settings(self) -> EngineSettings: ...

    async def record(self, *data: EventData, durable: bool = True) -> None:
        """Append events. ``durable``: commit now (with anything recorded before
        it not yet committed) and wait for it. ``durable=False``: the events take
        their place in the log at once and are committed with the next durable
        record — for what no side effect depends on until then (an assembly or a
        re-injection, committed with the ``model.requested`` that uses it: one
        commit less per model call; a crash in between loses only what the
        resumed turn recomputes)."""
        ...

    def delta(self, kind: str, text: str) -> None:
        """Show one upstream chunk live now; it is written with its window."""
        ...

    def deltas(self, kind: str, texts: list[str], *, call_id: str | None = None) -> None:
        """``delta`` for each of one network read's chunks of one kind, shown
        live as one message (``call_id``: the call a ``tool_arguments``
        chunk belongs to)."""
        ...

    def writes_behind(self) -> bool:
        """Whether the writer lags (checked per read, without a coroutine)."""
        ...

    async def catch_up(self) -> None:
        """Wait for the writer when delta windows pile up."""
        ...

    async def fail(self, message: str, type: str, *, status: int | None = None, code: str | None = None, extra: JsonObject | None = None) -> End:
        """Record ``turn.failed`` (unless the turn already ended) and end."""
        ...
