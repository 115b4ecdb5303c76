"""The requests of a group commit and what a batch of them decides, whatever the driver.

The two writers (``sqlite_writer`` on the ``sqlite3`` connection,
``postgres_writer`` on the asyncpg connection) write the same requests with
their own statements; the decisions must not differ. Those live here:
which appends still hold their lease, whether a run may be written in one
go, the one chat row a run of starts leaves behind, and the chain's links
(:class:`BatchWriter`: the turns' heads a batch moves on, and the fencing
tokens whose appends failed).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Sequence
from typing import Any

from adapters.store.common import Head, after_failure, stale_token
from adapters.store.group_commit import Request, Results
from engine.ports import ConcurrencyError


class Append(Request):
    """``append``: event rows of one turn (or several, without fencing), and
    the turn's index row (``i_*`` parameters) to update with them."""

    __slots__ = ("rows", "turn_id", "fencing", "index", "events")

    def __init__(self, rows: list[tuple[Any, ...]], turn_id: str | None, fencing: int | None, index: dict[str, Any] | None) -> None:
        super().__init__()
        self.rows = rows
        self.turn_id = turn_id
        self.fencing = fencing
        self.index = index
        self.events = len(rows)


class Start(Request):
    """``start_turn``: its turn row (``t_*``), chat (``c_*``) and first events."""

    __slots__ = ("rows", "chat", "turn", "events")

    def __init__(self, rows: list[tuple[Any, ...]], chat: dict[str, Any], turn: dict[str, Any]) -> None:
        super().__init__()
        self.rows = rows
        self.chat = chat
        self.turn = turn
        self.events = len(rows)


class Release(Request):
    """``release_turn``: ``(turn_id, owner)``."""

    __slots__ = ("turn_id", "owner")

    def __init__(self, turn_id: str, owner: str) -> None:
        super().__init__()
        self.turn_id = turn_id
        self.owner = owner


class Write(Request):
    """Any other write, alone in its savepoint: ``op`` names its statement in
    the writer's ``STATEMENTS`` (a list argument is an array: JSON text on
    SQLite); ``claim`` answers the fencing token it returned, or None."""

    __slots__ = ("op", "args")

    def __init__(self, op: str, *args: Any) -> None:
        super().__init__()
        self.op = op
        self.args = args


def runs(batch: Sequence[Request]) -> Iterator[tuple[type, int, int]]:
    """``(kind, start, end)``: the batch cut into runs of one kind of request,
    each :class:`Write` a run of its own."""
    i, n = 0, len(batch)
    while i < n:
        kind = type(batch[i])
        j = i + 1
        if kind is not Write:
            while j < n and type(batch[j]) is kind:
                j += 1
        yield kind, i, j
        i = j


class BatchWriter:
    """What both writers keep between batches: the chain's heads, and the
    fencing tokens whose appends failed."""

    def __init__(self, stats: dict[str, int]) -> None:
        #: The store's counters (``chain_reads``: previous hashes read back).
        self.stats = stats
        # turn -> (seq, hash) of its last event this writer linked and
        # committed: the next append's previous link without a read. A batch's
        # links go into ``linked`` and reach ``heads`` once it is committed.
        self.heads: dict[str, Head] = {}
        self.linked: dict[str, Head] = {}
        # Turns released in this batch (ended, or waiting for a decision):
        # their heads go once it commits. Kept, they were the Python objects a
        # waiting turn left behind (~0.2 KB each, by tracemalloc). A turn
        # appended to again reads its head back once.
        self.released: list[str] = []
        # (turn_id, fencing) of appends that failed: later appends with the same
        # token are refused, so a failed write can never leave a gap in a
        # turn's seqs behind a later successful one. The owner stops (LeaseLost)
        # and the turn is resumed under a new token, after the durable events.
        self.poisoned: set[tuple[str | None, int]] = set()

    def poison(self, req: Append) -> None:
        if req.fencing is not None:
            self.poisoned.add((req.turn_id, req.fencing))

    def failed(self, batch: Sequence[Request]) -> None:
        """The batch's transaction failed: nothing of it is stored, and its
        turns' later appends are refused (before the next batch is taken)."""
        self.linked = {}
        self.released = []
        for req in batch:
            if type(req) is Append:
                self.poison(req)

    def forget(self, reqs: Sequence[Release]) -> None:
        """Drop the released turns' heads once this batch commits."""
        self.released.extend(req.turn_id for req in reqs)

    def committed(self) -> None:
        """The batch committed: its links are the turns' heads now, less
        those of the turns it released."""
        if self.linked:
            if len(self.heads) > 20_000:  # turns long finished: read again if ever appended to
                self.heads.clear()
            self.heads.update(self.linked)
            self.linked = {}
        if self.released:
            for turn_id in self.released:
                self.heads.pop(turn_id, None)
            self.released = []

    def refused_again(self, req: Append, i: int, results: Results) -> bool:
        """An earlier append of the run with ``req``'s token failed: refuse it."""
        if (req.turn_id, req.fencing) in self.poisoned:
            results[i] = (False, after_failure(req.turn_id, req.fencing))
            return True
        return False

    def to_read(self, rows: Sequence[Sequence[Any]], trial: dict[str, Head]) -> list[tuple[str, int]]:
        """The ``(turn_id, seq)`` of ``rows`` whose previous hash the chain must
        read: no head at ``seq - 1`` in ``trial``, this batch's or the
        committed links (as ``common.link_rows`` decides)."""
        need: list[tuple[str, int]] = []
        last: dict[str, int] = {}
        for row in rows:
            turn_id, seq = row[0], row[1]
            if row[5] is None:  # the chain is off
                continue
            before = last.get(turn_id)
            if before is None:
                head = trial.get(turn_id) or self.linked.get(turn_id) or self.heads.get(turn_id)
                before = None if head is None else head[0]
            if seq > 1 and before != seq - 1:
                need.append((turn_id, seq))
            last[turn_id] = seq
        self.stats["chain_reads"] += len(need)
        return need


def fenced_turns(batch: Sequence[Any], start: int, end: int) -> set[str]:
    """The turns of ``batch[start:end]`` whose appends present a fencing token."""
    return {batch[i].turn_id for i in range(start, end) if batch[i].fencing is not None}


def live_appends(
    batch: Sequence[Any], start: int, end: int, current: dict[str, int], poisoned: Container[tuple[str | None, Any]], results: Results
) -> list[int]:
    """The appends of ``batch[start:end]`` that may be written: a stale token
    (``current``: each fenced turn's token in the database) or one whose
    earlier append failed gets its refusal in ``results`` instead."""
    live: list[int] = []
    for i in range(start, end):
        req = batch[i]
        if req.fencing is not None and current.get(req.turn_id) != req.fencing:
            results[i] = (False, stale_token(req.turn_id, req.fencing, current.get(req.turn_id)))
        elif (req.turn_id, req.fencing) in poisoned:
            results[i] = (False, after_failure(req.turn_id, req.fencing))
        else:
            live.append(i)
    return live


def distinct_seqs(rows: Iterable[Sequence[Any]]) -> bool:
    """No two rows share a ``(turn_id, seq)``: else some request must fail,
    and the run is written one request at a time to find which."""
    rows = list(rows)
    return len({(row[0], row[1]) for row in rows}) == len(rows)


def startable_together(reqs: Sequence[Any], rows: Sequence[Sequence[Any]]) -> bool:
    """A run of starts may be written in one go: no turn id nor event seq twice."""
    return len({req.turn["t_id"] for req in reqs}) == len(reqs) and distinct_seqs(rows)


def merged_chats(reqs: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per chat, as the starts one after another leave it: the first
    start creates it, the latest time is its ``updated_at`` (``c_upd``)."""
    chats: dict[str, dict[str, Any]] = {}
    for req in reqs:
        chat = req.chat
        have = chats.get(chat["c_id"])
        if have is None:
            chats[chat["c_id"]] = {**chat, "c_upd": chat["c_at"]}
        elif chat["c_at"] > have["c_upd"]:
            have["c_upd"] = chat["c_at"]
    return list(chats.values())


def seq_taken(turn_id: str | None, cause: BaseException) -> ConcurrencyError:
    """The refusal of an append whose event seq another writer took."""
    error = ConcurrencyError(f"turn {turn_id}: an event's seq is already taken")
    error.__cause__ = cause
    return error


def turn_exists(turn_id: str, cause: BaseException) -> ConcurrencyError:
    error = ConcurrencyError(f"turn {turn_id} already exists")
    error.__cause__ = cause
    return error
