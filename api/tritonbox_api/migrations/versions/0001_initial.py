"""The first schema: the `prediction` table as release 0.1.0 created it (before migrations).

A database made by that release has exactly this schema and no `alembic_version` table: it is
stamped with this revision, not created again (tritonbox_api.db.migrate).

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Enums are stored by value in VARCHAR(16) without a CHECK constraint (models.py), datetimes
    # as UTC (TIMESTAMP WITH TIME ZONE on PostgreSQL, DATETIME text on SQLite).
    op.create_table(
        "prediction",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("input", sa.JSON(), nullable=False),
        sa.Column("applied", sa.JSON(), nullable=False),
        sa.Column("output", sa.String(), nullable=False),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("finish_reason", sa.String(length=16), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("time_to_first_token_s", sa.Float(), nullable=True),
        sa.Column("time_per_output_token_s", sa.Float(), nullable=True),
        sa.Column("total_time_s", sa.Float(), nullable=True),
        sa.Column("tokens_per_second", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_prediction_created_at", "prediction", ["created_at"])
    op.create_index("ix_prediction_source", "prediction", ["source"])
    op.create_index("ix_prediction_status", "prediction", ["status"])


def downgrade() -> None:
    op.drop_table("prediction")
