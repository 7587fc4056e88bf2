"""The DPGAN trainer: exact step semantics, budget stop, resume, and what it logs.

Resume equals an uninterrupted run: tests/methods/test_contract.py (every registered method)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from opacus.accountants import RDPAccountant

from dpsynth import tracking
from dpsynth.config import load_config
from dpsynth.methods.dpgan import DPGANTrainer, d_step, g_step

def tiny(tmp_path, *extra):
    return load_config(overrides=[
        f"output.dir={tmp_path}", "tracking.enabled=false", "train.d_width=4", "train.g_width=4",
        "train.latent_dim=8", "train.batch_size=32", "train.steps=12", "train.n_d=2",
        "output.checkpoint_every=4", "output.sample_every=0", "output.log_every=0", "privacy.epsilon=50",
        "privacy.delta=1e-4", *extra,
    ])


def test_step_semantics_and_trace(tmp_path, small_mnist):
    cfg = tiny(tmp_path)
    trainer = DPGANTrainer(cfg, small_mnist)
    assert trainer.sanitizer.expected_batch_size == 2 * 32  # mean over 2B, expected not actual
    result = trainer.train()
    assert result.steps == 12 and result.generator_steps == 6 and result.stopped_by == "steps"
    trace = json.loads(Path(result.trace_path).read_text())
    assert len(trace["events"]) == 1
    ev = trace["events"][0]
    assert ev["count"] == 12 and ev["sampling"] == "poisson" and ev["sensitivity"] == "add_remove"
    assert ev["sample_rate"] == pytest.approx(32 / 600)
    # ε as reported equals an independent RDP account of the same mechanism (Opacus' accountant)
    ref = RDPAccountant()
    ref.history = [(ev["noise_multiplier"], 32 / 600, 12)]
    assert result.epsilon == pytest.approx(ref.get_epsilon(1e-4), rel=1e-6)
    assert result.epsilon <= 50


def test_noise_is_calibrated_to_spend_the_budget(tmp_path, small_mnist):
    cfg = tiny(tmp_path, "privacy.epsilon=8")
    t = DPGANTrainer(cfg, small_mnist)
    ref = RDPAccountant()
    ref.history = [(t.event.noise_multiplier, 32 / 600, 12)]
    assert ref.get_epsilon(1e-4) <= 8
    ref.history = [(t.event.noise_multiplier * 0.98, 32 / 600, 12)]
    assert ref.get_epsilon(1e-4) > 8  # not wastefully large


def test_stops_before_the_step_that_would_exceed(tmp_path, small_mnist):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=0.8", "privacy.epsilon=6", "train.steps=100000")
    t = DPGANTrainer(cfg, small_mnist)
    T = t.total_steps
    ref = RDPAccountant()
    ref.history = [(0.8, 32 / 600, T)]
    assert ref.get_epsilon(1e-4) <= 6
    ref.history = [(0.8, 32 / 600, T + 1)]
    assert ref.get_epsilon(1e-4) > 6


def test_physical_batch_cap_keeps_the_step(tmp_path, small_mnist):
    a = DPGANTrainer(tiny(tmp_path / "a", "train.steps=3"), small_mnist, mechanism_seed=3)
    b = DPGANTrainer(tiny(tmp_path / "b", "train.steps=3", "train.physical_batch_size=7"), small_mnist,
                     mechanism_seed=3)
    for t in (a, b):
        for _ in range(3):
            d_step(t.state, t.draw(), t.sanitizer, chunk=t.cfg.train.physical_batch_size)
    for pa, pb in zip(a.state.D.parameters(), b.state.D.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["ghost", "ghost_two_pass"])
def test_ghost_modes_take_the_step_of_expanded_weights(tmp_path, small_mnist, mode):
    """Same coins, same data: ghost clipping (physical chunks included) moves D as Opacus' ew does."""
    a = DPGANTrainer(tiny(tmp_path / "a", "train.steps=3", "train.grad_sample_mode=ew"), small_mnist, mechanism_seed=3)
    b = DPGANTrainer(tiny(tmp_path / "b", "train.steps=3", f"train.grad_sample_mode={mode}",
                          "train.physical_batch_size=7", "privacy.max_grad_norm=0.05"), small_mnist, mechanism_seed=3)
    a.sanitizer.set_bounds([0.05])  # clipping active on both sides
    for t in (a, b):
        for _ in range(3):
            d_step(t.state, t.draw(), t.sanitizer, chunk=t.cfg.train.physical_batch_size)
        g_step(t.state, t.cfg.train.batch_size)
    for pa, pb in zip(a.state.D.parameters(), b.state.D.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-6)


def test_resume_refuses_other_settings(tmp_path, small_mnist):
    DPGANTrainer(tiny(tmp_path), small_mnist).train(stop_after=4)
    from dpsynth.errors import ConfigError

    with pytest.raises(ConfigError, match="output.dir"):
        DPGANTrainer(tiny(tmp_path, "train.seed=7"), small_mnist).train()


# Slow tier (#35 item 5, ~1 min): the same killed-then-resumed `dpsynth train` (DPGAN, killed after its first
# checkpoint) is tests/ledger/test_attempt.py::test_a_killed_attempt_then_its_resumption_are_charged_at_least_what_ran
# (both attempts committed, the resumption adopting the killed one, and their ε); a resumed trace equal to the
# uninterrupted one is tests/methods/test_contract.py::test_resume_equals_an_uninterrupted_run[dpgan].
@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint(tmp_path, small_mnist, monkeypatch):
    from dpsynth.data import write_parquet
    from tests.ledger_fixtures import budgeted_ledger, kill_after_first_checkpoint

    ledger = budgeted_ledger(tmp_path, monkeypatch, "mnist600", epsilon=100.0)  # $DPSYNTH_LEDGER_URL
    data = tmp_path / "d.parquet"
    write_parquet(small_mnist, str(data))
    out = tmp_path / "run"
    args = [sys.executable, "-m", "dpsynth.cli", "train", "--set", f"data.uri={data}", "--set", f"output.dir={out}",
            "--set", "tracking.enabled=false", "--set", "train.steps=400", "--set", "train.d_width=4",
            "--set", "train.g_width=4", "--set", "train.batch_size=32", "--set", "output.checkpoint_every=20",
            "--set", "privacy.delta=1e-4", "--set", "ledger.population_id=mnist600", "--set", "data.num_classes=10"]
    ckpt = kill_after_first_checkpoint(args, out)
    assert not (out / "result.json").exists()
    step_at_kill = torch.load(ckpt, weights_only=False)["step"]
    assert 0 < step_at_kill < 400
    done = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["steps"] == 400
    assert json.loads(Path(result["trace_path"]).read_text())["events"][0]["count"] == 400
    # both attempts charged: the killed one at its whole reservation, adopted by the resumption
    killed, resumed = ledger.history("mnist600")
    assert killed["status"] == "committed" and killed["epsilon_spent"] == killed["epsilon_reserved"]
    assert resumed["status"] == "committed" and resumed["resumes_id"] == killed["id"]


def test_mlflow_gets_no_data_dependent_series(tmp_path, small_mnist):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = tiny(tmp_path / "out", "tracking.enabled=true", f"tracking.uri={uri}", "output.log_every=2",
               "output.sample_every=6")
    result = DPGANTrainer(cfg, small_mnist).train()
    client = mlflow.MlflowClient(uri)
    run = client.get_run(result.mlflow_run_id)
    allowed = {"epsilon", "n_d", "generator_steps", "d_accuracy_fake", "d_accuracy_fake_ema", "g_loss",
               "noise_multiplier", "sample_rate"}
    assert set(run.data.metrics) <= allowed
    assert run.data.tags["dpsynth.stage"] == "train"
    assert float(run.data.tags["dpsynth.epsilon_spent"]) == pytest.approx(result.epsilon, rel=1e-5)
    # nothing before the gate: no dataset hash, no image, no model on the train run
    assert "dpsynth.dataset_sha256" not in run.data.tags and tracking.TAG_DATASET_VERSION not in run.data.tags
    assert small_mnist.content_sha256() not in json.dumps([run.data.tags, run.data.params])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.yaml", "privacy"}
    assert (tmp_path / "out" / "grids" / "step-0000006.png").exists()  # grids stay in the sensitive output dir
