"""Which adapter sources the operator allows, and the folder each allowed one is read from.

A local source counts only inside ADAPTER_DIRS, checked on the path with every symbolic link
resolved (the folder's and each file's: a link inside a root that points out of it is outside);
a Hub repo only when it matches an ADAPTER_HUB_REPOS pattern, and only such a repo ever gets
HF_TOKEN. Whatever is not allowed, does not exist, or cannot be read gets the same answer
(`unavailable`), so that the answers map nothing of the server's disk or of the token's
private repos; the reason is logged for the operator. Sizes are checked against
ADAPTER_MAX_BYTES before a byte is downloaded (the Hub reports them) and before a file is read.
Blocking (disk, network): the service calls these in a thread.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, constants, snapshot_download

from tritonbox_api.settings import ApiSettings
from tritonbox_common.lora import AdapterError

log = logging.getLogger(__name__)
# Hugging Face's repo id form (org/name), optionally @revision.
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass(frozen=True)
class SourcePolicy:
    roots: tuple[Path, ...]  # absolute, symbolic links resolved
    hub_patterns: tuple[str, ...]
    max_bytes: int
    cache_dir: Path
    token: str | None

    @classmethod
    def of(cls, settings: ApiSettings) -> SourcePolicy:
        token = settings.hf_token.get_secret_value() if settings.hf_token else None
        return cls(
            roots=tuple(root.resolve() for root in settings.adapter_roots),
            hub_patterns=tuple(settings.hub_patterns),
            max_bytes=settings.adapter_max_bytes,
            cache_dir=settings.cache_dir,
            token=token,
        )

    def allows_repo(self, repo: str) -> bool:
        return any(fnmatch.fnmatchcase(repo, pattern) for pattern in self.hub_patterns)

    def root_of(self, path: Path) -> Path | None:
        """The allowed root `path` (resolved) lies in, or None."""
        return next((root for root in self.roots if path.is_relative_to(root)), None)


def unavailable(name: str, source: str) -> AdapterError:
    """The one answer for a source that is not allowed, not there, or not readable."""
    return AdapterError(
        f"adapter {name}: source {source!r} is not an adapter this server may load: neither a "
        "PEFT folder in ADAPTER_DIRS nor a Hugging Face repo ADAPTER_HUB_REPOS allows, or it "
        "does not exist"
    )


def local_folder(source: str, policy: SourcePolicy) -> Path | None:
    """The allowed folder `source` names, resolved; None if there is none.

    A relative source is taken from the working directory first (`.cache/adapters/demo` as
    before), then from each root (`demo`, as answers show it)."""
    try:
        given = Path(source).expanduser()
        tries = [given] if given.is_absolute() else [given, *(r / given for r in policy.roots)]
        for path in tries:
            folder = path.resolve()
            if folder.is_dir() and _inside(folder, policy):
                return folder
    except (OSError, RuntimeError, ValueError):  # too long, `~` of no user, a NUL, a link loop
        pass
    return None


def _inside(folder: Path, policy: SourcePolicy) -> bool:
    """Both files are there, and in an allowed root with every link resolved (a link in an
    allowed folder may point anywhere)."""
    root = policy.root_of(folder)
    files = [(folder / name).resolve() for name in PEFT_FILES]
    return root is not None and all(f.is_file() and f.is_relative_to(root) for f in files)


def fetch(name: str, source: str, policy: SourcePolicy, label: str | None = None) -> Path:
    """The folder holding the adapter's two files; AdapterError naming `name` if none, and
    the source as `label` (a recorded source is an absolute folder: answers show `shown`)."""
    folder = local_folder(source, policy)
    if folder is not None:
        return folder
    label = label or source
    repo, _, revision = source.partition("@")
    if not REPO_ID.match(source) or not policy.allows_repo(repo):
        log.warning("adapter %s: source %r is not allowed or not there", name, source)
        raise unavailable(name, label)
    token = policy.token or False  # False: no login of this machine's user as a fallback
    try:
        if not constants.is_offline_mode():  # offline, the cache answers and nothing downloads
            revision = _sized_commit(name, source, label, token, policy.max_bytes)
        path = snapshot_download(
            repo,
            revision=revision or None,
            cache_dir=policy.cache_dir / "hub",
            token=token,
            allow_patterns=list(PEFT_FILES),
        )
    except AdapterError:
        raise
    except Exception as error:  # not found, gated, private, unreachable: one answer, logged
        log.warning("adapter %s: cannot fetch %r: %s", name, source, error)
        raise unavailable(name, label) from None
    return Path(path)


def _sized_commit(name: str, source: str, label: str, token: str | bool, limit: int) -> str:
    """The commit `source`'s revision is now, once the Hub says its two files fit in `limit`
    bytes; the download then asks for that commit, so the files fetched are the ones sized."""
    repo, _, revision = source.partition("@")
    info = HfApi().model_info(repo, revision=revision or None, token=token, files_metadata=True)
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    if not all(sizes.get(file) is not None for file in PEFT_FILES):
        raise unavailable(name, label)
    total = sum(sizes[file] or 0 for file in PEFT_FILES)
    if total > limit:
        raise AdapterError(f"adapter {name}: its files are {total} bytes, over the limit of "
                           f"{limit} (ADAPTER_MAX_BYTES)")  # fmt: skip
    return info.sha or revision


def shown(source: str, policy: SourcePolicy) -> str:
    """`source` as answers show it: a local folder relative to its root (the server's own
    folders stay private; the form registers the same folder again), a repo id as it is."""
    path = Path(source)
    root = policy.root_of(path) if path.is_absolute() else None
    if root is None:
        return source if not path.is_absolute() else path.name
    return path.relative_to(root).as_posix()
