"""A prediction row for the database tests (tests/api/db), inserted through crud as the api
inserts one. Here rather than in that folder's conftest.py: with `--import-mode=importlib` a
conftest's functions cannot be imported, and a fixture would have to be threaded through every
helper that inserts."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from tritonbox_api.db import crud
from tritonbox_api.db.models import Prediction, Source


def new_prediction(session: Session, prediction_id: str | None = None, **values: Any) -> Prediction:
    """Inserts a processing prediction, a new id unless one is given. `values` replace the plain
    ones: from the api, model "m", its id as the prompt, nothing applied, one prompt token."""
    prediction_id = prediction_id or crud.new_prediction_id()
    plain: dict[str, Any] = dict(
        source=Source.API,
        model="m",
        input={"prompt": prediction_id},
        applied={},
        prompt_tokens=1,
    )
    return crud.create_prediction(session=session, id=prediction_id, **(plain | values))
