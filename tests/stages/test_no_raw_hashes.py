"""No raw hash of a sensitive-zone file, and no per-shard count, leaves the sensitive zone (issue #33, items 2–3).

A pre-trained GS-WGAN discriminator D_k is deterministic given train.seed, its shard and the code: anyone who knows
the other records can retrain it with and without a record and compare its sha256 with a published one (exact
membership). A per-shard row count tells D from D ∪ {x} once the partition key is known. One GS-WGAN pipeline
(K = 3 pre-trained discriminators) with MLflow on, run twice on one store: first with an audit that fails (nothing
is released, so nothing of the sensitive zone may be named by its raw hash), then one that passes (only what the
release publishes: the audited generator's bytes, and the trace it is bound to)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from dpsynth.ledger.store import Ledger
from dpsynth.stages import audit
from dpsynth.stages import protocol
from tests.stages.helpers import TINY, dpsynth, manifest, settings

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")

GSWGAN = ("train.method=gswgan", "partition.num_shards=3", "gswgan.d_width=4", "gswgan.g_width=4",
          "gswgan.latent_dim=8", "gswgan.batch_size=16", "train.n_d=2", "gswgan.pretrain_iterations=2", "train.steps=4")
RAW = re.compile(r'"(sha256|content_sha256)": "([0-9a-f]{64})"')


def file_hashes(root: Path) -> dict[str, str]:
    return {hashlib.sha256(p.read_bytes()).hexdigest(): str(p.relative_to(root.parent))
            for p in root.rglob("*") if p.is_file()}


def sensitive_hashes(run: Path) -> dict[str, str]:
    """sha256 → what it names: every file under sensitive/, and every raw hash its manifests record."""
    found = file_hashes(run / "sensitive")
    for m in (run / "sensitive").rglob("manifest.json"):
        for field, h in RAW.findall(m.read_text()):
            found.setdefault(h, f"{field} in {m.relative_to(run)}")
    return found


def store_texts(base: Path) -> dict[str, bytes]:
    """Everything MLflow holds: the backend database (params, metrics, tags, registry) and every artifact file."""
    files = [base / "mlflow.db", *(p for p in (base / "artifacts").rglob("*") if p.is_file())]
    return {str(p.relative_to(base)): p.read_bytes() for p in files}


def hits(texts: dict[str, bytes], hashes: dict[str, str]) -> list[str]:
    return sorted(f"{where}: {what}" for where, data in texts.items() for h, what in hashes.items() if h.encode() in data)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, source):
    base = tmp_path_factory.mktemp("no-raw-hashes")
    mlflow_uri = f"sqlite:///{base / 'mlflow.db'}"
    tracked = ("tracking.enabled=true", f"tracking.uri={mlflow_uri}", "tracking.experiment=no-raw-hashes",
               f"tracking.artifact_location={base / 'artifacts'}", *GSWGAN)
    run = base / "run"
    with pytest.MonkeyPatch.context() as mp:
        url = f"sqlite:///{base / 'ledger.db'}"
        mp.setenv("DPSYNTH_LEDGER_URL", url)
        Ledger(url).set_budget("mnist600", epsilon=1000.0, delta=1e-3, reason="no-raw-hashes test")

        def pipeline(run_id, *overrides):
            return dpsynth("pipeline", "run", "--run-dir", run, "--pipeline-run-id", run_id,
                           *settings(source, *tracked, *overrides))

        # the paper's own account (with a fixed σ, which as_published needs; 5 fits 4 steps in ε = 10): training
        # succeeds, the audit refuses it — a failed audit, reached (#52 item 4: without σ it failed at train)
        assert pipeline("failed", "privacy.accounting=as_published", "privacy.noise_multiplier=5") == 2
        failed = {"store": store_texts(base), "sensitive": sensitive_hashes(run),
                  "audit": manifest(run, "sensitive", "audit"), "released": (run / "release" / "sample").exists()}
        assert pipeline("passed") == 0
    return {"base": base, "run": run, "mlflow_uri": mlflow_uri, "failed": failed}


def test_a_failed_audit_leaves_no_raw_hash_of_the_sensitive_zone_in_mlflow(runs):
    from mlflow import MlflowClient

    failed = runs["failed"]
    # the audit ran and refused (not an earlier stage's failure), and nothing was released
    assert failed["audit"]["status"] == "failed" and failed["audit"]["pipeline_run_id"] == "failed"
    assert not failed["released"]
    client = MlflowClient(runs["mlflow_uri"])
    exp = client.get_experiment_by_name("no-raw-hashes")
    audit_runs = client.search_runs([exp.experiment_id], filter_string="tags.`dpsynth.stage` = 'audit' and "
                                    "tags.`dpsynth.pipeline_run_id` = 'failed'")
    assert [r.data.tags.get("dpsynth.stage_status") for r in audit_runs] == ["failed"]  # MLflow holds the refusal
    assert any("discriminator.pt" in what for what in failed["sensitive"].values())  # D_k's hashes are looked for
    assert hits(failed["store"], failed["sensitive"]) == []


def test_a_release_publishes_no_raw_hash_but_its_own(runs):
    run, base = runs["run"], runs["base"]
    sensitive = sensitive_hashes(run)
    released = file_hashes(run / "release")
    bound_trace = json.loads((run / "release" / "sample" / "audit.json").read_text())["trace"]["sha256"]
    # what the release publishes: files whose very bytes it holds (the audited generator), the trace it is bound to
    private = {h: what for h, what in sensitive.items() if h not in released and h != bound_trace}
    assert any("discriminator.pt" in what for what in private.values())
    outside = {**store_texts(base), **{f"release/{k}": v for k, v in
                                       ((str(p.relative_to(run / "release")), p.read_bytes())
                                        for p in (run / "release").rglob("*") if p.is_file())}}
    assert hits(outside, private) == []


def test_the_release_states_what_is_public_and_what_the_settings_were_tuned_on(runs):
    from dpsynth.privacy.statement import PUBLIC_FACTS, TUNING

    release = runs["run"] / "release" / "sample"
    for text in ((release / "audit.md").read_text(), json.dumps(manifest(runs["run"], "release", "sample"))):
        assert "n and the label set are public" in text and "hyperparameter search" in text
        assert "version history is public" in text  # #52 item 2: whether and when the records changed
    statement = json.loads((release / "audit.json").read_text())["statement"]
    assert statement["assumptions"][-2:] == [PUBLIC_FACTS, TUNING]


def test_no_per_shard_count_outside_the_sensitive_zone(runs):
    run, base = runs["run"], runs["base"]
    views = [json.loads(p.read_text()) for p in (base / "artifacts").rglob("manifest.json")]
    views += [manifest(run, "release", name) for name in ("sample", "evaluate")]
    assert {v["stage"] for v in views} >= {"partition", "pretrain", "train", "audit", "sample", "evaluate"}
    for v in views:
        for item in (*v["inputs"], *v["outputs"]):
            assert item.get("zone") == "release" or item.get("rows") is None, (v["stage"], item["role"])
    details = manifest(run, "sensitive", "partition")["details"]  # the public counts: n and the held-out count
    assert details["training_records"] > 0 and "heldout_records" in details


def test_the_audit_reads_mlflow_values_tags_and_artifacts(runs, tmp_path):
    """The audit's ``mlflow_values`` check passes on the run above, and fails once a raw D_k hash is planted
    in a tag or an artifact of the train run (the key allow-list alone would not see it)."""
    from mlflow import MlflowClient

    from dpsynth.config import load_config

    run = runs["run"]
    report = json.loads((run / "sensitive" / "audit" / "audit.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "mlflow_values"]
    assert check["passed"], check
    cfg = load_config(overrides=[*TINY, "tracking.enabled=true", f"tracking.uri={runs['mlflow_uri']}", *GSWGAN])
    ctx = protocol.StageContext.create(cfg, run_dir=str(run))
    train_run = manifest(run, "sensitive", "train")["mlflow_run_id"]
    d0 = next(o for o in manifest(run, "sensitive", "pretrain")["outputs"] if o["role"] == "discriminator")
    assert audit.mlflow_values_check(ctx, run_ids=[train_run], parent_run_id=None)["passed"]
    client = MlflowClient(runs["mlflow_uri"])
    client.set_tag(train_run, "note", f"D_0 is {d0['sha256']}")
    failed = audit.mlflow_values_check(ctx, run_ids=[train_run], parent_run_id=None)
    assert not failed["passed"] and "tag note" in failed["detail"]
    client.set_tag(train_run, "note", "nothing")
    (tmp_path / "shards.txt").write_text(d0["sha256"])
    client.log_artifact(train_run, str(tmp_path / "shards.txt"))
    failed = audit.mlflow_values_check(ctx, run_ids=[train_run], parent_run_id=None)
    assert not failed["passed"] and "artifact shards.txt" in failed["detail"]


def test_the_json_outcomes_an_orchestrator_logs_hold_no_raw_hash_or_shard_count(tmp_path, source, capsys):
    """``dpsynth <stage> --json`` and ``pretrain --shard K --json`` print what Airflow and KFP log and pass on."""
    from tests.stages.helpers import stage

    run = tmp_path / "run"
    assert stage("partition", run, source, *GSWGAN, flags=("--json",)) == 0
    partition = json.loads(capsys.readouterr().out)
    assert stage("pretrain", run, source, *GSWGAN, flags=("--shard", "0", "--json")) == 0
    shard = json.loads(capsys.readouterr().out)
    assert shard["status"] == "succeeded"
    # no per-shard pre-training time reaches the XCom (#52 item 8): one shard's time depends on its size
    assert shard["seconds"] is None and shard["details"]["seconds"] is None
    assert shard["details"]["iterations_per_second"] is None
    printed = {"partition": json.dumps(partition).encode(), "pretrain --shard 0": json.dumps(shard).encode()}
    assert hits(printed, sensitive_hashes(run)) == []
    assert all(o.get("rows") is None for o in partition["manifest"]["outputs"])
