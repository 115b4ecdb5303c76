"""The ports the engine talks through; adapters implement them.

The engine never imports an adapter. Everything with I/O (the event store, the
upstream model, the live fan-out) is reached through these protocols, so the
domain can be driven by real adapters in tests and by recorded results in
``verify``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.events import Event


class ConcurrencyError(Exception):
    """A second writer tried to append an event at an existing ``(turn_id, seq)``."""


class LeaseLost(Exception):
    """The writer's fencing token is no longer the turn's current one."""


@dataclass(frozen=True)
class TurnRecord:
    """The index row of a turn: what listing and ownership need without a fold."""

    id: str
    chat_id: str
    user_id: str
    model: str
    status: str  # running | completed | cancelled | failed | interrupted
    created_at: float
    updated_at: float
    owner: str | None = None
    lease_until: float | None = None
    fencing: int = 0
    view: dict[str, Any] | None = None  # the last stored projection (for `replay` to compare)


@dataclass(frozen=True)
class ChatRecord:
    id: str
    user_id: str
    title: str | None
    created_at: float
    updated_at: float
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class IndexUpdate:
    """Changes to the turn's index row, written in the same transaction as events."""

    status: str | None = None
    view: dict[str, Any] | None = None


class EventStore(Protocol):
    """Durable, per-turn ordered log plus the small index tables around it."""

    async def start_turn(
        self, turn: TurnRecord, events: Sequence[Event], *, lease_seconds: float
    ) -> int:
        """Create the turn row (and its chat if new) and append its first events.

        Returns the fencing token the owner must present on later appends.
        """
        ...

    async def append(
        self,
        events: Sequence[Event],
        *,
        fencing: int | None = None,
        index: IndexUpdate | None = None,
    ) -> None:
        """Append atomically. Raises ``ConcurrencyError`` on a taken ``(turn_id, seq)``
        and ``LeaseLost`` if ``fencing`` is given and no longer current."""
        ...

    def append_nowait(
        self,
        events: Sequence[Event],
        *,
        fencing: int | None = None,
        index: IndexUpdate | None = None,
    ) -> asyncio.Future[None]:
        """``append`` without a coroutine: queue the write now and return a future
        that resolves (or fails the same way) once it is durable. For the
        per-window delta path, where a task per write is measurable."""
        ...

    async def read(self, turn_id: str, after: int = 0, limit: int | None = None) -> list[Event]: ...

    async def get_turn(self, turn_id: str) -> TurnRecord | None: ...

    async def list_turns(
        self,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[TurnRecord]: ...

    async def get_chat(self, chat_id: str) -> ChatRecord | None: ...

    async def list_chats(
        self, user_id: str, *, limit: int = 50, before: float | None = None
    ) -> list[ChatRecord]: ...

    async def claim_turn(self, turn_id: str, owner: str, *, lease_seconds: float) -> int | None:
        """Take ownership of a turn whose lease has expired (or that we own).

        Returns the new fencing token, or None if someone else holds a live lease."""
        ...

    async def renew_leases(self, owner: str, turn_ids: Sequence[str], *, lease_seconds: float) -> None: ...

    async def release_turn(self, turn_id: str, owner: str) -> None: ...

    async def orphaned_turns(self, now: float) -> list[TurnRecord]:
        """Turns still marked running whose lease has expired."""
        ...

    async def create_api_key(self, user_id: str) -> str: ...

    async def user_for_api_key(self, key: str) -> str | None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class UpstreamError(Exception):
    """The upstream failed: HTTP error status, transport error, timeout, truncation."""

    message: str
    kind: str = "upstream_error"  # upstream_http_error | upstream_disconnected | upstream_timeout | upstream_truncated
    status: int | None = None

    def __str__(self) -> str:
        return self.message


@dataclass(slots=True)  # per chunk: not frozen (its init is 4x slower); never mutated
class RawChunk:
    """One parsed ``data:`` payload of the upstream stream."""

    data: dict[str, Any]


@dataclass(frozen=True)
class RawWarning:
    """A ``data:`` line that was not JSON: skipped, but recorded."""

    message: str
    raw: str


class ChatProvider(Protocol):
    """Chat Completions transport: bytes in, parsed chunk dicts out.

    Semantics (what a chunk means) live in ``engine.stream``; the adapter only
    frames SSE, decodes JSON and turns transport faults into ``UpstreamError``.
    The iterator ends normally only after ``[DONE]`` (or a finish reason followed
    by a clean end of body); anything else raises ``UpstreamError``. It yields
    the payloads of each network read as one list (never empty): the engine
    then takes one async step per read, not per chunk.
    """

    def stream_batches(self, body: dict[str, Any]) -> AsyncIterator[list[RawChunk | RawWarning]]: ...

    async def complete_chat(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def list_models(self) -> list[dict[str, Any]]: ...


class LiveBus(Protocol):
    """Live fan-out of a turn's deltas and committed events to subscribers."""

    def publish(self, turn_id: str, message: Any) -> None: ...

    def subscribe(self, turn_id: str) -> Subscription: ...


class Subscription(Protocol):
    async def get(self) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model id goes: its provider, the upstream's own name, the operator's profile."""

    provider: ChatProvider
    upstream_model: str
    api: str = "chat"  # chat | responses | ollama
    system: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


class ModelCatalog(Protocol):
    """The models of every configured upstream."""

    async def resolve(self, model: str) -> ResolvedModel | None: ...

    async def list_models(self) -> list[dict[str, Any]]: ...


class ToolCatalog(Protocol):
    """Server tools (modules in ``TURNLOG_TOOLS_DIR``) by tool id."""

    def known_ids(self) -> set[str]: ...

    def handles(self, tool_ids: Sequence[str]) -> dict[str, Any]:
        """Function name -> ``engine.tools.ToolHandle`` for the selected modules."""
        ...


class NoTools:
    """The catalog of a deployment without a tools folder."""

    def known_ids(self) -> set[str]:
        return set()

    def handles(self, tool_ids: Sequence[str]) -> dict[str, Any]:
        return {}


class CodeExecutor(Protocol):
    """Runs code for the legacy ``<code_interpreter>`` loop (the sandbox comes later)."""

    async def run(self, code: str, lang: str) -> dict[str, Any]:
        """``{"stdout", "stderr", "result"}`` (any may be missing)."""
        ...


class NoCodeExecutor:
    async def run(self, code: str, lang: str) -> dict[str, Any]:
        return {"stdout": "Code interpreter engine not configured."}
