"""``dpsynth sample``: release the audited generator, a synthetic dataset and a sample grid.

The only stage that writes the generator into the release zone, and only after reading a
passed audit whose generator sha256 is the generator's, and whose trace is the one the generator file is
bound to (its trace sha256): otherwise it exits non-zero having
written nothing. Labels are balanced over the classes (record i has label i mod K): the real
label distribution would be a statistic of the sensitive data. Everything is computed before
the first write. With MLflow on, the generator is logged as an MLflow model and registered as a new
version of ``dpsynth-<population>-<method>`` in the Model Registry, with its ε, δ, accountants, audit
decision and lineage as version tags, and the alias ``released`` moved to it (:func:`register`): the
registry holds audited generators only. ε consumed: 0 (post-processing of the generator). Before anything is
written, the samples that are patches of noise are dropped by a rule that reads the samples alone
(:mod:`dpsynth.evaluation.screen`, ``sample.screen``); the count dropped is in the details, and the grid shows the
screened release.
"""

from __future__ import annotations

import json

import numpy as np
import torch

from dpsynth import egress, storage, tracking
from dpsynth.data import ImageDataset, versions, write_parquet
from dpsynth.egress import refusal
from dpsynth.errors import StageError
from dpsynth.evaluation import screen
from dpsynth.training.artifacts import load_generator  # noqa: F401 (the stages' reader of generator files)
from dpsynth.stages import protocol, manifest

STAGE = "sample"
SECTIONS = ("sample",)
@torch.no_grad()
def synthesize(generator: torch.nn.Module, *, num_samples: int, seed: int, chunk: int = 1000) -> ImageDataset:
    rng = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_samples) % generator.num_classes
    images = []
    for start in range(0, num_samples, chunk):
        x, _ = generator.sample(len(labels[start:start + chunk]), labels=labels[start:start + chunk], generator=rng)
        images.append(((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy())
    return ImageDataset(
        record_ids=[f"synthetic:{i:07d}" for i in range(num_samples)], labels=labels.numpy().astype(np.int64),
        images=np.concatenate(images), splits=None, num_classes=generator.num_classes,
        source=f"dpsynth sample: {num_samples} records from an audited generator, seed {seed}",
    )


MLFLOW_KEYS = protocol.STAGE_RUN_KEYS | tracking.LoggedKeys(metrics={
    "release_epsilon": "the audit's recomputed upper bound on ε (after the gate)"})


def exportable(generator):
    """``generator`` as ``torch.export`` takes it: GS-WGAN's spectrally normalised one with its weights baked in."""
    from torch.nn.utils import parametrize

    if any(parametrize.is_parametrized(m) for m in generator.modules()):
        from dpsynth.models.gswgan_networks import without_spectral_norm

        return without_spectral_norm(generator)
    return generator


def require_passed_audit(ctx: protocol.StageContext) -> tuple[dict, dict, list[dict]]:
    """The release gate, for this stage and any other step that publishes: the audit manifest,
    its report (which must record a pass, every check passed, files intact) and their input
    entries; StageError otherwise."""
    uri = ctx.manifest_uri("audit")
    if not storage.exists(uri):
        raise StageError(f"stage audit: no audit at {uri}; nothing is released without a passed audit")
    audit = manifest.read(uri)
    report_item = manifest.verify(manifest.output(audit, "report"))
    report = json.loads(storage.read_bytes(report_item["uri"]))
    checks = report.get("checks")

    if (audit["status"] != "succeeded" or report.get("decision") != "passed" or not isinstance(checks, list)
            or not checks or not all(c.get("passed") is True or protocol.inconclusive(c) for c in checks)):
        raise StageError(f"stage audit: the audit {report_item['uri']} did not pass; nothing is released")
    return audit, report, [ctx.entry(uri, role="audit_manifest"), report_item,
                           manifest.verify(manifest.output(audit, "report_markdown"))]


def register(ctx: protocol.StageContext, model_id: str, *, report: dict, audit: dict, generator_sha256: str,
             release: dict):
    """The audited generator as a new version of its population/method's registered model, ``@released``
    moved to it; called only past :func:`require_passed_audit` and the generator and trace checks. Its tags
    state the release (ε, δ, the accountants behind ε, the audit decision) and its lineage (trace and generator
    sha256, the pipeline run, its parent, audit and train MLflow runs, the keyed dataset version)."""
    from dpsynth.ledger import charging

    runs = report.get("runs") or {}
    tags = {
        tracking.TAG_EPSILON_SPENT: f"{release['epsilon']:.6g}",  # the audit's recomputed upper bound
        tracking.TAG_DELTA: f"{release['delta']:.3g}",
        tracking.TAG_ACCOUNTANT: "+".join(report.get("epsilons") or {}) or "none",
        tracking.TAG_AUDIT: report["decision"],
        tracking.TAG_TRACE_SHA256: report["trace"]["sha256"],
        tracking.TAG_GENERATOR_SHA256: generator_sha256,
        tracking.TAG_DATASET_VERSION: audit["dataset_sha256"],  # the keyed version id, never a raw hash
        tracking.TAG_PIPELINE_RUN_ID: ctx.pipeline_run_id or "",
        tracking.TAG_PARENT_RUN_ID: ctx.parent_run_id or "",
        tracking.TAG_AUDIT_RUN_ID: audit.get("mlflow_run_id") or "",
        tracking.TAG_TRAIN_RUN_ID: runs.get("train") or "",
        tracking.TAG_METHOD: ctx.cfg.train.method,
        **tracking.lineage_tags(),  # the code version, its commit and image
    }
    if "epsilon_lower" in release:
        tags[tracking.TAG_EPSILON_LOWER] = f"{release['epsilon_lower']:.6g}"
    return tracking.register_release(tracking_uri=ctx.tracking_uri, model_id=model_id,
                                     population_id=charging.population_id(ctx.cfg), method=ctx.cfg.train.method,
                                     tags=tags)


def run(ctx: protocol.StageContext) -> protocol.Outcome:
    cfg = ctx.cfg
    audit, report, audit_inputs = require_passed_audit(ctx)
    generator_item = ctx.entry(report["generator"]["uri"], role="generator")
    if generator_item["sha256"] != report["generator"]["sha256"]:
        raise StageError(refusal(generator_item["uri"], "its sha256 is not the audited generator's (the audit "
                                 "report's)", fix="run the audit again"))
    inputs = [*audit_inputs, generator_item]
    fp = protocol.fingerprint(cfg, SECTIONS)
    if (reused := protocol.reuse(ctx, STAGE, fingerprint=fp, inputs=inputs)) is not None:
        return _released(cfg, reused)  # a retry after the release: record it, if it was not
    generator, claimed = load_generator(generator_item["uri"])
    audited_trace = (report.get("trace") or {}).get("sha256")
    if not audited_trace or claimed.get("trace_sha256") != audited_trace:
        raise StageError(refusal(generator_item["uri"], "bound to another trace than the audited one (the "
                                 "trace-binding check)", fix="nothing is released"))
    synthetic = synthesize(generator, num_samples=cfg.sample.num_samples, seed=cfg.sample.seed)
    synthetic, screened = screen.screen(synthetic, min_correlation=cfg.sample.screen)  # reads the samples only
    grid = screen.grid(synthetic, per_class=cfg.sample.per_class)
    with protocol.child_run(ctx, STAGE) as run:
        storage.copy(generator_item["uri"], ctx.uri(STAGE, "generator.pt"))
        # the released audit report: through the egress gate (dpsynth.egress.AUDIT; released, so the audited
        # generator's and trace's hashes are published as they are); its markdown page as the audit rendered it from that view
        storage.write_text(ctx.uri(STAGE, "audit.json"), json.dumps(egress.let_out(report, "audit"), indent=2) + "\n")
        storage.copy(audit_inputs[2]["uri"], ctx.uri(STAGE, "audit.md"))
        write_parquet(synthetic, ctx.uri(STAGE, "synthetic.parquet"))
        with storage.atomic_write(ctx.uri(STAGE, "samples.png")) as fh:
            grid.save(fh, format="PNG")
        outputs = [ctx.entry(ctx.uri(STAGE, "generator.pt"), role="generator"),
                   ctx.entry(ctx.uri(STAGE, "synthetic.parquet"), role="synthetic", rows=len(synthetic)),
                   ctx.entry(ctx.uri(STAGE, "samples.png"), role="grid"),
                   ctx.entry(ctx.uri(STAGE, "audit.json"), role="audit_report"),
                   ctx.entry(ctx.uri(STAGE, "audit.md"), role="audit_report_markdown")]
        release = {"epsilon": report["epsilon_upper_bound"], "delta": report["target"]["delta"], "audit": "passed",
                   "statement": report.get("statement")}  # adjacency, σ convention, assumptions, other accounts
        measured = report.get("empirical")  # the empirical audit's ε_lower, when it ran (audit/empirical.py)
        if measured:
            release["epsilon_lower"] = measured["epsilon_lower"]
            release["empirical"] = measured.get("verdict")  # passed | inconclusive (a failed audit releases nothing)
        if run is not None:
            import mlflow

            tracking.log_run(MLFLOW_KEYS, metrics={"release_epsilon": release["epsilon"]},
                             tags={tracking.TAG_AUDIT: "passed", **(tracking.empirical_tags(measured) if measured else {})})
            tracking.log_png(grid, "grids/samples.png")
            if hasattr(generator, "latent_dim"):  # the audited generator, as an MLflow model (pt2)
                model = tracking.log_generator(exportable(generator))
            else:  # Private Evolution's figures and weights: its generator file, as a logged model
                model = tracking.log_generator_file(storage.read_bytes(generator_item["uri"]))
            version = register(ctx, model.model_id, report=report, audit=audit, generator_sha256=generator_item["sha256"],
                               release=release)
            release["registered_model"] = {"name": version.name, "version": str(version.version),
                                           "alias": tracking.RELEASED_ALIAS}
        outcome = protocol.finish(
            ctx, STAGE, run, fingerprint=fp, dataset_sha256=audit["dataset_sha256"], inputs=inputs, outputs=outputs,
            details={"num_samples": len(synthetic), "num_classes": synthetic.num_classes, "release": release,
                     "screened": screened,
                     "trainer_claim": claimed},
            privacy=manifest.no_privacy(delta=cfg.privacy.delta, note="post-processing of the audited generator"),
        )
    return _released(cfg, outcome)


def _released(cfg, outcome: protocol.Outcome) -> protocol.Outcome:
    """``outcome``, after recording a versioned import's data as its population's last release
    (:func:`dpsynth.data.versions.record_release`: a retrain on the same version then opens no run, spends no ε)."""
    from dpsynth.ledger import charging

    versions.record_release(cfg.data.uri, charging.population_id(cfg))
    return outcome
