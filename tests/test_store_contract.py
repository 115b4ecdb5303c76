"""Contract of ``engine.ports.EventStore`` (and ``BlobStore``), run against every backend.

Like ``eventsourcing``'s recorder test cases: one class of tests, and the
suite's ``store_backend`` fixture (``tests/backends.py``: ``memory``,
``sqlite``, ``sqlite-async``, ``postgres``, as ``--backend`` selects) that
says how to open (and reopen: a second process) a store on one migrated
database. The in-memory store passes every contract test; only the schema and
migration tests below are SQL's alone.

Tests use fresh random ids, so none needs the database to itself.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, func, select, text

from adapters.http.response_deletions import metadata as deletions_metadata
from adapters.knowledge.schema import TABLES as KNOWLEDGE_TABLES
from adapters.knowledge.schema import metadata as knowledge_metadata
from adapters.presets import metadata as presets_metadata
from adapters.store import MemoryEventStore, SqlEventStore, hash_api_key, migrate, open_store, turn_search
from adapters.store.fork_index import TABLES as FORK_TABLES
from adapters.store.fork_index import forks_of
from adapters.store.migrate import alembic_config
from adapters.store.schema import api_keys, metadata, turns
from adapters.store.turn_search import TABLES as SEARCH_TABLES
from adapters.store.turn_search import QueryError, TurnQuery, chat_openers, count_turns, find_turns, parse_query
from adapters.vectors.schema import TABLES as VECTOR_TABLES
from engine.chain import check
from engine.events import Event
from engine.json_types import JsonObject
from engine.ports import BlobStore, ConcurrencyError, EventStore, IndexUpdate, LeaseLost, TurnRecord
from tests import chain_oracle
from tests.backends import SERVICE_BACKENDS, STORE_BACKENDS, Backend, Store
from tests.pg import pg_empty_database  # noqa: F401  (fixture)

#: The newest revision in migrations/versions.
HEAD = ScriptDirectory.from_config(alembic_config("")).get_current_head()

#: Tables that migrations create but ``schema.metadata`` does not describe
#: (the vector store's: their types depend on the dialect; the knowledge
#: features', compared with their own metadata below).
OTHER_TABLES = VECTOR_TABLES | KNOWLEDGE_TABLES | SEARCH_TABLES | FORK_TABLES

T0 = 1_800_000_000.0


def _our_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """compare_metadata filter before reflection (``vector`` is no SQLAlchemy type)."""
    return type_ != "table" or name not in OTHER_TABLES


def _ours(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """compare_metadata filter: leave out the tables ``schema.metadata`` does not own."""
    table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
    return table not in OTHER_TABLES


class Clock:
    """A fake clock for leases: ``clock()`` is now, ``advance`` moves it."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _sqlite_url(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "turnlog.db"
    return f"sqlite+aiosqlite:///{path}", path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(store_backend: Backend, clock: Clock) -> AsyncIterator[Store]:
    store = await store_backend.open(clock)
    yield store
    await store.close()


@pytest.fixture
def ids() -> Callable[[str], str]:
    """``ids("turn")`` → a fresh id, unique across tests and runs."""
    run = uuid.uuid4().hex[:10]
    return lambda name: f"{name}-{run}"


def ev(turn_id: str, seq: int, type: str = "test.event", at: float | None = None, **data: Any) -> Event:
    return Event(turn_id=turn_id, seq=seq, type=type, at=T0 + seq if at is None else at, data=data)


def turn_record(
    turn_id: str,
    *,
    chat_id: str,
    user_id: str,
    owner: str | None = "w1",
    created_at: float = T0,
    status: str = "running",
) -> TurnRecord:
    return TurnRecord(
        id=turn_id,
        chat_id=chat_id,
        user_id=user_id,
        model="gpt-test",
        status=status,
        created_at=created_at,
        updated_at=created_at,
        owner=owner,
    )


async def start(
    store: Store,
    turn_id: str,
    *,
    chat_id: str | None = None,
    user_id: str = "u",
    owner: str | None = "w1",
    lease: float = 30.0,
    created_at: float = T0,
) -> int:
    record = turn_record(
        turn_id,
        chat_id=chat_id or f"chat-of-{turn_id}",
        user_id=user_id,
        owner=owner,
        created_at=created_at,
    )
    started = ev(turn_id, 1, "turn.started", chat_id=record.chat_id, user_id=user_id)
    return await store.start_turn(record, [started], lease_seconds=lease)


@pytest.mark.backends(*STORE_BACKENDS)
class TestEventStoreContract:
    # ------------------------------------------------------------- the log

    async def test_append_read_round_trip(self, store: Store, ids: Any) -> None:
        t = ids("t")
        token = await start(store, t)
        assert token == 1
        batch1 = [ev(t, 2, "model.delta", text="héllo ✓", lens=[3, 3]), ev(t, 3, nested={"a": [1, None, 2.5]})]
        batch2 = [ev(t, 4, "turn.completed")]
        await store.append(batch1, fencing=token)
        await store.append(batch2)
        got = await store.read(t)
        assert [e.seq for e in got] == [1, 2, 3, 4]
        assert got[1:] == batch1 + batch2
        assert got[1].data == {"text": "héllo ✓", "lens": [3, 3]}
        assert isinstance(got[0].at, float)

    async def test_read_after_and_limit(self, store: Store, ids: Any) -> None:
        t = ids("t")
        await start(store, t)
        await store.append([ev(t, s) for s in range(2, 11)])
        assert [e.seq for e in await store.read(t, after=3)] == list(range(4, 11))
        assert [e.seq for e in await store.read(t, after=3, limit=2)] == [4, 5]
        assert [e.seq for e in await store.read(t, limit=1)] == [1]
        assert await store.read(t, after=10) == []
        assert await store.read(ids("unknown")) == []

    async def test_read_upcasts_old_shapes_and_returns_fresh_data(self, store: Store, ids: Any) -> None:
        """Readers never see an old data version (``engine.events.upcast``) nor
        the writer's objects: data goes through JSON on every backend."""
        t = ids("t")
        await start(store, t)
        data: dict[str, Any] = {"v": 1, "iteration": 0, "provider": "openai", "nested": {"k": [1, 2]}}
        await store.append([Event(turn_id=t, seq=2, type="model.requested", at=T0 + 2, data=data), ev(t, 3, pair=(1, 2))])
        data["nested"]["k"].append(3)  # the writer's object changes after the append
        first, second = await store.read(t, after=1), await store.read(t, after=1)
        assert first[0].data == {"v": 2, "iteration": 0, "nested": {"k": [1, 2]}}
        assert first[1].data == {"pair": [1, 2]}
        first[0].data["nested"]["k"].clear()  # nor another reader's
        assert second[0].data["nested"]["k"] == [1, 2]

    async def test_events_of_other_turns_do_not_mix(self, store: Store, ids: Any) -> None:
        a, b = ids("a"), ids("b")
        await start(store, a)
        await start(store, b)
        await asyncio.gather(store.append([ev(a, 2, x="a")]), store.append([ev(b, 2, x="b")]))
        assert [e.data.get("x") for e in await store.read(a)] == [None, "a"]
        assert [e.data.get("x") for e in await store.read(b)] == [None, "b"]

    # ------------------------------------------------------------ the chain

    async def test_events_are_hash_chained(self, store: Store, store_backend: Backend, clock: Clock, ids: Any) -> None:
        """Every append links its events (``sha256(previous hash || canonical
        event)``, from 32 zero bytes), whatever path writes them: start_turn,
        group-committed appends of several turns, append_nowait, a batch
        in which an append fails, another store (process) of the same log."""
        a, b = ids("a"), ids("b")
        token = await start(store, a)
        await start(store, b)
        await asyncio.gather(
            store.append_nowait([ev(a, 2, "model.delta", text="héllo ✓", lens=[3, 3])], fencing=token),
            store.append_nowait([ev(b, 2, x=1)]),
            store.append_nowait([ev(a, 3), ev(a, 4, nested={"z": 1, "a": [1.5, None, "é"]})], fencing=token),
        )
        # one batch: an append at a taken seq fails alone; the others are linked as if it never was
        results = await asyncio.gather(
            store.append([ev(b, 3, x="first")]),
            store.append([ev(b, 3, x="second")]),
            store.append([ev(a, 5)], fencing=token),
            return_exceptions=True,
        )
        assert sum(isinstance(r, ConcurrencyError) for r in results) == 1 and results[2] is None
        other = await store_backend.open(clock)  # a second process: no heads of its own
        try:
            await other.append([ev(a, 6, by="other")])
        finally:
            await other.close()
        await store.append([ev(a, 7)])  # the first store again, past the other's event
        await store.append([ev(b, 4)])
        for turn in (a, b):
            stored = await store.read_chain(turn)
            rows = [(e.turn_id, e.seq, e.type, e.at, e.data) for e in stored]
            assert [e.hash for e in stored] == chain_oracle.chain(rows), turn
            assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
            assert check(turn, stored).ok
        # stored data, not upcast: the chain is over what was written
        await store.append([Event(turn_id=b, seq=5, type="model.requested", at=T0, data={"v": 1, "provider": "openai"})])
        (old,) = await store.read_chain(b, after=4)
        assert old.data == {"v": 1, "provider": "openai"} and (await store.read(b, after=4))[0].data == {"v": 2}
        assert old.hash == chain_oracle.chain([(e.turn_id, e.seq, e.type, e.at, e.data) for e in await store.read_chain(b)])[-1]
        assert [e.seq for e in await store.read_chain(a, after=2, limit=3)] == [3, 4, 5]

    # ---------------------------------------------------- optimistic concurrency

    async def test_same_seq_concurrently_one_wins_batchmate_commits(self, store: Store, ids: Any) -> None:
        a, b = ids("a"), ids("b")
        await start(store, a)
        await start(store, b)
        batches = store.stats["batches"]
        results = await asyncio.gather(
            store.append([ev(a, 2, who="first")]),
            store.append([ev(a, 2, who="second")]),
            store.append([ev(b, 2, who="other turn")]),
            return_exceptions=True,
        )
        assert store.stats["batches"] == batches + 1, "all three in one group commit"
        outcomes = results[:2]
        assert sum(r is None for r in outcomes) == 1
        assert sum(isinstance(r, ConcurrencyError) for r in outcomes) == 1
        assert results[2] is None
        winner = "first" if outcomes[0] is None else "second"
        assert [e.data.get("who") for e in await store.read(a)] == [None, winner]
        assert [e.data.get("who") for e in await store.read(b)] == [None, "other turn"]

    async def test_conflict_with_committed_event_fails_alone(self, store: Store, ids: Any) -> None:
        a, b = ids("a"), ids("b")
        await start(store, a)
        await start(store, b)
        await store.append([ev(a, 2)])
        batches = store.stats["batches"]
        results = await asyncio.gather(
            store.append([ev(b, 2)]),
            store.append([ev(a, 3, part="of a failing request"), ev(a, 2)]),  # seq 2 is taken
            store.append([ev(b, 3)]),
            return_exceptions=True,
        )
        assert store.stats["batches"] == batches + 1
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], ConcurrencyError)
        # The failing request was atomic: its seq 3 is not there...
        assert [e.seq for e in await store.read(a)] == [1, 2]
        assert [e.seq for e in await store.read(b)] == [1, 2, 3]
        # ...and can be appended afterwards.
        await store.append([ev(a, 3)])
        assert [e.seq for e in await store.read(a)] == [1, 2, 3]

    async def test_duplicate_seq_inside_one_request(self, store: Store, ids: Any) -> None:
        t = ids("t")
        await start(store, t)
        with pytest.raises(ConcurrencyError):
            await store.append([ev(t, 2), ev(t, 2)])
        assert [e.seq for e in await store.read(t)] == [1]

    async def test_start_turn_twice_is_a_conflict(self, store: Store, ids: Any) -> None:
        t = ids("t")
        await start(store, t)
        with pytest.raises(ConcurrencyError):
            await start(store, t)
        assert len(await store.read(t)) == 1

    async def test_many_concurrent_appends_are_gap_free(self, store: Store, ids: Any) -> None:
        n_turns, n_events = 50, 50
        turn_ids = [ids(f"t{i}") for i in range(n_turns)]
        tokens = {t: await start(store, t) for t in turn_ids}

        async def writer(t: str) -> None:
            for seq in range(2, n_events + 2):
                await store.append([ev(t, seq, i=seq)], fencing=tokens[t])

        await asyncio.gather(*(writer(t) for t in turn_ids))
        for t in turn_ids:
            got = await store.read(t)
            assert [e.seq for e in got] == list(range(1, n_events + 2))
            assert [e.data.get("i") for e in got[1:]] == list(range(2, n_events + 2))

    async def test_failed_writes_leave_nothing_behind(self, store: Store, clock: Clock, ids: Any) -> None:
        """Conflicts, lost leases and a duplicate turn in one group commit fail
        alone and write nothing; the events after them land as if they had
        never been tried."""
        a, b = ids("a"), ids("b")
        token = await start(store, a, lease=1)
        await start(store, b)
        results = await asyncio.gather(
            store.append([ev(a, 2), ev(a, 3)]),
            store.append([ev(a, 3, dup=True)]),  # conflicts with the one before
            start(store, a),  # the turn exists
            store.append([ev(b, 2)]),
            return_exceptions=True,
        )
        assert [type(r) for r in results] == [type(None), ConcurrencyError, ConcurrencyError, type(None)]
        clock.advance(2)
        await store.claim_turn(a, "w2", lease_seconds=30)
        with pytest.raises(LeaseLost):
            await store.append([ev(a, 4)], fencing=token)
        with pytest.raises(ConcurrencyError):
            await store.append([ev(b, 3), ev(b, 2)])
        await store.append([ev(b, 3)])
        got = {t: [(e.seq, e.data) for e in await store.read(t)] for t in (a, b)}
        assert got[a] == [(1, {"chat_id": f"chat-of-{a}", "user_id": "u"}), (2, {}), (3, {})]
        assert [seq for seq, _ in got[b]] == [1, 2, 3]

    # ---------------------------------------------------------------- leases

    async def test_stale_fencing_token_raises_lease_lost(self, store: Store, clock: Clock, ids: Any) -> None:
        t, other = ids("t"), ids("other")
        old = await start(store, t, owner="w1", lease=30)
        await start(store, other, owner="w1", lease=30)
        clock.advance(31)
        new = await store.claim_turn(t, "w2", lease_seconds=30)
        assert new == old + 1
        results = await asyncio.gather(
            store.append([ev(t, 2, by="w1")], fencing=old),
            store.append([ev(other, 2)], fencing=1),
            return_exceptions=True,
        )
        assert isinstance(results[0], LeaseLost)
        assert results[1] is None
        await store.append([ev(t, 2, by="w2")], fencing=new)
        assert [e.data.get("by") for e in await store.read(t)] == [None, "w2"]
        turn = await store.get_turn(t)
        assert turn is not None and (turn.owner, turn.fencing) == ("w2", new)
        assert turn.lease_until == pytest.approx(clock() + 30)

    async def test_append_nowait_queues_at_once_and_fails_like_append(self, store: Store, clock: Clock, ids: Any) -> None:
        t = ids("t")
        token = await start(store, t, owner="w1", lease=30)
        # Both queued before either is awaited: one group commit, in order.
        first = store.append_nowait([ev(t, 2)], fencing=token)
        second = store.append_nowait([ev(t, 3)], fencing=token)
        assert not first.done()
        await asyncio.gather(first, second)
        assert [e.seq for e in await store.read(t)] == [1, 2, 3]
        with pytest.raises(ConcurrencyError):
            await store.append_nowait([ev(t, 3)], fencing=token)
        clock.advance(31)
        assert await store.claim_turn(t, "w2", lease_seconds=30) == token + 1
        with pytest.raises(LeaseLost):
            await store.append_nowait([ev(t, 4)], fencing=token)
        with pytest.raises(ValueError):
            store.append_nowait([ev(t, 4), ev(ids("u"), 1)], fencing=token)  # refused before queueing

    async def test_after_a_failed_append_later_ones_with_that_token_are_refused(self, store: Store, ids: Any) -> None:
        # A failed write followed by a successful later one would leave a gap
        # in the turn's seqs: the owner's later appends are refused instead.
        t, other = ids("t"), ids("other")
        token = await start(store, t)
        other_token = await start(store, other)
        await store.append([ev(t, 2)], fencing=token)
        # Queued together, one group commit: seq 2 is taken, so seq 3 must not land.
        taken = store.append_nowait([ev(t, 2, who="late")], fencing=token)
        after = store.append_nowait([ev(t, 3)], fencing=token)
        bystander = store.append_nowait([ev(other, 2)], fencing=other_token)
        results = await asyncio.gather(taken, after, bystander, return_exceptions=True)
        assert isinstance(results[0], ConcurrencyError)
        assert isinstance(results[1], LeaseLost)
        assert results[2] is None  # other turns are not affected
        with pytest.raises(LeaseLost):  # nor any later batch
            await store.append([ev(t, 3)], fencing=token)
        assert [e.seq for e in await store.read(t)] == [1, 2]
        # A new owner (a new token) continues after what is durable.
        await store.release_turn(t, "w1")
        new = await store.claim_turn(t, "w2", lease_seconds=30)
        assert new is not None and new != token
        await store.append([ev(t, 3)], fencing=new)
        assert [e.seq for e in await store.read(t)] == [1, 2, 3]

    async def test_fencing_on_unknown_turn_is_lease_lost(self, store: Store, ids: Any) -> None:
        with pytest.raises(LeaseLost):
            await store.append([ev(ids("nobody"), 1)], fencing=1)

    async def test_claim_refused_while_lease_live(self, store: Store, clock: Clock, ids: Any) -> None:
        t = ids("t")
        await start(store, t, owner="w1", lease=30)
        clock.advance(10)
        assert await store.claim_turn(t, "w2", lease_seconds=30) is None
        # The owner itself may claim again (e.g. after a restart with the same id).
        assert await store.claim_turn(t, "w1", lease_seconds=30) == 2
        clock.advance(29)
        assert await store.claim_turn(t, "w2", lease_seconds=30) is None
        clock.advance(2)
        assert await store.claim_turn(t, "w2", lease_seconds=30) == 3
        assert await store.claim_turn(ids("unknown"), "w2", lease_seconds=30) is None

    async def test_renew_and_release(self, store: Store, clock: Clock, ids: Any) -> None:
        a, b = ids("a"), ids("b")
        await start(store, a, owner="w1", lease=30)
        await start(store, b, owner="w2", lease=30)
        clock.advance(20)
        await store.renew_leases("w1", [a, b], lease_seconds=30)
        ta, tb = await store.get_turn(a), await store.get_turn(b)
        assert ta is not None and ta.lease_until == pytest.approx(clock() + 30)
        assert tb is not None and tb.lease_until == pytest.approx(T0 + 30)  # not w1's
        await store.renew_leases("w1", [], lease_seconds=30)
        clock.advance(15)
        assert await store.claim_turn(a, "w3", lease_seconds=30) is None  # renewed: live
        await store.release_turn(a, "w2")  # not the owner: no effect
        assert await store.claim_turn(a, "w3", lease_seconds=30) is None
        await store.release_turn(a, "w1")
        ta = await store.get_turn(a)
        assert ta is not None and ta.owner is None and ta.lease_until is None
        assert await store.claim_turn(a, "w3", lease_seconds=30) == 2

    async def test_releases_queued_together_release_only_their_owners_turns(self, store: Store, ids: Any) -> None:
        """Releases written in one group commit (SQLite: one statement for the
        run): each releases its turn only if its owner still holds it."""
        a, b, c = ids("a"), ids("b"), ids("c")
        await start(store, a, owner="w1", lease=30)
        await start(store, b, owner="w2", lease=30)
        await start(store, c, owner="w1", lease=30)
        batches = store.stats["batches"]
        await asyncio.gather(store.release_turn(a, "w1"), store.release_turn(b, "w1"), store.release_turn(c, "w1"))
        assert store.stats["batches"] == batches + 1, "one group commit"
        got = [await store.get_turn(t) for t in (a, b, c)]
        assert [(t.owner, t.lease_until is None) for t in got if t is not None] == [(None, True), ("w2", False), (None, True)]

    async def test_an_append_releases_the_lease_with_its_index_update(self, store: Store, ids: Any) -> None:
        """``IndexUpdate.release``: the owner's lease goes in the append's own
        transaction (a turn's terminal event); another owner's stays, and the
        releases of several turns in one group commit are each their own."""
        mine, theirs, kept = ids("mine"), ids("theirs"), ids("kept")
        for t in (mine, theirs, kept):
            await start(store, t)
        await asyncio.gather(
            store.append([ev(mine, 2, "turn.completed")], fencing=1, index=IndexUpdate(status="completed", release="w1")),
            store.append([ev(theirs, 2, "turn.completed")], fencing=1, index=IndexUpdate(status="completed", release="w2")),
            store.append([ev(kept, 2)], fencing=1, index=IndexUpdate(status="running")),
        )
        got = {t: await store.get_turn(t) for t in (mine, theirs, kept)}
        assert all(r is not None for r in got.values())
        assert (got[mine].status, got[mine].owner, got[mine].lease_until) == ("completed", None, None)  # type: ignore[union-attr]
        assert (got[theirs].status, got[theirs].owner) == ("completed", "w1")  # type: ignore[union-attr]
        assert got[theirs].lease_until is not None  # type: ignore[union-attr]
        assert (got[kept].status, got[kept].owner) == ("running", "w1")  # type: ignore[union-attr]

    async def test_orphaned_turns(self, store: Store, clock: Clock, ids: Any) -> None:
        user = ids("user")
        live, expired, done, released = ids("live"), ids("expired"), ids("done"), ids("released")
        await start(store, live, user_id=user, lease=100)
        await start(store, expired, user_id=user, lease=10)
        await start(store, done, user_id=user, lease=10)
        await start(store, released, user_id=user, lease=100)
        await store.append([ev(done, 2, "turn.completed")], index=IndexUpdate(status="completed"))
        await store.release_turn(released, "w1")
        mine = {live, expired, done, released}
        orphans = [t.id for t in await store.orphaned_turns(T0 + 5) if t.id in mine]
        assert orphans == [released]
        orphan_ids = {t.id for t in await store.orphaned_turns(T0 + 11) if t.id in mine}
        assert orphan_ids == {expired, released}
        clock.advance(50)
        assert await store.claim_turn(expired, "w2", lease_seconds=30) == 2
        orphan_ids = {t.id for t in await store.orphaned_turns(clock()) if t.id in mine}
        assert orphan_ids == {released}

    # ----------------------------------------------------------------- index

    async def test_index_update_is_atomic_with_events(self, store: Store, ids: Any) -> None:
        t = ids("t")
        await start(store, t)
        view: JsonObject = {"status": "completed", "content": "hi ✓", "usage": {"total": 3}}
        await store.append(
            [ev(t, 2, "turn.completed", at=T0 + 42)],
            index=IndexUpdate(status="completed", view=view),
        )
        turn = await store.get_turn(t)
        assert turn is not None
        assert (turn.status, turn.view, turn.updated_at) == ("completed", view, T0 + 42)
        # A failing append does not touch the index.
        with pytest.raises(ConcurrencyError):
            await store.append([ev(t, 2)], index=IndexUpdate(status="failed", view={"x": 1}))
        turn = await store.get_turn(t)
        assert turn is not None and (turn.status, turn.view) == ("completed", view)
        # None leaves a field as it is.
        await store.append([ev(t, 3, at=T0 + 50)], index=IndexUpdate(view={"v": 2}))
        turn = await store.get_turn(t)
        assert turn is not None and (turn.status, turn.view) == ("completed", {"v": 2})

    async def test_index_update_with_lease_lost_is_not_applied(self, store: Store, clock: Clock, ids: Any) -> None:
        t = ids("t")
        old = await start(store, t, lease=1)
        clock.advance(2)
        await store.claim_turn(t, "w2", lease_seconds=30)
        with pytest.raises(LeaseLost):
            await store.append([ev(t, 2)], fencing=old, index=IndexUpdate(status="completed"))
        turn = await store.get_turn(t)
        assert turn is not None and turn.status == "running"
        assert len(await store.read(t)) == 1

    async def test_append_needs_one_turn_for_fencing_or_index(self, store: Store, ids: Any) -> None:
        a, b = ids("a"), ids("b")
        with pytest.raises(ValueError):
            await store.append([ev(a, 2), ev(b, 2)], fencing=1)
        with pytest.raises(ValueError):
            await store.append([], index=IndexUpdate(status="completed"))
        await store.append([])  # nothing to do, but fine

    # ------------------------------------------------------- turns and chats

    async def test_start_turn_creates_the_chat(self, store: Store, ids: Any) -> None:
        user, chat = ids("user"), ids("chat")
        t1, t2 = ids("t1"), ids("t2")
        await start(store, t1, chat_id=chat, user_id=user, created_at=T0 + 1)
        got = await store.get_chat(chat)
        assert got is not None
        assert (got.id, got.user_id, got.title, got.tags) == (chat, user, None, [])
        assert got.created_at == got.updated_at == T0 + 1
        await start(store, t2, chat_id=chat, user_id=user, created_at=T0 + 5)
        got = await store.get_chat(chat)
        assert got is not None and (got.created_at, got.updated_at) == (T0 + 1, T0 + 5)
        await start(store, ids("t3"), chat_id=chat, user_id=user, created_at=T0 + 3)  # an older clock
        got = await store.get_chat(chat)
        assert got is not None and got.updated_at == T0 + 5, "a turn never moves its chat back in time"
        turn = await store.get_turn(t1)
        assert turn is not None
        assert (turn.chat_id, turn.user_id, turn.model, turn.status, turn.fencing, turn.owner) == (
            chat,
            user,
            "gpt-test",
            "running",
            1,
            "w1",
        )
        assert await store.get_chat(ids("nochat")) is None
        assert await store.get_turn(ids("noturn")) is None

    async def test_a_burst_of_starts_is_one_commit_and_a_conflict_fails_alone(self, store: Store, ids: Any) -> None:
        """Starts queued together are written in one group commit (SQL: multi-row
        statements); the outcome is that of the starts one after another: a
        turn id already taken, or taken twice in the burst, fails only its
        caller, whose chat is neither created nor moved; the chats end with the
        first start's creation time and the latest start's time."""
        chat, lone, never = ids("chat"), ids("lone"), ids("never")
        burst = [ids(f"b{i}") for i in range(3)]
        batches = store.stats["batches"]
        tokens = await asyncio.gather(
            start(store, burst[0], chat_id=chat, created_at=T0 + 2),
            start(store, burst[1], chat_id=chat, created_at=T0 + 5),
            start(store, burst[2], chat_id=chat, created_at=T0 + 3),
        )
        assert tokens == [1, 1, 1] and store.stats["batches"] == batches + 1
        got = await store.get_chat(chat)
        assert got is not None and (got.created_at, got.updated_at) == (T0 + 2, T0 + 5)

        fresh = [ids(f"f{i}") for i in range(3)]
        batches = store.stats["batches"]
        results = await asyncio.gather(
            start(store, fresh[0], chat_id=chat, created_at=T0 + 9),
            start(store, burst[1], chat_id=never, created_at=T0 + 9),  # taken before
            start(store, fresh[1], chat_id=lone, created_at=T0 + 1),
            start(store, fresh[1], chat_id=never, created_at=T0 + 9),  # taken in this burst
            start(store, fresh[2], chat_id=chat, created_at=T0 + 7),
            return_exceptions=True,
        )
        assert store.stats["batches"] == batches + 1, "one group commit"
        assert [type(r) for r in results] == [int, ConcurrencyError, int, ConcurrencyError, int]
        assert await store.get_chat(never) is None
        got = await store.get_chat(chat)
        assert got is not None and (got.created_at, got.updated_at) == (T0 + 2, T0 + 9)
        got = await store.get_chat(lone)
        assert got is not None and (got.created_at, got.updated_at) == (T0 + 1, T0 + 1)
        turn = await store.get_turn(fresh[1])
        assert turn is not None and turn.chat_id == lone
        for t in burst + fresh:
            stored = await store.read_chain(t)
            assert [e.seq for e in stored] == [1] and check(t, stored).ok
        # the new turns' heads are linked: their next appends chain on
        await store.append([ev(fresh[0], 2)], fencing=1)
        assert check(fresh[0], await store.read_chain(fresh[0])).ok

    async def test_a_batch_of_every_kind_of_write_fails_only_its_culprits(self, store: Store, clock: Clock, ids: Any) -> None:
        """Writes of every kind queued together are one group commit (SQLite:
        the appends, starts and releases at the driver level, inside the
        transaction the claim and the chat's metadata share), and each has
        the outcome it has alone: a taken seq or turn id fails only its caller."""
        a, b, c, d, new = ids("a"), ids("b"), ids("c"), ids("d"), ids("new")
        token_a = await start(store, a)
        await start(store, b)
        await start(store, c, owner="w2", lease=10)
        await start(store, d)
        await store.append([ev(b, 2)])
        clock.advance(60)  # every lease has run out
        batches = store.stats["batches"]
        results = await asyncio.gather(
            store.append([ev(a, 2, x=1)], fencing=token_a, index=IndexUpdate(status="completed", release="w1")),
            store.set_chat_meta(f"chat-of-{a}", title="mixed"),
            store.append([ev(b, 3), ev(b, 2)]),  # seq 2 is taken
            store.claim_turn(c, "w3", lease_seconds=30),
            start(store, new),
            start(store, a),  # taken
            store.release_turn(d, "w1"),
            return_exceptions=True,
        )
        assert store.stats["batches"] == batches + 1, "one group commit"
        assert results[:2] == [None, None] and results[3:5] == [2, 1] and results[6] is None
        assert isinstance(results[2], ConcurrencyError) and isinstance(results[5], ConcurrencyError)
        turn_a, turn_c, turn_d = await store.get_turn(a), await store.get_turn(c), await store.get_turn(d)
        assert turn_a is not None and (turn_a.status, turn_a.owner) == ("completed", None)
        assert turn_c is not None and (turn_c.owner, turn_c.fencing) == ("w3", 2)
        assert turn_d is not None and turn_d.owner is None
        chat = await store.get_chat(f"chat-of-{a}")
        assert chat is not None and chat.title == "mixed"
        for t, seqs in ((a, [1, 2]), (b, [1, 2]), (new, [1])):
            stored = await store.read_chain(t)
            assert [e.seq for e in stored] == seqs and check(t, stored).ok
        await store.append([ev(b, 3)])  # the failed request left nothing behind
        assert check(b, await store.read_chain(b)).ok

    async def test_chat_meta_and_listing(self, store: Store, ids: Any) -> None:
        user, other = ids("user"), ids("other")
        chats = [ids(f"c{i}") for i in range(4)]
        for i, chat in enumerate(chats):
            await start(store, ids(f"t{i}"), chat_id=chat, user_id=user, created_at=T0 + i)
        await start(store, ids("t-other"), chat_id=ids("c-other"), user_id=other)
        await store.set_chat_meta(chats[0], title="First ✓", tags=["a", "b"])
        await store.set_chat_meta(chats[0], tags=["c"])  # title kept
        got = await store.get_chat(chats[0])
        assert got is not None and (got.title, got.tags) == ("First ✓", ["c"])
        assert got.updated_at == T0  # metadata does not reorder the list
        listed = await store.list_chats(user)
        assert [c.id for c in listed] == chats[::-1]
        assert [c.id for c in await store.list_chats(user, limit=2)] == [chats[3], chats[2]]
        page2 = await store.list_chats(user, limit=2, before=listed[1].updated_at)
        assert [c.id for c in page2] == [chats[1], chats[0]]
        assert [c.id for c in await store.list_chats(other)] == [ids("c-other")]

    async def test_list_turns_filters(self, store: Store, ids: Any) -> None:
        u1, u2 = ids("u1"), ids("u2")
        c1, c2 = ids("c1"), ids("c2")
        specs = [  # (turn, user, chat, created)
            (ids("a"), u1, c1, T0 + 1),
            (ids("b"), u1, c1, T0 + 2),
            (ids("c"), u1, c2, T0 + 3),
            (ids("d"), u2, ids("c3"), T0 + 4),
        ]
        for t, user, chat, created in specs:
            await start(store, t, chat_id=chat, user_id=user, created_at=created)
        await store.append([ev(ids("b"), 2)], index=IndexUpdate(status="completed"))
        assert [t.id for t in await store.list_turns(user_id=u1)] == [ids("c"), ids("b"), ids("a")]
        assert [t.id for t in await store.list_turns(chat_id=c1)] == [ids("b"), ids("a")]
        assert [t.id for t in await store.list_turns(user_id=u1, status="running")] == [ids("c"), ids("a")]
        assert [t.id for t in await store.list_turns(user_id=u1, chat_id=c1, status="completed")] == [ids("b")]
        assert [t.id for t in await store.list_turns(user_id=u1, limit=1)] == [ids("c")]
        assert [t.id for t in await store.list_turns(user_id=u2)] == [ids("d")]
        assert await store.list_turns(user_id=ids("nobody")) == []

    # ------------------------------------------------------------ turn search

    async def _search_corpus(self, store: Store, ids: Any) -> tuple[str, dict[str, str]]:
        """Turns of one user (and one of another's) whose words say what ``q`` finds."""
        user = ids("searcher")
        t = {name: ids(f"search-{name}") for name in ("a", "b", "c", "e", "other")}

        async def turn(name: str, created: float, new_messages: list[Any], *, answer: str | None, status: str, user_id: str = user, more: Any = ()) -> None:
            await start(store, t[name], user_id=user_id, created_at=created)
            events = [ev(t[name], 2, "assembly.completed", messages=[], new_messages=new_messages), *more]
            await store.append(events)
            view: JsonObject = {"content": answer, "title": "Printer setup" if name == "a" else None}
            await store.append([ev(t[name], 2 + len(events), "turn." + status)], index=IndexUpdate(status=status, view=view))

        await turn(
            "a",
            T0 + 1,
            [{"role": "user", "content": "How do I configure the Zebra-printer driver?"}],
            answer="Install zebra_utils 3.14 first; see the e-mail from Ünal.",
            status="completed",
        )
        history = [
            {"role": "system", "content": "You are helpful"},
            {"role": "user", "content": "an old question about giraffes"},
            {"role": "assistant", "content": "giraffes are tall"},
            {"role": "user", "content": "and what about penguins?"},
        ]
        await turn("b", T0 + 2, history, answer="Penguins swimming.", status="failed")
        parts = [
            {"type": "text", "text": "Describe this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "photo of a GIRAFFE"},
        ]
        tool_events = [
            ev(t["c"], 3, "tool.started", call_id="k1", name="look", arguments="{}"),
            ev(t["c"], 4, "tool.completed", call_id="k1", name="look", output=None, status="failed", error="boom"),
        ]
        await turn("c", T0 + 3, [{"role": "user", "content": parts}], answer="A giraffe standing", status="completed", more=tool_events)
        await turn("e", T0 + 4, [{"role": "tool", "tool_call_id": "x", "content": "zebra secret tool output"}], answer=None, status="completed")
        await turn("other", T0 + 5, [{"role": "user", "content": "zebra penguins giraffe"}], answer="zebra", status="completed", user_id=ids("someone-else"))
        return user, t

    @pytest.mark.parametrize("selective", [turn_search.SELECTIVE, 0])
    async def test_turn_search_has_one_meaning(self, store: Store, ids: Any, selective: int, monkeypatch: pytest.MonkeyPatch) -> None:
        """One oracle for every backend: what each ``q`` finds, written by hand
        (on SQLite from the matches and, ``selective`` 0, by walking the turns)."""
        monkeypatch.setattr(turn_search, "SELECTIVE", selective)
        user, t = await self._search_corpus(store, ids)
        expected = {
            "zebra": ["a"],  # not a tool's output, not another user's turn
            "ZEBRA printer": ["a"],  # no case; a hyphen separates words
            "zebra_utils": ["a"],  # so does an underscore
            "3.14": ["a"],
            "ünal": ["a"],  # letters beyond ASCII, case folded
            "unal": [],  # diacritics are kept
            "giraffes": [],  # only in the history the client sent again
            "giraffe": ["c"],  # the text parts of a message, and the answer
            "giraff*": ["c"],
            "penguins": ["b"],  # the new user message after the resent history
            "helpful": [],  # the system message is not the user's
            "photo standing": ["c"],  # one word from the message, one from the answer
            "photo zebra": [],  # every word must be there
            "setup": [],  # the title is shown, not searched
            "swim": [],  # whole words
            "swim*": ["b"],  # or a word's start
            "secret": [],
            "?!": ["e", "c", "b", "a"],  # no words: no filter
            "": ["e", "c", "b", "a"],
        }
        for q, names in expected.items():
            found = await find_turns(store, TurnQuery(user_id=user, terms=parse_query(q)))
            assert [f.id for f in found] == [t[n] for n in names], q
        (a,) = await find_turns(store, TurnQuery(user_id=user, terms=parse_query("zebra")))
        assert (a.title, a.first_message, a.status, a.tools, a.failed) == (
            "Printer setup",
            "How do I configure the Zebra-printer driver?",
            "completed",
            False,
            False,
        )
        (b,) = await find_turns(store, TurnQuery(user_id=user, terms=parse_query("penguins")))
        assert (b.title, b.first_message, b.failed) == (None, "and what about penguins?", True)
        (c,) = await find_turns(store, TurnQuery(user_id=user, terms=parse_query("giraffe")))
        assert (c.first_message, c.tools, c.failed) == ("Describe this\nphoto of a GIRAFFE", True, True)

    async def test_turn_search_filters_count_and_page(self, store: Store, ids: Any) -> None:
        user, t = await self._search_corpus(store, ids)

        async def found(**filters: Any) -> list[str]:
            names = {v: k for k, v in t.items()}
            return [names[f.id] for f in await find_turns(store, TurnQuery(user_id=user, **filters))]

        assert await found(status="failed") == ["b"]
        assert await found(tools=True) == ["c"]
        assert await found(tools=False) == ["e", "b", "a"]
        assert await found(failed=True) == ["c", "b"]  # the turn failed, or a tool call did
        assert await found(failed=False) == ["e", "a"]
        assert await found(since=T0 + 2, until=T0 + 4) == ["c", "b"]
        assert await found(model="gpt-test", terms=parse_query("zebra")) == ["a"]
        assert await found(model="another") == []
        assert await found(limit=2) == ["e", "c"]
        assert await found(limit=2, before=(T0 + 3, t["c"])) == ["b", "a"]
        assert await found(before=(T0 + 3, None)) == ["b", "a"]
        counts = await count_turns(store, TurnQuery(user_id=user, status="failed"))  # status aside
        assert counts == {"completed": 3, "failed": 1}
        # a running turn is interrupted once no one owns it: neither a live
        # actor here nor an unexpired lease (this one's ends at T0 + 30)
        lost = ids("search-lost")
        await start(store, lost, user_id=user, created_at=T0 + 6)
        later = T0 + 60
        assert [f.id for f in await find_turns(store, TurnQuery(user_id=user, status="interrupted", now=later))] == [lost]
        assert [f.id for f in await find_turns(store, TurnQuery(user_id=user, status="running", now=later, live=[lost]))] == [lost]
        assert [f.id for f in await find_turns(store, TurnQuery(user_id=user, status="running", now=T0))] == [lost]  # leased
        assert await count_turns(store, TurnQuery(user_id=user, now=later)) == {"completed": 3, "failed": 1, "interrupted": 1}
        assert await count_turns(store, TurnQuery(user_id=user, now=later, live=[lost])) == {"completed": 3, "failed": 1, "running": 1}
        assert await count_turns(store, TurnQuery(user_id=user, now=T0)) == {"completed": 3, "failed": 1, "running": 1}
        assert await count_turns(store, TurnQuery(user_id=user, terms=parse_query("giraffe"))) == {"completed": 1}

    async def test_a_chat_is_named_by_its_first_turns_first_message(self, store: Store, ids: Any) -> None:
        c1, c2, c3 = ids("chat-1"), ids("chat-2"), ids("chat-3")
        said = [  # (chat, created, new messages)
            (c1, T0 + 2, [{"role": "user", "content": "the second question"}]),
            (c1, T0 + 1, [{"role": "user", "content": "the first question"}, {"role": "user", "content": "and more"}]),
            (c2, T0 + 3, [{"role": "tool", "tool_call_id": "x", "content": "no user here"}]),
            (c2, T0 + 4, [{"role": "user", "content": [{"type": "text", "text": "asked in parts"}]}]),
            (c3, T0 + 5, []),
        ]
        for i, (chat, created, messages) in enumerate(said):
            turn_id = ids(f"opener-{i}")
            await start(store, turn_id, chat_id=chat, created_at=created)
            await store.append([ev(turn_id, 2, "assembly.completed", messages=[], new_messages=messages)])
        assert await chat_openers(store, [c1, c2, c3, ids("no-chat")]) == {c1: "the first question", c2: "asked in parts"}
        assert await chat_openers(store, []) == {}

    async def test_turn_search_refuses_unanswerable_queries(self, store: Store, ids: Any) -> None:
        with pytest.raises(QueryError):
            parse_query("x" * 201)
        with pytest.raises(QueryError):
            parse_query(" ".join(["w"] * 17))
        user, _ = await self._search_corpus(store, ids)
        assert await find_turns(store, TurnQuery(user_id=user, terms=parse_query("y" * 200))) == []

    # -------------------------------------------------------------- api keys

    async def test_api_keys_store_only_the_hash(self, store: Store, store_backend: Backend, ids: Any) -> None:
        user = ids("user")
        key = await store.create_api_key(user)
        assert key.startswith("tl-") and len(key) > 40
        assert key != await store.create_api_key(user)
        assert await store.user_for_api_key(key) == user
        assert await store.user_for_api_key(key + "x") is None
        assert await store.user_for_api_key("") is None
        rows = await stored_api_keys(store, user)
        assert len(rows) == 2
        assert hash_api_key(key) in {row[0] for row in rows}
        assert all(key not in str(row) for row in rows)
        if store_backend.file is not None:
            on_disk = b"".join(p.read_bytes() for p in store_backend.file.parent.glob(store_backend.file.name + "*"))
            assert hash_api_key(key).encode() in on_disk
            assert key.encode() not in on_disk

    # ------------------------------------------------------------ durability

    async def test_data_survives_a_new_store_instance(self, store_backend: Backend, clock: Clock, ids: Any) -> None:
        t = ids("t")
        first = await store_backend.open(clock)
        token = await start(first, t, chat_id=ids("chat"))
        await first.append([ev(t, 2, text="durable")], fencing=token, index=IndexUpdate(status="completed"))
        key = await first.create_api_key(ids("user"))
        await first.close()
        second = await store_backend.open(clock)
        try:
            assert [e.data.get("text") for e in await second.read(t)] == [None, "durable"]
            turn = await second.get_turn(t)
            assert turn is not None and turn.status == "completed"
            assert await second.get_chat(ids("chat")) is not None
            assert await second.user_for_api_key(key) == ids("user")
        finally:
            await second.close()

    async def test_two_store_instances_share_the_log(self, store: Store, store_backend: Backend, clock: Clock, ids: Any) -> None:
        """A second process on the same database: writes interleave without
        "database is locked", and fencing stops the one that lost the lease."""
        other = await store_backend.open(clock)
        try:
            a, b = ids("a"), ids("b")
            token_a = await start(store, a, owner="p1", lease=10)
            token_b = await start(other, b, owner="p2", lease=10)

            async def writer(s: Store, t: str, token: int) -> None:
                for seq in range(2, 42):
                    await s.append([ev(t, seq)], fencing=token)

            await asyncio.gather(writer(store, a, token_a), writer(other, b, token_b))
            assert len(await other.read(a)) == len(await store.read(b)) == 41
            clock.advance(11)
            taken = await other.claim_turn(a, "p2", lease_seconds=10)
            assert taken == token_a + 1
            with pytest.raises(LeaseLost):
                await store.append([ev(a, 42)], fencing=token_a)
            await other.append([ev(a, 42)], fencing=taken)
            assert [e.seq for e in await store.read(a, after=40)] == [41, 42]
        finally:
            await other.close()

    async def test_close_drains_queued_writes(self, store_backend: Backend, clock: Clock, ids: Any) -> None:
        t = ids("t")
        first = await store_backend.open(clock)
        await start(first, t)
        pending = [asyncio.ensure_future(first.append([ev(t, s)])) for s in range(2, 22)]
        await asyncio.sleep(0)  # let them queue
        await first.close()
        assert all(p.done() and p.exception() is None for p in pending)
        with pytest.raises(RuntimeError):
            await first.append([ev(t, 22)])
        second = await store_backend.open(clock)
        try:
            assert [e.seq for e in await second.read(t)] == list(range(1, 22))
        finally:
            await second.close()

    async def test_reads_run_while_the_writer_writes(self, store: Store, ids: Any) -> None:
        t = ids("t")
        await start(store, t)

        async def write() -> None:
            for seq in range(2, 102):
                await store.append([ev(t, seq)])

        async def read() -> int:
            seen = 0
            while seen < 101:
                got = await store.read(t)
                assert [e.seq for e in got] == list(range(1, len(got) + 1))
                seen = len(got)
            return seen

        _, seen = await asyncio.gather(write(), read())
        assert seen == 101


async def stored_api_keys(store: Store, user_id: str) -> list[tuple[Any, ...]]:
    """``user_id``'s API key rows as the backend holds them, key hash first."""
    if isinstance(store, MemoryEventStore):
        return [(h, *entry) for h, entry in store.database.api_keys.items() if entry[0] == user_id]
    async with store.engine.connect() as conn:
        rows = (await conn.execute(select(api_keys).where(api_keys.c.user_id == user_id))).all()
    return [tuple(row) for row in rows]  # key_hash, user_id, created_at


@pytest.mark.parametrize("store_class", [SqlEventStore, MemoryEventStore])
def test_every_store_implements_the_whole_port(store_class: type) -> None:
    """Both stores have every method of ``EventStore`` and ``BlobStore``, with
    the same parameters (names, kinds, defaults): an engine test on memory
    calls exactly what the service calls on SQL."""
    for port in (EventStore, BlobStore):
        for name, member in vars(port).items():
            if name.startswith("_") or not callable(member):
                continue
            declared = inspect.signature(member).parameters.values()
            implemented = inspect.signature(getattr(store_class, name)).parameters.values()
            shape = lambda ps: [(p.name, p.kind, p.default) for p in ps]  # noqa: E731
            assert shape(implemented) == shape(declared), f"{store_class.__name__}.{name}"
            assert inspect.iscoroutinefunction(getattr(store_class, name)) == inspect.iscoroutinefunction(member)


@pytest.mark.backends(*SERVICE_BACKENDS)
async def test_migrate_is_idempotent_and_matches_schema(store: Store, store_backend: Backend) -> None:
    """SQL's alone: the in-memory store has no schema to migrate."""
    assert isinstance(store, SqlEventStore) and store_backend.url is not None
    await migrate(store_backend.url)  # the fixture already migrated once
    await migrate(store_backend.url)
    async with store.engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
        diff = await conn.run_sync(
            lambda sync: compare_metadata(
                MigrationContext.configure(
                    sync,
                    opts={"compare_type": True, "include_name": _our_name, "include_object": _ours},
                ),
                # A list, as autogenerate's target_metadata takes; the annotation names one MetaData.
                cast(MetaData, [metadata, knowledge_metadata, deletions_metadata, presets_metadata]),
            )
        )
        knowledge_diff = await conn.run_sync(
            lambda sync: compare_metadata(
                MigrationContext.configure(
                    sync,
                    opts={
                        "compare_type": True,
                        "include_name": lambda name, type_, _parents: type_ != "table" or name in KNOWLEDGE_TABLES,
                        "include_object": lambda obj, name, type_, _r, _c: (
                            (name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)) in KNOWLEDGE_TABLES
                        ),
                    },
                ),
                knowledge_metadata,
            )
        )
    assert version == [(HEAD,)]
    assert diff == []
    assert knowledge_diff == []


async def test_sqlite_memory_url_is_rejected() -> None:
    with pytest.raises(ValueError):
        await open_store("sqlite+aiosqlite:///:memory:")


async def test_sqlite_pragmas(tmp_path: Path) -> None:
    url, _ = _sqlite_url(tmp_path)
    await migrate(url)
    store = await open_store(url, synchronous="NORMAL")
    try:
        async with store.engine.connect() as conn:
            pragmas = {
                name: (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar() for name in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")
            }
        assert pragmas == {"journal_mode": "wal", "synchronous": 1, "busy_timeout": 5000, "foreign_keys": 1}
        assert (await store.get_turn("x")) is None
    finally:
        await store.close()
    default = await open_store(url)
    try:
        async with default.engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA synchronous")).scalar() == 2  # FULL
    finally:
        await default.close()


async def test_migrate_from_a_running_loop_without_alembic_ini(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no alembic.ini, no migrations/ here
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    await migrate(url)
    store = await open_store(url)
    try:
        async with store.engine.connect() as conn:
            count = (await conn.execute(select(func.count()).select_from(turns))).scalar()
        assert count == 0
    finally:
        await store.close()


async def test_concurrent_migrations_of_a_fresh_sqlite_file(tmp_path: Path) -> None:
    url, _ = _sqlite_url(tmp_path)
    await asyncio.gather(*(migrate(url) for _ in range(3)))
    store = await open_store(url)
    try:
        async with store.engine.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
        assert version == [(HEAD,)]
    finally:
        await store.close()


async def test_migration_0004_moves_the_postgres_id_sequence_past_old_ids(pg_url: str) -> None:
    """Before 0004 the store numbered PostgreSQL events itself (``max(id) + n``)
    and the ``events.id`` sequence never moved: after the upgrade, new events
    take ids past the old ones instead of colliding with id 1."""
    import asyncpg

    admin = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:  # the database as an earlier version left it, at revision 0003
        await admin.execute("UPDATE alembic_version SET version_num = '0003'")
        await admin.execute("DROP TABLE knowledge_files, knowledge, file_chunks, files, memories")  # 0005's
        await admin.execute("DROP INDEX vector_items_metadata")  # 0006's
        await admin.execute("ALTER TABLE vector_collections DROP COLUMN version")
        await admin.execute("ALTER TABLE events DROP COLUMN hash")  # 0007's
        await admin.execute("DROP TABLE response_deletions")  # 0008's
        await admin.execute("ALTER TABLE api_keys DROP COLUMN role")  # 0009's
        await admin.execute("DROP TABLE presets")  # 0010's (and knowledge.shared, dropped with knowledge)
        await admin.execute(  # 0011's (its triggers go with its functions)
            "DROP INDEX ix_turns_user_status_created; DROP TABLE turn_texts;"
            " DROP FUNCTION turn_texts_on_event, turn_texts_on_view, turn_texts_doc, turn_search_prompt, turn_search_words CASCADE"
        )
        await admin.execute("DROP TABLE turn_forks; DROP FUNCTION turn_forks_on_event CASCADE")  # 0012's
        await admin.execute("DROP TRIGGER turns_usage_rollup ON turns")  # 0013's
        await admin.execute(
            "DROP FUNCTION turnlog_usage_rollup(), turnlog_turn_key(text), turnlog_view_tokens(jsonb, text), "
            "turnlog_view_calls(jsonb), turnlog_count(jsonb, text), turnlog_jsonb(text)"
        )
        await admin.execute("DROP TABLE usage_rollup, rate_counters, key_quotas")
        await admin.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), 1, false)")
        await admin.execute(
            "INSERT INTO events (id, turn_id, seq, type, at, data) SELECT n, 'old-turn', n, 'test.event', 0, '{}' FROM generate_series(1, 5) AS n"
        )
    finally:
        await admin.close()
    await migrate(pg_url)
    store = await open_store(pg_url)
    try:
        await start(store, "new-turn")
        await store.append([ev("new-turn", 2), ev("new-turn", 3)])
        assert [e.seq for e in await store.read("new-turn")] == [1, 2, 3]
        assert [e.seq for e in await store.read("old-turn")] == [1, 2, 3, 4, 5]
        async with store.engine.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
        assert version == HEAD
    finally:
        await store.close()


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
async def test_migration_0011_back_fills_turn_search(database: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Turns stored before the search existed are found after the upgrade, by
    the same words as new ones."""
    url = _sqlite_url(tmp_path)[0] if database == "sqlite" else request.getfixturevalue("pg_empty_database")()
    await migrate(url, "0009")
    store = await open_store(url)
    try:
        await start(store, "old-a", user_id="u", created_at=T0 + 1)
        await store.append([ev("old-a", 2, "assembly.completed", messages=[], new_messages=[{"role": "user", "content": "zebra question"}])])
        view: JsonObject = {"content": "an answer about okapis", "title": "Zebras"}
        await store.append([ev("old-a", 3, "turn.completed")], index=IndexUpdate(status="completed", view=view))
        await start(store, "old-c", user_id="u", created_at=T0 + 2)
        await store.append(
            [ev("old-c", 2, "assembly.completed", messages=[], new_messages=[{"role": "user", "content": [{"type": "text", "text": "zebra too"}]}])]
        )
        await store.append([ev("old-c", 3, "tool.started", call_id="k", name="n", arguments="{}")])
        await store.append([ev("old-c", 4, "tool.completed", call_id="k", name="n", output=None, status="failed")])
    finally:
        await store.close()
    await migrate(url)
    store = await open_store(url)
    try:
        assert [f.id for f in await find_turns(store, TurnQuery(user_id="u", terms=parse_query("zebra")))] == ["old-c", "old-a"]
        (a,) = await find_turns(store, TurnQuery(user_id="u", terms=parse_query("okapis")))
        assert (a.id, a.title, a.first_message) == ("old-a", "Zebras", "zebra question")
        assert [(f.id, f.tools, f.failed) for f in await find_turns(store, TurnQuery(user_id="u", tools=True))] == [("old-c", True, True)]
        # and the triggers index what comes after
        await store.append([ev("old-c", 5, "turn.completed")], index=IndexUpdate(status="completed", view={"content": "fresh okapis"}))
        assert [f.id for f in await find_turns(store, TurnQuery(user_id="u", terms=parse_query("okapis")))] == ["old-c", "old-a"]
    finally:
        await store.close()


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
async def test_migration_0012_back_fills_the_fork_index_and_its_trigger_keeps_it(database: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Forks stored before the index existed are found after the upgrade; a
    fork stored after it is found through the trigger; a fork of another user
    or of another turn is not."""
    url = _sqlite_url(tmp_path)[0] if database == "sqlite" else request.getfixturevalue("pg_empty_database")()
    await migrate(url, "0011")
    store = await open_store(url)

    async def fork(turn_id: str, parent: str, at: int, user_id: str = "u", created_at: float = T0) -> None:
        await store.start_turn(
            turn_record(turn_id, chat_id=f"chat-of-{turn_id}", user_id=user_id, created_at=created_at),
            [Event(turn_id=turn_id, seq=1, type="turn.forked", at=created_at, data={"parent_turn_id": parent, "at": at})],
            lease_seconds=30.0,
        )

    try:
        await start(store, "parent", user_id="u")
        await fork("old-fork", "parent", 7, created_at=T0 + 1)
        await fork("someone-elses", "parent", 7, user_id="v", created_at=T0 + 2)
        await start(store, "plain", user_id="u")
    finally:
        await store.close()
    await migrate(url)
    store = await open_store(url)
    try:
        assert [(f.turn_id, f.at) for f in await forks_of(store, "parent", "u")] == [("old-fork", 7)]
        await fork("new-fork", "parent", 3, created_at=T0 + 3)
        await fork("fork-of-fork", "new-fork", 2, created_at=T0 + 4)
        assert [(f.turn_id, f.at, f.status) for f in await forks_of(store, "parent", "u")] == [("old-fork", 7, "running"), ("new-fork", 3, "running")]
        assert [f.turn_id for f in await forks_of(store, "new-fork", "u")] == ["fork-of-fork"]
        assert [f.turn_id for f in await forks_of(store, "parent", "v")] == ["someone-elses"]
        assert await forks_of(store, "plain", "u") == []
    finally:
        await store.close()


async def test_the_memory_store_finds_forks_as_the_index_does() -> None:
    store = MemoryEventStore()
    for turn_id, parent, at, user, when in (("f1", "parent", 7, "u", T0 + 1), ("f2", "parent", 3, "u", T0 + 2), ("f3", "parent", 3, "v", T0 + 3)):
        forked = Event(turn_id=turn_id, seq=1, type="turn.forked", at=when, data={"parent_turn_id": parent, "at": at})
        await store.start_turn(turn_record(turn_id, chat_id=f"c-{turn_id}", user_id=user, created_at=when), [forked], lease_seconds=30.0)
    await start(store, "parent", user_id="u")
    try:
        assert [(f.turn_id, f.at) for f in await forks_of(store, "parent", "u")] == [("f1", 7), ("f2", 3)]
        assert await forks_of(store, "f1", "u") == []
    finally:
        await store.close()
