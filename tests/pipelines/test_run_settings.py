"""#55 item 5: the allow-list of the settings a trigger may give (``dpsynth.config.RUN_SETTINGS``)."""

from __future__ import annotations

import json
from pathlib import Path

from dpsynth.config import RUN_SETTINGS, SETTING_OWNERS, json_schema, refusal, run_settings

DAG_SCHEMA = Path(__file__).resolve().parents[2] / "pipelines" / "airflow" / "dags" / "dpsynth_config.schema.json"


def every_setting() -> list[str]:
    schema = json_schema()
    return [f"{section}.{field}" for section, ref in schema["properties"].items()
            for field in schema["$defs"][ref["$ref"].rsplit("/", 1)[1]]["properties"]]


def test_every_entry_names_settings_that_exist():
    names = every_setting()
    for entry in RUN_SETTINGS:  # a typo would silently allow nothing
        section, field = entry.split(".")
        assert any(n.startswith(f"{section}.") for n in names) if field == "*" else entry in names, entry


def test_the_platforms_settings_are_not_a_runs():
    allowed = set(run_settings())
    for name in ("tracking.enabled", "tracking.uri", "tracking.experiment", "ledger.url", "ledger.population_id",
                 "ledger.stale_after_hours", "partition.key", "privacy.accounting", "privacy.accountant",
                 "privacy.secure_mode", "audit.confidence", "audit.canaries", "data.public_fraction_unprotected",
                 "data.public_fraction", "data.public_source", "data.num_classes", "evaluate.reference_uri",
                 "output.dir", "pipeline.run_dir"):
        assert name not in allowed, name
        line = refusal(f"{name}=x")
        assert line.startswith(f"{name}: not a run's setting; ") and line.endswith(" sets it") and "\n" not in line
        assert len(line) < 200, line
    assert refusal("bogus.x=1") == "bogus.x: no such setting (`dpsynth config schema` lists them)"
    for name in ("train.steps", "privacy.epsilon", "partition.num_shards", "audit.empirical", "data.uri"):
        assert refusal(f"{name}=1") is None


def test_the_dags_read_the_same_lists():
    """The Airflow DAGs cannot import dpsynth: the exported schema carries both lists (scripts/config_schema.py)."""
    exported = json.loads(DAG_SCHEMA.read_text())
    assert exported["x-dpsynth-run-settings"] == list(run_settings())
    assert exported["x-dpsynth-owners"] == SETTING_OWNERS
