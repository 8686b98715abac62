"""Whether an adapter's files can be read and fit the served base model.

Where the files may come from is adapter_sources.py's. A repo id is recorded pinned to the
commit it resolved to (`pinned`): a branch moves, and a later load (a restart, an evicted
adapter) must read the files that were checked and hashed; a local folder is recorded as the
absolute folder it resolved to, so it does not depend on the directory the api starts in.
Blocking (disk): the service calls these in a thread.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from tritonbox_api.service.adapter_sources import REPO_ID
from tritonbox_api.triton_gateway import LoraSupport
from tritonbox_common.lora import AdapterError, PeftAdapter, llama_module_dims, read_peft_adapter

log = logging.getLogger(__name__)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a git commit hash: a revision that never moves


def pinned(source: str, folder: Path, *, local: bool) -> str:
    """`source` as the registry records it: a local folder as `folder` (absolute, resolved); a
    repo id at a branch or tag (or none: `main`) as `org/name@<commit>`, the commit its files
    in `folder` came from (huggingface_hub names a snapshot folder after it); a commit as is."""
    if local:
        return str(folder)
    if not REPO_ID.match(source):
        return source
    repo, _, revision = source.partition("@")
    if _COMMIT.match(revision) or not _COMMIT.match(folder.name):
        return source
    return f"{repo}@{folder.name}"


def read(name: str, folder: Path, max_bytes: int | None = None) -> PeftAdapter:
    """The adapter, or AdapterError naming `name`: a malformed file is refused whatever its
    defect (a reader's unexpected exception included), never a 500."""
    try:
        return read_peft_adapter(folder, name=name, max_bytes=max_bytes)
    except AdapterError:
        raise
    except Exception as error:
        log.warning("adapter %s: unreadable", name, exc_info=True)
        message = f"adapter {name}: its files are malformed ({type(error).__name__})"
        raise AdapterError(message) from None


def check_fits(
    name: str, adapter: PeftAdapter, *, support: LoraSupport, model_dir: Path, model_name: str
) -> None:
    """AdapterError naming `name` and the reason when the engine cannot serve `adapter`."""
    if support.max_rank == 0:
        raise AdapterError(
            f"adapter {name}: this engine serves no adapters (MAX_LORA_RANK=0, or a TensorRT-LLM "
            "engine built without the LoRA plugin)"
        )
    if adapter.rank > support.max_rank:
        raise AdapterError(
            f"adapter {name}: rank {adapter.rank} is over this engine's maximum of "
            f"{support.max_rank} (MAX_LORA_RANK)"
        )
    unsupported = sorted(set(adapter.target_modules) - set(support.target_modules))
    if unsupported:
        raise AdapterError(
            f"adapter {name}: target modules {unsupported} are not among the engine's "
            f"{list(support.target_modules)}"
        )
    _check_base(name, adapter, model_dir=model_dir, model_name=model_name)


def _check_base(name: str, adapter: PeftAdapter, *, model_dir: Path, model_name: str) -> None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    served = {model_name.lower(), model_dir.name.lower()}
    if isinstance(config.get("_name_or_path"), str):
        served.add(Path(config["_name_or_path"]).name.lower())
    if adapter.base_model and Path(adapter.base_model).name.lower() not in served:
        raise AdapterError(
            f"adapter {name}: trained for {adapter.base_model!r}, but this server serves "
            f"{model_name!r}"
        )
    if {"hidden_size", "intermediate_size", "num_attention_heads"} <= config.keys():
        _check_shapes(name, adapter, config)


def _check_shapes(name: str, adapter: PeftAdapter, config: dict[str, object]) -> None:
    # Names can agree while the architecture differs (a renamed folder): the weights must fit.
    heads = int(str(config["num_attention_heads"]))
    hidden = int(str(config["hidden_size"]))
    dims = llama_module_dims(
        hidden,
        int(str(config["intermediate_size"])),
        heads,
        int(str(config.get("num_key_value_heads", heads))),
        int(str(config.get("head_dim") or hidden // heads)),
    )
    layers = int(str(config.get("num_hidden_layers", 0))) or None
    for (layer, module), (a, b) in sorted(adapter.weights.items()):
        if layers is not None and layer >= layers:
            raise AdapterError(
                f"adapter {name}: has layer {layer}, but the base model has {layers} layers"
            )
        if (a.shape[1], b.shape[0]) != dims[module]:
            raise AdapterError(
                f"adapter {name}: layer {layer} {module} maps {a.shape[1]} → {b.shape[0]} "
                f"features, but the base model's maps {dims[module][0]} → {dims[module][1]} "
                "(an adapter for another base model)"
            )
