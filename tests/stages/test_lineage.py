"""What code ran (#55 item 7): in an image (no git checkout) the code version comes from ``DPSYNTH_GIT_SHA``, and
every stage manifest and MLflow run, the release card and the registered version record the commit and the
image (``DPSYNTH_IMAGE``): :func:`check_lineage`, on tests/stages/test_pipeline.py's tracked pipeline run (made with
both set: one tracked DPGAN pipeline run for that module's checks and these)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from dpsynth import __version__, storage, tracking
from dpsynth.stages import protocol

SHA = "0123456789abcdef0123456789abcdef01234567"
IMAGE = "registry.example/dpsynth-stage@sha256:" + "ab" * 32
REPO = Path(__file__).resolve().parents[2]


def _code_version_outside_git(tmp_path, **env) -> str:
    """``tracking.code_version()`` of a copy of the package outside any git checkout, as an image holds it."""
    shutil.copytree(REPO / "components" / "dpsynth", tmp_path / "site" / "dpsynth",
                    ignore=shutil.ignore_patterns("__pycache__"))
    base = {k: v for k, v in os.environ.items() if k not in ("DPSYNTH_GIT_SHA", "PYTHONPATH")}
    done = subprocess.run([sys.executable, "-c", "from dpsynth import tracking; print(tracking.code_version())"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**base, "PYTHONPATH": str(tmp_path / "site"), **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_in_an_image_the_code_version_is_the_built_commit(tmp_path):
    assert _code_version_outside_git(tmp_path, DPSYNTH_GIT_SHA=SHA) == f"{__version__}+{SHA[:12]}"


def test_an_image_built_without_a_commit_says_only_the_version(tmp_path):
    assert _code_version_outside_git(tmp_path, DPSYNTH_GIT_SHA="unknown") == __version__


def check_lineage(run, uri, experiment, pipeline_run_ids) -> None:
    """Every stage's manifest, every MLflow run of the pipeline runs PIPELINE_RUN_IDS (in EXPERIMENT), the release
    card and the registered version 1 record SHA and IMAGE (the runs made with DPSYNTH_GIT_SHA=SHA and
    DPSYNTH_IMAGE=IMAGE)."""
    from mlflow import MlflowClient

    expected = {"code_version": f"{__version__}+{SHA[:12]}", "git_sha": SHA, "image": IMAGE}
    for stage in protocol.STAGES:
        zone = protocol.ZONE[stage]
        m = json.loads(storage.read_bytes(f"{run}/{zone}/{stage}/manifest.json"))
        assert {k: m[k] for k in expected} == expected, stage
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment).experiment_id
    runs = [r for i in pipeline_run_ids
            for r in client.search_runs([exp], f"tags.`{tracking.TAG_PIPELINE_RUN_ID}` = '{i}'")]
    assert len(runs) >= 7 * len(pipeline_run_ids)  # the parent and one per stage, of each
    for r in runs:
        assert r.data.tags[tracking.TAG_GIT_SHA] == SHA and r.data.tags[tracking.TAG_IMAGE] == IMAGE, r.data.tags
        assert r.data.tags[tracking.TAG_CODE_VERSION] == expected["code_version"]
    card = json.loads((run / "release" / "card" / "card.json").read_text())
    assert {k: card[k] for k in expected} == expected
    assert all(row["image"] == IMAGE for row in card["stages"])
    assert f"<code>{SHA}</code>" in (run / "release" / "card" / "card.html").read_text()
    version = client.get_model_version("dpsynth-mnist600-dpgan", "1")
    assert version.tags[tracking.TAG_GIT_SHA] == SHA and version.tags[tracking.TAG_IMAGE] == IMAGE
    assert version.tags[tracking.TAG_CODE_VERSION] == expected["code_version"]
