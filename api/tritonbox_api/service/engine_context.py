"""The serving engine's tokenizer and limits, fetched from Triton once it is reachable.

The api may start before Triton (compose starts them together, and Triton can restart under a
running api). Each api process loads the context in the background from its start (`warm_up`),
retrying until Triton answers, so that its first request does not wait for the tokenizer (seconds
of a busy core, during which the worker's event loop answers nothing else, a cancel included);
a request that comes first loads it itself.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import dataclass
from typing import Any

from tritonbox_api.triton_gateway import EngineInfo, TritonGateway, TritonUnavailableError
from tritonbox_common.end_ids import TokenIds, default_token_ids
from tritonbox_common.tokenization import load_tokenizer

log = logging.getLogger(__name__)
# The first retry's wait, doubled up to the second: a second at most between tries, so that the
# api is ready soon after Triton (at 5 s, up to 5 s later; a try that fails costs ~1 ms).
WARM_UP_RETRY_S = (0.5, 1.0)


def _freeze_heap() -> None:
    """Take every object alive once the engine context is loaded out of the collector's scans.

    The imports and the tokenizer leave ~430 000 objects that live as long as the process; every
    full collection walked them all, 0.2 to 0.4 s on the event loop (every stream stalled), a
    twelfth of the api's CPU at 64 streams. Frozen, they are never scanned again; what the
    process creates later is collected as before. Collected first, so no garbage is frozen. Done
    once per process, when the context loads (at its start, by `warm_up`, before any request).
    """
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class EngineContext:
    info: EngineInfo
    tokenizer: Any  # a transformers tokenizer
    model_name: str
    token_ids: TokenIds  # end and pad ids, as the ensemble's preprocessing step defaults them


class EngineContextLoader:
    def __init__(self, gateway: TritonGateway, *, model_name: str | None) -> None:
        self._gateway = gateway
        self._model_name = model_name
        self._context: EngineContext | None = None
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> EngineContext | None:
        return self._context

    async def get(self) -> EngineContext:
        """The context; raises TritonUnavailableError while Triton cannot be asked."""
        if self._context is not None:
            return self._context
        async with self._lock:
            if self._context is None:
                info = await self._gateway.engine_info()
                # The tokenizer Triton's preprocessing step uses: one place configures it.
                tokenizer = await asyncio.to_thread(load_tokenizer, info.tokenizer_dir)
                token_ids = default_token_ids(tokenizer, info.tokenizer_dir)
                name = self._model_name or info.tokenizer_dir.name
                self._context = EngineContext(
                    info=info, tokenizer=tokenizer, model_name=name, token_ids=token_ids
                )
                _freeze_heap()
        return self._context

    async def warm_up(self) -> None:
        """Load the context as soon as Triton answers; runs until loaded (or cancelled)."""
        wait, longest = WARM_UP_RETRY_S
        while self._context is None:
            try:
                await self.get()
            except TritonUnavailableError:
                pass  # Triton is starting: the usual case at a compose start
            except Exception:  # e.g. a tokenizer folder not there yet: requests will say why
                log.exception("could not load the engine's tokenizer yet; retrying")
            else:
                return
            await asyncio.sleep(wait)
            wait = min(wait * 2, longest)
