"""events.hash: every event hash-chained, existing turns back-filled

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

``hash`` is ``sha256(previous hash || canonical event)``, its 32 bytes (BLOB, BYTEA),
the first event of a turn chaining from 32 zero bytes (``engine.chain``
defines the canonical form; the stores compute it on every append). The
events already stored are chained here, turn by turn in seq order, from their
stored rows: a turn's log from before this revision gets the receipt its
rows give today (the chain proves nothing about what happened to them before).

On both dialects the column is added nullable (the store writes NULL only
with the chain turned off, to measure its cost) and the back-fill reads the
log in pages of 1,000 rows, keyset-ordered by ``(turn_id, seq)`` (the unique
index), updating each page's rows by id.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import sqlalchemy as sa
from alembic import op

from engine.chain import GENESIS, canonical, link

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH = 1000


def _loads(text: str) -> object:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        import json

        return json.loads(text)  # integers beyond 64 bits, as the store reads them


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("hash", sa.LargeBinary(), nullable=True))
    bind = op.get_bind()
    first = sa.text("SELECT id, turn_id, seq, type, at, data FROM events ORDER BY turn_id, seq LIMIT :n")
    following = sa.text("SELECT id, turn_id, seq, type, at, data FROM events WHERE turn_id > :t OR (turn_id = :t AND seq > :s) ORDER BY turn_id, seq LIMIT :n")
    update = sa.text("UPDATE events SET hash = :h WHERE id = :i").bindparams(sa.bindparam("h", type_=sa.LargeBinary()))
    turn: str | None = None
    prev = GENESIS
    # Page by page, keyset on the unique (turn_id, seq): memory stays bounded
    # whatever the log's size, and each page's UPDATEs run once its rows are
    # fetched (some drivers cannot update on a connection with a result open).
    rows = bind.execute(first, {"n": _BATCH}).fetchall()
    while rows:
        pending: list[dict[str, object]] = []
        for id_, turn_id, seq, type_, at, data in rows:
            if turn_id != turn:
                turn, prev = turn_id, GENESIS
            prev = link(prev, canonical(turn_id, seq, type_, at, _loads(data)))
            pending.append({"h": prev, "i": id_})
        bind.execute(update, pending)
        last = rows[-1]
        rows = bind.execute(following, {"t": last[1], "s": last[2], "n": _BATCH}).fetchall()


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("hash")
