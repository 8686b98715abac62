"""Where an adapter's files come from, and whether they fit the served base model.

A source is a local PEFT folder or a Hugging Face repo id (`org/name`, `org/name@revision`),
fetched with huggingface_hub into CACHE_DIR/hub like the base model. A repo id is recorded
pinned to the commit it resolved to (`pinned`): a branch moves, and a later load (a restart, an
evicted adapter) must read the files that were checked and hashed. Blocking (disk, network):
the service calls these in a thread.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError

from tritonbox_api.triton_gateway import LoraSupport
from tritonbox_common.lora import AdapterError, PeftAdapter, llama_module_dims, read_peft_adapter

# Hugging Face's repo id form (org/name), optionally @revision.
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a git commit hash: a revision that never moves
PEFT_FILES = ["adapter_config.json", "adapter_model.safetensors"]


def _local_folder(source: str) -> Path | None:
    try:
        folder = Path(source).expanduser()
        return folder.resolve() if folder.is_dir() else None
    except (OSError, RuntimeError, ValueError):  # too long, `~` of no user, a NUL: no folder
        return None


def fetch(name: str, source: str, *, cache_dir: Path, token: str | None) -> Path:
    """The local folder holding the adapter's two files; AdapterError naming `name` if none."""
    folder = _local_folder(source)
    if folder is not None:
        return folder
    if not _REPO_ID.match(source):
        raise AdapterError(
            f"adapter {name}: source {source!r} is neither a local folder nor a Hugging Face "
            "repo id (org/name or org/name@revision)"
        )
    repo, _, revision = source.partition("@")
    try:
        path = snapshot_download(
            repo,
            revision=revision or None,
            cache_dir=cache_dir / "hub",
            token=token,
            allow_patterns=PEFT_FILES,
        )
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise AdapterError(f"adapter {name}: cannot fetch {source!r}: {error}") from None
    return Path(path)


def pinned(source: str, folder: Path) -> str:
    """`source` as the registry records it: a repo id at a branch or tag (or none: `main`)
    becomes `org/name@<commit>`, the commit its files in `folder` came from (huggingface_hub
    names a snapshot folder after it); a local folder or a commit is kept as it is."""
    if Path(source).expanduser().is_dir() or not _REPO_ID.match(source):
        return source
    repo, _, revision = source.partition("@")
    if _COMMIT.match(revision) or not _COMMIT.match(folder.name):
        return source
    return f"{repo}@{folder.name}"


def read(name: str, folder: Path) -> PeftAdapter:
    try:
        return read_peft_adapter(folder)
    except AdapterError as error:  # name the adapter, not only its folder
        raise AdapterError(f"adapter {name}: {str(error).removeprefix('adapter ')}") from None


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
