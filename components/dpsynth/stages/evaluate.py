"""``dpsynth evaluate``: utility of the synthetic data — a classifier trained on it, tested on held-out real data.

Train on the released synthetic Parquet, test once on the held-out records of the partition
(never trained on, by the generator or the classifier). Nothing is selected or tuned on the
held-out data: the classifier's settings come from the config. The report goes to the
release zone. ε consumed: 0 with respect to the training records; the held-out records are
sensitive, and the accuracy is computed on them without noise, which the report says.
Further metrics (FID/IS, membership inference) are added as entries of ``METRICS``.
"""

from __future__ import annotations

import json
from typing import Callable

import numpy as np

from dpsynth import storage
from dpsynth.data import ImageDataset, read_parquet
from dpsynth.errors import StageError
from dpsynth.stages import common, manifest

STAGE = "evaluate"
SECTIONS = ("evaluate",)
HELDOUT_NOTE = (
    "The test records are real, sensitive records held out by the partition stage: never trained on "
    "(neither by the generator nor by this classifier) and used once, for this report; no model "
    "selection or early stopping happens on them. The accuracy is an exact (noise-free) statistic of "
    "the held-out records, so it is not covered by the training run's (ε, δ)."
)


def _features(ds: ImageDataset) -> np.ndarray:
    return ds.images.reshape(len(ds), -1).astype(np.float32) / 255.0


def _logreg(cfg, train: ImageDataset, test: ImageDataset) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=cfg.evaluate.max_iter, random_state=cfg.evaluate.seed)
    model.fit(_features(train), train.labels)
    return model.predict(_features(test))


def _cnn(cfg, train: ImageDataset, test: ImageDataset) -> np.ndarray:
    import torch
    from torch import nn

    torch.manual_seed(cfg.evaluate.seed)
    x, y = train.to_tensors()
    c = x.shape[1]
    model = nn.Sequential(nn.Conv2d(c, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, train.num_classes))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(cfg.evaluate.epochs):
        for idx in torch.randperm(len(x)).split(128):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return model(test.to_tensors()[0]).argmax(1).numpy()


CLASSIFIERS: dict[str, Callable] = {"logreg": _logreg, "cnn": _cnn}


def accuracy(cfg, train: ImageDataset, test: ImageDataset) -> tuple[dict, dict]:
    """Accuracy (overall and per class; None for a class absent from ``test``) of the classifier
    ``evaluate.classifier`` trained on ``train``; the report part and the MLflow metrics."""
    if train.shape != test.shape or train.num_classes != test.num_classes:
        raise StageError(f"evaluate: synthetic data ({train.shape}, {train.num_classes} classes) does not match "
                         f"the held-out data ({test.shape}, {test.num_classes} classes)")
    correct = CLASSIFIERS[cfg.evaluate.classifier](cfg, train, test) == test.labels
    per_class = [float(correct[test.labels == k].mean()) if (test.labels == k).any() else None
                 for k in range(test.num_classes)]
    overall = float(correct.mean())
    metrics = {"accuracy": overall, **{f"accuracy_class_{k}": a for k, a in enumerate(per_class) if a is not None}}
    return {"classifier": cfg.evaluate.classifier, "accuracy": overall, "per_class_accuracy": per_class}, metrics


# name -> fn(cfg, synthetic, heldout) -> (report section, MLflow metrics)
METRICS: dict[str, Callable] = {"classifier_accuracy": accuracy}


def run(ctx: common.StageContext) -> common.Outcome:
    cfg = ctx.cfg
    sampled, sample_entry = common.upstream(ctx, "sample")
    partition, partition_entry = common.upstream(ctx, "partition")
    heldout = manifest.outputs(partition, "heldout")
    if not heldout:
        raise StageError("data.heldout_fraction: 0, so nothing was held out to evaluate on")
    synthetic_item = manifest.verify(manifest.output(sampled, "synthetic"))
    heldout_item = manifest.verify(heldout[0])
    inputs = [sample_entry, partition_entry, synthetic_item, heldout_item]
    fp = common.fingerprint(cfg, SECTIONS)
    if (reused := common.reuse(ctx, STAGE, fingerprint=fp, inputs=inputs)) is not None:
        return reused
    train, test = read_parquet(synthetic_item["uri"]), read_parquet(heldout_item["uri"])
    results = {name: fn(cfg, train, test) for name, fn in METRICS.items()}
    scores = {name: section for name, (section, _) in results.items()}
    report = {"format": "dpsynth.evaluation/1", **scores,
              "train": {"uri": synthetic_item["uri"], "records": len(train), "kind": "synthetic (released)"},
              "test": {"uri": heldout_item["uri"], "records": len(test), "kind": "real, held out (sensitive)"},
              "heldout_data": HELDOUT_NOTE}
    with common.child_run(ctx, STAGE) as run:
        storage.write_text(ctx.uri(STAGE, "report.json"), json.dumps(report, indent=2) + "\n")
        if run is not None:
            import mlflow

            for _, metrics in results.values():
                mlflow.log_metrics(metrics)
        return common.finish(
            ctx, STAGE, run, fingerprint=fp, dataset_sha256=partition["dataset_sha256"], inputs=inputs,
            outputs=[ctx.entry(ctx.uri(STAGE, "report.json"), role="report")], details=scores,
            privacy=manifest.no_privacy(delta=cfg.privacy.delta, note="0 for the training records. " + HELDOUT_NOTE),
        )
