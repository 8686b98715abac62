"""docs/api.md's table of generation parameters, generated from `parameters` (never by hand)."""

from __future__ import annotations

from tritonbox_common.parameters import ALL_PARAMETERS


def parameter_table() -> str:
    lines = ["| parameter | default | limits | meaning |", "|---|---|---|---|"]
    for parameter in ALL_PARAMETERS:
        default = "–" if parameter.default is None else f"`{parameter.default}`"
        lines.append(
            f"| `{parameter.name}` | {default} | {parameter.limits() or '–'} | {parameter.hint} |"
        )
    return "\n".join(lines)
