"""The knowledge tables (``adapters.knowledge.schema``) on SQLAlchemy Core.

One async engine on the service's database (SQLite or PostgreSQL). On SQLite
writes begin with ``BEGIN IMMEDIATE`` (the write lock up front, waiting on
``busy_timeout`` like the event store's writer that shares the file) and
single-statement reads run outside a transaction.

Every read that a user's request makes carries the user id in its WHERE:
someone else's file or collection is not found, exactly like a missing one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, func, insert, or_, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from adapters.knowledge.chunking import Chunk
from adapters.knowledge.schema import file_chunks, files, knowledge, knowledge_files
from adapters.store.sqlite import SQLITE_BEGIN

PROCESSING, READY, FAILED = "processing", "ready", "failed"

#: Rows per INSERT of chunks (PostgreSQL's and SQLite's parameter limits).
_CHUNK_ROWS = 2000


@dataclass(frozen=True)
class FileRecord:
    id: str
    user_id: str
    filename: str
    content_type: str
    bytes: int
    blob_id: str
    status: str
    error: str | None
    chars: int | None
    chunks: int | None
    tokens: int | None
    embedding_model: str | None
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, row: RowMapping) -> FileRecord:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})

    def public(self) -> dict[str, Any]:
        """The ``file`` object of the HTTP API."""
        return {
            "id": self.id,
            "object": "file",
            "filename": self.filename,
            "bytes": self.bytes,
            "content_type": self.content_type,
            "status": self.status,
            "error": self.error,
            "chars": self.chars,
            "chunks": self.chunks if self.status == READY else None,
            "tokens": self.tokens,
            "embedding_model": self.embedding_model if self.status == READY else None,
            "created_at": int(self.created_at),
            "updated_at": int(self.updated_at),
        }


@dataclass(frozen=True)
class CollectionRecord:
    id: str
    user_id: str
    name: str
    description: str
    created_at: float
    updated_at: float
    shared: bool = False  # readable by every user (an admin created it so)

    @classmethod
    def of(cls, row: RowMapping) -> CollectionRecord:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


class KnowledgeTables:
    """Reads and writes of files, chunks and collections."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self._write = engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._read = engine.execution_options(**{SQLITE_BEGIN: None})
        self.clock = clock

    async def close(self) -> None:
        await self.engine.dispose()

    # ------------------------------------------------------------------ files

    async def insert_file(self, record: FileRecord) -> None:
        async with self._write.begin() as conn:
            await conn.execute(insert(files).values(**record.__dict__))

    async def get_file(self, file_id: str, user_id: str | None) -> FileRecord | None:
        """The file, if it exists and (with ``user_id``) is that user's."""
        stmt = select(files).where(files.c.id == file_id)
        if user_id is not None:
            stmt = stmt.where(files.c.user_id == user_id)
        async with self._read.connect() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return FileRecord.of(row) if row else None

    async def list_files(self, user_id: str) -> list[FileRecord]:
        stmt = select(files).where(files.c.user_id == user_id).order_by(files.c.created_at.desc(), files.c.id)
        async with self._read.connect() as conn:
            return [FileRecord.of(r) for r in (await conn.execute(stmt)).mappings()]

    async def files_of(self, user_id: str, file_ids: Iterable[str]) -> dict[str, FileRecord]:
        ids = sorted(set(file_ids))
        if not ids:
            return {}
        stmt = select(files).where(files.c.user_id == user_id, files.c.id.in_(ids))
        async with self._read.connect() as conn:
            return {r["id"]: FileRecord.of(r) for r in (await conn.execute(stmt)).mappings()}

    async def processing_ids(self) -> list[str]:
        """Every file left ``processing`` (by any user), oldest first."""
        stmt = select(files.c.id).where(files.c.status == PROCESSING).order_by(files.c.created_at)
        async with self._read.connect() as conn:
            return list((await conn.execute(stmt)).scalars())

    async def plan(self, file_id: str, chunks: int, tokens: int, chars: int, embedding_model: str | None) -> bool:
        """Record, before any vector is written, how many chunks (hence vector
        ids) and which model a processing file will have: a deletion after a
        crash then knows which vectors to remove. False if the file is gone."""
        async with self._write.begin() as conn:
            result = await conn.execute(
                update(files)
                .where(files.c.id == file_id, files.c.status == PROCESSING)
                .values(chunks=chunks, tokens=tokens, chars=chars, embedding_model=embedding_model, updated_at=self.clock())
            )
        return result.rowcount == 1

    async def finish_ready(self, file_id: str, chunks: Sequence[Chunk]) -> bool:
        """The chunks and the ``ready`` status, in one transaction; False (and
        nothing written) if the file was deleted or finished meanwhile."""
        async with self._write.begin() as conn:
            result = await conn.execute(
                update(files).where(files.c.id == file_id, files.c.status == PROCESSING).values(status=READY, error=None, updated_at=self.clock())
            )
            if result.rowcount != 1:
                return False  # nothing was written
            # A resumed ingestion may follow one that got this far in another process.
            await conn.execute(delete(file_chunks).where(file_chunks.c.file_id == file_id))
            for i in range(0, len(chunks), _CHUNK_ROWS):
                await conn.execute(
                    insert(file_chunks),
                    [{"file_id": file_id, "seq": c.seq, "text": c.text, "tokens": c.tokens, "start": c.start} for c in chunks[i : i + _CHUNK_ROWS]],
                )
        return True

    async def finish_failed(self, file_id: str, error: str) -> bool:
        async with self._write.begin() as conn:
            result = await conn.execute(
                update(files).where(files.c.id == file_id, files.c.status == PROCESSING).values(status=FAILED, error=error, updated_at=self.clock())
            )
        return result.rowcount == 1

    async def delete_file(self, file_id: str, user_id: str) -> FileRecord | None:
        """Delete the user's file, its chunks and its collection entries
        (cascades); the deleted record, or None if there was none."""
        async with self._write.begin() as conn:
            row = (await conn.execute(select(files).where(files.c.id == file_id, files.c.user_id == user_id))).mappings().first()
            if row is None:
                return None
            # Explicit, not only ON DELETE CASCADE: a connection without
            # foreign-key enforcement must not leave chunks behind.
            await conn.execute(delete(file_chunks).where(file_chunks.c.file_id == file_id))
            await conn.execute(delete(knowledge_files).where(knowledge_files.c.file_id == file_id))
            await conn.execute(delete(files).where(files.c.id == file_id))
        return FileRecord.of(row)

    # ----------------------------------------------------------------- chunks

    async def chunk_count(self, file_id: str) -> int:
        async with self._read.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(file_chunks).where(file_chunks.c.file_id == file_id))).scalar_one())

    async def all_chunks(self, file_ids: Sequence[str]) -> tuple[list[tuple[str, int]], list[str]]:
        """``(keys, texts)`` of every chunk of the files, ``keys[i] = (file_id, seq)``."""
        keys: list[tuple[str, int]] = []
        texts: list[str] = []
        ids = sorted(set(file_ids))
        async with self._read.connect() as conn:
            for i in range(0, len(ids), 500):
                stmt = (
                    select(file_chunks.c.file_id, file_chunks.c.seq, file_chunks.c.text)
                    .where(file_chunks.c.file_id.in_(ids[i : i + 500]))
                    .order_by(file_chunks.c.file_id, file_chunks.c.seq)
                )
                result = await conn.stream(stmt)
                async for part in result.partitions(5000):
                    for file_id, seq, text in part:
                        keys.append((file_id, seq))
                        texts.append(text)
        return keys, texts

    async def chunk_texts(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
        if not keys:
            return {}
        by_file: dict[str, list[int]] = {}
        for file_id, seq in keys:
            by_file.setdefault(file_id, []).append(seq)
        # Per file ``file_id = ? AND seq IN (...)``, OR-ed: each an index range
        # of the primary key (a row-value ``IN`` makes SQLite scan the table).
        stmt = select(file_chunks.c.file_id, file_chunks.c.seq, file_chunks.c.text).where(
            or_(*(and_(file_chunks.c.file_id == f, file_chunks.c.seq.in_(seqs)) for f, seqs in by_file.items()))
        )
        async with self._read.connect() as conn:
            return {(f, s): t for f, s, t in (await conn.execute(stmt))}

    async def document(self, file_id: str) -> list[tuple[int, str]]:
        """``(start, text)`` of the file's chunks in order (for the whole text)."""
        stmt = select(file_chunks.c.start, file_chunks.c.text).where(file_chunks.c.file_id == file_id).order_by(file_chunks.c.seq)
        async with self._read.connect() as conn:
            return [(s, t) for s, t in (await conn.execute(stmt))]

    # ------------------------------------------------------------ collections

    async def insert_collection(self, record: CollectionRecord) -> None:
        async with self._write.begin() as conn:
            await conn.execute(insert(knowledge).values(**record.__dict__))

    async def get_collection(self, collection_id: str, user_id: str, *, shared: bool = False) -> CollectionRecord | None:
        """The user's collection; with ``shared``, a shared one too (to read, never to change)."""
        stmt = select(knowledge).where(knowledge.c.id == collection_id, _readable(user_id, shared))
        async with self._read.connect() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return CollectionRecord.of(row) if row else None

    async def is_shared(self, collection_id: str) -> bool:
        stmt = select(knowledge.c.id).where(knowledge.c.id == collection_id, knowledge.c.shared.is_(True))
        async with self._read.connect() as conn:
            return (await conn.execute(stmt)).first() is not None

    async def list_collections(self, user_id: str) -> list[CollectionRecord]:
        """The user's collections and the shared ones."""
        stmt = select(knowledge).where(_readable(user_id, True)).order_by(knowledge.c.created_at.desc(), knowledge.c.id)
        async with self._read.connect() as conn:
            return [CollectionRecord.of(r) for r in (await conn.execute(stmt)).mappings()]

    async def collection_files(self, user_id: str, collection_ids: Iterable[str]) -> dict[str, list[FileRecord]]:
        """The files of each of the user's collections and of the shared ones (in the order they were added)."""
        ids = sorted(set(collection_ids))
        out: dict[str, list[FileRecord]] = {}
        if not ids:
            return out
        stmt = (
            select(knowledge_files.c.knowledge_id, files)
            .join(files, files.c.id == knowledge_files.c.file_id)
            .join(knowledge, knowledge.c.id == knowledge_files.c.knowledge_id)
            .where(_readable(user_id, True), knowledge_files.c.knowledge_id.in_(ids))
            .order_by(knowledge_files.c.added_at, files.c.id)
        )
        async with self._read.connect() as conn:
            for row in (await conn.execute(stmt)).mappings():
                out.setdefault(row["knowledge_id"], []).append(FileRecord.of(row))
        return out

    async def add_to_collection(self, collection_id: str, file_id: str) -> bool:
        """Add (idempotent); False if the file is already in it."""
        async with self._write.begin() as conn:
            exists = (
                await conn.execute(
                    select(knowledge_files.c.file_id).where(knowledge_files.c.knowledge_id == collection_id, knowledge_files.c.file_id == file_id)
                )
            ).first()
            if exists:
                return False
            now = self.clock()
            await conn.execute(insert(knowledge_files).values(knowledge_id=collection_id, file_id=file_id, added_at=now))
            await conn.execute(update(knowledge).where(knowledge.c.id == collection_id).values(updated_at=now))
        return True

    async def remove_from_collection(self, collection_id: str, file_id: str) -> bool:
        async with self._write.begin() as conn:
            result = await conn.execute(delete(knowledge_files).where(knowledge_files.c.knowledge_id == collection_id, knowledge_files.c.file_id == file_id))
            if result.rowcount:
                await conn.execute(update(knowledge).where(knowledge.c.id == collection_id).values(updated_at=self.clock()))
        return bool(result.rowcount)

    async def delete_collection(self, collection_id: str, user_id: str) -> bool:
        """The collection (not its files: they stay the user's)."""
        async with self._write.begin() as conn:
            owned = (await conn.execute(select(knowledge.c.id).where(knowledge.c.id == collection_id, knowledge.c.user_id == user_id))).first()
            if owned is None:
                return False
            await conn.execute(delete(knowledge_files).where(knowledge_files.c.knowledge_id == collection_id))
            await conn.execute(delete(knowledge).where(knowledge.c.id == collection_id))
        return True


def _readable(user_id: str, shared: bool) -> ColumnElement[bool]:
    """The collections a user may read: their own, and with ``shared`` the shared ones."""
    own = knowledge.c.user_id == user_id
    return or_(own, knowledge.c.shared.is_(True)) if shared else own
