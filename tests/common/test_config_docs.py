"""`.env.example` and docs/configuration.md's settings table match the settings classes."""

from __future__ import annotations

from pathlib import Path

from tritonbox_common.config_docs import env_example, markdown_table, with_table
from tritonbox_common.env_file import check_env_file, known_env_keys, settings_classes

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "run `.venv/bin/python scripts/gen_config_docs.py`"


def test_env_example_is_generated_from_the_settings() -> None:
    assert (REPO / ".env.example").read_text() == env_example(), REGENERATE


def test_configuration_table_is_generated_from_the_settings() -> None:
    document = (REPO / "docs" / "configuration.md").read_text()
    assert document == with_table(document, markdown_table()), REGENERATE


def test_env_example_has_only_known_keys() -> None:
    check_env_file(REPO / ".env.example", known_env_keys())


def test_every_setting_is_documented() -> None:
    text = env_example()
    for key in known_env_keys():
        assert f"{key}=" in text


def test_a_key_read_by_several_services_has_one_definition() -> None:
    definitions: dict[str, set[tuple[str, str]]] = {}
    for cls in settings_classes():
        for name, field in cls.model_fields.items():
            definitions.setdefault(name, set()).add((repr(field.get_default()), repr(field)))
    differing = {name: found for name, found in definitions.items() if len(found) > 1}
    assert not differing, "define shared keys once, in tritonbox_common.shared_settings"


def test_a_shared_key_is_documented_once() -> None:
    keys = [line.split("=")[0].lstrip("# ") for line in env_example().splitlines() if "=" in line]
    keys = [key for key in keys if key.isupper()]
    assert len(keys) == len(set(keys))
