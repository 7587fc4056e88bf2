"""The one gate between the sensitive zone and everything outside it (issue #52).

Whatever leaves a stage for a place an orchestrator, an operator or an auditor reads — the ``--json`` outcome of
every ``dpsynth`` command (Airflow keeps it as ``return.json`` and XCom, KFP echoes it into the pod log), the
manifests logged to MLflow, the release zone's manifests, the audit report's MLflow and released copies, the release
card, the ``ledger`` commands' ``--json`` and the auditor's ledger page — passes through :func:`let_out` with its
:data:`SHAPES` entry; every MLflow tag, metric and parameter through :func:`let_out_run` (``tracking.log_run`` and
``tracking.run_tags``, the only code that writes them). The gate is an **allow-list**: a field leaves only when its shape names it, with the reason it
may; every other field is dropped (its path, never its value, is logged as a warning, so a new field is noticed and
then declared here, with its reason). Three rules for the fields that name data:

- ``KEYED``: a content hash. Outside the release zone it leaves as its keyed version id (``key``: HMAC under the
  run's key in the sensitive zone, :func:`dpsynth.stages.protocol.dataset_version`), never raw — a raw hash of a
  shard, of a pre-trained discriminator or of a manifest is a membership test for anyone who knows the other
  records. A file of the release zone (an entry whose ``zone`` is ``"release"``) is published, and so is its hash.
- ``WITHHELD``: a count or a duration of one shard or one class (``rows`` of a shard file, a shard's pre-training
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
    # pretrain: whole-stage figures only, none per shard (#52 item 8)
    "performed": "whether the method pre-trains (code)",
    "reason": "why not (text)",
    "shards": "K (configuration)",
    "ran_here": "how many shards this task pre-trained (K, or fewer when an earlier task did some)",
    "workers": "pretrain.workers (configuration)",
    "fan_in_seconds": "the whole stage's wall time (as MLflow's run duration shows it)",
    "shard_seconds_total": WITHHELD,  # the shards' times (the sensitive manifest keeps them: benchmarks read them)
    "shard_seconds_max": WITHHELD,  # one shard's time: depends on its size when it is smaller than the batch
    "iterations": "the public pre-training's iterations (configuration)",
    "iterations_per_second": "the public pre-training's speed (public data only)",
    "critic_steps_per_iteration": "train.n_d, dp-GAN's n_critic (configuration)",
    "seconds": "the public pre-training's wall time (dp-GAN: public data only)",
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

SHARD = {  # ``dpsynth pretrain --shard K --json``: one fan-out task's record
    "format": "the record format's name (code)",
    "shard": "K (the task's index: configuration)",
    "status": "succeeded | skipped",
    "performed": "whether the method pre-trains per shard (code)",
    "reason": "why not (text)",
    "config_fingerprint": "sha256 of the configuration (no data)",
    "input_sha256": KEYED,
    "output": ENTRY,
    "seconds": WITHHELD,  # one shard's time: depends on its size when it is smaller than the batch (#52 item 8)
    "details": {"shard": "K (configuration)", "iterations": "gswgan.pretrain_iterations (configuration)",
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

IMPORT = {  # ``dpsynth data import --json`` (``--outside``, the default): the import DAG's XCom and asset event
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

AUDIT = {  # the audit report as MLflow keeps it (audit.json, and audit.md rendered from this view)
    "format": "the report format's name (code)", "decision": "the audit's verdict",
    "target": Free("privacy.epsilon and privacy.delta (configuration)"),
    "epsilon_upper_bound": "ε recomputed from the trace (accounted)",
    "epsilons": Free("ε per accountant, recomputed from the trace (accounted)"),
    "accountants_note": "which accountants apply (text the code writes)",
    "training_records": DETAILS["training_records"],
    "checks": Free("each check's name, verdict and detail: refusals name the file and the check, never a value read "
                   "from the data (refusal())"),
    "statement": Free("the privacy statement (text the code writes from the configuration and the public n)"),
    "generator": {"uri": ENTRY["uri"], "sha256": KEYED},
    "trace": {"uri": ENTRY["uri"], "sha256": KEYED, "events": PRIVACY["events"]},
    "claimed": Free("the trainer's claimed ε and accountant (accounted)"),
    "empirical": Free("the empirical audit: ε_lower and verdicts of canaries on public stand-ins, never on the records"),
    "runs": Free("the MLflow run ids of the train and parent runs and the pipeline run id (random)"),
}

CARD = {  # the release card: card.json, and card.html rendered from it (release/card.py)
    "format": "the card format's name (code)", "decision": "released | refused (the audit's verdict)",
    "created_at": "when the card was written", **_RUN_IDS, "method": "train.method (configuration)",
    "code_version": MANIFEST["code_version"], "git_sha": MANIFEST["git_sha"], "image": MANIFEST["image"],
    "dataset_version": MANIFEST["dataset_sha256"],
    "stages": Each({"stage": "the stage's name", "zone": "sensitive | release (the run directory's layout)",
                    "status": "the stage's status", "epsilon": "accounted", "mlflow_run_id": _RUN_IDS["mlflow_run_id"],
                    "code_version": MANIFEST["code_version"], "image": MANIFEST["image"]}),
    "target": AUDIT["target"], "epsilon": AUDIT["epsilon_upper_bound"], "delta": "privacy.delta (configuration)",
    "epsilons": AUDIT["epsilons"], "accountants_note": AUDIT["accountants_note"], "statement": AUDIT["statement"],
    "training_records": DETAILS["training_records"],
    "public": Free("what the card states public: n, the public sources (configuration), the label set (text)"),
    "outside_guarantee": Free("what ε does not cover (text the code writes)"),
    "empirical": AUDIT["empirical"],
    "checks": Each({"name": "the audit check's name", "passed": "its verdict"}),
    "trace_sha256": "the audited trace's sha256 (published with the release: release/trace.json)",
    "generator_sha256": "the audited generator's sha256 (published with the release: sample/generator.pt)",
    "events": Free("the trace's events with ε alone per event (the plan: configuration and the public n)"),
    "ledger": Free("the population's ledger around this run: budget, ε charged per attempt and per block, statuses "
                   "(accounted; the ledger page shows the same)"),
    "refused_because": Free("the failed checks' names and details (refusal(): never a value read from the data)"),
    "release": {"generator": Free("the released generator's path, sha256 and size (release zone)"),
                "synthetic": Free("the released synthetic data's path, sha256, size and rows (sample.num_samples)"),
                "registered_model": Free("the registered model's name, version and alias"),
                "num_classes": DETAILS["num_classes"]},
    "utility": Free("the evaluate stage's headline figures (release zone; docs/privacy.md, the evaluate stage)"),
    "files": Free("every released file's path, sha256 and size (release zone)"),
    "pdf": "whether card.pdf was written (code)", "signing_key_sha256": "the signing key's public fingerprint",
}

_BALANCE = {  # a population's balance, as the ledger keeps it (accounted, never a count of records)
    "population_id": "ledger.population_id (configuration)", "budget": "the lifetime ε budget (set by an operator)",
    "committed": "ε committed (accounted)", "reserved": "ε reserved by open attempts (accounted)",
    "remaining": "ε left (accounted)", "delta": "the δ budget (set by an operator)", "delta_used": "δ charged",
    "blocks": Each({"block": "the privacy block's index (by arrival: docs/privacy.md, \"Privacy blocks\")",
                    "committed": "accounted", "reserved": "accounted", "remaining": "accounted",
                    "delta_used": "accounted"}),
    "epsilon_budget": "the lifetime ε budget", "created_at": "when the population was created",
    "updated_at": "when its budget last changed",
    "data_id": "the data's id under the ledger's key (HMAC of the content hash: equal only for the same records)",
    "shared_data_reason": "an operator's reason for charging data another population was charged for (text)",
}

_RESERVATION = {  # one attempt's reservation (dpsynth.ledger.store)
    "id": "the ledger's counter", "population_id": _BALANCE["population_id"],
    "dataset_sha256": "the dataset's keyed version id (the stage keyed it)",
    "pipeline_run_id": _RUN_IDS["pipeline_run_id"], "stage": "the stage's name",
    "epsilon_reserved": "accounted", "delta": "privacy.delta (configuration)", "epsilon_spent": "accounted",
    "status": "reserved | committed | released", "accountant": "privacy.accountant (configuration)",
    "created_at": "when the attempt opened", "closed_at": "when it closed", "note": "text the code writes",
    "attempt_id": "the attempt's random id", "resumes_id": "the reservation whose checkpoint it resumed",
    "steps": "private steps its last checkpoint holds (the plan's, fixed by ε and the public n)",
    "heartbeat_at": "when it last reported", "epsilon_bound": "the ε it may reach (accounted)",
    "data_id": _BALANCE["data_id"], "blocks": "the privacy blocks it reads (its window: public rules)",
    "token_sha256": WITHHELD,  # the hash of the attempt's secret: no one outside the attempt needs it
}

LEDGER = {  # ``dpsynth ledger show | set-budget | settle | history | forecast --json``: one shape for each
    "balance": _BALANCE,
    "populations": Each(_BALANCE),
    "reservation": _RESERVATION,
    "history": {"reservations": Each(_RESERVATION),
                "budget_changes": Each({"id": "the ledger's counter", "population_id": _BALANCE["population_id"],
                                        "changed_at": "when", "changed_by": "the operator's role", "old_epsilon":
                                        "set by an operator", "old_delta": "set by an operator", "new_epsilon":
                                        "set by an operator", "new_delta": "set by an operator",
                                        "reason": "the operator's reason (text)"})},
    "forecast": Free("the retrain's plan over the privacy blocks: their arrival, ε and δ left, what each funds "
                     "(public rules over the ledger's charges; docs/privacy.md, \"Privacy blocks\")"),
    "roles": {"stage_role": "the role's name (an operator's argument)", "auditor_role": "the role's name",
              "statements": Free("the SQL the command ran (text the code writes)")},
}

_PAGE_RUN = {  # one pipeline run on the ledger page
    "pipeline_run_id": _RUN_IDS["pipeline_run_id"], "reservation_ids": "the ledger's counters",
    "attempts": Each({**{k: _RESERVATION[k] for k in ("stage", "status", "epsilon_reserved", "delta", "resumes_id",
                                                       "steps", "created_at", "blocks", "closed_at", "note")},
                      "reservation_id": "the ledger's counter", "epsilon_charged": "accounted"}),
    "status": "the run's ledger status", "epsilon_charged": "accounted", "delta": "accounted",
    "dataset_sha256": Each("the dataset's keyed version ids (the stage keyed them)"),
    "created_at": "when the run's first attempt opened",
    "mlflow": Free("the run's MLflow part: stage run ids, ε per stage, the audit's and the empirical audit's "
                   "verdicts, the release card's link, the registered versions (tags the egress gate let out)"),
    "lineage": Each({"kind": "the link's kind (code)",
                     "sha256": "a keyed version id (sensitive-zone files) or a released file's sha256",
                     "detail": "text the code writes: n, ε, the method, the audit's verdict",
                     "items": Each({"name": "the shard file's name (configuration)", "sha256": "a keyed version id"}),
                     "run_id": _RUN_IDS["mlflow_run_id"], "pipeline_run_id": _RUN_IDS["pipeline_run_id"],
                     "versions": Free("the registered versions (the registry's tags the egress gate let out)")}),
}

LEDGER_PAGE = {  # the auditor's Privacy ledger page (mlflow_plugins/dpsynth_mlflow): its JSON API and its HTML
    "format": "the page's format name (code)",
    "populations": Each({**{k: _BALANCE[k] for k in ("population_id", "budget", "committed", "reserved",
                                                      "remaining", "delta", "delta_used", "blocks")},
                         "runs": Each(_PAGE_RUN)}),
}

SHAPES: dict[str, Mapping] = {"manifest": MANIFEST, "outcome": OUTCOME, "shard": SHARD, "summary": SUMMARY,
                              "start": START, "trace": TRACE, "evaluation": EVALUATION, "import": IMPORT,
                              "audit": AUDIT, "card": CARD, "ledger page": LEDGER_PAGE,
                              **{f"ledger {name}": shape for name, shape in LEDGER.items()}}


# --- MLflow: every tag, metric and parameter a run, the parent run or a registered version gets ----------------
# Metrics and parameters: the run's stage declares its own (its ``MLFLOW_KEYS``, a ``tracking.LoggedKeys``: a trainer's
# for the train run), each with its reason; the one function that writes them (``tracking.log_run``) passes them
# through :func:`let_out_run` with that declaration. Tags: one list for every run, here. A name ending in ``*``
# declares a prefix.
TAGS = {
    "dpsynth.stage": "the stage's name (code)",
    "dpsynth.dataset_version": "the dataset's keyed version id: the version history is public (docs/privacy.md)",
    "dpsynth.epsilon_spent": "accounted ε", "dpsynth.delta": "privacy.delta (configuration)",
    "dpsynth.accountant": "privacy.accountant (configuration)", "dpsynth.accounting": "sound | as_published (code)",
    "dpsynth.audit": "the audit's verdict", "dpsynth.epsilon_lower": "the empirical audit's lower bound (public stand-ins)",
    "dpsynth.empirical_audit": "the empirical audit's m, confidence, mode and verdicts (public stand-ins)",
    "dpsynth.empirical_verdict": "the empirical audit's verdict",
    "dpsynth.pipeline_run_id": _RUN_IDS["pipeline_run_id"], "dpsynth.parent_run_id": _RUN_IDS["parent_run_id"],
    "dpsynth.audit_run_id": "the audit stage's MLflow run id (random)",
    "dpsynth.train_run_id": "the train stage's MLflow run id (random)",
    "dpsynth.reused_run_id": "the MLflow run whose outputs a skipped stage reuses (random)",
    "dpsynth.code_version": MANIFEST["code_version"], "dpsynth.git_sha": MANIFEST["git_sha"],
    "dpsynth.image": MANIFEST["image"], "dpsynth.method": "train.method (configuration)",
    "dpsynth.population_id": "ledger.population_id (configuration)",
    "dpsynth.ledger_reservation_id": "the ledger's reservation ids of the run (the ledger's own counter)",
    "dpsynth.stage_status": "succeeded | failed | skipped", "dpsynth.run_dir": "the run directory (configuration)",
    "dpsynth.privacy.*": "the privacy statement: adjacency, assumptions, what is unprotected (text the code writes)",
    "dpsynth.evaluate.*": "the evaluate stage's reference kind, metrics status and Fréchet feature (code and "
                          "configuration)",
    "dpsynth.trace_sha256": "the released trace's sha256 (a registered version: published with the release)",
    "dpsynth.generator_sha256": "the released generator's sha256 (a registered version: published with the release)",
    "dpsynth.release_card": "the release card's runs:/ URI", "dpsynth.release_card_sha256": "the card page's sha256 "
                                                                                            "(release zone)",
}


def declared(name: str, allowed: Mapping) -> bool:
    """Whether ``allowed`` names ``name``, itself or by a prefix ending in ``*``."""
    return name in allowed or any(d.endswith("*") and name.startswith(d[:-1]) for d in allowed)


def let_out_run(keys, *, metrics: Mapping | None = None, params: Mapping | None = None,
                tags: Mapping | None = None) -> tuple[dict, dict, dict]:
    """The ``metrics``, ``params`` and ``tags`` an MLflow run may get: metrics and parameters that ``keys`` (the
    stage's declaration: ``.metrics`` and ``.params``, names → reasons; None declares none) names, tags that
    :data:`TAGS` names. Dropped names are logged (never their values)."""
    allowed = {"metric": getattr(keys, "metrics", {}), "param": getattr(keys, "params", {}), "tag": TAGS}
    out, dropped = {}, []
    for kind, given in (("metric", metrics), ("param", params), ("tag", tags)):
        out[kind] = {k: v for k, v in (given or {}).items() if declared(k, allowed[kind])}
        dropped += [f"{kind} {k}" for k in (given or {}) if k not in out[kind]]
    if dropped:
        log.warning("egress: withheld field(s) no allow-list names: %s (dpsynth/egress.py)", ", ".join(dropped))
    return out["metric"], out["param"], out["tag"]


# The commands whose output is for the data owner's own terminal, inside the sensitive zone, on purpose: no
# orchestrator runs them (tests/stages/test_egress.py checks both), and their output goes through no gate.
INSIDE = {
    "data info": "a dataset's rows, class counts, splits and content sha256: the data owner's look at their records",
    "data import --inside": "the import's rows, classes and content sha256, asked for by name: the data owner's "
                            "view (without --inside, data import prints only what IMPORT names)",
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


def let_out(obj, shape: str | Mapping | Each | Free, *, key: Callable[[str], str] | None = None):
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


# --- what docs/privacy.md states (its "What is public" lists exactly this; tests/stages/test_egress.py compares) ---


def public_fields() -> str:
    """Every field the gate lets out, shape by shape, as the Markdown list docs/privacy.md holds between its
    ``egress:fields`` markers: ``(keyed)`` leaves as a keyed version id outside the release zone, ``(null)`` leaves
    as null outside it, ``(whole)`` leaves whole (text and numbers the code writes); a shared sub-shape is listed
    once, by name."""
    named = {"entry": ENTRY, "privacy": PRIVACY, "details": DETAILS, "manifest": MANIFEST, "balance": _BALANCE,
             "reservation": _RESERVATION, "page run": _PAGE_RUN}

    def fields(shape) -> str:
        out = []
        for name, rule in shape.items():
            inner = rule.shape if isinstance(rule, Each) else rule
            mark = "[]" if isinstance(rule, Each) else ""
            ref = next((n for n, s in named.items() if s is inner), None)
            if ref is not None:
                out.append(f"`{name}{mark}` → {ref}")
            elif isinstance(inner, dict):
                out.append(f"`{name}{mark}` {{{fields(inner)}}}")
            else:
                out.append(f"`{name}{mark}`" + {KEYED: " (keyed)", WITHHELD: " (null)"}.get(inner, "")
                           + (" (whole)" if isinstance(inner, Free) else ""))
        return ", ".join(out)

    def top(shape) -> str:
        inner, mark = (shape.shape, "[] ") if isinstance(shape, Each) else (shape, "")
        ref = next((n for n, s in named.items() if s is inner), None)
        return f"{mark}→ {ref}" if ref else mark + fields(inner) if isinstance(inner, dict) else "(whole)"

    lines = [f"- **{name}**: {fields(shape)}" for name, shape in named.items()]
    lines += [f"- **{name}**: {top(shape)}" for name, shape in SHAPES.items() if shape is not named.get(name)]
    lines.append("- **MLflow tags** (every run and registered version): " + ", ".join(f"`{t}`" for t in TAGS))
    lines.append("- **MLflow metrics and parameters**: those the run's stage declares (its `MLFLOW_KEYS`, a trainer's "
                 "for the train run), each with its reason")
    return "\n".join(lines) + "\n"
