"""The one gate between the sensitive zone and everything outside it (issue #52).

Whatever leaves a stage for a place an orchestrator, an operator or an auditor reads — the ``--json`` outcome of
every ``dpsynth`` command (Airflow keeps it as ``return.json`` and XCom, KFP echoes it into the pod log), the
manifests logged to MLflow, the release zone's manifests — passes through :func:`let_out` with its
:data:`SHAPES` entry. The gate is an **allow-list**: a field leaves only when its shape names it, with the reason it
may; every other field is dropped (its path, never its value, is logged as a warning, so a new field is noticed and
then declared here, with its reason). Three rules for the fields that name data:

- ``KEYED``: a content hash. Outside the release zone it leaves as its keyed version id (``key``: HMAC under the
  run's key in the sensitive zone, :func:`dpsynth.stages.protocol.dataset_version`), never raw — a raw hash of a
  shard, of a warm-started discriminator or of a manifest is a membership test for anyone who knows the other
  records. A file of the release zone (an entry whose ``zone`` is ``"release"``) is published, and so is its hash.
- ``WITHHELD``: a count or a duration of one shard or one class (``rows`` of a shard file, a shard's warm-start
  seconds): null outside the release zone. The counts that are public (n, the held-out count) are fields of their
  own (``training_records``, ``heldout_records``).
- anything else the shape names leaves as it is: configuration, accounted ε and δ, the trace's events (fixed by the
  plan before any data is read), identifiers of runs, URIs, statuses.

Refusals (:func:`refusal`) name the file and the check that failed, never a value read from the data.

>>> out = let_out({"stage": "partition", "secret": 1, "outputs": [
...     {"role": "shard", "uri": "s/shard-0", "zone": "sensitive", "rows": 17, "sha256": "ab" * 32}]},
...     "manifest", key=lambda h: "keyed:" + h[:4])
>>> out["outputs"][0]["sha256"], out["outputs"][0]["rows"], "secret" in out
('keyed:abab', None, False)
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

log = logging.getLogger(__name__)

KEYED = "keyed"  # a content hash: its keyed version id outside the release zone
WITHHELD = "withheld"  # a per-shard or per-class count or duration: null outside the release zone


class Each:
    """A list whose items all have one shape."""

    def __init__(self, shape):
        self.shape = shape


class Free:
    """A value that leaves whole (a dict or list of any fields), with the reason it may: text and numbers the code
    writes from the configuration and the accounting, never from the records."""

    def __init__(self, reason: str):
        self.reason = reason


# --- the allow-list ------------------------------------------------------------------------------------------

_RUN_IDS = {
    "pipeline_run_id": "the orchestrator's run id (chosen before any data is read)",
    "parent_run_id": "the MLflow parent run's id (random)",
    "mlflow_run_id": "the stage's MLflow run id (random)",
}

ENTRY = {  # a file a manifest lists
    "role": "what the file is to the stage (code)",
    "uri": "where the file is (the run directory and the file name, from the configuration)",
    "zone": "sensitive | release (the run directory's layout)",
    "shard": "the shard's index (0 … K − 1: configuration)",
    "sha256": KEYED,
    "content_sha256": KEYED,
    "rows": WITHHELD,
}

PRIVACY = {
    "epsilon": "accounted: the accountant's bound of the recorded trace",
    "delta": "privacy.delta (configuration)",
    "accountant": "privacy.accountant (configuration)",
    "events": Free("the mechanism trace's events: fixed by the privacy plan (configuration and the public n) "
                   "before any data is read; no data-dependent per-step value is recorded"),
    "note": "text the code writes",
}

DETAILS = {  # every stage's manifest details, one allow-list (a stage's new detail is declared here)
    # partition: the public counts and the configuration
    "num_shards": "partition.num_shards (configuration)",
    "heldout_fraction": "data.heldout_fraction (configuration)",
    "records": "n, all records (public: docs/privacy.md)",
    "training_records": "n, the training records (public: docs/privacy.md)",
    "heldout_records": "the held-out count (public: docs/privacy.md)",
    "public_records": "the count of the public records (public data)",
    "public_fraction": "data.public_fraction (configuration)",
    "public_split": "data.public_split (configuration)",
    "public_source": "data.public_uri (configuration)",
    "num_classes": "data.num_classes: the public label set (configuration, never max(label) + 1)",
    "image_shape": "the image shape H×W×C (public: docs/privacy.md)",
    "key": "the partition key's digest (never the key)",
    "assignment": "how records are assigned to shards (text)",
    # warmstart: whole-stage figures only, none per shard (#52 item 8)
    "performed": "whether the method warm-starts (code)",
    "reason": "why not (text)",
    "shards": "K (configuration)",
    "ran_here": "how many shards this task warm-started (K, or fewer when an earlier task did some)",
    "workers": "warmstart.workers (configuration)",
    "fan_in_seconds": "the whole stage's wall time (as MLflow's run duration shows it)",
    "shard_seconds_total": WITHHELD,  # the shards' times (the sensitive manifest keeps them: benchmarks read them)
    "shard_seconds_max": WITHHELD,  # one shard's time: depends on its size when it is smaller than the batch
    "iterations": "the public warm start's iterations (configuration)",
    "iterations_per_second": "the public warm start's speed (public data only)",
    "critic_steps_per_iteration": "train.n_d, dp-GAN's n_critic (configuration)",
    "seconds": "the public warm start's wall time (dp-GAN: public data only)",
    "blocks": "the privacy blocks the run reads (its window: chosen by public rules from the blocks' arrival and "
              "the ledger's charges, before any record is read; docs/privacy.md, \"Privacy blocks\")",
    # train
    "method": "train.method (configuration)",
    "ranks": "train.nodes × train.gpus_per_node (configuration)",
    "steps": "steps taken: the plan's, fixed by ε and the public n",
    "generator_steps": "generator steps: the plan's",
    "noise_multiplier": "σ: calibrated from the configuration and the public n",
    "sample_rate": "the sampling rate: configuration and the public n",
    "stopped_by": "what ended training: the plan's step count or the budget (accounted)",
    "warmup": Free("the private warm-up's releases as planned (their σ and ε: configuration and the public n)"),
    # audit
    "decision": "the audit's verdict",
    "epsilon_upper_bound": "ε recomputed from the trace (accounted)",
    "epsilon_lower": "the empirical audit's lower bound (measured on public stand-ins, never on the records)",
    "empirical": "the empirical audit's verdict",
    # sample and evaluate (release zone: published after the audit)
    "num_samples": "the released samples' count (sample.num_samples less those the screen dropped)",
    "screened": Free("the sample screen's rule and the count of released samples it dropped (a function of the "
                     "released samples alone)"),
    "release": Free("the release's ε, δ, audit verdict and privacy statement (text the code writes)"),
    "trainer_claim": Free("the released generator's own privacy record: ε, δ, the accountant, and the sha256 and "
                          "steps of the audited trace it is bound to (published with the release)"),
    "metrics_status": Free("which metrics are releasable (code)"),
    "frechet": "the Fréchet feature's name (configuration)",
    "accuracy": "the CNN's accuracy on held-out records: an exact statistic, stated as not covered by ε "
                "(docs/privacy.md, the evaluate stage)",
    "suite": "evaluate.suite (configuration)",
}

MANIFEST = {
    "format": "the manifest format's name (code)",
    "stage": "the stage's name (code)",
    "status": "succeeded | failed",
    "config_fingerprint": "sha256 of the configuration (no data)",
    "dataset_sha256": "the dataset's keyed version id (already keyed by the stage, never a raw content hash)",
    "inputs": Each(ENTRY),
    "outputs": Each(ENTRY),
    "privacy": PRIVACY,
    "details": DETAILS,
    **_RUN_IDS,
    "code_version": "the package version and commit",
    "git_sha": "the commit the code was built from (DPSYNTH_GIT_SHA or the checkout's HEAD: code)",
    "image": "the stage image the run used (DPSYNTH_IMAGE: deployment)",
    "created_at": "when the manifest was written",
}

OUTCOME = {  # ``dpsynth <stage> --json``, ``dpsynth train --launch … --json``
    "stage": "the stage's name",
    "status": "succeeded | skipped | failed",
    "manifest_uri": "where the manifest is (run directory layout)",
    "mlflow_run_id": _RUN_IDS["mlflow_run_id"],
    "manifest": MANIFEST,
    "trainjob": Free("the job's kind, name, namespace and shape (configuration)"),
}

SHARD = {  # ``dpsynth warmstart --shard K --json``: one fan-out task's record
    "format": "the record format's name (code)",
    "shard": "K (the task's index: configuration)",
    "status": "succeeded | skipped",
    "performed": "whether the method warm-starts per shard (code)",
    "reason": "why not (text)",
    "config_fingerprint": "sha256 of the configuration (no data)",
    "input_sha256": KEYED,
    "output": ENTRY,
    "seconds": WITHHELD,  # one shard's time: depends on its size when it is smaller than the batch (#52 item 8)
    "details": {"shard": "K (configuration)", "iterations": "gswgan.warmstart_iterations (configuration)",
                "seconds": WITHHELD, "iterations_per_second": WITHHELD},  # one shard's time and speed (#52 item 8)
}

STAGE_ROW = {
    "stage": "the stage's name", "status": "the stage's status", "epsilon": "accounted",
    "outputs": "how many files the stage wrote (code: one per shard, K from the configuration)",
    "where": "the stage's folder (run directory layout)", "mlflow_run_id": _RUN_IDS["mlflow_run_id"],
    "error": "the stage's refusal: names the file and the check, never a value read from the data (refusal())",
}

SUMMARY = {  # ``dpsynth pipeline run | finish | show --json``
    **_RUN_IDS, "run_dir": "the run directory (configuration)", "succeeded": "whether every stage succeeded",
    "epsilon_total": "accounted", "delta": "privacy.delta (configuration)", "audit": "the audit's verdict",
    "empirical": "the empirical audit's verdict", "stages": Each(STAGE_ROW), "card": "the release card's URI",
    "ledger": Free("the ledger's charges to this run: ε charged, attempts, reservation ids (accounted)"),
}

START = {  # ``dpsynth pipeline start --json``
    **_RUN_IDS, "run_dir": "the run directory (configuration)", "skipped": "why a retrain started no run (text)",
    "train": Free("where the train stage runs: nodes, gpus_per_node, ranks (configuration)"),
}

IMPORT = {  # ``dpsynth data import --outside --json``: the import DAG's XCom and asset event
    "uri": "the import's destination (configuration)",
    "shape": "the image shape H×W×C (public)",
    "version": "the import's keyed version id: the version history is public (docs/privacy.md)",
    "versioned_uri": "where this version is kept (the destination and the version id)",
    "changed": "whether this import is a new version (the version history is public)",
}

TRACE = {  # the mechanism trace the trainer logs to its MLflow run
    "format": "the trace format's name (code)",
    "events": PRIVACY["events"],
    "steps": "the steps the plan fixed (configuration and the public n)",
}

EVALUATION = {  # the evaluate stage's report.json (release zone, logged to MLflow after the audit passed)
    name: Free("the evaluate stage's report: published after the audit; its statistics of held-out real records "
               "are stated as outside ε (docs/privacy.md, the evaluate stage), membership inference is kept in the "
               "sensitive zone")
    for name in ("format", "classifier_accuracy", "utility", "quality", "epsilon_curve", "membership_inference",
                 "reference", "labels", "model_selection", "privacy", "train", "test", "heldout_data", "operator")
}

SHAPES: dict[str, Mapping] = {"manifest": MANIFEST, "outcome": OUTCOME, "shard": SHARD, "summary": SUMMARY,
                              "start": START, "trace": TRACE, "evaluation": EVALUATION, "import": IMPORT}


# The commands whose output is for the data owner's own terminal, inside the sensitive zone, on purpose: no
# orchestrator runs them (tests/stages/test_egress.py checks both), and their output goes through no gate.
INSIDE = {
    "data info": "a dataset's rows, class counts, splits and content sha256: the data owner's look at their records",
}

# The files a stage writes to the sensitive zone for the operator on purpose (under the run's sensitive zone): exact
# statistics of sensitive records, read there and never copied out; the release, MLflow and every --json outcome
# carry only their path and status (tests/stages/test_egress.py checks that none of their figures leaves).
INSIDE_FILES = {
    "evaluate/operator.json": "the ceiling (the release's classifier trained on the training records, tested on the "
                              "held-out records), the release's share of it, and per-class accuracies (a null there "
                              "says a class has no held-out record): the operator's reading of the release",
    "evaluate/membership_inference.json": "membership inference on training and held-out records: the auditor's",
}


# --- the gate ------------------------------------------------------------------------------------------------


def let_out(obj: dict, shape: str | Mapping, *, key: Callable[[str], str] | None = None) -> dict:
    """``obj`` as it may leave the sensitive zone: only the fields ``shape`` (a name in :data:`SHAPES`, or a shape)
    allows; ``KEYED`` hashes outside the release zone through ``key`` (None: the object was keyed when it was
    written — a release-zone manifest — and its hashes leave as they are), ``WITHHELD`` values null outside the
    release zone. Dropped fields are logged by path (never by value)."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    dropped: list[str] = []
    out = _walk(obj, shape, key=key, release=False, path="", dropped=dropped)
    if dropped:
        log.warning("egress: withheld field(s) no allow-list names: %s (dpsynth/egress.py)", ", ".join(dropped))
    return out


def _walk(value, shape, *, key, release: bool, path: str, dropped: list[str]):
    if value is None:
        return None
    if isinstance(shape, Free) or isinstance(shape, str) and shape not in (KEYED, WITHHELD):
        return value
    if shape == KEYED:
        if release or key is None:
            return value
        return key(value) if isinstance(value, str) else None
    if shape == WITHHELD:
        return value if release else None
    if isinstance(shape, Each):
        if not isinstance(value, list):
            dropped.append(path)
            return None
        return [_walk(v, shape.shape, key=key, release=release, path=f"{path}[]", dropped=dropped) for v in value]
    if not isinstance(value, dict):
        dropped.append(path)
        return None
    release = release or value.get("zone") == "release"
    out = {}
    for field, v in value.items():
        where = f"{path}.{field}" if path else field
        if field not in shape:
            dropped.append(where)
            continue
        out[field] = _walk(v, shape[field], key=key, release=release, path=where, dropped=dropped)
    return out


def refusal(what: str, check: str, *, fix: str = "") -> str:
    """A refusal about a sensitive file or dataset: ``what`` (the file, or the field) failed ``check`` — never a value
    read from the data (a record id, a label, a hash, a count). ``fix``: what to do."""
    return f"{what}: {check}" + (f"; {fix}" if fix else "")
