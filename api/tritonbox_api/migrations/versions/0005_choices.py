"""Every choice of a prediction asked for several (`n` > 1 on the OpenAI routes):
`prediction.choices`, one `{index, output, finish_reason, stop_word, completion_tokens}` each.

`output`, `finish_reason` and `stop_word` stay the first choice's, so every reader of a row works
as before; `completion_tokens` is the sum over the choices. Rows from before this revision, and
rows of one choice, keep NULL.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # ADD COLUMN of a nullable column: SQLite does it in place, without copying the table.
    op.add_column("prediction", sa.Column("choices", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("prediction") as batch:
        batch.drop_column("choices")
