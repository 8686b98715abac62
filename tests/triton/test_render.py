"""Rendering the model repository from the real templates, for every flavour."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tritonbox_triton.render import (
    MARKER,
    RenderError,
    placeholder_values,
    render_repository,
    templates_dir,
)
from tritonbox_triton.settings import TritonSettings

MODELS = {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm"}


@pytest.mark.parametrize(
    ("flavour", "backend"),
    [
        ("cpu", 'backend: "python"'),
        ("trtllm", 'backend: "tensorrtllm"'),
        ("synthetic", 'backend: "python"'),
    ],
)
def test_every_flavour_renders_completely(
    request: pytest.FixtureRequest, tmp_path: Path, flavour: str, backend: str
) -> None:
    settings: TritonSettings = request.getfixturevalue(flavour)
    repository = render_repository(settings, out_dir=tmp_path / "repo")
    assert repository == (tmp_path / "repo").resolve()
    assert {path.name for path in repository.iterdir() if path.is_dir()} == MODELS
    files = [path for path in repository.rglob("*") if path.is_file()]
    assert len(files) >= 6  # four configs and two model.py at least
    for path in files:
        assert "${" not in path.read_text(), path
    engine = (repository / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'name: "tensorrt_llm"' in engine and backend in engine
    assert (repository / "tensorrt_llm" / "1").is_dir()
    assert (repository / "preprocessing" / "1" / "model.py").is_file()


def test_rerender_replaces_the_previous_repository(cpu: TritonSettings, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    render_repository(cpu, out_dir=out)
    (out / "stale_model").mkdir()
    render_repository(cpu, out_dir=out)
    assert not (out / "stale_model").exists()
    assert (out / MARKER).read_text() == "cpu\n"


def test_default_output_is_the_settings_repository(cpu: TritonSettings) -> None:
    assert render_repository(cpu) == cpu.resolved_model_repository
    assert (cpu.resolved_model_repository / "ensemble" / "config.pbtxt").is_file()


def test_refuses_to_clear_a_folder_it_did_not_render(cpu: TritonSettings, tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(RenderError, match="refusing to clear it"):
        render_repository(cpu, out_dir=out)
    assert (out / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "precious.partial").exists()


def copy_templates(tmp_path: Path) -> Path:
    copy = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy)
    return copy


def test_unknown_placeholder_names_the_key_and_the_file(
    cpu: TritonSettings, tmp_path: Path
) -> None:
    templates = copy_templates(tmp_path)
    config = templates / "postprocessing" / "config.pbtxt"
    config.write_text(
        config.read_text()
        + '\nparameters: { key: "x" value: { string_value: "${no_such_key}" } }\n'
    )
    with pytest.raises(RenderError) as raised:
        render_repository(cpu, templates_dir=templates, out_dir=tmp_path / "repo")
    assert "no_such_key" in str(raised.value)
    assert str(config) in str(raised.value)
    assert not (tmp_path / "repo").exists()


def test_unclosed_placeholder(cpu: TritonSettings, tmp_path: Path) -> None:
    templates = copy_templates(tmp_path)
    config = templates / "ensemble" / "config.pbtxt"
    config.write_text(
        config.read_text().replace("${triton_max_batch_size}", "${triton_max_batch_size")
    )
    with pytest.raises(RenderError, match="never closed"):
        render_repository(cpu, templates_dir=templates, out_dir=tmp_path / "repo")


def test_flavour_keys_do_not_leak(cpu: TritonSettings, trtllm: TritonSettings) -> None:
    assert "engine_dir" not in placeholder_values(cpu)
    assert "model_dir" not in placeholder_values(trtllm)
    assert "synthetic_token_interval_s" not in placeholder_values(cpu)


def test_synthetic_renders_the_stand_in_as_tensorrt_llm(
    synthetic: TritonSettings, tmp_path: Path, tokenizer_dir: Path
) -> None:
    settings = synthetic.model_copy(update={"synthetic_token_interval_s": 0.02})
    values = placeholder_values(settings)
    assert values["synthetic_token_interval_s"] == "0.02"
    assert "model_dir" not in values and "engine_dir" not in values
    repository = render_repository(settings, out_dir=tmp_path / "repo")
    assert (repository / MARKER).read_text() == "synthetic\n"
    engine = repository / "tensorrt_llm"
    source = templates_dir() / "tensorrt_llm_synthetic" / "1" / "model.py"
    assert (engine / "1" / "model.py").read_text() == source.read_text()
    config = (engine / "config.pbtxt").read_text()
    assert 'string_value: "0.02"' in config and f'string_value: "{tokenizer_dir}"' in config


def test_synthetic_needs_no_model_only_a_tokenizer(
    synthetic: TritonSettings, tmp_path: Path
) -> None:
    # MODEL_DIR is not read by the synthetic engine: a missing one matters only as the tokenizer.
    without_model = synthetic.model_copy(update={"model_dir": tmp_path / "no_model"})
    assert "model_dir" not in placeholder_values(without_model)
    settings = synthetic.model_copy(update={"tokenizer_dir": tmp_path})
    with pytest.raises(RenderError, match=r"has no tokenizer.json or tokenizer_config.json"):
        placeholder_values(settings)


def test_engine_template_must_be_named_tensorrt_llm(cpu: TritonSettings, tmp_path: Path) -> None:
    templates = copy_templates(tmp_path)
    config = templates / "tensorrt_llm_cpu" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "tensorrt_llm"', 'name: "engine"'))
    with pytest.raises(RenderError, match="declares name 'engine', served as 'tensorrt_llm'"):
        render_repository(cpu, templates_dir=templates, out_dir=tmp_path / "repo")


def test_missing_template_folder(cpu: TritonSettings, tmp_path: Path) -> None:
    templates = copy_templates(tmp_path)
    shutil.rmtree(templates / "tensorrt_llm_cpu")
    with pytest.raises(
        RenderError, match=r"tensorrt_llm_cpu/config\.pbtxt: the template is missing"
    ):
        render_repository(cpu, templates_dir=templates, out_dir=tmp_path / "repo")


def test_missing_engine_dir(trtllm: TritonSettings, tmp_path: Path) -> None:
    settings = trtllm.model_copy(update={"engine_dir": tmp_path / "nowhere"})
    with pytest.raises(RenderError, match=r"engine_dir: .*nowhere is not a directory"):
        render_repository(settings, out_dir=tmp_path / "repo")


def test_engine_dir_without_config(trtllm: TritonSettings, engine_dir: Path) -> None:
    (engine_dir / "config.json").unlink()
    with pytest.raises(RenderError, match=r"has no config.json"):
        placeholder_values(trtllm)


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (
            {"max_batch_size": 128},
            r"MAX_BATCH_SIZE=128 is more than the engine was built for \(64\)",
        ),
        (
            {"max_input_len": 4096},
            r"MAX_INPUT_LEN=4096 is more than the engine was built for \(3000\)",
        ),
        ({"tensor_parallelism": 2}, "TENSOR_PARALLELISM=2 but the engine .* was built for 1"),
    ],
)
def test_settings_must_fit_the_engine_build(
    trtllm: TritonSettings, update: dict[str, int], message: str
) -> None:
    with pytest.raises(RenderError, match=message):
        placeholder_values(trtllm.model_copy(update=update))


def test_missing_model_dir(cpu: TritonSettings, tmp_path: Path) -> None:
    settings = cpu.model_copy(update={"model_dir": tmp_path / "no_model"})
    with pytest.raises(RenderError, match=r"model_dir: .*no_model is not a directory"):
        placeholder_values(settings)


def test_tokenizer_dir_needs_tokenizer_files(trtllm: TritonSettings, tmp_path: Path) -> None:
    settings = trtllm.model_copy(update={"tokenizer_dir": tmp_path})
    with pytest.raises(RenderError, match=r"has no tokenizer.json or tokenizer_config.json"):
        placeholder_values(settings)


def test_a_quote_in_a_path_cannot_break_the_config(cpu: TritonSettings, tmp_path: Path) -> None:
    odd = tmp_path / 'tok"enizer'
    odd.mkdir()
    (odd / "tokenizer.json").write_text("{}")
    with pytest.raises(RenderError, match=r"tokenizer_dir: .* contains a quote"):
        placeholder_values(cpu.model_copy(update={"tokenizer_dir": odd}))


def test_output_must_not_overlap_the_templates(cpu: TritonSettings) -> None:
    with pytest.raises(RenderError, match="must not overlap"):
        render_repository(cpu, out_dir=templates_dir() / "rendered")
