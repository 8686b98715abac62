"""Regenerate `.env.example` and README.md's tables: settings (from the settings classes) and
generation parameters (from tritonbox_common.parameters)."""

from __future__ import annotations

from pathlib import Path

from tritonbox_api.parameter_docs import parameter_table
from tritonbox_common.config_docs import env_example, markdown_table, with_table

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    (REPO / ".env.example").write_text(env_example())
    readme = REPO / "README.md"
    text = with_table(readme.read_text(), markdown_table())
    readme.write_text(with_table(text, parameter_table(), name="parameter-table"))


if __name__ == "__main__":
    main()
