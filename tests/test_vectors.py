"""Contract of ``engine.vectors.VectorStore``, run against every adapter.

* ``sqlite``: ``adapters.vectors.sqlite`` on a migrated temp file;
* ``postgres``: ``adapters.vectors.pgvector`` on a fresh migrated database
  (``tests.pg.pg_url``: PostgreSQL 18 + pgvector; skipped without one).

Plus PostgreSQL specifics: the per-dimension HNSW index exists and serves
the query (sequential scans off), and a selective filter still yields ``k``
hits in exact order (iterative index scans).
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from array import array
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from adapters.store import migrate
from adapters.vectors import PgVectorStore, SqliteVectorStore, open_vector_store
from engine.json_types import JsonObject
from engine.vectors import DimensionMismatch, VectorHit, VectorItem, VectorStore


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'turnlog.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    await migrate(url)
    return url


@pytest.fixture
async def vectors(db_url: str) -> AsyncIterator[Any]:
    store = await open_vector_store(db_url)
    yield store
    await store.close()


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def brute_force(items: list[VectorItem], q: list[float], k: int, filter: dict[str, Any] | None = None) -> list[str]:
    keep = [i for i in items if not filter or all(i.metadata.get(f) == v for f, v in filter.items())]
    return [i.id for i in sorted(keep, key=lambda i: -cosine(i.vector, q))[:k]]


def random_items(n: int, dim: int, seed: int = 1, **meta: Any) -> list[VectorItem]:
    rnd = random.Random(seed)
    return [
        VectorItem(
            id=f"i{j:04d}",
            vector=[rnd.gauss(0, 1) for _ in range(dim)],
            text=f"item {j}",
            metadata={"mod7": j % 7, "even": j % 2 == 0, **meta},
        )
        for j in range(n)
    ]


def ids(hits: list[VectorHit]) -> list[str]:
    return [h.id for h in hits]


async def test_query_orders_by_cosine_and_honours_k(vectors: VectorStore) -> None:
    items = [
        VectorItem("east", [1.0, 0.0, 0.0], "East ✓", {"lang": "en"}),
        VectorItem("north-east", [1.0, 1.0, 0.0], "NE", {"lang": "en"}),
        VectorItem("north", [0.0, 3.0, 0.0], "N", {"lang": "de"}),
        VectorItem("west", [-2.0, 0.0, 0.0], "W", {"lang": "fr", "nested": {"a": [1, 2]}}),
        VectorItem("up", [0.1, 0.2, 5.0], "U", {}),
    ]
    await vectors.upsert("docs", items)
    q = [0.9, 0.1, 0.0]
    hits = await vectors.query("docs", q, k=10)
    assert ids(hits) == ["east", "north-east", "north", "up", "west"]
    for hit in hits:
        item = next(i for i in items if i.id == hit.id)
        assert hit.score == pytest.approx(cosine(item.vector, q), abs=1e-5)
        assert (hit.text, hit.metadata) == (item.text, item.metadata)
    assert hits[-1].score == pytest.approx(-cosine([2.0, 0.0, 0.0], q), abs=1e-5)  # opposite: < 0
    assert ids(await vectors.query("docs", q, k=2)) == ["east", "north-east"]
    assert await vectors.query("docs", q, k=0) == []
    # Length does not matter, direction does.
    assert (await vectors.query("docs", [0.0, 100.0, 0.0], k=1))[0].id == "north"


async def test_filter_by_metadata_equality(vectors: VectorStore) -> None:
    items = random_items(60, 8)
    await vectors.upsert("c", items)
    q = items[0].vector
    filters: list[JsonObject] = [{"mod7": 3}, {"even": True}, {"mod7": 2, "even": False}]
    for flt in filters:
        got = await vectors.query("c", q, k=5, filter=flt)
        assert ids(got) == brute_force(items, q, 5, flt)
        assert all(all(h.metadata[f] == v for f, v in flt.items()) for h in got)
    assert await vectors.query("c", q, k=5, filter={"mod7": 99}) == []
    assert await vectors.query("c", q, k=5, filter={"missing": 1}) == []
    # JSON equality: true is not 1, 3 is 3.0, nested values compare whole.
    await vectors.upsert(
        "j",
        [
            VectorItem("t", [1.0, 0.0], "", {"v": True, "n": {"a": [1, "x"]}}),
            VectorItem("one", [0.0, 1.0], "", {"v": 1, "n": {"a": [1]}}),
        ],
    )
    assert ids(await vectors.query("j", [1.0, 1.0], k=5, filter={"v": True})) == ["t"]
    assert ids(await vectors.query("j", [1.0, 1.0], k=5, filter={"v": 1.0})) == ["one"]
    assert ids(await vectors.query("j", [1.0, 1.0], k=5, filter={"n": {"a": [1, "x"]}})) == ["t"]


async def test_upsert_replaces_and_delete_removes(vectors: VectorStore) -> None:
    await vectors.upsert("c", [VectorItem("a", [1.0, 0.0], "old", {"v": 1}), VectorItem("b", [0.0, 1.0])])
    await vectors.upsert("c", [VectorItem("a", [0.0, -1.0], "new", {"v": 2})])
    hits = await vectors.query("c", [0.0, 1.0], k=5)
    assert ids(hits) == ["b", "a"]
    assert (hits[1].text, hits[1].metadata) == ("new", {"v": 2})
    assert hits[1].score == pytest.approx(-1.0, abs=1e-6)
    # The same id twice in one upsert: the last one wins.
    await vectors.upsert("c", [VectorItem("d", [1.0, 1.0], "first"), VectorItem("d", [1.0, 1.0], "second")])
    assert [h.text for h in await vectors.query("c", [1.0, 1.0], k=1)] == ["second"]
    await vectors.delete("c", ["a", "d", "nonexistent"])
    assert ids(await vectors.query("c", [0.0, 1.0], k=5)) == ["b"]
    await vectors.delete("c", [])
    await vectors.delete("no-such-collection", ["b"])
    assert ids(await vectors.query("c", [0.0, 1.0], k=5)) == ["b"]


async def test_collections_are_isolated(vectors: VectorStore) -> None:
    await vectors.upsert("one", [VectorItem("x", [1.0, 0.0], "in one"), VectorItem("y", [0.0, 1.0], "y")])
    await vectors.upsert("two", [VectorItem("x", [0.0, 1.0], "in two", {"c": 2})])
    assert [(h.id, h.text) for h in await vectors.query("two", [1.0, 0.0], k=5)] == [("x", "in two")]
    assert [h.text for h in await vectors.query("one", [1.0, 0.0], k=5)] == ["in one", "y"]
    await vectors.delete("two", ["x"])
    assert await vectors.query("two", [1.0, 0.0], k=5) == []
    assert len(await vectors.query("one", [1.0, 0.0], k=5)) == 2
    assert await vectors.query("never-created", [1.0, 0.0], k=5) == []


async def test_dimension_mismatch(vectors: VectorStore) -> None:
    await vectors.upsert("c", [VectorItem("a", [1.0, 2.0, 3.0])])
    with pytest.raises(DimensionMismatch):
        await vectors.upsert("c", [VectorItem("b", [1.0, 2.0])])
    with pytest.raises(DimensionMismatch):
        await vectors.query("c", [1.0, 2.0], k=1)
    with pytest.raises(DimensionMismatch):  # one upsert, two dimensions
        await vectors.upsert("d", [VectorItem("a", [1.0, 2.0]), VectorItem("b", [1.0, 2.0, 3.0])])
    assert isinstance(DimensionMismatch("x"), ValueError)
    # Nothing of the failed upserts was written; another collection may use 2.
    assert ids(await vectors.query("c", [1.0, 2.0, 3.0], k=5)) == ["a"]
    await vectors.upsert("e", [VectorItem("b", [1.0, 2.0])])
    assert ids(await vectors.query("e", [1.0, 2.0], k=5)) == ["b"]


async def test_invalid_vectors_are_rejected(vectors: VectorStore) -> None:
    for bad in ([0.0, 0.0], [1.0, float("nan")], [float("inf"), 1.0], []):
        with pytest.raises(ValueError):
            await vectors.upsert("c", [VectorItem("a", bad)])
    await vectors.upsert("c", [VectorItem("a", [1.0, 1.0])])
    with pytest.raises(ValueError):
        await vectors.query("c", [0.0, 0.0], k=1)


@pytest.mark.parametrize("dim", [1536, 3072, 4100])
async def test_high_dimensions(vectors: VectorStore, dim: int) -> None:
    """pgvector: HNSW on vector(dim) up to 2000, on halfvec up to 4000, exact above."""
    items = random_items(12, dim, seed=dim)
    await vectors.upsert(f"d{dim}", items)
    q = items[3].vector
    hits = await vectors.query(f"d{dim}", q, k=4)
    assert ids(hits) == brute_force(items, q, 4)
    assert hits[0].score == pytest.approx(1.0, abs=1e-3)


# ------------------------------------------------------------ PostgreSQL only


async def test_pgvector_hnsw_index_serves_filtered_queries(pg_url: str) -> None:
    # Only the HNSW index can give the order here: no sequential or bitmap
    # scans, no sorts. (With its statistics the planner may prefer the primary
    # key on (collection, id) plus a sort for a small collection: exact, and
    # the right choice; here we want to see the index work.)
    no_sort = {"enable_seqscan": "off", "enable_bitmapscan": "off", "enable_sort": "off"}
    store = PgVectorStore.open(pg_url, connect_args={"server_settings": no_sort})
    try:
        items = random_items(400, 16, seed=7)
        await store.upsert("big", items)
        await store.upsert("other", random_items(50, 16, seed=8))
        async with store.engine.connect() as conn:
            indexdef = (await conn.execute(text("SELECT indexdef FROM pg_indexes WHERE indexname = 'vector_items_hnsw_16'"))).scalar_one()
            assert "hnsw" in indexdef and "vector_cosine_ops" in indexdef and "vector(16)" in indexdef
            plan = "\n".join(
                row[0]
                for row in await conn.execute(
                    text(
                        "EXPLAIN SELECT id FROM vector_items WHERE dim = 16 AND collection = 'big' "
                        "ORDER BY (embedding::vector(16)) <=> CAST(:q AS vector(16)) LIMIT 5"
                    ),
                    {"q": items[0].vector},  # the store's connections send vectors in binary
                )
            )
            assert "vector_items_hnsw_16" in plan
        # A selective filter (1 row in 14 of the collection, which is most of
        # the table) still gives k hits, best first: iterative index scans.
        q = items[5].vector
        flt = {"mod7": 4, "even": True}
        seen: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if "ORDER BY" in statement:
                seen.append((statement, params))

        event.listen(store.engine.sync_engine, "before_cursor_execute", capture)
        got = await store.query("big", q, k=10, filter=flt)
        event.remove(store.engine.sync_engine, "before_cursor_execute", capture)
        assert ids(got) == brute_force(items, q, 10, flt)
        assert len(got) == 10
        # ...and that query of the adapter is the one the index serves.
        [(statement, params)] = seen
        async with store.engine.connect() as conn:
            plan_lines = (await conn.exec_driver_sql("EXPLAIN " + statement, params)).scalars().all()
        assert "vector_items_hnsw_16" in "\n".join(plan_lines), plan_lines
        # k beyond hnsw.ef_search (40) still returns k.
        assert len(await store.query("big", q, k=120)) == 120
    finally:
        await store.close()


async def test_pgvector_selective_filter_reads_the_metadata_index(pg_url: str) -> None:
    """A filter on one file's chunks is answered from the GIN index on
    metadata (migration 0006), exactly, instead of walking the HNSW graph."""
    store = PgVectorStore.open(pg_url)
    try:
        rnd = random.Random(3)
        items = [VectorItem(f"c{j}", [rnd.gauss(0, 1) for _ in range(16)], "", {"file_id": f"f{j // 50}", "seq": j % 50}) for j in range(3000)]
        for start in range(0, len(items), 500):
            await store.upsert("kb", items[start : start + 500])
        async with store.engine.begin() as conn:
            await conn.execute(text("ANALYZE vector_items"))
        seen: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if "ORDER BY" in statement:
                seen.append((statement, params))

        event.listen(store.engine.sync_engine, "before_cursor_execute", capture)
        q = items[7].vector
        got = await store.query("kb", q, k=5, filter={"file_id": "f17"})
        event.remove(store.engine.sync_engine, "before_cursor_execute", capture)
        assert ids(got) == brute_force(items, q, 5, {"file_id": "f17"})
        [(statement, params)] = seen
        async with store.engine.connect() as conn:
            plan = "\n".join((await conn.exec_driver_sql("EXPLAIN " + statement, params)).scalars().all())
        assert "vector_items_metadata" in plan and "vector_items_hnsw_16" not in plan, plan
        # Containment alone would be wrong for nested values: equality stays exact.
        await store.upsert("n", [VectorItem("a", [1.0, 0.0], "", {"t": [1, 2]}), VectorItem("b", [0.0, 1.0], "", {"t": [1]})])
        assert ids(await store.query("n", [1.0, 1.0], k=5, filter={"t": [1]})) == ["b"]
    finally:
        await store.close()


async def test_pgvector_index_of_a_new_dimension_built_by_one_of_two_processes(pg_url: str) -> None:
    """Two stores (two processes' worth of connections) meeting a new
    dimension at the same moment: both see no index, both queue for the
    build; one builds it, the other finds it built, and both upserts land."""
    import asyncpg

    from adapters.vectors.pgvector import index_name

    name = index_name(24)
    admin = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://", 1))
    stores = [PgVectorStore.open(pg_url) for _ in range(2)]
    upserts: list[asyncio.Task[None]] = []
    try:
        # Hold the build lock, so that both stores get past their "is there an
        # index?" look before either can build.
        await admin.execute("BEGIN")
        await admin.execute("SELECT pg_advisory_xact_lock(hashtext($1))", name)
        upserts = [asyncio.create_task(store.upsert(f"c{i}", random_items(20, 24, seed=i))) for i, store in enumerate(stores)]
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        deadline = time.monotonic() + 20
        while await admin.fetchval(waiting) < 2:
            for task in upserts:
                if task.done():
                    task.result()  # an exception says why
                    raise AssertionError("an upsert finished while the build lock was held")
            assert time.monotonic() < deadline, "the stores never queued for the index build"
            await asyncio.sleep(0.02)
        await admin.execute("COMMIT")
        await asyncio.wait_for(asyncio.gather(*upserts), 30)
        assert await admin.fetchval("SELECT count(*) FROM pg_indexes WHERE indexname = $1", name) == 1
        for i, store in enumerate(stores):
            assert len(await store.query(f"c{1 - i}", random_items(1, 24, seed=9)[0].vector, k=5)) == 5
    finally:
        for task in upserts:
            task.cancel()
        await asyncio.gather(*upserts, return_exceptions=True)
        await admin.close()
        for store in stores:
            await store.close()


async def test_sqlite_adapter_type(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'v.db'}"
    await migrate(url)
    store = await open_vector_store(url)
    try:
        assert isinstance(store, SqliteVectorStore)
    finally:
        await store.close()


async def test_sqlite_migration_matches_vector_schema(tmp_path: Path) -> None:
    """Migration 0003 creates on SQLite exactly ``adapters.vectors.schema``."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from adapters.vectors.schema import TABLES, metadata

    url = f"sqlite+aiosqlite:///{tmp_path / 'v.db'}"
    await migrate(url)
    store = SqliteVectorStore.open(url)
    try:
        async with store.engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(
                        sync,
                        opts={
                            "compare_type": True,
                            "include_name": lambda name, type_, _: type_ != "table" or name in TABLES,
                        },
                    ),
                    metadata,
                )
            )
        assert diff == []
    finally:
        await store.close()


# ------------------------------------------------ a random history, against an oracle


async def test_random_upserts_deletes_and_filtered_queries_match_brute_force(vectors: VectorStore) -> None:
    """Upserts (new ids and replacements, metadata changing), deletes (the
    SQLite image fills holes with its last row) and filtered queries, checked
    after every step against exact search over what was written."""
    await _random_history_against_brute_force(vectors)


async def test_sqlite_worker_thread_path_matches_brute_force(tmp_path: Path) -> None:
    """The same on SQLite with every product sent to the worker thread (a
    size threshold otherwise keeps these small collections inline)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'v.db'}"
    await migrate(url)
    store = SqliteVectorStore.open(url, inline_work=0)
    try:
        await _random_history_against_brute_force(store)
    finally:
        await store.close()


async def _random_history_against_brute_force(vectors: VectorStore) -> None:
    rnd = random.Random(5)
    live: dict[str, VectorItem] = {}
    for step in range(40):
        op = rnd.random()
        if op < 0.55 or len(live) < 5:
            batch = []
            for _ in range(rnd.randint(1, 12)):
                id_ = f"i{rnd.randint(0, 60):02d}"
                meta: JsonObject = {"file_id": f"f{rnd.randint(0, 4)}", "n": rnd.choice([1, 2, 2.0, True])}
                if rnd.random() < 0.2:
                    del meta["n"]
                batch.append(VectorItem(id_, [rnd.gauss(0, 1) for _ in range(6)], f"text {id_} {step}", meta))
            await vectors.upsert("r", batch)
            live.update({item.id: item for item in batch})
        else:
            gone = rnd.sample(sorted(live), rnd.randint(1, min(8, len(live)))) + ["never-there"]
            await vectors.delete("r", gone)
            for id_ in gone:
                live.pop(id_, None)
        q = [rnd.gauss(0, 1) for _ in range(6)]
        some: list[JsonObject | None] = [None, {"file_id": f"f{rnd.randint(0, 4)}"}, {"n": 2}, {"n": True, "file_id": "f1"}]
        for flt in some:
            got = await vectors.query("r", q, k=4, filter=flt)
            # JSON equality (2 == 2.0, but true != 1), not Python's ==.
            keep = [i for i in live.values() if not flt or all(f in i.metadata and _json_eq(i.metadata[f], v) for f, v in flt.items())]
            assert ids(got) == brute_force(keep, q, 4), (step, flt)
            for hit in got:
                item = live[hit.id]
                assert (hit.text, hit.metadata) == (item.text, item.metadata)
                assert hit.score == pytest.approx(cosine(item.vector, q), abs=1e-5)


def _json_eq(a: Any, b: Any) -> bool:
    from adapters.vectors.common import json_equal

    return json_equal(a, b)


# ------------------------------------------------------------------ SQLite only


async def test_sqlite_stores_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    """Two stores (or processes) on one file: each keeps collections in memory,
    and a query notices (the collection's version) that the other wrote."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'v.db'}"
    await migrate(url)
    a, b = SqliteVectorStore.open(url), SqliteVectorStore.open(url)
    try:
        await a.upsert("c", [VectorItem("x", [1.0, 0.0], "x", {"f": 1}), VectorItem("y", [0.0, 1.0], "y", {"f": 2})])
        assert ids(await a.query("c", [1.0, 0.1], k=5, filter={"f": 1})) == ["x"]  # a loads its image
        assert ids(await b.query("c", [1.0, 0.1], k=5)) == ["x", "y"]  # so does b
        await b.upsert("c", [VectorItem("z", [1.0, 0.05], "z", {"f": 1}), VectorItem("x", [-1.0, 0.0], "x2", {"f": 2})])
        await b.delete("c", ["y"])
        hits = await a.query("c", [1.0, 0.1], k=5)
        assert [(h.id, h.text) for h in hits] == [("z", "z"), ("x", "x2")]
        assert ids(await a.query("c", [1.0, 0.1], k=5, filter={"f": 1})) == ["z"]
        # a's own writes go to its image directly; b still notices them.
        await a.delete("c", ["z"])
        assert ids(await b.query("c", [1.0, 0.1], k=5)) == ["x"]
        assert ids(await a.query("c", [1.0, 0.1], k=5, filter={"f": 2})) == ["x"]
        # b writes, then a writes before querying: a's image missed b's write,
        # so a's write must not just be applied to it.
        await b.upsert("c", [VectorItem("w", [0.0, 1.0], "w", {"f": 2})])
        await a.upsert("c", [VectorItem("v", [0.1, 1.0], "v", {"f": 2})])
        assert ids(await a.query("c", [0.0, 1.0], k=5, filter={"f": 2})) == ["w", "v", "x"]
    finally:
        await a.close()
        await b.close()


async def test_sqlite_reads_float64_rows_of_the_previous_format(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'v.db'}"
    await migrate(url)
    store = SqliteVectorStore.open(url)
    try:
        await store.upsert("c", [VectorItem("new", [0.0, 1.0], "n")])
        old = array("d", [0.6, 0.8])  # a unit vector as the store used to write it
        if sys.byteorder != "little":  # pragma: no cover
            old.byteswap()
        async with store.engine.begin() as conn:
            await conn.execute(text("INSERT INTO vector_items VALUES ('c', 'old', 2, :e, 'o', '{}')"), {"e": old.tobytes()})
            await conn.execute(text("UPDATE vector_collections SET version = version + 1"))
        hits = await store.query("c", [3.0, 4.0], k=2)
        assert ids(hits) == ["old", "new"] and hits[0].score == pytest.approx(1.0, abs=1e-6)
    finally:
        await store.close()


async def test_sqlite_queries_during_writes(tmp_path: Path) -> None:
    """Queries in worker threads while the same collection is written: every
    answer is one of the collection's states, and the last one is exact."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'v.db'}"
    await migrate(url)
    store = SqliteVectorStore.open(url, inline_work=0)
    try:
        items = random_items(300, 16, seed=3)
        await store.upsert("c", items[:100])
        q = items[150].vector

        async def writer() -> None:
            for start in range(100, 300, 20):
                await store.upsert("c", items[start : start + 20])
                await store.delete("c", [items[start - 100].id])

        async def reader() -> None:
            for _ in range(30):
                hits = await store.query("c", q, k=3, filter={"even": True})
                assert len(hits) == 3 and all(h.metadata["even"] for h in hits)

        await asyncio.gather(writer(), reader(), reader())
        deleted = {items[s - 100].id for s in range(100, 300, 20)}
        live = [i for i in items if i.id not in deleted]
        assert ids(await store.query("c", q, k=5, filter={"even": True})) == brute_force(live, q, 5, {"even": True})
        assert ids(await store.query("c", q, k=5)) == brute_force(live, q, 5)
    finally:
        await store.close()
