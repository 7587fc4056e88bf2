"""Write the configuration's JSON Schema (``dpsynth config schema``) where the repository keeps it.

    .venv/stage/bin/python scripts/config_schema.py          # write (make schema)
    .venv/stage/bin/python scripts/config_schema.py --check  # exit 1 if a file is stale (tests/test_config_schema.py)

- ``pipelines/airflow/dags/dpsynth_config.schema.json``: the schema itself, beside the DAGs that build the
  trigger form from it (the Airflow environment has no dpsynth to import; the Airflow image and the chart's
  DAG ConfigMap carry that folder whole).
- ``charts/dpsynth/values.schema.json``: the same schema embedded under ``$defs.dpsynthConfig`` (it keeps its
  own ``$id``), which validates the chart's ``stage.config`` values; the rest of that file is hand-written.

The KFP pipeline reads the models themselves (``dpsynth.config.setting_schema``); ``make kfp-yaml`` recompiles it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dpsynth.config import json_schema

REPO = Path(__file__).resolve().parents[1]
DAG_SCHEMA = REPO / "pipelines" / "airflow" / "dags" / "dpsynth_config.schema.json"
VALUES_SCHEMA = REPO / "charts" / "dpsynth" / "values.schema.json"


def dumps(document: dict) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def expected() -> dict[Path, str]:
    """Each file's text as it should be, from the models."""
    schema = json_schema()
    values = json.loads(VALUES_SCHEMA.read_text(encoding="utf-8"))
    values["$defs"]["dpsynthConfig"] = schema
    return {DAG_SCHEMA: dumps(schema), VALUES_SCHEMA: dumps(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file differs")
    args = ap.parse_args(argv)
    files = expected()
    stale = [path for path, text in files.items() if not path.exists() or path.read_text(encoding="utf-8") != text]
    for path in stale:
        if args.check:
            print(f"stale: {path} (run: make schema)", file=sys.stderr)
        else:
            path.write_text(files[path], encoding="utf-8")
            print(f"wrote {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
