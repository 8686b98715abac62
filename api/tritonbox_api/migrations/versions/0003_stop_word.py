"""Which stop word ended a prediction: `prediction.stop_word`.

The output has the stop word cut off, so with several stop words only this column says which one
matched (the playground shows it beside the answer). Rows from before this revision keep NULL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # ADD COLUMN of a nullable column: SQLite does it in place, without copying the table.
    op.add_column("prediction", sa.Column("stop_word", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("prediction") as batch:
        batch.drop_column("stop_word")
