"""Alembic migrations of the prediction database (run on start by tritonbox_api.db.migrate)."""
