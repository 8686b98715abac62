"""The adapter routes' bodies: what registering takes and what an adapter looks like."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tritonbox_api.db.models import Adapter
from tritonbox_common import parameters as p
from tritonbox_common.lora import task_id


class AdapterCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: p.AdapterName = Field(
        description="What requests call it: `adapter` on /predict and /v1/predictions, `model` "
        "on the OpenAI routes (letters, digits, `.`, `_`, `-`; at most 64)."
    )
    source: str = Field(
        min_length=1,
        max_length=1024,
        description="A PEFT folder (adapter_config.json + adapter_model.safetensors) in one of "
        "ADAPTER_DIRS (absolute, or relative to one of them), or a Hugging Face repo id that "
        "ADAPTER_HUB_REPOS allows, org/name or org/name@revision.",
    )


class AdapterObject(BaseModel):
    object: Literal["adapter"] = "adapter"
    name: str
    source: str = Field(
        description="A repo id at its commit, or a local folder relative to its ADAPTER_DIRS "
        "root (the server's own folders are not shown)."
    )
    base_model: str | None = Field(description="adapter_config.json's base_model_name_or_path.")
    rank: int
    alpha: float
    target_modules: list[str]
    sha256: str = Field(description="Of adapter_config.json and adapter_model.safetensors.")
    task_id: int = Field(description="TensorRT-LLM's lora_task_id for it (from the sha256).")
    size_bytes: int
    created_at: datetime

    @classmethod
    def of(cls, row: Adapter, source: str) -> AdapterObject:
        """`row` as answers show it, its source as `source` (AdapterService.shown_source)."""
        return cls(
            name=row.name, source=source, base_model=row.base_model, rank=row.rank,
            alpha=row.alpha, target_modules=row.target_modules, sha256=row.sha256,
            task_id=task_id(row.sha256), size_bytes=row.size_bytes, created_at=row.created_at,
        )  # fmt: skip


class AdapterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AdapterObject]
