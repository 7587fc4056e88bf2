"""dpsynth evaluate: a classifier trained on the synthetic data, tested once on the held-out real records."""

import json

import numpy as np
import pytest

from dpsynth.data import read_parquet
from tests.stages.helpers import manifest, stage, stages


@pytest.fixture(scope="module")
def released(tmp_path_factory, source):
    run = tmp_path_factory.mktemp("evaluate") / "run"
    stages(run, source, "partition", "warmstart", "train", "audit", "sample")
    return run


@pytest.mark.parametrize("classifier", ["logreg", "cnn"])
def test_accuracy_on_heldout_records(released, source, classifier):
    assert stage("evaluate", released, source, f"evaluate.classifier={classifier}", "evaluate.epochs=1") == 0
    m = manifest(released, "release", "evaluate")
    report = json.loads((released / "release" / "evaluate" / "report.json").read_text())
    heldout = next(o for o in manifest(released, "sensitive", "partition")["outputs"] if o["role"] == "heldout")
    assert [i["role"] for i in m["inputs"]] == ["sample_manifest", "partition_manifest", "synthetic", "heldout"]
    assert m["outputs"][0]["zone"] == "release" and m["privacy"]["epsilon"] == 0
    acc = report["classifier_accuracy"]
    assert acc["classifier"] == classifier and 0 <= acc["accuracy"] <= 1
    assert report["test"]["records"] == heldout["rows"] and report["train"]["records"] == 200
    labels = read_parquet(heldout["uri"]).labels
    counts = np.bincount(labels, minlength=10)
    weighted = sum(a * c for a, c in zip(acc["per_class_accuracy"], counts) if a is not None) / counts.sum()
    assert weighted == pytest.approx(acc["accuracy"])  # per-class accuracies add up to the overall one
    assert "no model selection" in report["heldout_data"]


def test_needs_the_released_sample(tmp_path, source, capsys):
    stages(tmp_path / "run", source, "partition")
    assert stage("evaluate", tmp_path / "run", source) == 2
    assert "no manifest" in capsys.readouterr().err
