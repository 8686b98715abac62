"""Made tritonbox-0.1.0.db (checked in beside this script): a prediction database written by the
api's own code of release 0.1.0 (commit 62a2e11, before migrations), for the upgrade test.

Run once from the repository root: `PYTHONSAFEPATH=1 .venv/bin/python
tests/api/db/data/make_legacy_db.py`. It reads that release's db package from git history
into a temporary folder and writes rows through its own crud functions.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

RELEASE = "62a2e11"
HERE = Path(__file__).resolve().parent
TARGET = HERE / "tritonbox-0.1.0.db"


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        package = Path(folder) / "legacy_db"
        package.mkdir()
        (package / "__init__.py").write_text("")
        for module in ("models", "crud", "session"):
            source = subprocess.run(
                ["git", "show", f"{RELEASE}:api/tritonbox_api/db/{module}.py"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            (package / f"{module}.py").write_text(source.replace("tritonbox_api.db", "legacy_db"))
        sys.path.insert(0, folder)
        from legacy_db import crud
        from legacy_db.models import FinishReason, Source, Status
        from legacy_db.session import Database

        TARGET.unlink(missing_ok=True)
        database = Database(TARGET)
        database.open()
        base = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
        with database.session() as session:
            for index in range(30):
                row = crud.create_prediction(
                    session=session,
                    id=f"legacy{index:03d}",
                    source=list(Source)[index % 4],
                    model="tiny-model",
                    input={"prompt": f"Bonjour é {index}", "max_tokens": 8},
                    applied={"prompt": f"Bonjour é {index}", "max_tokens": 8, "seed": index},
                    prompt_tokens=4,
                )
                # Pairs share a created_at, as concurrent inserts do: the id breaks the tie.
                row.created_at = row.started_at = base + timedelta(seconds=index // 2)
                session.add(row)
                session.commit()
                if index % 5 == 4:
                    continue  # left running: the api stopped before it finished
                ending = index % 3
                crud.complete_prediction(
                    session=session,
                    id=row.id,
                    status=(Status.SUCCEEDED, Status.FAILED, Status.CANCELED)[ending],
                    output=f"Salut {index}",
                    finish_reason=(FinishReason.STOP, FinishReason.ERROR, FinishReason.CANCELED)[
                        ending
                    ],
                    error="boom" if ending == 1 else None,
                    completion_tokens=3,
                    time_to_first_token_s=0.1,
                    total_time_s=0.5,
                )
        database.close()
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
