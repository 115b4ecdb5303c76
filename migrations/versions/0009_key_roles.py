"""key_roles: an API key's role (admin or user)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04

``api_keys.role``: ``admin`` keys also reach the operator's endpoints
(``/metrics``); every key that exists before this revision becomes ``user``,
the default, so an upgrade gives no key more than it had.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("role", sa.Text(), nullable=False, server_default="user"))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("role")
