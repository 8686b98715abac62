"""The human permalink page `GET /p/{id}`."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from tritonbox_api.deps import ServicesDep
from tritonbox_api.pages.permalink import render_not_found, render_permalink
from tritonbox_api.routes.responses import TEXT

# Open to whoever holds the link, with or without API_KEY: the id (192 random bits) is the
# capability, as with Replicate's shared predictions. The page links to nothing that lists others.
router = APIRouter(prefix="/p", tags=["permalink"])
HTML = {"text/html": TEXT}


@router.get(
    "/{prediction_id}",
    response_class=HTMLResponse,
    responses={404: {"description": "No such prediction: a page saying so.", "content": HTML}},
)
async def permalink(prediction_id: str, services: ServicesDep) -> HTMLResponse:
    row = await services.predictions.get(prediction_id)
    if row is None:
        return HTMLResponse(render_not_found(prediction_id), status_code=404)
    settings = services.settings
    page = render_permalink(
        row,
        public_url=settings.public_url,
        playground_url=settings.playground_url,
        # With a key set, a snippet without the Authorization header would only get 401.
        api_key_required=not services.keys.open,
    )
    return HTMLResponse(page)
