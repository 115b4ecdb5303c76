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
from collections.abc import Mapping, Sequence

from engine.events import Event, EventData, TurnCancelled, TurnCancelRequested, TurnInterrupted, TurnStarted, make_event
from engine.fold.turn_view import TurnView
from engine.json_types import JsonObject
from engine.machine import TERMINAL_STATUSES
from engine.ports import (
    EventStore,
    LiveBus,
    LiveEvent,
    OwnerLocks,
    RemoteControl,
    TurnRecord,
    TurnToolServers,
)
from engine.run.actor import NotStarted, TurnActor, index_update
from engine.run.approvals import decide, settle
from engine.run.client_channel import ClientRequests
from engine.run.folded import Folded
from engine.run.fork import fork_log
from engine.run.live import Joined
from engine.run.loop_state import LoopState
from engine.run.recovery import StoreRecovery
from engine.run.wiring import TurnWiring

log = logging.getLogger("turnlog.supervisor")

#: The end of the owner token of a process that holds its lock (``OwnerLocks``).
LOCKED = "-locked"


class TurnConflict(Exception):
    """The turn is not in a state that allows the request (e.g. resume a finished turn)."""


class Draining(Exception):
    """This process is shutting down (``drain``): it starts no turn; another
    process, or this one restarted, will."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class Supervisor:
    def __init__(
        self,
        *,
        store: EventStore,
        bus: LiveBus,
        wiring: TurnWiring,
        remote: RemoteControl | None = None,
        owner_locks: OwnerLocks | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        # What each turn runs with (its tools, assembler...): engine.run.wiring.
        self.wiring = wiring
        self.settings = wiring.settings
        # Several processes on one database: asks a turn's owner to cancel it.
        self.remote = remote
        # This process's lock, named by its owner token (the suffix says that
        # the owner holds one: an owner without it is judged by its lease only).
        self.owner_locks = owner_locks
        self.owner = f"proc_{secrets.token_hex(6)}{LOCKED if owner_locks is not None else ''}"
        self.actors: dict[str, TurnActor] = {}
        self._channels: dict[str, ClientRequests] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # Actors that ended and whose lease is being released (see approvals.settle).
        self.retiring: dict[str, asyncio.Task[None]] = {}

        # MCP: each turn's connections, closed when its actor is done.
        self._open_servers: set[TurnToolServers] = set()
        # Set by ``drain``: no new turns, no adoption of other processes' turns.
        self.draining = False
        # One orphan scan at a time: two would both claim (same owner) and both run a turn.
        self._scan_lock = asyncio.Lock()
        self._adopting: set[asyncio.Task[None]] = set()
        # Turns whose actor stopped on a store failure (engine.run.recovery).
        self._recovery = StoreRecovery(self)

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        if self.owner_locks is not None:
            await self.owner_locks.hold(self.owner)
        await self.scan_orphans(include_interrupted=self.settings.auto_resume)
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="turnlog:heartbeat"))

    async def stop(self) -> None:
        await self._recovery.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        await self.release_all()
        if self.owner_locks is not None:
            await self.owner_locks.release(self.owner)

    async def drain(self, seconds: float) -> list[str]:
        """Shut down gracefully: start no turn and adopt none from now on, give
        the running ones ``seconds`` to finish, then release the rest (as
        :meth:`release_all`). Returns the ids of the turns released unfinished."""
        self.draining = True
        pending = [actor.done for actor in self.actors.values()]
        if pending and seconds > 0:
            await asyncio.wait(pending, timeout=seconds)
        return await self.release_all()

    async def release_all(self) -> list[str]:
        """Stop every actor of this process and hand its turn back at once.

        Each actor makes its open delta window durable and stops writing (a
        crash the log can show: ``halt``); its lease is then given up, so that
        another process (told through ``remote``) records the interruption and
        resumes the turn at once instead of after the lease runs out."""
        actors = [actor for actor in self.actors.values() if actor.task is not None and not actor.task.done()]
        await asyncio.gather(*(self._halt(actor) for actor in actors))
        results = await asyncio.gather(*(self.store.release_turn(actor.turn_id, self.owner) for actor in actors), return_exceptions=True)
        released: list[str] = []
        for actor, result in zip(actors, results, strict=True):
            if isinstance(result, BaseException):
                log.error("turn %s: could not release the lease (it expires instead): %s", actor.turn_id, result)
            else:
                released.append(actor.turn_id)
            self.bus.close_turn(actor.turn_id)
        self.actors.clear()
        for servers in list(self._open_servers):
            await self._close_servers(servers)
        self._channels.clear()
        if released and self.remote is not None:
            try:
                await self.remote.turns_released(released)
            except Exception:
                log.warning("could not announce %d released turns (others adopt them at their next scan)", len(released))
        if released:
            log.info("released %d running turns for another process to resume", len(released))
        return released

    async def _halt(self, actor: TurnActor) -> None:
        try:
            await actor.halt()
        except Exception:
            log.exception("turn %s: halting failed", actor.turn_id)

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise Draining("this instance is shutting down; retry the request")

    def adopt_soon(self) -> None:
        """Another process released turns (its drain): take them over now
        rather than at the next heartbeat."""
        if not self.draining:
            task = asyncio.get_running_loop().create_task(self._adopt(), name="turnlog:adopt")
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    async def _adopt(self) -> None:
        try:
            await self.scan_orphans()
        except Exception:
            log.exception("adopting released turns failed (the heartbeat retries)")

    async def _heartbeat(self) -> None:
        interval = max(0.05, self.settings.lease_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                if self.owner_locks is not None:
                    await self.owner_locks.hold(self.owner)  # again if its connection was lost
                if self.actors:
                    await self.store.renew_leases(self.owner, list(self.actors), lease_seconds=self.settings.lease_seconds)
                if not self.draining:
                    await self.scan_orphans()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("heartbeat failed")

    # -- turns -----------------------------------------------------------------

    def _spawn(
        self,
        folded: Folded,
        fencing: int,
        *,
        resume: bool,
        history: list[Event] | None = None,
        start: tuple[TurnRecord, Event] | None = None,
    ) -> TurnActor:
        turn_id = folded.view.id
        channel = ClientRequests(self.bus, turn_id)
        servers = self.wiring.open_servers(folded.view.request)
        self._open_servers.add(servers)
        actor = TurnActor(
            view=folded.view,
            state=folded.state,
            fencing=fencing,
            store=self.store,
            bus=self.bus,
            ports=self.wiring.ports(folded.view, channel, servers),
            settings=self.settings,
            owner=self.owner,
            history=history,
            start=start,
        )
        self.actors[turn_id] = actor
        self._channels[turn_id] = channel
        actor.start(resume=resume)
        actor.done.add_done_callback(lambda _f: self._track_retire(turn_id, asyncio.create_task(self._retire(turn_id, actor, servers))))
        return actor

    def _track_retire(self, turn_id: str, task: asyncio.Task[None]) -> None:
        self.retiring[turn_id] = task
        task.add_done_callback(lambda t: self.retiring.pop(turn_id, None) if self.retiring.get(turn_id) is t else None)

    def continue_turn(self, folded: Folded, fencing: int) -> TurnActor:
        """Start an actor for a turn this process has just claimed and written
        (the last decision of an approval): it goes on from its log."""
        return self._spawn(folded, fencing, resume=False)

    async def decide(self, turn_id: str, call_id: str, *, approve: bool, reason: str | None = None, by: str | None = None) -> str:
        """A person's decision on a call waiting for approval (``engine.run.approvals``)."""
        return await decide(self, turn_id, call_id, approve=approve, reason=reason, by=by)

    def deliver_tool_result(self, turn_id: str, call_id: str, result: object) -> bool:
        channel = self._channels.get(turn_id)
        return channel is not None and channel.deliver(call_id, result)

    async def _close_servers(self, servers: TurnToolServers) -> None:
        self._open_servers.discard(servers)
        try:
            await servers.close()
        except Exception:
            log.exception("could not close a turn's tool server sessions")

    async def _retire(self, turn_id: str, actor: TurnActor, servers: TurnToolServers | None = None) -> None:
        if servers is not None:
            await self._close_servers(servers)
        if self.actors.get(turn_id) is actor:
            del self.actors[turn_id]
            self._channels.pop(turn_id, None)
        if actor.released or actor.never_started:  # with its terminal event; or not in the log
            return
        if actor.store_fault and not self.draining:
            # Its write failed (the database down, its disk full): resume it
            # as soon as the store answers again, not once its lease runs out.
            self._recovery.add(turn_id)
            return
        try:
            await self.store.release_turn(turn_id, self.owner)
        except Exception:
            log.exception("turn %s: could not release the lease", turn_id)

    async def start_turn(self, *, request: JsonObject, user_id: str, model: str, preset: JsonObject | None = None, key_hash: str | None = None) -> TurnActor:
        """Start a new turn; return its actor once the turn is durable.

        The actor runs at once: ``turn.started`` goes into the log with the
        turn's first events recorded durably (its assembly and the
        ``model.requested`` that sends it: one commit before the model request,
        not two). A caller answers the client only after this returns, so
        nothing reaches a client that the log does not hold; the caller's
        subscription then starts from the actor's history. Raises what the
        first commit raised (the store down: no turn was created).

        A request with direct tools is recorded first, on its own, as before:
        the client may have to run one of them during the assembly, so it
        must know the turn before the assembly runs."""
        self._refuse_if_draining()
        turn_id = new_id("turn")
        given = request.get("chat_id")
        chat_id = given if isinstance(given, str) and given else new_id("chat")
        now = time.time()
        started = TurnStarted(
            chat_id=chat_id, user_id=user_id, model=model, stream=bool(request.get("stream", False)), request=request, preset=preset, key_hash=key_hash
        )
        event = make_event(turn_id, 1, started, at=now)
        record = TurnRecord(id=turn_id, chat_id=chat_id, user_id=user_id, model=model, status="running", created_at=now, updated_at=now, owner=self.owner)
        if request.get("direct_tools"):
            # The client may have to run one of its tools during the assembly
            # (prompt-based tool selection): it must hold the turn's id before.
            fencing = await self.store.start_turn(record, [event], lease_seconds=self.settings.lease_seconds)
            return self._spawn(Folded.of(turn_id, [event]), fencing, resume=False, history=[event])
        actor = self._spawn(Folded.of(turn_id, [event]), 0, resume=False, start=(record, event))
        try:
            await asyncio.shield(actor.started)
        except NotStarted:
            raise Draining("this instance is shutting down; retry the request") from None
        return actor

    async def fork(
        self,
        parent: str | TurnRecord,
        *,
        at: int,
        model: str | None = None,
        tool_results: Mapping[str, str] | None = None,
        parent_log: Sequence[Event] | None = None,
        key_hash: str | None = None,
    ) -> TurnActor:
        """A new turn in a new chat that continues the parent's log from its
        event ``at`` (``engine.run.fork``): its first events are written at once,
        then it runs as a resumed turn does, from where its log ends.

        ``parent``: its id, or its record when the caller has read it already;
        ``parent_log``: its events when the caller has read (and checked) them.

        ``KeyError``: no such turn; ``TurnConflict``: the parent has not ended
        (its log may still change); ``ForkError``: ``at`` or ``tool_results``
        do not name a point the fork can start from."""
        self._refuse_if_draining()
        record = parent if isinstance(parent, TurnRecord) else await self.store.get_turn(parent)
        if record is None:
            raise KeyError(parent)
        if record.id in self.actors or record.status not in TERMINAL_STATUSES:
            raise TurnConflict(f"turn {record.id} is {record.status}: only a turn that has ended can be forked")
        turn_id, chat_id = new_id("turn"), new_id("chat")
        log = parent_log if parent_log is not None else await self.store.read(record.id)
        # The copies are folded once, into the fold the fork's actor continues.
        folded = Folded(TurnView(turn_id, enforce=True), LoopState())
        events = fork_log(log, at=at, turn_id=turn_id, chat_id=chat_id, model=model, tool_results=tool_results, into=folded, key_hash=key_hash)
        now = events[0].at
        fork = TurnRecord(
            id=turn_id,
            chat_id=chat_id,
            user_id=folded.view.user_id or record.user_id,
            model=folded.view.model or record.model,
            status="running",
            created_at=now,
            updated_at=now,
            owner=self.owner,
        )
        fencing = await self.store.start_turn(fork, events, lease_seconds=self.settings.lease_seconds)
        return self._spawn(folded, fencing, resume=False)

    def join(self, turn_id: str, *, runs_tools: bool = False) -> Joined:
        """Follow a turn: the subscription, the open window and the history are
        taken together, so that nothing falls between them."""
        sub = self.bus.subscribe(turn_id, runs_tools=runs_tools)
        actor = self.actors.get(turn_id)
        if actor is None:
            return Joined(sub, [], None)
        return Joined(sub, actor.open_batch(), actor.history())

    async def cancel(self, turn_id: str, by: str) -> str:
        """Cancel and return the final status once it is durable."""
        await settle(self, turn_id)  # an actor that just stopped at an approval
        actor = self.actors.get(turn_id)
        if actor is not None:
            await actor.cancel(by)
            return actor.view.status
        record = await self.store.get_turn(turn_id)
        if record is None:
            raise KeyError(turn_id)
        if record.status in TERMINAL_STATUSES:
            raise TurnConflict(f"turn {turn_id} is already {record.status}")
        fencing = await self.store.claim_turn(turn_id, self.owner, lease_seconds=self.settings.lease_seconds)
        if fencing is None:
            if self.remote is None:
                raise TurnConflict(f"turn {turn_id} is running on another process")
            return await self._cancel_elsewhere(self.remote, turn_id, by)
        try:
            folded = Folded.of(turn_id, await self.store.read(turn_id))
            await self._append(folded, fencing, TurnCancelRequested(by=by))
            await self._append(folded, fencing, TurnCancelled())
            return folded.view.status
        finally:
            await self.store.release_turn(turn_id, self.owner)

    async def _cancel_elsewhere(self, remote: RemoteControl, turn_id: str, by: str, timeout: float = 15.0) -> str:
        """Ask the owning process to cancel, until the log shows the turn ended.

        The request is repeated (a notification can be missed); the answer is
        the log, so the caller gets its 202 only once ``turn.cancelled`` (with the
        partial answer) is durable, as with a local cancel."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_ask = 0.0
        while loop.time() < deadline:
            record = await self.store.get_turn(turn_id)
            if record is not None and record.status in TERMINAL_STATUSES:
                return record.status
            if record is not None and record.status == "interrupted":
                return await self.cancel(turn_id, by)  # nobody owns it any more
            if loop.time() >= next_ask:
                await remote.request_cancel(turn_id, by)
                next_ask = loop.time() + 1.0
            await asyncio.sleep(0.02)
        raise TurnConflict(f"turn {turn_id}: its owner did not confirm the cancel within {timeout:g} s")

    def cancel_requested_elsewhere(self, turn_id: str, by: str) -> None:
        """Another process asked to cancel a turn; act if this process owns it."""
        actor = self.actors.get(turn_id)
        if actor is not None:
            asyncio.get_running_loop().create_task(actor.cancel(by or "remote"))

    async def resume(self, turn_id: str) -> TurnActor:
        self._refuse_if_draining()
        if turn_id in self.actors:
            raise TurnConflict(f"turn {turn_id} is running")
        record = await self.store.get_turn(turn_id)
        if record is None:
            raise KeyError(turn_id)
        if record.status in TERMINAL_STATUSES:
            raise TurnConflict(f"turn {turn_id} is already {record.status}")
        if record.status == "waiting":
            raise TurnConflict(f"turn {turn_id} is waiting for a tool approval (POST /v1/turns/{turn_id}/approvals)")
        fencing = await self.store.claim_turn(turn_id, self.owner, lease_seconds=self.settings.lease_seconds)
        if fencing is None:
            raise TurnConflict(f"turn {turn_id} is running on another process")
        folded = Folded.of(turn_id, await self.store.read(turn_id))
        if folded.view.terminal:
            await self.store.release_turn(turn_id, self.owner)
            raise TurnConflict(f"turn {turn_id} is already {folded.view.status}")
        return self._spawn(folded, fencing, resume=True)

    async def scan_orphans(self, *, include_interrupted: bool = False) -> None:
        """Record ``turn.interrupted`` for running turns whose owner is gone."""
        if self.draining:
            return
        async with self._scan_lock:
            await self._scan_orphans(include_interrupted)

    async def _scan_orphans(self, include_interrupted: bool) -> None:
        await self._adopt_from_dead_owners()
        orphans = [r for r in await self.store.orphaned_turns(time.time()) if r.id not in self.actors]
        # Together, not one after the other: a drained instance hands over all
        # its turns at once, and each takes a few round trips (claim, read, record).
        results = await asyncio.gather(*(self._adopt_orphan(record) for record in orphans), return_exceptions=True)
        for record, result in zip(orphans, results, strict=True):
            if isinstance(result, BaseException):
                log.error("turn %s: could not take it over: %s", record.id, result)
        if include_interrupted:
            for record in await self.store.list_turns(status="interrupted", limit=10_000):
                if record.id not in self.actors:
                    try:
                        await self.resume(record.id)
                    except TurnConflict:
                        pass

    async def append(self, folded: Folded, fencing: int, data: EventData) -> None:
        """``_append`` for the turn's other writers (``engine.run.approvals``)."""
        await self._append(folded, fencing, data)

    async def recover(self, turn_id: str) -> None:
        """Take back a turn whose actor here stopped on a store failure: give
        its lease up and adopt it as an orphan (``turn.interrupted``, then
        resumed under a new fencing token). Raises while the store fails."""
        async with self._scan_lock:  # not beside a scan's adoption of the same turn
            if self.draining or turn_id in self.actors:
                return  # resumed here meanwhile (POST …/resume): its lease is that actor's
            await self.store.release_turn(turn_id, self.owner)
            record = await self.store.get_turn(turn_id)
            if record is None or record.status != "running":
                return
            try:
                await self._adopt_orphan(record)
            except BaseException:
                if turn_id not in self.actors:  # claimed, not started: give it back for the next try
                    await self.store.release_turn(turn_id, self.owner)
                raise

    async def _adopt_from_dead_owners(self) -> None:
        """Adopt at once, not at lease expiry, the running turns of owners whose
        lock is free: their process is gone (kill -9, a crash)."""
        if self.owner_locks is None:
            return
        now = time.time()
        by_owner: dict[str, list[TurnRecord]] = {}
        for record in await self.store.list_turns(status="running", limit=10_000):
            owner = record.owner
            leased = record.lease_until is not None and record.lease_until >= now  # else an orphan already
            if owner and owner != self.owner and owner.endswith(LOCKED) and leased and record.id not in self.actors:
                by_owner.setdefault(owner, []).append(record)
        for owner, records in by_owner.items():
            if not await self.owner_locks.is_free(owner):
                continue
            for record in records:
                left = (record.lease_until or now) - now
                log.warning("turn %s: its owner %s is gone (its lock is free): adopted now, %.1f s before its lease ran out", record.id, owner, left)
                try:
                    await self._adopt_orphan(record, dead_owner=owner)
                except Exception as exc:
                    log.error("turn %s: could not take it over: %s", record.id, exc)
            await self.owner_locks.forget(owner)

    async def _adopt_orphan(self, record: TurnRecord, *, dead_owner: str | None = None) -> None:
        """Record ``turn.interrupted`` for one turn whose owner is gone, and resume it (auto-resume)."""
        fencing = await self.store.claim_turn(record.id, self.owner, lease_seconds=self.settings.lease_seconds, dead_owner=dead_owner)
        if fencing is None:
            return
        folded = Folded.of(record.id, await self.store.read(record.id))
        if folded.view.terminal:
            await self.store.release_turn(record.id, self.owner)
            return
        if folded.view.status != "interrupted":
            await self._append(folded, fencing, TurnInterrupted(last_owner=record.owner))
        if self.settings.auto_resume:
            self._spawn(folded, fencing, resume=True)
        else:
            await self.store.release_turn(record.id, self.owner)

    async def _append(self, folded: Folded, fencing: int, data: EventData) -> None:
        """An event the supervisor records itself (no actor runs the turn)."""
        event = make_event(folded.view.id, folded.view.last_seq + 1, data)
        folded.apply(event)
        await self.store.append([event], fencing=fencing, index=index_update(event, folded.view))
        self.bus.publish(folded.view.id, LiveEvent(event))
