"""Unknown `.env` keys are an error, and `.env.example` documents every setting."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from tritonbox_common.env_file import (
    EnvFileError,
    check_env_file,
    known_env_keys,
    load_service_settings,
    settings_classes,
)
from tritonbox_common.shared_settings import env_fields
from tritonbox_triton.settings import TritonSettings

EXAMPLE = Path(__file__).resolve().parents[2] / ".env.example"
# `KEY=value` or a commented-out `# KEY=` (keys without a default).
ASSIGNMENT = re.compile(r"^(?:# )?([A-Z][A-Z0-9_]*)=(.*)$")


def test_known_keys_are_the_settings_fields_in_upper_case() -> None:
    keys = known_env_keys()
    assert {
        "ENGINE",
        "MAX_BATCH_SIZE",
        "KV_CACHE_FREE_GPU_MEM_FRACTION",
        "TRITON_GRPC_PORT",
    } <= keys
    assert set(env_fields(TritonSettings)) <= {key.lower() for key in keys}


def test_resolved_folders_have_no_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the model is has one key per fact (ENGINE_REPOSITORY, TOKENIZER_REPOSITORY); the
    # folders they resolve to are derived at start, never read from the environment or `.env`.
    assert not {"MODEL_DIR", "ENGINE_DIR", "TOKENIZER_DIR"} & known_env_keys()
    env = tmp_path / ".env"
    env.write_text("MODEL_DIR=/somewhere\n")
    with pytest.raises(EnvFileError, match="unknown key MODEL_DIR"):
        load_service_settings(TritonSettings, env)
    monkeypatch.setenv("ENGINE_DIR", "/elsewhere")
    assert TritonSettings(_env_file=None).engine_dir is None  # type: ignore[call-arg]
    assert TritonSettings(_env_file=None, engine_dir=tmp_path).engine_dir == tmp_path  # type: ignore[call-arg]


def test_known_keys_of_more_classes_with_a_prefix() -> None:
    class ApiSettings(BaseSettings):
        model_config = {"env_prefix": "api_"}
        database_path: str = "x"

    assert "API_DATABASE_PATH" in known_env_keys((TritonSettings, ApiSettings))


def test_a_missing_file_is_fine(tmp_path: Path) -> None:
    check_env_file(tmp_path / ".env", known_env_keys())


def test_known_keys_pass_in_any_case(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("# a comment\n\nENGINE=cpu\nexport MAX_BATCH_SIZE=4\nmax_input_len=10\n")
    check_env_file(env, known_env_keys())


def test_unknown_keys_are_listed_with_suggestions(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("ENGINE=cpu\nMAX_BATCH_SIZ=4\n\n# comment\nKV_CACHE_MAX_TOKEN=1\nZZZ=1\n")
    with pytest.raises(EnvFileError) as raised:
        check_env_file(env, known_env_keys())
    message = str(raised.value)
    assert f"{env} has 3 problem(s)" in message
    assert "line 2: unknown key MAX_BATCH_SIZ (did you mean MAX_BATCH_SIZE?)" in message
    assert "line 5: unknown key KV_CACHE_MAX_TOKEN (did you mean KV_CACHE_MAX_TOKENS?)" in message
    assert "line 6: unknown key ZZZ\n" in message + "\n"
    assert "ZZZ (did you mean" not in message


def test_a_line_that_cannot_be_parsed_is_reported(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("ENGINE=cpu\nthis is not an assignment\n")
    with pytest.raises(EnvFileError, match="line 2: cannot parse 'this is not an assignment'"):
        check_env_file(env, known_env_keys())


def test_env_example_documents_every_setting_with_its_default() -> None:
    check_env_file(EXAMPLE, known_env_keys())
    lines = EXAMPLE.read_text().splitlines()
    documented: dict[str, str] = {}
    for index, line in enumerate(lines):
        match = ASSIGNMENT.match(line)
        if match is None:
            continue
        key, value = match.groups()
        assert lines[index - 1].startswith("# ") and not ASSIGNMENT.match(lines[index - 1]), (
            f"{key} needs a one-line description above it"
        )
        documented[key] = value
    fields = {name: f for cls in settings_classes() for name, f in env_fields(cls).items()}
    assert set(documented) == {name.upper() for name in fields}
    for name, field in fields.items():
        default = field.default
        shown = documented[name.upper()]
        if default is None:
            assert shown == "", f"{name.upper()} has no default: leave it commented out and empty"
        elif isinstance(default, bool):
            assert shown == str(default).lower(), name
        else:
            assert shown == str(getattr(default, "value", default)), name


def test_env_example_values_are_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TritonSettings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    factory: Any = TritonSettings  # mypy does not know BaseSettings' `_env_file` option
    assert factory(_env_file=EXAMPLE) == factory(_env_file=None)
