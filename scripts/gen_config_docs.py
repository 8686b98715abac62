"""Regenerate `.env.example` and README.md's configuration table from the settings classes."""

from __future__ import annotations

from pathlib import Path

from tritonbox_triton.config_docs import env_example, markdown_table, with_table

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    (REPO / ".env.example").write_text(env_example())
    readme = REPO / "README.md"
    readme.write_text(with_table(readme.read_text(), markdown_table()))


if __name__ == "__main__":
    main()
