"""Utility: gen2real and real2gen accuracy (Chen et al. 2023, §5.1) over the classifiers of
GS-WGAN's Tables A1–A2, and calibrated accuracy (gen2real ÷ the same classifier trained on real).

* gen2real: trained on generated data, tested on the real test data.
* real: the same classifier trained on real data (``fit_real``), tested on the same real test
  data — the denominator of the calibrated accuracy.
* real2gen: that real-trained classifier, tested on generated data (labels are the ones the
  generator was asked for).

The scikit-learn classifiers use scikit-learn's defaults, as GS-WGAN's supplement (C.3) says
(logistic regression gets ``evaluate.max_iter`` iterations). CNN and MLP pick their epoch on
held-out generated data; nothing is ever selected on the real test data.
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from dpsynth.data import ImageDataset
from dpsynth.evaluation import classifiers

TORCH = ("cnn", "mlp", "resnet")


def _sklearn(cfg) -> dict[str, Callable]:
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.ensemble import AdaBoostClassifier, BaggingClassifier, GradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import BernoulliNB, GaussianNB
    from sklearn.svm import LinearSVC
    from sklearn.tree import DecisionTreeClassifier

    seed = cfg.evaluate.seed
    return {
        "logreg": lambda: LogisticRegression(max_iter=cfg.evaluate.max_iter, random_state=seed),
        "random_forest": lambda: RandomForestClassifier(random_state=seed),
        "gaussian_nb": GaussianNB,
        "bernoulli_nb": BernoulliNB,
        "linear_svc": lambda: LinearSVC(random_state=seed),
        "decision_tree": lambda: DecisionTreeClassifier(random_state=seed),
        "lda": LinearDiscriminantAnalysis,
        "adaboost": lambda: AdaBoostClassifier(random_state=seed),
        "bagging": lambda: BaggingClassifier(random_state=seed),
        "gbm": lambda: GradientBoostingClassifier(random_state=seed),
        "xgboost": lambda: _xgboost(seed),
    }


def _xgboost(seed: int):
    import xgboost  # optional: not in the stage image's lock; ImportError means "skipped"

    return xgboost.XGBClassifier(random_state=seed)


FULL_SUITE = ("cnn", "mlp", "adaboost", "bagging", "bernoulli_nb", "decision_tree", "gaussian_nb", "gbm", "lda",
              "linear_svc", "logreg", "random_forest", "xgboost")  # the rows of Tables A1–A2


QUICK_EXTRA = "logreg"  # seconds, beside the headline classifier of the quick suite


def suite(cfg) -> tuple[str, ...]:
    """full: every classifier of Tables A1–A2; quick: ``evaluate.classifier`` (the headline) and logreg."""
    if cfg.evaluate.suite == "full":
        return FULL_SUITE
    return tuple(dict.fromkeys((cfg.evaluate.classifier, QUICK_EXTRA)))


def flat(ds: ImageDataset) -> np.ndarray:
    return ds.images.reshape(len(ds), -1).astype(np.float32) / 255.0


def epochs(name: str, cfg) -> int:
    """Passes over the training data: ``evaluate.resnet_epochs`` for the ResNet (augmented batches converge
    later), ``evaluate.epochs`` for the CNN and the MLP."""
    return cfg.evaluate.resnet_epochs if name == "resnet" else cfg.evaluate.epochs


class Trained:
    """One classifier trained on one dataset: ``predict(ds)`` and what training chose."""

    def __init__(self, name: str, cfg, train: ImageDataset, validation: ImageDataset | None = None,
                 what: str | None = None):
        self.name = name
        if name in TORCH:
            self.model = classifiers.build(name, train, seed=cfg.evaluate.seed)
            x, y = train.to_tensors()
            self.training = classifiers.fit(self.model, x, y, epochs=epochs(name, cfg), seed=cfg.evaluate.seed,
                                            validation=validation.to_tensors() if validation is not None else None,
                                            desc=what and f"evaluate: {name} on {what}",
                                            augmented=name in classifiers.AUGMENTED, flip=cfg.evaluate.flip)
        else:
            self.model = _sklearn(cfg)[name]()
            self.model.fit(flat(train), train.labels)
            self.training = {"selection": "none (scikit-learn defaults)"}

    def predict(self, ds: ImageDataset) -> np.ndarray:
        if self.name in TORCH:
            return classifiers.apply(self.model, classifiers.pixels(ds)).argmax(1).numpy()
        return np.asarray(self.model.predict(flat(ds)))


def per_class(correct: np.ndarray, labels: np.ndarray, num_classes: int) -> list[float | None]:
    """Accuracy per class (None for a class absent from ``labels``)."""
    return [float(correct[labels == k].mean()) if (labels == k).any() else None for k in range(num_classes)]


def evaluate(name: str, cfg, *, synthetic: ImageDataset, validation: ImageDataset, fit_real: ImageDataset,
             test_real: ImageDataset) -> dict:
    """gen2real, real, calibrated and real2gen accuracy of one classifier (a "skipped" entry when
    its package is not installed)."""
    try:
        on_generated = Trained(name, cfg, synthetic, validation, what="synthetic records")
    except ImportError as exc:
        return {"classifier": name, "skipped": f"{exc.name or name} not installed"}
    on_real = Trained(name, cfg, fit_real, what="real records")
    correct = on_generated.predict(test_real) == test_real.labels
    gen2real = float(correct.mean())
    real = float((on_real.predict(test_real) == test_real.labels).mean())
    real2gen = float((on_real.predict(synthetic) == synthetic.labels).mean())
    return {"classifier": name, "gen2real": gen2real, "real": real,
            "calibrated": gen2real / real if real > 0 else None, "real2gen": real2gen,
            "gen2real_per_class": per_class(correct, test_real.labels, test_real.num_classes),
            "model_selection": on_generated.training}


def utility(cfg, *, synthetic: ImageDataset, validation: ImageDataset, fit_real: ImageDataset,
            test_real: ImageDataset, names: tuple[str, ...]) -> dict:
    """Every classifier of ``names`` and the averages over those that ran (Tables A1–A2's last row)."""
    rows = []
    for k, name in enumerate(names, 1):
        logging.getLogger(__name__).info("evaluate: classifier %d of %d, %s", k, len(names), name)
        rows.append(evaluate(name, cfg, synthetic=synthetic, validation=validation, fit_real=fit_real,
                             test_real=test_real))
    ran = [r for r in rows if "skipped" not in r]
    average = {k: float(np.mean([r[k] for r in ran if r[k] is not None])) if ran else None
               for k in ("gen2real", "real", "calibrated", "real2gen")}
    return {"classifiers": rows, "average": average,
            "records": {"synthetic_train": len(synthetic), "synthetic_validation": len(validation),
                        "real_train": len(fit_real), "real_test": len(test_real)}}
