"""ENGINE_REPOSITORY / TOKENIZER_REPOSITORY: local paths, Hugging Face ids fetched once into the
cache (a pre-populated hub cache, offline), and the errors users see. Nothing here touches the
network: the hub is either offline or, in the error tests, stubbed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import snapshot_download
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
from pydantic import SecretStr

from tritonbox_triton import fetch as fetch_module
from tritonbox_triton.fetch import FetchError, Source, fetch, parse_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(cache_dir: Path, repo_id: str, files: dict[str, str]) -> Path:
    """A Hugging Face cache holding `repo_id` at main, as snapshot_download leaves it."""
    repo = cache_dir / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    for name, text in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_text(text)
    return snapshot


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("my-org/engine", ("my-org/engine", None, None)),
        ("my-org/engine@v1.2", ("my-org/engine", "v1.2", None)),
        ("my-org/engine/tp2/int4", ("my-org/engine", None, "tp2/int4")),
        ("my-org/engine@main/tp2/", ("my-org/engine", "main", "tp2")),
    ],
)
def test_repository_ids(value: str, expected: tuple[str, str | None, str | None]) -> None:
    source = parse_source("ENGINE_REPOSITORY", value)
    assert (source.repo_id, source.revision, source.subfolder) == expected
    assert source.path is None


def test_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "local").mkdir(parents=True)
    for value in ("/models/engine", "./engine", "../engine", "~/engine", "org/local"):
        assert parse_source("ENGINE_REPOSITORY", value).path is not None, value


@pytest.mark.parametrize("value", ["engine", "a/b/../c", "org/na me", "@rev"])
def test_bad_values_name_the_setting(value: str) -> None:
    with pytest.raises(FetchError, match=r"TOKENIZER_REPOSITORY=.* is neither an existing path"):
        parse_source("TOKENIZER_REPOSITORY", value)


def test_local_folder_is_used_in_place(tmp_path: Path) -> None:
    source = parse_source("ENGINE_REPOSITORY", str(tmp_path))
    assert fetch(source, tmp_path / "cache") == tmp_path.resolve()
    assert not (tmp_path / "cache").exists()  # nothing copied


def test_missing_local_folder(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"ENGINE_REPOSITORY: .*/gone is not a directory"):
        fetch(parse_source("ENGINE_REPOSITORY", str(tmp_path / "gone")), tmp_path)


def test_repository_fetched_once_then_reused_without_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = hub_cache(tmp_path, "my-org/engine", {"tp1/config.json": "{}"})
    calls: list[dict[str, Any]] = []
    real = snapshot_download

    def offline(repo_id: str, **kwargs: Any) -> str:
        calls.append(kwargs)
        return str(real(repo_id, **kwargs, local_files_only=True))

    monkeypatch.setattr(fetch_module, "snapshot_download", offline)
    source = parse_source("ENGINE_REPOSITORY", "my-org/engine/tp1")
    assert fetch(source, tmp_path, SecretStr("hf_abc")) == snapshot / "tp1"
    assert calls[0]["allow_patterns"] == ["tp1/*"]
    assert calls[0]["token"] == "hf_abc"
    assert calls[0]["cache_dir"] == tmp_path.resolve() / "hub"
    # The second start finds the finished download and does not ask the hub at all.
    assert fetch(source, tmp_path, SecretStr("hf_abc")) == snapshot / "tp1"
    assert len(calls) == 1


def test_no_token_means_no_login_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def download(repo_id: str, **kwargs: Any) -> str:
        seen.update(kwargs)
        return str(tmp_path)

    monkeypatch.setattr(fetch_module, "snapshot_download", download)
    fetch(parse_source("ENGINE_REPOSITORY", "my-org/engine"), tmp_path)
    assert seen["token"] is False


def _failing(error: Exception) -> Any:
    def download(repo_id: str, **kwargs: Any) -> str:
        raise error

    return download


class _Response:
    status_code = 401
    headers: dict[str, str] = {}  # noqa: RUF012
    url = "https://huggingface.co/api/models/my-org/engine"
    request = None


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (GatedRepoError("gated", response=_Response()), "gated; accept its terms"),  # type: ignore[arg-type]
        (RepositoryNotFoundError("404", response=_Response()), "no such repository"),  # type: ignore[arg-type]
        (OSError("disk full"), r"download failed \(OSError\): disk full"),
    ],
)
def test_hub_errors_are_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, message: str
) -> None:
    monkeypatch.setattr(fetch_module, "snapshot_download", _failing(error))
    with pytest.raises(FetchError, match=message) as raised:
        fetch(parse_source("ENGINE_REPOSITORY", "my-org/engine"), tmp_path, SecretStr("hf_x"))
    assert "ENGINE_REPOSITORY=my-org/engine" in str(raised.value)
    assert "hf_x" not in str(raised.value)


def test_missing_subfolder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch_module, "snapshot_download", lambda *a, **k: str(tmp_path))
    with pytest.raises(FetchError, match="has no folder tp8"):
        fetch(
            Source(key="ENGINE_REPOSITORY", value="o/e/tp8", repo_id="o/e", subfolder="tp8"),
            tmp_path,
        )


def test_cli_prepare_fetches_a_checkpoint_offline(tmp_path: Path, tokenizer_dir: Path) -> None:
    # The whole `prepare` step of the entrypoint, for real: a Hugging Face id resolved from a
    # pre-populated cache with the hub switched off (HF_HUB_OFFLINE), for the cpu engine.
    files = {p.name: p.read_text() for p in tokenizer_dir.iterdir() if p.suffix == ".json"}
    hub_cache(tmp_path, "my-org/small-model", files)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ENGINE", "MODEL"))}
    env |= {"HF_HUB_OFFLINE": "1", "ENGINE": "cpu", "CACHE_DIR": str(tmp_path)}
    env |= {"ENGINE_REPOSITORY": "my-org/small-model", "PYTHONSAFEPATH": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tritonbox_triton", "prepare", "--env-file", str(tmp_path / "none")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "hub" / "tritonbox-fetched").glob("*.json"))
    env["ENGINE_REPOSITORY"] = "my-org/not-cached"
    result = subprocess.run(
        [sys.executable, "-m", "tritonbox_triton", "prepare", "--env-file", str(tmp_path / "none")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "ENGINE_REPOSITORY=my-org/not-cached" in result.stderr
