"""CHAT_TEMPLATE: give the served tokenizer a chat template its files lack, or replace theirs.

The template has to reach every place a chat is turned into a prompt: the api's chat routes
load the tokenizer from the folder named in Triton's preprocessing config, often in another
container. So instead of passing the template along, the tokenizer's own small files (never
the weights) are copied into CACHE_DIR/tokenizers with the template written as
`chat_template.jinja`, and that folder is served as the tokenizer: every step that loads it,
here or in the api, sees the same template. The copy is keyed by the source files and the
template, so a changed template or tokenizer makes a new one and a restart reuses it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "chat_templates"
# The templates shipped for the families the cpu engine knows; a name here, or a .jinja path.
SHIPPED = ("gemma", "llama", "mistral", "qwen2", "qwen3")
# Files that hold weights, never part of a tokenizer: a copy of them would cost gigabytes.
WEIGHT_SUFFIXES = frozenset(
    {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".engine", ".h5", ".onnx", ".npz"}
)
# The tokenizer's own template files: the new template replaces them.
TEMPLATE_FILES = frozenset({"chat_template.jinja", "chat_template.json"})
MARKER = ".tritonbox-chat-template"


class ChatTemplateError(ValueError):
    """CHAT_TEMPLATE names neither a file nor a shipped template; the message says which exist."""


def read_chat_template(value: str) -> str:
    """The template text CHAT_TEMPLATE names: a shipped family's name or a Jinja file's path."""
    name = value.strip()
    if name.lower() in SHIPPED:
        return (SHIPPED_DIR / f"{name.lower()}.jinja").read_text(encoding="utf-8")
    path = Path(name).expanduser()
    if not path.is_file():
        raise ChatTemplateError(
            f"CHAT_TEMPLATE={value!r} is neither a file nor a shipped template "
            f"({', '.join(SHIPPED)})"
        )
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ChatTemplateError(f"CHAT_TEMPLATE: {path} is empty")
    return text


def _tokenizer_files(source: Path) -> list[Path]:
    return sorted(
        path
        for path in source.iterdir()
        if path.is_file()
        and path.suffix.lower() not in WEIGHT_SUFFIXES
        and path.name not in TEMPLATE_FILES
        and not path.name.startswith(".")
    )


def _key(source: Path, template: str, names: list[Path]) -> str:
    digest = hashlib.sha256(f"{source}\n{template}\n".encode())
    for path in names:
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def with_chat_template(tokenizer_dir: Path, template: str, cache_dir: Path) -> Path:
    """A copy of `tokenizer_dir`'s tokenizer with `template` as its chat template (made once).

    The copy keeps the folder's name: MODEL_NAME defaults to the tokenizer folder's name.
    """
    source = tokenizer_dir.resolve()
    if not source.is_dir():
        raise FileNotFoundError(f"tokenizer folder {source} is not a directory")
    names = _tokenizer_files(source)
    target = cache_dir.resolve() / "tokenizers" / _key(source, template, names) / source.name
    if (target / MARKER).is_file():
        return target
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in names:
        # copyfile follows links: a Hugging Face snapshot's files are links into its blobs.
        shutil.copyfile(path, staging / path.name)
    config_path = staging / "tokenizer_config.json"
    if config_path.is_file():
        # A template in tokenizer_config.json would be a second one; the .jinja file is the one.
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if isinstance(config, dict) and config.pop("chat_template", None) is not None:
            config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (staging / "chat_template.jinja").write_text(template, encoding="utf-8")
    (staging / MARKER).write_text(f"{source}\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
