"""The cpu engine's adapters by TensorRT-LLM task id: an LRU cache bounded in bytes, and the
per-request resolution of `lora_task_id` / `lora_weights` / `lora_config`.

Resolution (conversion included) runs on Triton's request thread, before the request reaches
the engine loop, so a new adapter never stalls the running rows. A request holds its adapter
object until it finishes: eviction drops the cache's reference, never a running row's.
Error texts are TensorRT-LLM 0.20's where it has one (peftCacheManager.cpp, loraUtils.cpp), so
clients that match them (the api resends weights on "not found in cache") work on both engines.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from tritonbox_common.errors import RequestError
from tritonbox_common.lora import HF_TO_TRTLLM, MODULE_ID, AdapterError, from_lora_tensors
from tritonbox_triton.engine.lora_layers import EngineAdapter

LORA_INPUTS = ("lora_task_id", "lora_weights", "lora_config")
_TRTLLM_NAME = {MODULE_ID[hf]: trt for hf, trt in HF_TO_TRTLLM.items()}


class LoraCache:
    """Converted adapters, least recently used evicted first once `max_bytes` would overflow."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._adapters: OrderedDict[int, EngineAdapter] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, task_id: int) -> EngineAdapter | None:
        with self._lock:
            adapter = self._adapters.get(task_id)
            if adapter is not None:
                self._adapters.move_to_end(task_id)
            return adapter

    def put(self, adapter: EngineAdapter) -> None:
        if adapter.nbytes > self.max_bytes:
            raise RequestError(
                f"LoRA task {adapter.task_id} needs {adapter.nbytes} bytes, more than the whole "
                f"LoRA cache (lora_cache_host_memory_bytes={self.max_bytes})"
            )
        with self._lock:
            old = self._adapters.pop(adapter.task_id, None)
            self._bytes -= old.nbytes if old is not None else 0
            while self._adapters and self._bytes + adapter.nbytes > self.max_bytes:
                _, evicted = self._adapters.popitem(last=False)
                self._bytes -= evicted.nbytes
            self._adapters[adapter.task_id] = adapter
            self._bytes += adapter.nbytes

    def __contains__(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._adapters


class LoraResolver:
    """Turns a request's three LoRA inputs into the adapter its rows decode with."""

    def __init__(
        self,
        cache: LoraCache,
        dims: Mapping[str, tuple[int, int]],
        num_layers: int,
        max_rank: int,
    ) -> None:
        self.cache = cache
        self.dims = dims
        self.num_layers = num_layers
        self.max_rank = max_rank

    def resolve(self, tensors: Mapping[str, Any]) -> EngineAdapter | None:
        """None for a base request; RequestError for anything the engine cannot serve."""
        task, weights, config = (tensors.get(name) for name in LORA_INPUTS)
        if task is None and weights is None and config is None:
            return None
        if self.max_rank <= 0:
            raise RequestError("LoRA adapters are disabled on this server (MAX_LORA_RANK=0)")
        if task is None:
            raise RequestError("lora_task_id must be set for LoRA inference")
        task_id = int(np.asarray(task).reshape(-1)[0])
        if weights is None and config is None:
            adapter = self.cache.get(task_id)
            if adapter is None:
                raise RequestError(
                    f"LoRA task {task_id} not found in cache. Please send LoRA weights with request"
                )
            return adapter
        if weights is None or config is None:
            raise RequestError(
                "Request for LoRA inference must have both lora_weights and lora_keys"
            )
        adapter = self._convert(task_id, np.asarray(weights), np.asarray(config))
        self.cache.put(adapter)
        return adapter

    def _convert(
        self, task_id: int, weights: np.ndarray[Any, Any], config: np.ndarray[Any, Any]
    ) -> EngineAdapter:
        # TensorRT-LLM's own checks and texts first; from_lora_tensors checks shapes.
        rows = config.reshape(-1, 3).tolist() if config.ndim >= 2 and config.shape[-1] == 3 else []
        for module_id, _, rank in rows:
            hf = next((m for m, i in MODULE_ID.items() if i == module_id), None)
            if hf is None or hf not in self.dims:
                name = _TRTLLM_NAME.get(module_id, f"id {module_id}")
                raise RequestError(f"lora module {name} not enabled for this model")
            if rank > self.max_rank:
                raise RequestError(
                    f"Invalid low_rank ({rank}). low_rank must be smaller than mMaxLowRank "
                    f"({self.max_rank})"
                )
        try:
            converted = from_lora_tensors(weights, config, self.dims, num_layers=self.num_layers)
        except AdapterError as error:
            raise RequestError(f"LoRA task {task_id}: {error}") from None
        tensors = {
            key: (torch.from_numpy(a.copy()), torch.from_numpy(b.copy()))
            for key, (a, b) in converted.items()
        }
        return EngineAdapter(
            task_id=task_id,
            weights=tensors,
            rank=max(a.shape[0] for a, _ in tensors.values()),
            nbytes=sum(a.nbytes + b.nbytes for a, b in converted.values()),
        )
