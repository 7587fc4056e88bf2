"""Slow checks (`make test-slow`): the paper's full-width networks and the paper's privacy plan."""

from pathlib import Path

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from dpsynth.config import load_config
from dpsynth.data import import_source
from dpsynth.mechanisms.discriminator import DPGAN
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.models.dcgan import count_parameters

MNIST = Path(__file__).resolve().parents[2] / "data" / "mnist"

pytestmark = pytest.mark.slow


def test_paper_width_networks_take_private_steps(tmp_path):
    ds = import_source(str(MNIST)).subset(np.arange(2000))
    cfg = load_config(overrides=[f"output.dir={tmp_path}", "tracking.enabled=false", "train.steps=4", "train.n_d=2",
                                 "train.d_width=128", "train.g_width=128", "privacy.delta=1e-4",
                                 "train.physical_batch_size=64"])
    trainer = DPGANTrainer(cfg, ds)
    assert count_parameters(trainer.state.D) == pytest.approx(1.72e6, rel=0.01)
    result = trainer.train()
    assert result.steps == 4 and result.generator_steps == 2 and result.epsilon <= 10


def test_paper_plan_for_mnist_eps10():
    """Bie et al. §4: σ=1, B=128 on 60k MNIST images targets ε=10 with ≈450K discriminator steps."""
    cfg = load_config(overrides=["privacy.noise_multiplier=1.0", "privacy.epsilon=10", "train.steps=10000000",
                                 "train.batch_size=128"])
    plan = DPGAN.plan(cfg, 60000)
    event, steps = plan.event, plan.steps
    assert 445_000 <= steps <= 455_000
    ref = RDPAccountant()
    ref.history = [(1.0, 128 / 60000, steps)]
    assert ref.get_epsilon(1e-5) <= 10
