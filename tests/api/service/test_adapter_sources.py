"""Only the sources the operator chose: folders in ADAPTER_DIRS (after every link is resolved),
Hub repos ADAPTER_HUB_REPOS allows (the only ones that get HF_TOKEN), within ADAPTER_MAX_BYTES
before a byte is downloaded, and one answer for whatever is not allowed or not there.

The files here need not be adapters: where a source may come from is decided before a byte of
it is read (reading: test_adapter_files.py, tests/common/lora)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import huggingface_hub.constants
import pytest

from tritonbox_api.service import adapter_sources
from tritonbox_api.service.adapter_sources import (
    PEFT_FILES,
    SourcePolicy,
    fetch,
    local_folder,
    shown,
)
from tritonbox_api.settings import ApiSettings
from tritonbox_common.lora import AdapterError

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _peft(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name in PEFT_FILES:
        (folder / name).write_bytes(b"{}")
    return folder


@pytest.fixture
def layout(tmp_path: Path) -> SimpleNamespace:
    """An allowed root with one adapter, and an adapter outside every root."""
    root = tmp_path / "adapters"
    good = _peft(root / "good")
    secret = _peft(tmp_path / "outside" / "secret")
    policy = SourcePolicy((root.resolve(),), ("acme/*",), 1000, tmp_path / "cache", "hf_secret")
    return SimpleNamespace(root=root, good=good, secret=secret, policy=policy, tmp=tmp_path)


def _refusal(name: str, source: str, policy: SourcePolicy) -> str:
    with pytest.raises(AdapterError) as refused:
        fetch(name, source, policy)
    return str(refused.value)


def test_a_folder_in_a_root_is_allowed_absolute_or_relative(
    layout: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert fetch("a", str(layout.good), layout.policy) == layout.good.resolve()
    assert local_folder("good", layout.policy) == layout.good.resolve()  # relative to the root
    monkeypatch.chdir(layout.tmp)  # relative to the working directory, as LORA_ADAPTERS says
    found = local_folder("adapters/good", layout.policy)
    assert found is not None and found.is_absolute() and found == layout.good.resolve()
    (layout.root / "alias").symlink_to(layout.good)  # a link that stays inside is fine
    assert local_folder(str(layout.root / "alias"), layout.policy) == layout.good.resolve()


def test_traversal_and_links_out_of_the_root_are_refused(layout: Any) -> None:
    for source in (
        str(layout.secret),
        str(layout.root / ".." / "outside" / "secret"),
        "../outside/secret",
    ):
        assert local_folder(source, layout.policy) is None, source
    (layout.root / "escape").symlink_to(layout.secret)  # the folder is a link out
    assert local_folder(str(layout.root / "escape"), layout.policy) is None
    half = layout.root / "half"  # a real folder in the root whose weights are a link out
    half.mkdir()
    (half / PEFT_FILES[0]).write_bytes(b"{}")
    (half / PEFT_FILES[1]).symlink_to(layout.secret / PEFT_FILES[1])
    assert local_folder(str(half), layout.policy) is None


def test_every_refused_source_gets_one_answer(layout: Any, offline: None) -> None:
    os.chmod(layout.secret, 0o000)  # unreadable: still the same answer
    try:
        answers = {
            source: _refusal("x", source, layout.policy)
            for source in (
                str(layout.secret),  # exists, outside
                str(layout.tmp / "outside" / "nothing"),  # missing, outside
                str(layout.root / "nothing"),  # missing, inside
                str(layout.root),  # a folder inside without the files
                "evil/lora",  # a repo no pattern allows
                "acme/missing",  # an allowed repo that is not there
                "/etc",
            )
        }
    finally:
        os.chmod(layout.secret, 0o755)
    assert {a.replace(repr(s), "SOURCE") for s, a in answers.items()} == {
        "adapter x: source SOURCE is not an adapter this server may load: neither a PEFT folder "
        "in ADAPTER_DIRS nor a Hugging Face repo ADAPTER_HUB_REPOS allows, or it does not exist"
    }


class FakeHub:
    """huggingface_hub's calls, recorded: the Hub is not reachable from tests."""

    def __init__(self, sizes: dict[str, int | None]) -> None:
        self.sizes = sizes
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def model_info(self, repo: str, **options: Any) -> Any:
        self.calls.append(("model_info", {"repo": repo, **options}))
        siblings = [SimpleNamespace(rfilename=f, size=s) for f, s in self.sizes.items()]
        return SimpleNamespace(sha=COMMIT, siblings=siblings)

    def snapshot_download(self, repo: str, **options: Any) -> str:
        self.calls.append(("snapshot_download", {"repo": repo, **options}))
        return f"/hub/{COMMIT}"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    fake = FakeHub(dict.fromkeys(PEFT_FILES, 400))
    monkeypatch.setattr(adapter_sources, "HfApi", lambda: fake)
    monkeypatch.setattr(adapter_sources, "snapshot_download", fake.snapshot_download)
    monkeypatch.setattr(huggingface_hub.constants, "is_offline_mode", lambda: False)
    return fake


def test_an_allowed_repo_is_sized_then_fetched_at_that_commit_with_the_token(
    layout: Any, hub: FakeHub
) -> None:
    assert fetch("a", "acme/pirate@v1", layout.policy) == Path(f"/hub/{COMMIT}")
    (_, info), (_, download) = hub.calls
    assert info["revision"] == "v1" and info["files_metadata"] and info["token"] == "hf_secret"
    assert download["revision"] == COMMIT and download["token"] == "hf_secret"


def test_a_repo_no_pattern_allows_is_never_asked_for(layout: Any, hub: FakeHub) -> None:
    assert "is not an adapter this server may load" in _refusal("a", "evil/lora", layout.policy)
    assert "is not an adapter" in _refusal("a", "acmeX/lora", layout.policy)  # `acme/*` only
    assert hub.calls == []  # the token went nowhere


def test_an_oversized_repo_is_refused_before_a_byte_is_downloaded(
    layout: Any, hub: FakeHub
) -> None:
    hub.sizes[PEFT_FILES[1]] = 601  # 400 + 601 > 1000
    message = _refusal("big", "acme/huge", layout.policy)
    assert message == "adapter big: its files are 1001 bytes, over the limit of 1000 " \
        "(ADAPTER_MAX_BYTES)"  # fmt: skip
    assert [call for call, _ in hub.calls] == ["model_info"]
    hub.sizes[PEFT_FILES[1]] = None  # no weights file in the repo: not an adapter there
    assert "is not an adapter" in _refusal("big", "acme/huge", layout.policy)


def test_answers_show_no_server_folder(layout: Any) -> None:
    assert shown(str(layout.good.resolve()), layout.policy) == "good"
    assert shown(f"acme/pirate@{COMMIT}", layout.policy) == f"acme/pirate@{COMMIT}"
    assert shown("/somewhere/else/registered-before", layout.policy) == "registered-before"


def test_the_settings_default_root_and_patterns(tmp_path: Path) -> None:
    settings = ApiSettings(_env_file=None, cache_dir=tmp_path / "c")  # type: ignore[call-arg]
    policy = SourcePolicy.of(settings)
    assert policy.roots == ((tmp_path / "c" / "adapters").resolve(),) and policy.hub_patterns == ()
    many = ApiSettings(  # type: ignore[call-arg]
        _env_file=None, adapter_dirs=f"{tmp_path}/a, {tmp_path}/b", adapter_hub_repos="acme/*, x/y"
    )
    assert many.adapter_roots == [tmp_path / "a", tmp_path / "b"]
    assert SourcePolicy.of(many).allows_repo("x/y") and not SourcePolicy.of(many).allows_repo("x/z")
