"""LoRA adapters: the `adapter` registry, and which adapter answered a prediction.

Rows from before this revision keep NULL (the base model answered them).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "adapter",
        sa.Column("name", sa.String(length=64), primary_key=True),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("base_model", sa.String(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("target_modules", sa.JSON(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    # ADD COLUMN of nullable columns: SQLite does it in place, without copying the table.
    op.add_column("prediction", sa.Column("adapter_name", sa.String(length=64), nullable=True))
    op.add_column("prediction", sa.Column("adapter_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("prediction") as batch:
        batch.drop_column("adapter_sha256")
        batch.drop_column("adapter_name")
    op.drop_table("adapter")
