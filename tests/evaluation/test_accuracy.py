"""gen2real / real2gen / calibrated accuracy and the classifier suite, on real MNIST records."""

import dataclasses

import numpy as np
import pytest

from dpsynth.config import load_config
from dpsynth.evaluation import accuracy, classifiers


def parts(mnist):
    """"Generated" data that is real data: a classifier's gen2real then matches its real accuracy."""
    return dict(synthetic=mnist.subset(np.arange(0, 600)), validation=mnist.subset(np.arange(600, 700)),
                fit_real=mnist.subset(np.arange(1000, 1600)), test_real=mnist.subset(np.arange(2000, 2500)))


def test_real_data_as_generated_data_is_fully_useful(mnist):
    cfg = load_config(overrides=["evaluate.classifier=logreg"])
    u = accuracy.utility(cfg, **parts(mnist), names=("logreg",))
    (row,) = u["classifiers"]
    assert row["real"] > 0.8 and row["calibrated"] == pytest.approx(1, abs=0.05) and row["real2gen"] > 0.8
    assert u["average"]["gen2real"] == row["gen2real"]
    test = parts(mnist)["test_real"]
    counts = np.bincount(test.labels, minlength=10)
    per_class = row["gen2real_per_class"]
    assert sum(a * c for a, c in zip(per_class, counts)) / counts.sum() == pytest.approx(row["gen2real"])


def test_generated_data_with_wrong_labels_is_useless(mnist):
    cfg = load_config()
    p = parts(mnist)
    shuffled = dataclasses.replace(p["synthetic"], labels=np.random.default_rng(0).permutation(p["synthetic"].labels))
    (row,) = accuracy.utility(cfg, **{**p, "synthetic": shuffled}, names=("logreg",))["classifiers"]
    assert row["gen2real"] < 0.25 and row["real2gen"] < 0.25 and row["calibrated"] < 0.3


def test_torch_training_keeps_the_best_epoch_on_validation(mnist):
    p = parts(mnist)
    x, y = p["synthetic"].to_tensors()
    val = p["validation"].to_tensors()
    model = classifiers.build("mlp", p["synthetic"], seed=3)
    chosen = classifiers.fit(model, x, y, epochs=4, seed=3, validation=val)
    # brute force: the same seeded run stopped after e epochs, for every e
    by_epoch = []
    for e in range(1, 5):
        m = classifiers.build("mlp", p["synthetic"], seed=3)
        classifiers.fit(m, x, y, epochs=e, seed=3)
        by_epoch.append(classifiers.accuracy(m, *val))
    assert chosen["validation_accuracy"] == max(by_epoch)
    assert chosen["selected_epoch"] == 1 + int(np.argmax(by_epoch))
    assert classifiers.accuracy(model, *val) == max(by_epoch)


def test_xgboost_is_reported_skipped_when_absent(mnist):
    try:
        import xgboost  # noqa: F401
    except ImportError:
        (row,) = accuracy.utility(load_config(), **parts(mnist), names=("xgboost",))["classifiers"]
        assert row == {"classifier": "xgboost", "skipped": "xgboost not installed"}
    else:
        pytest.skip("xgboost is installed here")


@pytest.mark.slow
def test_full_suite(mnist):
    cfg = load_config(overrides=["evaluate.suite=full", "evaluate.epochs=2"])
    small = {k: v.subset(np.arange(min(len(v), 300))) for k, v in parts(mnist).items()}
    u = accuracy.utility(cfg, **small, names=accuracy.suite(cfg))
    rows = {r["classifier"]: r for r in u["classifiers"]}
    assert tuple(rows) == accuracy.FULL_SUITE
    ran = [r for r in rows.values() if "skipped" not in r]
    assert len(ran) >= 12
    for r in ran:
        assert 0 <= r["gen2real"] <= 1 and 0 <= r["real2gen"] <= 1
        assert r["real"] > 0.3, r  # every classifier learns something from 300 real MNIST records
    assert u["average"]["gen2real"] == pytest.approx(np.mean([r["gen2real"] for r in ran]))
