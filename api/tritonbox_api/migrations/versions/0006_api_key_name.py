"""The name of the API key each prediction came with: `prediction.api_key_name` (API_KEYS'
names; `default` for API_KEY). Rows from before this revision, and rows of an api without
keys, keep NULL.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # ADD COLUMN of a nullable column: SQLite does it in place, without copying the table.
    op.add_column("prediction", sa.Column("api_key_name", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("prediction") as batch:
        batch.drop_column("api_key_name")
