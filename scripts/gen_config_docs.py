"""Regenerate `.env.example` and the generated tables in docs/: settings (docs/configuration.md,
from the settings classes) and generation parameters (docs/api.md, from
tritonbox_common.parameters)."""

from __future__ import annotations

from pathlib import Path

from tritonbox_common.config_docs import env_example, markdown_table, with_table
from tritonbox_common.parameter_docs import parameter_table

REPO = Path(__file__).resolve().parent.parent
CONFIGURATION_DOC = REPO / "docs" / "configuration.md"
API_DOC = REPO / "docs" / "api.md"


def main() -> None:
    (REPO / ".env.example").write_text(env_example())
    CONFIGURATION_DOC.write_text(with_table(CONFIGURATION_DOC.read_text(), markdown_table()))
    API_DOC.write_text(with_table(API_DOC.read_text(), parameter_table(), name="parameter-table"))


if __name__ == "__main__":
    main()
