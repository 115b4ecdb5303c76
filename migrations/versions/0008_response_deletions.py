"""response_deletions: responses deleted through DELETE /v1/responses/{id}

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

A row per deleted response (``adapters.http.response_deletions``): the
Responses API answers 404 for it from then on. The turn's log is not touched
(it is append-only and hash-chained; the audit record stays).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "response_deletions",
        sa.Column("turn_id", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("deleted_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("response_deletions")
