"""No raw hash of a sensitive-zone file, and no per-shard count, leaves the sensitive zone (issue #33, items 2–3).

A pre-trained GS-WGAN discriminator D_k is deterministic given train.seed, its shard and the code: anyone who knows
the other records can retrain it with and without a record and compare its sha256 with a published one (exact
membership). A per-shard row count tells D from D ∪ {x} once the partition key is known. Here: one GS-WGAN pipeline
(K = 3 pre-trained discriminators) with MLflow on whose audit fails (nothing is released, so nothing of the sensitive
zone may be named by its raw hash). The same GS-WGAN run with an audit that passes (only what the release publishes
leaves: the audited generator's bytes, and the trace it is bound to) is tests/stages/test_egress.py's walk, which
checks it with this module's helpers (one passing GS-WGAN run with MLflow for both modules)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from dpsynth.ledger.store import Ledger
from tests.stages.helpers import dpsynth, manifest, settings

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
