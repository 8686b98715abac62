"""Several api workers on one database: who runs each prediction, cancel requests, heartbeats.

`prediction.owner` is the id of the api worker running it, `cancel_requested_at` is set by
`POST .../cancel` on any worker and acted on by the owner; `api_worker` holds each live worker's
heartbeat, so crash recovery fails only the rows of workers that are gone. Rows from before this
revision get no owner (they were all run by a single process).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "api_worker",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    # ADD COLUMN of a nullable column: SQLite does it in place, without copying the table.
    op.add_column("prediction", sa.Column("owner", sa.String(length=64), nullable=True))
    op.add_column(
        "prediction", sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index("ix_prediction_owner", "prediction", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_prediction_owner", table_name="prediction")
    with op.batch_alter_table("prediction") as batch:
        batch.drop_column("cancel_requested_at")
        batch.drop_column("owner")
    op.drop_table("api_worker")
