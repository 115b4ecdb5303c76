"""The supervisor: owns the turn actors of one process.

It starts turns, routes cancel and resume to their actor, renews the leases of
the turns it runs (heartbeat), and finds turns whose owner is gone: a running
turn whose lease expired is recorded ``interrupted`` (and resumed at once when
auto-resume is on). Anything it decides goes into the log first.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

from engine.events import Event, TurnCancelled, TurnCancelRequested, TurnInterrupted, TurnStarted, make_event
from engine.live import LiveDelta, LiveEvent
from engine.blobs import Blobs
from engine.direct_tools import DirectToolHandle, direct_tool_specs
from engine.ports import EventStore, IndexUpdate, LiveBus, ModelCatalog, NoTools, ToolCatalog, TurnRecord
from engine.projection import TurnView, fold
from engine.turn import EngineConfig, TurnActor
from engine.upstream import ModelClient

log = logging.getLogger("turnlog.supervisor")


class TurnConflict(Exception):
    """The turn is not in a state that allows the request (e.g. resume a finished turn)."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


@dataclass
class SupervisorConfig:
    lease_seconds: float = 10.0
    auto_resume: bool = True
    flush_interval: float = 0.05
    flush_max_chunks: int = 512
    max_tool_call_iterations: int = 256
    tool_timeout: float = 60.0
    direct_tool_timeout: float = 60.0
    responses_stateful: bool = False


class Supervisor:
    def __init__(
        self,
        *,
        store: EventStore,
        bus: LiveBus,
        models: ModelCatalog,
        config: SupervisorConfig,
        tools: ToolCatalog | None = None,
        model_client: ModelClient | None = None,
        code_executor: Any = None,
    ) -> None:
        self.store = store
        self.code_executor = code_executor
        self.bus = bus
        self.models = models
        self.config = config
        self.tools: ToolCatalog = tools or NoTools()
        self.model_client = model_client
        # Set by a multi-process deployment: ask the owner of a turn to cancel it.
        self.remote_cancel: Any = None
        self.owner = f"proc_{secrets.token_hex(6)}"
        self.engine_config = EngineConfig(
            owner=self.owner,
            lease_seconds=config.lease_seconds,
            flush_interval=config.flush_interval,
            flush_max_chunks=config.flush_max_chunks,
            max_tool_call_iterations=config.max_tool_call_iterations,
            tool_timeout=config.tool_timeout,
            direct_tool_timeout=config.direct_tool_timeout,
            responses_stateful=config.responses_stateful,
        )
        self.actors: dict[str, TurnActor] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        await self.scan_orphans(include_interrupted=self.config.auto_resume)
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="turnlog:heartbeat"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        actors = list(self.actors.values())
        for actor in actors:
            if actor.task is not None:
                actor.task.cancel()
        for actor in actors:
            if actor.task is not None:
                try:
                    await actor.task
                except (asyncio.CancelledError, Exception):
                    pass
            # Hand the turn back at once: the next process resumes it without
            # waiting for the lease to run out.
            await self.store.release_turn(actor.turn_id, self.owner)
            self.bus.close_turn(actor.turn_id)  # type: ignore[attr-defined]
        self.actors.clear()

    async def _heartbeat(self) -> None:
        interval = max(0.05, self.config.lease_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                if self.actors:
                    await self.store.renew_leases(
                        self.owner, list(self.actors), lease_seconds=self.config.lease_seconds
                    )
                await self.scan_orphans()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("heartbeat failed")

    # -- turns -----------------------------------------------------------------

    def _spawn(
        self, view: TurnView, fencing: int, *, resume: bool, history: list[Event] | None = None
    ) -> TurnActor:
        actor = TurnActor(
            view=view,
            fencing=fencing,
            store=self.store,
            bus=self.bus,
            models=self.models,
            config=self.engine_config,
            model_client=self.model_client,
            blobs=Blobs(self.store, view.user_id or "") if hasattr(self.store, "put_blob") else None,  # type: ignore[arg-type]
            history=history,
        )
        actor.tool_handles = self.tool_handles(view, actor)
        if self.code_executor is not None:
            actor.code_runner = self.code_executor
        self.actors[view.id] = actor
        actor.start(resume=resume)
        actor.done.add_done_callback(lambda _f, tid=view.id: asyncio.create_task(self._retire(tid, actor)))
        return actor

    def tool_handles(self, view: TurnView, actor: TurnActor) -> dict[str, Any]:
        """The tools this turn may run: its server tools, then its direct tools."""
        request = view.request
        handles: dict[str, Any] = dict(self.tools.handles(list(request.get("tool_ids") or [])))
        for spec in direct_tool_specs(request.get("direct_tools")):
            handles[spec.name] = DirectToolHandle(spec, actor, self.config.direct_tool_timeout)
        return handles

    def deliver_tool_result(self, turn_id: str, call_id: str, result: Any) -> bool:
        actor = self.actors.get(turn_id)
        return actor is not None and actor.deliver(call_id, result)

    async def _retire(self, turn_id: str, actor: TurnActor) -> None:
        if self.actors.get(turn_id) is actor:
            del self.actors[turn_id]
        try:
            await self.store.release_turn(turn_id, self.owner)
        except Exception:
            log.exception("turn %s: could not release the lease", turn_id)

    async def start_turn(self, *, request: dict[str, Any], user_id: str, model: str) -> TurnActor:
        """Record ``turn.started`` durably, then start the actor (not yet running:
        the caller can subscribe before the first chunk)."""
        turn_id = new_id("turn")
        chat_id = request.get("chat_id") or new_id("chat")
        now = time.time()
        event = make_event(
            turn_id,
            1,
            TurnStarted(
                chat_id=chat_id,
                user_id=user_id,
                model=model,
                stream=bool(request.get("stream", False)),
                request=request,
            ),
            at=now,
        )
        record = TurnRecord(
            id=turn_id,
            chat_id=chat_id,
            user_id=user_id,
            model=model,
            status="running",
            created_at=now,
            updated_at=now,
            owner=self.owner,
        )
        fencing = await self.store.start_turn(record, [event], lease_seconds=self.config.lease_seconds)
        view = TurnView(turn_id, enforce=True)
        view.apply(event)
        return self._spawn(view, fencing, resume=False, history=[event])

    def subscribe(
        self, turn_id: str, *, runs_tools: bool = False
    ) -> tuple[Any, list[LiveDelta], list[Event] | None]:
        """A live subscription, the open window of the turn's actor and, while
        the actor still holds them, the committed events so far (else None: read
        the log) — taken together, so that nothing falls between them."""
        sub = self.bus.subscribe(turn_id, runs_tools=runs_tools)  # type: ignore[call-arg]
        actor = self.actors.get(turn_id)
        if actor is None:
            return sub, [], None
        return sub, actor.open_batch(), actor.history()

    async def cancel(self, turn_id: str, by: str) -> str:
        """Cancel and return the final status once it is durable."""
        actor = self.actors.get(turn_id)
        if actor is not None:
            await actor.cancel(by)
            return actor.view.status
        record = await self.store.get_turn(turn_id)
        if record is None:
            raise KeyError(turn_id)
        if record.status in ("completed", "cancelled", "failed"):
            raise TurnConflict(f"turn {turn_id} is already {record.status}")
        fencing = await self.store.claim_turn(turn_id, self.owner, lease_seconds=self.config.lease_seconds)
        if fencing is None:
            if self.remote_cancel is None:
                raise TurnConflict(f"turn {turn_id} is running on another process")
            return await self._cancel_elsewhere(turn_id, by)
        try:
            view = fold(turn_id, await self.store.read(turn_id))
            await self._append(view, fencing, TurnCancelRequested(by=by))
            await self._append(view, fencing, TurnCancelled())
            return view.status
        finally:
            await self.store.release_turn(turn_id, self.owner)

    async def _cancel_elsewhere(self, turn_id: str, by: str, timeout: float = 15.0) -> str:
        """Ask the owning process to cancel, until the log shows the turn ended.

        The request is repeated (a notification can be missed); the answer is
        the log, so the caller gets its 202 only once ``turn.cancelled`` (with the
        partial answer) is durable, as with a local cancel."""
        assert self.remote_cancel is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_ask = 0.0
        while loop.time() < deadline:
            record = await self.store.get_turn(turn_id)
            if record is not None and record.status in ("completed", "cancelled", "failed"):
                return record.status
            if record is not None and record.status == "interrupted":
                return await self.cancel(turn_id, by)  # nobody owns it any more
            if loop.time() >= next_ask:
                await self.remote_cancel(turn_id, by)
                next_ask = loop.time() + 1.0
            await asyncio.sleep(0.02)
        raise TurnConflict(f"turn {turn_id}: its owner did not confirm the cancel within {timeout:g} s")

    def cancel_requested_elsewhere(self, turn_id: str, by: str) -> None:
        """Another process asked to cancel a turn; act if this process owns it."""
        actor = self.actors.get(turn_id)
        if actor is not None:
            asyncio.get_running_loop().create_task(actor.cancel(by or "remote"))

    async def resume(self, turn_id: str) -> TurnActor:
        if turn_id in self.actors:
            raise TurnConflict(f"turn {turn_id} is running")
        record = await self.store.get_turn(turn_id)
        if record is None:
            raise KeyError(turn_id)
        if record.status in ("completed", "cancelled", "failed"):
            raise TurnConflict(f"turn {turn_id} is already {record.status}")
        fencing = await self.store.claim_turn(turn_id, self.owner, lease_seconds=self.config.lease_seconds)
        if fencing is None:
            raise TurnConflict(f"turn {turn_id} is running on another process")
        view = fold(turn_id, await self.store.read(turn_id), enforce=True)
        if view.machine.terminal:
            await self.store.release_turn(turn_id, self.owner)
            raise TurnConflict(f"turn {turn_id} is already {view.status}")
        return self._spawn(view, fencing, resume=True)

    async def scan_orphans(self, *, include_interrupted: bool = False) -> None:
        """Record ``turn.interrupted`` for running turns whose owner is gone."""
        orphans = [r for r in await self.store.orphaned_turns(time.time()) if r.id not in self.actors]
        for record in orphans:
            fencing = await self.store.claim_turn(record.id, self.owner, lease_seconds=self.config.lease_seconds)
            if fencing is None:
                continue
            view = fold(record.id, await self.store.read(record.id), enforce=True)
            if view.machine.terminal:
                await self.store.release_turn(record.id, self.owner)
                continue
            if view.status != "interrupted":
                await self._append(view, fencing, TurnInterrupted(last_owner=record.owner))
            if self.config.auto_resume:
                self._spawn(view, fencing, resume=True)
            else:
                await self.store.release_turn(record.id, self.owner)
        if include_interrupted:
            for record in await self.store.list_turns(status="interrupted", limit=10_000):
                if record.id not in self.actors:
                    try:
                        await self.resume(record.id)
                    except TurnConflict:
                        pass

    async def _append(self, view: TurnView, fencing: int, data: Any) -> None:
        event = make_event(view.id, view.last_seq + 1, data)
        view.apply(event)
        status = {"turn.interrupted": "interrupted", "turn.cancelled": "cancelled"}.get(event.type)
        index = None
        if status:
            index = IndexUpdate(status=status, view=view.public() if status == "cancelled" else None)
        await self.store.append([event], fencing=fencing, index=index)
        self.bus.publish(view.id, LiveEvent(event))
