"""The serving engine's limits as numbers, for pages that must show them to people (the
playground's hints say "up to 512 tokens", not a setting's name)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from tritonbox_api.deps import Guarded, ServicesDep
from tritonbox_api.protocol.batches import MAX_WINDOW_TEXT
from tritonbox_api.protocol.errors import unavailable
from tritonbox_api.routes.responses import GUARDED, errors
from tritonbox_api.service.batch_pace import LINES_PER_STEP
from tritonbox_api.service.batch_room import LIVE_QUIET_S
from tritonbox_api.triton_gateway import TritonUnavailableError
from tritonbox_common import parameters as p

router = APIRouter(prefix="/v1", tags=["predictions"], dependencies=Guarded, responses=GUARDED)


class Limits(BaseModel):
    model: str
    max_input_tokens: int = Field(description="Longest prompt, in tokens (MAX_INPUT_LEN).")
    max_output_tokens: int = Field(description="Largest max_tokens (MAX_OUTPUT_LEN).")
    max_beam_width: int = Field(description="Largest beam_width (MAX_BEAM_WIDTH).")
    max_words: int = Field(description="Most words in a stop-word or bad-word list.")
    max_word_chars: int = Field(description="Longest stop word or bad word, in characters.")
    max_word_tokens: int = Field(
        description="Longest stop word or bad word, in the engine's tokens (each spelling: "
        "as given, and with a leading space added or removed)."
    )
    max_batch_file_bytes: int = Field(
        description="Largest batch input file, in bytes (MAX_BATCH_FILE_BYTES)."
    )
    max_batch_lines: int = Field(description="Most lines in a batch input file (MAX_BATCH_LINES).")
    batch_concurrent_requests: int = Field(
        description="Engine requests batch lines run at once, live requests included in the "
        "count (BATCH_CONCURRENT_REQUESTS; with API_WORKERS > 1, the workers' total)."
    )
    batch_requests_beside_live: int = Field(
        description="Engine requests batch lines keep while live requests run; the newest "
        "lines over it stop as a live request comes (BATCH_REQUESTS_BESIDE_LIVE; with "
        "API_WORKERS > 1, the workers' total)."
    )
    batch_live_quiet_s: float = Field(
        description="Seconds after the last live request ends during which batch lines still "
        "keep at most batch_requests_beside_live (a client's next request comes within it)."
    )
    batch_lines_per_step: int = Field(
        description="New batch lines the api starts per engine step (its time per token as "
        "recent lines saw it), spaced evenly: lines reach the engine spread out, never as a "
        "burst whose prefill a live request would wait for."
    )
    max_completion_window: str = Field(description="Longest batch completion_window.")
    echo_max_prompt_tokens: int = Field(
        description="Longest prompt `echo` with `logprobs` scores (ECHO_MAX_PROMPT_TOKENS)."
    )


@router.get("/limits", response_model=Limits, responses=errors(503))
async def limits(services: ServicesDep) -> Limits:
    """What this engine accepts: the bounds the api checks every request against."""
    try:
        context = await services.engine_context.get()
    except TritonUnavailableError as error:
        raise unavailable(f"the engine is not available yet: {error}") from None
    return Limits(
        model=context.model_name,
        max_input_tokens=context.info.max_input_len,
        max_output_tokens=context.info.max_output_len,
        max_beam_width=services.settings.max_beam_width,
        max_words=p.MAX_WORDS,
        max_word_chars=p.MAX_WORD_CHARS,
        max_word_tokens=p.MAX_WORD_TOKENS,
        max_batch_file_bytes=services.settings.max_batch_file_bytes,
        max_batch_lines=services.settings.max_batch_lines,
        batch_concurrent_requests=services.settings.batch_concurrent_requests,
        batch_requests_beside_live=services.settings.batch_requests_beside_live,
        batch_live_quiet_s=LIVE_QUIET_S,
        batch_lines_per_step=LINES_PER_STEP,
        max_completion_window=MAX_WINDOW_TEXT,
        echo_max_prompt_tokens=services.settings.echo_max_prompt_tokens,
    )
