"""The paper-scale GPU configs (``configs/*-mnist-gpu.yaml``): each loads, names a registered method, and
DPGAN's privacy plan at the paper's n = 60,000 reproduces the step budgets Bie et al. publish (Table 6–7)."""

from pathlib import Path

import pytest

from dpsynth.config import load_config
from dpsynth.methods import registry
from dpsynth.mechanisms.discriminator import DPGAN

REPO = Path(__file__).resolve().parents[2]
GPU_CONFIGS = sorted(REPO.glob("configs/*-mnist-gpu.yaml"))


def test_every_method_has_a_paper_scale_gpu_config():
    methods = {load_config(c).train.method for c in GPU_CONFIGS}
    assert methods == {"dpgan", "gswgan", "dpac", "zhang"}
    for c in GPU_CONFIGS:
        cfg = load_config(c)
        assert cfg.train.method in registry.METHODS and cfg.train.device == "cuda", c.name
        assert (REPO / "configs" / c.name.replace("-gpu", "-cpu")).exists(), c.name


def test_dpgan_gpu_config_plans_the_papers_step_budget():
    """Table 7: B = 512, σ = 2 on 60,000 MNIST images at (10, 1e-5) gives T = 174K (their RDP account)."""
    cfg = load_config(REPO / "configs/dpgan-mnist-gpu.yaml", overrides=["train.steps=10000000"])
    assert cfg.train.batch_size == 512 and cfg.privacy.noise_multiplier == 2.0
    assert DPGAN.plan(cfg, 60_000).steps == pytest.approx(174_000, rel=0.03)


@pytest.mark.parametrize("batch, sigma, epsilon, published", [
    (2048, 5.6, 10.0, 98_000),   # Table 6
    (512, 14.0, 1.0, 165_000),   # Tables 6–7, ε = 1
])
def test_dpgan_plan_matches_other_published_budgets(batch, sigma, epsilon, published):
    cfg = load_config(REPO / "configs/dpgan-mnist-gpu.yaml",
                      overrides=["train.steps=10000000", f"train.batch_size={batch}",
                                 f"privacy.noise_multiplier={sigma}", f"privacy.epsilon={epsilon}"])
    assert DPGAN.plan(cfg, 60_000).steps == pytest.approx(published, rel=0.05)
