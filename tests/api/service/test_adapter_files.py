"""Where an adapter's files come from, and whether they fit the served base.

A source is a local folder in an allowed root, or a Hugging Face repo id an allowed pattern
matches, fetched by the real huggingface_hub into CACHE_DIR/hub (what is not allowed:
test_adapter_sources.py). The hub is not reachable from tests: offline mode makes
huggingface_hub answer from its cache, laid out as a download leaves it
(tritonbox_testing.lora.hub_snapshot). The fit checks refuse, by name, what the engine cannot
serve; the route turns each refusal into a 400 (tests/api/routes)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from tritonbox_testing.lora import ALL, hub_snapshot, make_adapter

from tritonbox_api.service.adapter_files import check_fits, pinned, read
from tritonbox_api.service.adapter_sources import SourcePolicy
from tritonbox_api.service.adapter_sources import fetch as fetch_from
from tritonbox_api.triton_gateway import LoraSupport
from tritonbox_common.lora import AdapterError
from tritonbox_triton.prepare_model import prepare_default_model

REPO_ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = REPO_ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LATER = "89abcdef0123456789abcdef0123456789abcdef"  # main, once the owner pushed other weights


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prepare_default_model(MODEL_DIR)  # once per machine, as the server tests' fixture does
    return make_adapter(MODEL_DIR, tmp_path_factory.mktemp("peft") / "a", 7, r=4,
                        target_modules=["q_proj"])  # fmt: skip


def fetch(name: str, source: str, *, cache_dir: Path, token: str | None) -> Path:
    """The adapter files' folder, with pytest's temporary folders and acme/* allowed."""
    roots = (Path(tempfile.gettempdir()).resolve(),)
    policy = SourcePolicy(roots, ("acme/*",), 1 << 30, cache_dir, token)
    return fetch_from(name, source, policy)


def test_a_local_folder_is_used_where_it_is(adapter: Path, tmp_path: Path) -> None:
    assert fetch("local", str(adapter), cache_dir=tmp_path, token=None) == adapter.resolve()


def test_a_repo_id_comes_from_the_hub_cache(adapter: Path, tmp_path: Path, offline: None) -> None:
    snapshot = hub_snapshot(tmp_path, "acme/pirate-lora", adapter, COMMIT)
    folder = fetch("pirate", "acme/pirate-lora", cache_dir=tmp_path, token=None)
    assert folder == snapshot
    assert read("pirate", folder).rank == 4


def test_a_revision_after_the_at_sign(adapter: Path, tmp_path: Path, offline: None) -> None:
    snapshot = hub_snapshot(tmp_path, "acme/pirate-lora", adapter, COMMIT, ref="v1")
    assert fetch("pirate", "acme/pirate-lora@v1", cache_dir=tmp_path, token=None) == snapshot


def test_a_repo_id_is_pinned_to_the_commit_it_resolved_to(
    adapter: Path, tmp_path: Path, offline: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    hub_snapshot(tmp_path, "acme/pirate-lora", adapter, COMMIT)
    folder = fetch("pirate", "acme/pirate-lora", cache_dir=tmp_path, token=None)
    recorded = pinned("acme/pirate-lora", folder, local=False)
    assert recorded == f"acme/pirate-lora@{COMMIT}"
    checked = read("pirate", folder).sha256

    # main moves on: the bare repo id follows it, the recorded source still reads what was checked
    other = make_adapter(MODEL_DIR, tmp_path_factory.mktemp("peft") / "b", 11, r=4,
                         target_modules=["q_proj"])  # fmt: skip
    hub_snapshot(tmp_path, "acme/pirate-lora", other, LATER)
    moved = fetch("pirate", "acme/pirate-lora", cache_dir=tmp_path, token=None)
    assert read("pirate", moved).sha256 != checked
    again = fetch("pirate", recorded, cache_dir=tmp_path, token=None)
    assert again == folder and read("pirate", again).sha256 == checked

    # A branch or tag is pinned too; a commit is kept as given, a local folder as the folder.
    assert pinned("acme/pirate-lora@v1", folder, local=False) == f"acme/pirate-lora@{COMMIT}"
    assert pinned(f"acme/pirate-lora@{LATER}", moved, local=False) == f"acme/pirate-lora@{LATER}"
    assert pinned("../a", adapter.resolve(), local=True) == str(adapter.resolve())


def test_what_cannot_be_fetched_names_the_adapter(tmp_path: Path, offline: None) -> None:
    refused = r"adapter ghost: source 'acme/missing' is not an adapter this server may load"
    with pytest.raises(AdapterError, match=refused):
        fetch("ghost", "acme/missing", cache_dir=tmp_path, token=None)
    with pytest.raises(AdapterError, match=r"adapter odd: source 'not a repo' is not an adapter"):
        fetch("odd", "not a repo", cache_dir=tmp_path, token=None)
    # Sources no folder can have (schemathesis found each a 500): refused the same way.
    for source in ("0" * 5000, "~nobody-here-at-all/x", "a\x00b"):
        with pytest.raises(AdapterError, match=r"adapter odd: source .* is not an adapter"):
            fetch("odd", source, cache_dir=tmp_path, token=None)


# What the cpu engine takes with MAX_LORA_RANK=8.
CPU = LoraSupport(max_rank=8, target_modules=tuple(ALL), weights_datatype="FP32")


def _fits(name: str, folder: Path, support: LoraSupport = CPU, model_dir: Path = MODEL_DIR) -> None:
    check_fits(name, read(name, folder), support=support, model_dir=model_dir,
               model_name=MODEL_DIR.name)  # fmt: skip


def test_the_rank_is_checked_against_max_lora_rank(adapter: Path) -> None:
    _fits("four", adapter, CPU)  # r=4 under 8
    _fits("four", adapter, LoraSupport(4, tuple(ALL), "FP32"))  # the maximum itself is allowed
    with pytest.raises(AdapterError, match=r"^adapter four: rank 4 is over .* maximum of 2 "):
        _fits("four", adapter, LoraSupport(2, tuple(ALL), "FP32"))
    with pytest.raises(AdapterError, match=r"^adapter four: this engine serves no adapters"):
        _fits("four", adapter, LoraSupport(0, (), "FP32"))


def test_target_modules_the_engine_lacks_are_refused(
    adapter: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A TensorRT-LLM engine built with --lora_target_modules attn_q attn_v takes only q and v.
    attention = LoraSupport(8, ("q_proj", "v_proj"), "FP16")
    _fits("q", adapter, attention)
    mlp = make_adapter(MODEL_DIR, tmp_path_factory.mktemp("peft") / "mlp", 8, r=2,
                       target_modules=["q_proj", "up_proj", "down_proj"])  # fmt: skip
    lacking = r"^adapter mlp: target modules \['down_proj', 'up_proj'\] are not among"
    with pytest.raises(AdapterError, match=lacking):
        _fits("mlp", mlp, attention)
    # A module no engine has (the output head) is refused when the files are read.
    head = make_adapter(MODEL_DIR, tmp_path_factory.mktemp("peft") / "head", 9, r=2,
                        target_modules=["lm_head"])  # fmt: skip
    with pytest.raises(AdapterError, match=r"^adapter head: .*unexpected tensor .*lm_head"):
        read("head", head)


def _other_base(tmp_path: Path, **changes: int) -> Path:
    """The served base's folder name and config, but with other shapes (a renamed folder)."""
    model_dir = tmp_path / MODEL_DIR.name
    model_dir.mkdir(parents=True)
    config = json.loads((MODEL_DIR / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | changes))
    return model_dir


def test_an_adapter_must_fit_the_bases_shapes(adapter: Path, tmp_path: Path) -> None:
    config = json.loads((MODEL_DIR / "config.json").read_text())
    wider = _other_base(tmp_path / "wider", hidden_size=config["hidden_size"] * 2)
    message = (
        rf"^adapter q: layer 0 q_proj maps {config['hidden_size']} → .* features, but the base "
        rf"model's maps {config['hidden_size'] * 2} → .*\(an adapter for another base model\)"
    )
    with pytest.raises(AdapterError, match=message):
        _fits("q", adapter, model_dir=wider)
    shallower = _other_base(tmp_path / "shallower", num_hidden_layers=2)
    with pytest.raises(AdapterError, match=r"^adapter q: has layer 2, but the base model has 2 "):
        _fits("q", adapter, model_dir=shallower)
    _fits("q", adapter, model_dir=_other_base(tmp_path / "same"))  # the same shapes fit
