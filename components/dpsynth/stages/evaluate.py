"""``dpsynth evaluate``: utility, quality and membership-inference metrics of the released generator.

Reads the released synthetic Parquet and generator, the audit, and real *reference* data:
``evaluate.reference_uri`` when set (declared ``public``, ``heldout`` or ``sensitive`` by
``evaluate.reference_kind``), else the partition's held-out records (never trained on). The
reference data is split once, by a seeded permutation, into a half that trains the real
classifiers (the reference CNN behind fid_classifier / IS / JS, and every classifier's real
baseline, which also gives real2gen) and a half that tests (gen2real, the real Fréchet statistics).

Metrics (see dpsynth.evaluation): gen2real / real2gen / calibrated accuracy (``evaluate.suite``:
quick = ``evaluate.classifier``, full = GS-WGAN's Tables A1–A2), FID (Inception weights at
``evaluate.inception_weights``) or else ``fid_classifier``, Inception Score, dp-GAN's JS score,
and GAN-Leaks membership inference (training records vs held-out records).

Privacy: ε consumed 0 with respect to the training run. The stage selects no model on real
data (CNN/MLP epochs are chosen on held-out generated data), so the only real-data outputs are
the exact metrics themselves. Metrics on public or held-out reference data are labelled
"releasable"; on reference data declared sensitive, and membership inference always (it reads
training records), "internal": an auditor's diagnostic, not covered by the release's (ε, δ).

The ceiling (``evaluate.ceiling``): the headline classifier trained on the private *training* records (its epoch
chosen on a split of them) and tested on the same held-out test half as gen2real, with the release's gen2real as a
share of it, and every classifier's gen2real per class: exact statistics of sensitive records, so they are written
to the operator's report in the sensitive zone (``evaluate/operator.json``), never to the release zone, MLflow or the
stage's ``--json`` (a per-class figure, even a null, says which classes the held-out records hold).
Outputs (release zone): report.json, report.html, manifest.json; (sensitive zone) operator.json and
membership_inference.json.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import torch

from dpsynth import egress, storage, tracking
from dpsynth.data import ImageDataset, read_parquet
from dpsynth.errors import StageError
from dpsynth.evaluation import accuracy, fid, mia, report as html_report, scores
from dpsynth.evaluation.classifiers import ReferenceClassifier
from dpsynth.grids import tile
from dpsynth.stages import protocol, manifest
from dpsynth.stages.sample import load_generator, synthesize

log = logging.getLogger(__name__)

STAGE = "evaluate"
SECTIONS = ("evaluate",)
FORMAT = "dpsynth.evaluation/2"
HELDOUT_NOTE = (
    "The test records are real, sensitive records held out by the partition stage: never trained on "
    "(neither by the generator nor by this classifier) and used once, for this report; no model "
    "selection or early stopping happens on them. The accuracy is an exact (noise-free) statistic of "
    "the held-out records, so it is not covered by the training run's (ε, δ)."
)
REFERENCE_NOTES = {
    "heldout": HELDOUT_NOTE,
    "public": "The reference data is declared public: metrics on it reveal nothing about the sensitive records.",
    "sensitive": "The reference data is declared sensitive (it may contain training records): every metric computed "
                 "on it is internal, an exact statistic of sensitive data outside the release's (ε, δ); none of "
                 "them may select a model or be published unless that use is accounted.",
}
MIA_FILE = "membership_inference.json"  # under the run's sensitive zone, evaluate/
OPERATOR_FILE = "operator.json"  # under the run's sensitive zone, evaluate/: the ceiling and per-class figures
CEILING_NOTE = ("The ceiling (the same classifier trained on the private training records, tested on the same held-out "
                "records) and the per-class accuracies are exact statistics of sensitive records: they are written to "
                "the operator's report in the sensitive zone only, never to the release zone or MLflow.")
MIA_KEPT = (" So its results are written to the sensitive zone only (for the auditor), never to the release zone "
            "or MLflow.")
MIA_NOTE = ("Membership inference reads training records (held-in) and held-out records: its numbers are exact "
            "statistics of sensitive data, internal to the auditor, not released statistics.")


def _split(n: int, *, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded permutation of range(n) cut into (first ⌈fraction·n⌉, rest); both non-empty."""
    order = np.random.default_rng(seed).permutation(n)
    k = min(max(1, math.ceil(fraction * n)), n - 1)
    return order[:k], order[k:]


def _cap(ds: ImageDataset, limit: int | None, *, seed: int) -> ImageDataset:
    if limit is None or len(ds) <= limit:
        return ds
    return ds.subset(np.sort(np.random.default_rng(seed).permutation(len(ds))[:limit]))


def class_rows(ds: ImageDataset, *, per_class: int) -> torch.Tensor:
    """Up to ``per_class`` images of each class, one row per class (blank where a class has fewer)."""
    x = ds.to_tensors()[0]
    rows = []
    for k in range(ds.num_classes):
        imgs = x[torch.from_numpy(ds.labels == k)][:per_class]
        blank = torch.ones((per_class - len(imgs), *x.shape[1:]))
        rows.append(torch.cat([imgs, blank]))
    return torch.cat(rows)


def quality(cfg, *, synthetic: ImageDataset, fit_real: ImageDataset, test_real: ImageDataset,
            classifier: ReferenceClassifier, space) -> dict:
    """Fréchet distance (FID or fid_classifier), its real-vs-real floor, Inception Score, JS score."""
    real_c, (gen_c, gen_p) = classifier.features(test_real), classifier.features_and_probabilities(synthetic)
    if isinstance(space, fid.ClassifierFeatures):
        real_f, gen_f = real_c, gen_c
    else:
        real_f, gen_f = space.features(test_real), space.features(synthetic)
    a, b = _split(len(real_f), fraction=0.5, seed=cfg.evaluate.seed)
    frechet = {"name": space.name, "value": fid.distance(real_f, gen_f), "real_vs_real": fid.distance(real_f[a], real_f[b]),
               "features": space.source, "records": {"real": len(real_f), "generated": len(gen_f)}}
    mean, std = scores.inception_score(gen_p)
    inception = {"mean": mean, "std": std, "splits": 10,
                 "classifier": f"CNN trained on {len(fit_real)} real reference records "
                               f"(not Inception-v3: comparable within dpsynth only)"}
    return {"frechet": frechet, "inception_score": inception,
            "js_score": scores.js_score(real_c, gen_c, seed=cfg.evaluate.seed)}


def epsilon_curve(cfg, snapshots: list[tuple[float, object]], *, test_real: ImageDataset,
                  classifier: ReferenceClassifier, space) -> list[dict]:
    """Quality and gen2real utility of each (ε, generator) snapshot, by increasing ε, on
    ``evaluate.curve_samples`` samples each. Nothing is selected from the curve."""
    e = cfg.evaluate
    real_f = space.features(test_real)
    points = []
    for eps, generator in sorted(snapshots, key=lambda s: s[0]):
        ds = synthesize(generator, num_samples=e.curve_samples, seed=e.seed)
        _, probs = classifier.features_and_probabilities(ds)
        val_idx, train_idx = _split(len(ds), fraction=e.validation_fraction, seed=e.seed)
        trained = accuracy.Trained(e.classifier, cfg, ds.subset(train_idx), ds.subset(val_idx),
                                   what=f"the ε = {eps:.3g} snapshot's records")
        points.append({"epsilon": eps, space.name: fid.distance(real_f, space.features(ds)),
                       "inception_score": scores.inception_score(probs)[0],
                       f"gen2real.{e.classifier}": float((trained.predict(test_real) == test_real.labels).mean())})
    return points


def curve_figure(points: list[dict]):
    """ε on the x axis, one panel per metric, as a PIL image."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    names = [k for k in points[0] if k != "epsilon"]
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3), squeeze=False)
    eps = [p["epsilon"] for p in points]
    for ax, name in zip(axes[0], names):
        ax.plot(eps, [p[name] for p in points], marker="o")
        ax.set_xlabel("ε spent (trainer's accountant)")
        ax.set_title(name)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def membership(cfg, *, generator, members: ImageDataset | None, nonmembers: ImageDataset | None) -> dict:
    e = cfg.evaluate
    if not e.mia:
        return {"skipped": "evaluate.mia is false"}
    if members is None or nonmembers is None:
        return {"skipped": "the partition held out no records (data.heldout_fraction: 0)"}
    n = min(e.mia_records, len(members), len(nonmembers))
    samples = synthesize(generator, num_samples=e.mia_generated, seed=e.seed + 1)
    result = mia.attack(samples, members=_cap(members, n, seed=e.seed), nonmembers=_cap(nonmembers, n, seed=e.seed))
    return {**result, "status": "internal", "note": MIA_NOTE}


def ceiling(cfg, *, training: ImageDataset, test_real: ImageDataset, release: dict) -> dict:
    """The headline classifier trained on the private training records (its epoch chosen on a
    ``evaluate.validation_fraction`` split of them, at most ``evaluate.max_train_records``), tested on ``test_real``;
    ``release`` (the headline's utility row) as a share of it. Exact statistics of sensitive records: internal."""
    e = cfg.evaluate
    val_idx, train_idx = _split(len(training), fraction=e.validation_fraction, seed=e.seed)
    train = _cap(training.subset(train_idx), e.max_train_records, seed=e.seed)
    trained = accuracy.Trained(e.classifier, cfg, train, training.subset(val_idx),
                               what="the private training records (the ceiling)")
    correct = trained.predict(test_real) == test_real.labels
    value, gen2real = float(correct.mean()), release.get("gen2real")
    return {"classifier": e.classifier, "accuracy": value, "release_gen2real": gen2real,
            "share": gen2real / value if gen2real is not None and value > 0 else None,
            "per_class": accuracy.per_class(correct, test_real.labels, test_real.num_classes),
            "records": {"train": len(train), "validation": len(val_idx), "test": len(test_real)},
            "model_selection": trained.training}


def evaluate(cfg, *, synthetic: ImageDataset, reference: ImageDataset, reference_info: dict, generator,
             members: ImageDataset | None, nonmembers: ImageDataset | None,
             snapshots: list[tuple[float, object]] = (), training: ImageDataset | None = None) -> dict:
    """Every metric, as the report.json dict (privacy and provenance are added by ``run``), and under ``operator``
    what only the operator may see (``run`` writes it to the sensitive zone): each classifier's gen2real per class
    and, given the private ``training`` records, the ceiling."""
    e = cfg.evaluate
    if synthetic.shape != reference.shape or synthetic.num_classes != reference.num_classes:
        raise StageError(f"evaluate: synthetic data ({synthetic.shape}, {synthetic.num_classes} classes) does not match "
                         f"the reference data ({reference.shape}, {reference.num_classes} classes)")
    if len(reference) < 4:
        raise StageError(f"evaluate: {len(reference)} reference records; at least 4 are needed")
    fit_idx, test_idx = _split(len(reference), fraction=0.5, seed=e.seed)
    fit_real, test_real = reference.subset(fit_idx), reference.subset(test_idx)
    val_idx, train_idx = _split(len(synthetic), fraction=e.validation_fraction, seed=e.seed)
    train = _cap(synthetic.subset(train_idx), e.max_train_records, seed=e.seed)
    validation = synthetic.subset(val_idx)
    log.info("evaluate: training the reference classifier on %d real records", len(fit_real))
    classifier = ReferenceClassifier(fit_real, steps=e.feature_steps, seed=e.seed)
    space = fid.feature_space(e.inception_weights, classifier)
    utility = accuracy.utility(cfg, synthetic=train, validation=validation, fit_real=fit_real, test_real=test_real,
                               names=accuracy.suite(cfg))
    log.info("evaluate: sample quality (%s, Inception Score, JS score)", space.name)
    sample_quality = quality(cfg, synthetic=synthetic, fit_real=fit_real, test_real=test_real, classifier=classifier,
                             space=space)
    curve = []
    if snapshots and e.curve_samples:
        log.info("evaluate: ε curve over %d generator snapshots", len(snapshots))
        curve = epsilon_curve(cfg, list(snapshots), test_real=test_real, classifier=classifier, space=space)
    if e.mia:
        log.info("evaluate: membership inference")
    attack = membership(cfg, generator=generator, members=members, nonmembers=nonmembers)
    status = "internal" if reference_info["kind"] == "sensitive" else "releasable"
    first = utility["classifiers"][0]
    per_class = {r["classifier"]: r.pop("gen2real_per_class") for r in utility["classifiers"]
                 if "gen2real_per_class" in r}  # a null there would say a class has no held-out record
    operator = {"status": "internal", "note": CEILING_NOTE, "gen2real_per_class": per_class}
    if training is not None and e.ceiling:
        log.info("evaluate: the ceiling (%s on the private training records)", e.classifier)
        operator["ceiling"] = ceiling(cfg, training=training, test_real=test_real, release=first)
    compat = {"classifier": first["classifier"], "accuracy": first.get("gen2real")}
    return {"operator": operator,
        "format": FORMAT, "classifier_accuracy": compat, "utility": utility, "quality": sample_quality,
        "epsilon_curve": curve, "membership_inference": attack,
        "reference": {**reference_info, "records": len(reference), "status": status,
                      "split": {"fit": len(fit_real), "test": len(test_real), "seed": e.seed},
                      "note": REFERENCE_NOTES[reference_info["kind"]]},
        "labels": {"utility": status, "quality": status, "membership_inference": "internal"},
        "model_selection": "CNN/MLP epochs chosen on held-out generated data; nothing is selected on real data",
    }


_SYNTHETIC = ("computed from the audited, released generator (post-processing) against the held-out or "
              "public reference records, after the gate")
MLFLOW_KEYS = protocol.STAGE_RUN_KEYS | tracking.LoggedKeys(metrics={
    **{k: _SYNTHETIC for k in ("accuracy", "gen2real.*", "real.*", "calibrated.*", "real2gen.*",
                               "fid", "fid_real_vs_real", "fid_classifier", "fid_classifier_real_vs_real",
                               "inception_score", "inception_score_std", "js_score", "curve.*")},
})


def mlflow_metrics(report: dict) -> dict[str, float]:
    m = {}
    compat = report["classifier_accuracy"]
    if compat["accuracy"] is not None:
        m["accuracy"] = compat["accuracy"]  # never per class: see CEILING_NOTE
    u = report["utility"]
    for row in u["classifiers"]:
        for key in ("gen2real", "real", "calibrated", "real2gen"):
            if row.get(key) is not None:
                m[f"{key}.{row['classifier']}"] = row[key]
    m.update({f"{key}.average": v for key, v in u["average"].items() if v is not None})
    q = report["quality"]
    m[q["frechet"]["name"]] = q["frechet"]["value"]
    m[f"{q['frechet']['name']}_real_vs_real"] = q["frechet"]["real_vs_real"]
    m["inception_score"], m["inception_score_std"] = q["inception_score"]["mean"], q["inception_score"]["std"]
    m["js_score"] = q["js_score"]["js_score"]
    return m  # never the membership-inference results: they stay in the sensitive zone


def _reference_item(ctx, heldout: list[dict]) -> tuple[dict, dict]:
    e = ctx.cfg.evaluate
    if e.reference_uri is not None:
        ds = read_parquet(e.reference_uri)
        return ctx.entry(e.reference_uri, role="reference", rows=len(ds)), {"uri": e.reference_uri, "kind": e.reference_kind}
    if not heldout:
        raise StageError("data.heldout_fraction: 0, so nothing was held out to evaluate on (or set evaluate.reference_uri)")
    item = manifest.verify(heldout[0])
    return item, {"uri": item["uri"], "kind": "heldout"}


def _privacy(audit_report: dict, sampled: dict) -> dict:
    release = sampled.get("details", {}).get("release", {})
    return {"epsilon": audit_report.get("epsilon_upper_bound"), "delta": audit_report["target"]["delta"],
            "target_epsilon": audit_report["target"]["epsilon"], "epsilons": audit_report.get("epsilons"),
            "accountant": "rdp+prv (recomputed by the audit)", "audit": audit_report.get("decision"),
            "released": release}


def run(ctx: protocol.StageContext) -> protocol.Outcome:
    cfg = ctx.cfg
    sampled, sample_entry = protocol.upstream(ctx, "sample")
    partition, partition_entry = protocol.upstream(ctx, "partition")
    audited, audit_entry = protocol.upstream(ctx, "audit")
    trained, train_entry = protocol.upstream(ctx, "train")
    heldout = manifest.outputs(partition, "heldout")
    synthetic_item = manifest.verify(manifest.output(sampled, "synthetic"))
    reference_item, reference_info = _reference_item(ctx, heldout)
    generator_item = manifest.verify(manifest.output(sampled, "generator"))
    audit_item = manifest.verify(manifest.output(audited, "report"))
    mia_items = []
    reads_shards = (cfg.evaluate.mia and heldout) or cfg.evaluate.ceiling  # the training records: MIA, the ceiling
    if reads_shards:
        mia_items = [manifest.verify(s) for s in manifest.outputs(partition, "shard")]
    if cfg.evaluate.mia and heldout and cfg.evaluate.reference_uri is not None:  # held-out records, not the reference
        mia_items.append(manifest.verify(heldout[0]))
    # generator snapshots the trainer left (sensitive; role generator_snapshot): the ε-vs-metric curve
    snapshot_items = ([manifest.verify(s) for s in manifest.outputs(trained, "generator_snapshot")]
                      if cfg.evaluate.curve_samples else [])
    inputs = [sample_entry, partition_entry, audit_entry, train_entry, synthetic_item, reference_item, generator_item,
              audit_item, *mia_items, *snapshot_items]
    fp = protocol.fingerprint(cfg, SECTIONS)
    if (reused := protocol.reuse(ctx, STAGE, fingerprint=fp, inputs=inputs)) is not None:
        return reused
    synthetic, reference = read_parquet(synthetic_item["uri"]), read_parquet(reference_item["uri"])
    generator, _ = load_generator(generator_item["uri"])
    members = nonmembers = training = None
    if reads_shards:
        training = protocol.concat([read_parquet(s["uri"]) for s in manifest.outputs(partition, "shard")])
    if cfg.evaluate.mia and heldout:
        members, nonmembers = training, read_parquet(heldout[0]["uri"])
    snapshots = []
    for item in snapshot_items:
        snapshot, claim = load_generator(item["uri"])
        snapshots.append((float(claim["epsilon"]), snapshot))
    report = evaluate(cfg, synthetic=synthetic, reference=reference, reference_info=reference_info, generator=generator,
                      members=members, nonmembers=nonmembers, snapshots=snapshots, training=training)
    # exact statistics of training and held-out records (the ceiling, per-class figures): the operator's, kept in
    # the sensitive zone, never in the release, MLflow or the --json outcome (dpsynth.egress.INSIDE_FILES)
    operator_uri = storage.join(ctx.zones.sensitive, STAGE, OPERATOR_FILE)
    storage.write_text(operator_uri, json.dumps(report.pop("operator"), indent=2) + "\n")
    report["operator"] = {"status": "internal", "kept_in": operator_uri, "note": CEILING_NOTE}
    if "auc" in report["membership_inference"]:
        # exact statistics of training records: kept in the sensitive zone, never in the release or MLflow
        mia_uri = storage.join(ctx.zones.sensitive, STAGE, MIA_FILE)
        storage.write_text(mia_uri, json.dumps(report["membership_inference"], indent=2) + "\n")
        report["membership_inference"] = {"status": "internal", "kept_in": mia_uri, "note": MIA_NOTE + MIA_KEPT}
    audit_report = json.loads(storage.read_bytes(audit_item["uri"]))
    report.update({"privacy": _privacy(audit_report, sampled),
                   "train": {"uri": synthetic_item["uri"], "records": report["utility"]["records"]["synthetic_train"],
                             "kind": "synthetic (released)"},
                   "test": {"uri": reference_item["uri"], "records": report["utility"]["records"]["real_test"],
                            "kind": f"real, {reference_info['kind']}"},
                   "heldout_data": REFERENCE_NOTES[reference_info["kind"]]})
    # the report leaves the sensitive zone (release zone, its page, MLflow): one gated view for all three
    report = egress.let_out(report, "evaluation")
    per_class = cfg.sample.per_class
    grids = {"synthetic records by class (one row per class)": tile(class_rows(synthetic, per_class=per_class),
                                                                   rows=synthetic.num_classes, cols=per_class, scale=2)}
    if report["epsilon_curve"]:
        grids["ε vs metrics (generator snapshots of the training run)"] = curve_figure(report["epsilon_curve"])
    page = html_report.html(report, grids=grids)
    metrics = mlflow_metrics(report)
    with protocol.child_run(ctx, STAGE) as run:
        storage.write_text(ctx.uri(STAGE, "report.json"), json.dumps(report, indent=2) + "\n")
        storage.write_text(ctx.uri(STAGE, "report.html"), page)
        if run is not None:
            import mlflow

            tracking.log_run(MLFLOW_KEYS, metrics=metrics, tags={
                "dpsynth.evaluate.reference": reference_info["kind"],
                "dpsynth.evaluate.metrics_status": report["reference"]["status"],
                "dpsynth.evaluate.frechet": report["quality"]["frechet"]["name"]})
            mlflow.log_text(page, "report.html")
            tracking.log_json(report, "report.json", shape="evaluation")
            images = list(grids.values())
            tracking.log_png(images[0], "grids/synthetic_by_class.png")
            if report["epsilon_curve"]:
                tracking.log_png(images[1], "curves/epsilon_vs_metrics.png")
                for step, point in enumerate(report["epsilon_curve"]):
                    tracking.log_run(MLFLOW_KEYS, metrics={f"curve.{k}": v for k, v in point.items()}, step=step)
        details = {"metrics_status": report["labels"], "frechet": report["quality"]["frechet"]["name"],
                   "accuracy": report["classifier_accuracy"]["accuracy"], "suite": cfg.evaluate.suite}
        note = (f"0 for the training records. {REFERENCE_NOTES[reference_info['kind']]}"
                + (f" {MIA_NOTE}{MIA_KEPT}" if "kept_in" in report["membership_inference"] else ""))
        return protocol.finish(
            ctx, STAGE, run, fingerprint=fp, dataset_sha256=partition["dataset_sha256"], inputs=inputs,
            outputs=[ctx.entry(ctx.uri(STAGE, "report.json"), role="report"),
                     ctx.entry(ctx.uri(STAGE, "report.html"), role="report_html")], details=details,
            privacy=manifest.no_privacy(delta=cfg.privacy.delta, note=note),
        )
