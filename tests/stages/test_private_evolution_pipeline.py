"""Private Evolution as a pipeline release, and the one default (`make run`'s config) picking it for colour images.

A tiny colour source (benchmarks/datasets.py's symbols-rgb, 12 classes × 10 images of 32 × 32) runs the six stages under the shipped default config, with
train.method auto: the stages resolve it to private-evolution from the public schema, the trace holds one full-batch
event per round, the card's ε is `dpsynth release verify`'s, and the release zone holds samples of the schema's
shape. A grey source resolves the same config to the grey recipe (dpgan, the warm-up on).

One run for the module (:func:`pe_run`): the stages as an orchestrator runs them (``pipeline start``, each stage with
``--json``, ``pipeline finish``), MLflow on, so that the same run is also Private Evolution's pass of the egress walk
(tests/stages/test_egress.py's gate and raw-hash checks). `dpsynth pipeline run` itself runs the same stage functions
(tests/stages/test_pipeline.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dpsynth import storage
from dpsynth.config import load_config
from dpsynth.data import import_source, read_parquet, write_parquet
from dpsynth.stages.protocol import StageContext
from tests.stages.helpers import KEY, dpsynth, manifest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "dpgan-mnist-cpu.yaml"  # `make run`'s CONFIG
_spec = importlib.util.spec_from_file_location("bench_datasets", ROOT / "benchmarks" / "datasets.py")
datasets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(datasets)

# the evolution at test size: 2 rounds of 6 candidates a class; the rest of the default as shipped
SMALL = ("evolution.rounds=2", "evolution.candidates=6", "privacy.delta=1e-3", "sample.num_samples=48",
         "evaluate.epochs=1", "evaluate.feature_steps=5", "evaluate.mia_generated=48", "evaluate.mia_records=20",
         "evaluate.curve_samples=0", "tracking.enabled=false", "audit.empirical=off", f"partition.key={KEY}",
         "data.num_classes=12", "ledger.population_id=mnist600", "output.log_every=0", "output.sample_every=0",
         "output.checkpoint_every=0")


@pytest.fixture(scope="module")
def rgb_source(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("symbols") / "symbols-rgb"
    datasets.write_folder("symbols-rgb", folder, n=120, seed=0)
    path = folder.parent / "symbols-rgb.parquet"
    write_parquet(import_source(folder), path)
    return str(path)


def _set(source, *overrides):
    return [a for item in (f"data.uri={source}", *SMALL, *overrides) for a in ("--set", item)]


def test_the_default_config_picks_by_the_public_schema(tmp_path, rgb_source, source):
    """auto → private-evolution on colour (warm-up and the DCGAN layers off), → dpgan on grey (the recipe as
    written: the resolved grey config equals the config with train.method=dpgan)."""
    over = [f"partition.key={KEY}", "data.num_classes=12"]
    colour = StageContext.create(load_config(DEFAULT, overrides=[f"data.uri={rgb_source}", *over]),
                                 run_dir=str(tmp_path / "a")).cfg
    assert colour.train.method == "private-evolution"
    assert not colour.warmup.central_images and not colour.train.g_tone and not colour.train.g_warp
    grey = StageContext.create(load_config(DEFAULT, overrides=[f"data.uri={source}", *over]),
                               run_dir=str(tmp_path / "b")).cfg
    written = StageContext.create(load_config(DEFAULT, overrides=[f"data.uri={source}", *over,
                                                                  "train.method=dpgan"]), run_dir=str(tmp_path / "b")).cfg
    assert grey == written and grey.warmup.central_images and grey.train.g_tone


@pytest.fixture(scope="module")
def pe_run(tmp_path_factory, rgb_source):
    """The six stages of the default on the colour source, each with --json and MLflow on, in the order an
    orchestrator runs them; each command's stdout and stderr kept (the ledger: one of its own, with a budget)."""
    from dpsynth.ledger.store import Ledger
    from tests.stages.test_egress import captured

    base = tmp_path_factory.mktemp("pe-run")
    ledger = f"sqlite:///{base / 'ledger.db'}"
    Ledger(ledger).set_budget("mnist600", epsilon=1000.0, delta=1e-3, reason="test_private_evolution_pipeline.py")
    mlflow_uri = f"sqlite:///{base / 'mlflow.db'}"
    tracked = ["audit.empirical=auto", "audit.canaries=100", "tracking.enabled=true", f"tracking.uri={mlflow_uri}",
               "tracking.experiment=egress-pe", f"tracking.artifact_location={base / 'artifacts'}"]
    run, ran = base / "run", []
    on = ["--run-dir", run, "--pipeline-run-id", "pe1", "--config", DEFAULT, *_set(rgb_source, *tracked), "--json"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSYNTH_LEDGER_URL", ledger)
        with captured() as got:
            assert dpsynth("pipeline", "start", *on) == 0
        ran.append(("pipeline start", got["out"], got["err"]))
        on += ["--parent-run-id", json.loads(got["out"])["parent_run_id"]]
        for stage in ("partition", "pretrain", "train", "audit", "sample", "evaluate"):
            with captured() as got:
                assert dpsynth(stage, *on) == 0, (stage, got["err"][-3000:])
            ran.append((stage, got["out"], got["err"]))
        with captured() as got:
            assert dpsynth("pipeline", "finish", *on) == 0
        ran.append(("pipeline finish", got["out"], got["err"]))
    return {"base": base, "run": run, "ran": ran}


def test_a_colour_run_of_the_default_releases_private_evolution(pe_run, capsys):
    run = pe_run["run"]
    train = manifest(run, "sensitive", "train")
    assert train["details"]["method"] == "private-evolution"
    trace = json.loads(storage.read_bytes(run / "sensitive" / "train" / "trace.json"))
    events = trace["events"]
    assert sum(e.get("count", 1) for e in events) == 2  # T rounds
    assert all(e["sampling"] == "full_batch" and e["sample_rate"] == 1.0 for e in events)
    audit = json.loads((run / "sensitive" / "audit" / "audit.json").read_text())
    (part,) = audit["empirical"]["components"]  # the histogram canaries (no warm-up release)
    assert part["attacks"][0]["name"] == "votes" and part["verdict"] in ("passed", "inconclusive")
    stored = (run / "sensitive" / "train" / "config.yaml").read_text()
    assert "method: private-evolution" in stored
    synthetic = read_parquet(run / "release" / "sample" / "synthetic.parquet")
    # the noise screen may drop a sample or two (one, in a one-process run of the whole quick tier; none alone)
    screened = manifest(run, "release", "sample")["details"]["screened"]
    assert screened["dropped"] <= 2
    assert synthetic.shape == (32, 32, 3) and len(synthetic) == 48 - screened["dropped"] and synthetic.num_classes == 12
    card = json.loads((run / "release" / "card" / "card.json").read_text())
    capsys.readouterr()
    assert dpsynth("release", "verify", run / "release", "--json") == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["headline epsilon"]["passed"]  # the card's ε is the largest recomputed from its trace.json
    assert 0 < card["epsilon"] <= 10.0
    html = (run / "release" / "card" / "card.html").read_text()
    assert "public prior" in html and "Private Evolution" in html


def test_a_private_evolution_run_leaves_only_declared_fields_and_no_raw_hash(pe_run):
    """Private Evolution's pass of the egress walk (#51, tests/stages/test_egress.py): its stages with --json and
    MLflow on leave no field the gate does not name (its train details, its generator-file model in MLflow), and no
    raw hash of the sensitive zone in what the commands print or MLflow holds."""
    from tests.stages.test_no_raw_hashes import file_hashes, hits, sensitive_hashes, store_texts

    run, ran = pe_run["run"], pe_run["ran"]
    assert manifest(run, "sensitive", "train")["details"]["method"] == "private-evolution"
    warned = [f"{stage}: {line}" for stage, _, err in ran for line in err.splitlines()
              if "egress: withheld field" in line]
    assert warned == []
    printed = {f"{stage} stdout": out.encode() for stage, out, _ in ran} | store_texts(pe_run["base"])
    sensitive = sensitive_hashes(run)
    released = file_hashes(run / "release")
    bound_trace = json.loads((run / "release" / "sample" / "audit.json").read_text())["trace"]["sha256"]
    private = {h: what for h, what in sensitive.items() if h not in released and h != bound_trace}
    assert any("sensitive/train/" in what for what in private.values())  # the run's own files are looked for
    assert hits(printed, private) == []
