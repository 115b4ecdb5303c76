"""Recording a person's decision on a call that waits for approval.

A waiting turn has no actor anywhere: its log ends with the batch's
``tool.approval_requested`` events and its index row says ``waiting``. Any
process can record a decision: it takes the turn's lease (so two decisions,
or a decision and a cancel, are serialized by the store's fencing), checks the
decision against the log, appends ``tool.approval``, and — when that was the
last undecided call of the batch — starts an actor that continues the turn
from its log, on this process. Nothing is kept in memory between the question
and the answer, so the wait survives restarts and costs one row.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from engine.events import EventData, ToolApproval
from engine.ports import ConcurrencyError, EventStore, LeaseLost
from engine.run.actor import TurnActor
from engine.run.folded import Folded
from engine.settings import EngineSettings


class ApprovalHost(Protocol):
    """What a decision needs of the process that records it (the supervisor):
    its local actors, its store and lease owner, and a way to append to and
    continue a turn it has claimed."""

    store: EventStore
    owner: str
    settings: EngineSettings

    @property
    def actors(self) -> Mapping[str, TurnActor]: ...

    @property
    def retiring(self) -> Mapping[str, asyncio.Task[None]]: ...

    async def append(self, folded: Folded, fencing: int, data: EventData) -> None: ...

    def continue_turn(self, folded: Folded, fencing: int) -> TurnActor: ...


#: How long a decision waits for the turn's lease while another process (or
#: another decision) briefly holds it.
CLAIM_WAIT_SECONDS = 10.0


class ApprovalError(Exception):
    """A decision the turn cannot take. ``code``: ``call_not_found`` (no such
    call waits), ``already_decided``, ``turn_not_waiting``, ``turn_busy``."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def check(folded: Folded, call_id: str) -> None:
    """Raise ``ApprovalError`` unless ``call_id`` waits for a decision."""
    view, state = folded.view, folded.state
    asked = view.approvals.get(call_id)
    if asked is not None and asked["status"] in ("approved", "rejected"):
        raise ApprovalError(f"call {call_id} is already {asked['status']}", "already_decided")
    if view.terminal or view.state != "awaiting_approval":
        raise ApprovalError(f"turn {view.id} is not waiting for approval (it is {view.status})", "turn_not_waiting")
    if call_id not in state.asked:
        raise ApprovalError(f"turn {view.id} has no call {call_id} waiting for approval", "call_not_found")


async def settle(sup: ApprovalHost, turn_id: str) -> None:
    """Let go of a local actor that has just stopped at an approval: wait until
    it is gone and its lease released, so that nothing it does afterwards can
    touch the lease of whoever writes the turn next."""
    actor = sup.actors.get(turn_id)
    if actor is not None and actor.view.status == "waiting":
        await asyncio.shield(actor.done)
    retiring = sup.retiring.get(turn_id)
    if retiring is not None:
        await asyncio.shield(retiring)


class TurnLocks:
    """One lock per turn while someone in this process waits on it: two
    decisions here would both get the lease (a process may re-claim its own)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, turn_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(turn_id, (asyncio.Lock(), 0))
        self._locks[turn_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[turn_id]
            if users == 1:
                del self._locks[turn_id]
            else:
                self._locks[turn_id] = (lock, users - 1)


_LOCKS: weakref.WeakKeyDictionary[ApprovalHost, TurnLocks] = weakref.WeakKeyDictionary()


async def decide(sup: ApprovalHost, turn_id: str, call_id: str, *, approve: bool, reason: str | None, by: str | None) -> str:
    """Record the decision on ``call_id``; returns the turn's status after it
    (``waiting`` while other calls of the batch are undecided, else ``running``).

    ``KeyError``: no such turn; ``ApprovalError``: see its codes."""
    locks = _LOCKS.setdefault(sup, TurnLocks())
    async with locks.hold(turn_id):
        return await _decide(sup, turn_id, call_id, approve=approve, reason=reason, by=by)


async def _decide(sup: ApprovalHost, turn_id: str, call_id: str, *, approve: bool, reason: str | None, by: str | None) -> str:
    await settle(sup, turn_id)
    actor = sup.actors.get(turn_id)
    if actor is not None:
        check(Folded(actor.view, actor.state), call_id)  # names the call decided already
        raise ApprovalError(f"turn {turn_id} is running, not waiting for approval", "turn_not_waiting")
    if await sup.store.get_turn(turn_id) is None:
        raise KeyError(turn_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CLAIM_WAIT_SECONDS
    while True:
        check(Folded.of(turn_id, await sup.store.read(turn_id)), call_id)
        fencing = await sup.store.claim_turn(turn_id, sup.owner, lease_seconds=sup.settings.lease_seconds)
        if fencing is not None:
            break
        if loop.time() >= deadline:
            raise ApprovalError(f"turn {turn_id} is held by another process; try again", "turn_busy")
        await asyncio.sleep(0.02)  # another decision or a retiring owner holds it for a moment
    try:
        folded = Folded.of(turn_id, await sup.store.read(turn_id))
        check(folded, call_id)
        await sup.append(folded, fencing, ToolApproval(call_id=call_id, approve=approve, reason=reason or None, by=by))
    except (LeaseLost, ConcurrencyError) as exc:
        # Another writer of this process (a cancel) re-claimed the turn and got
        # there first; it releases the lease. The log says what happened.
        check(Folded.of(turn_id, await sup.store.read(turn_id)), call_id)
        raise ApprovalError(f"turn {turn_id} changed while the decision was recorded; try again", "turn_busy") from exc
    except BaseException:
        await sup.store.release_turn(turn_id, sup.owner)
        raise
    if folded.state.undecided:
        await sup.store.release_turn(turn_id, sup.owner)
    else:
        sup.continue_turn(folded, fencing)
    return folded.view.status
