"""#55 item 11, small runs small: the warm-up's generator fit follows ``train.steps`` when ``warmup.steps`` is null
(40 × train.steps, at most 4,000), so a 6-step trial fits 240 steps (a 2-step one, below, 80), not the recipes' 4,000; every shipped recipe
still fits exactly the 4,000 steps it set before (the same draws: ``make run``'s figures unchanged)."""

from pathlib import Path

import pytest
import yaml

from dpsynth.config import load_config
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.warmup import fit as warmup
from tests.warmup.test_warmup import tiny

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted(p for p in CONFIGS.glob("*.yaml") if (yaml.safe_load(p.read_text()).get("warmup") or {}).get(
    "central_images"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_fits_what_it_fitted_before(recipe):
    cfg = load_config(str(recipe))
    assert cfg.warmup.steps is None  # it follows train.steps ...
    assert warmup.fit_steps(cfg) == 4000  # ... to the 4,000 steps each recipe set explicitly before
    assert warmup.fit_steps(load_config(str(recipe), overrides=["train.steps=12"])) == 480
    assert warmup.fit_steps(load_config(str(recipe), overrides=["train.steps=12", "warmup.steps=7"])) == 7


def test_a_small_run_fits_a_small_generator(tmp_path, small_mnist, monkeypatch, caplog):
    """A real DPGAN run with the warm-up on and no warmup.steps: the fit runs 40 × 2 steps, and says so (2 private
    steps, not 1, so that 40 × train.steps is told from a constant 40; each fit step costs as much as a private one)."""
    ran = []
    fit = warmup.fit_generator
    monkeypatch.setattr(warmup, "fit_generator", lambda *a, **kw: ran.append(kw["steps"]) or fit(*a, **kw))
    cfg = tiny(tmp_path, "warmup.steps=null", "train.steps=2", "output.checkpoint_every=0")
    assert cfg.warmup.steps is None and cfg.train.steps == 2
    with caplog.at_level("INFO"):
        DPGANTrainer(cfg, small_mnist).train()
    assert ran == [80]
    assert "then 80 generator fit steps (null warmup.steps: 40 × train.steps, at most 4,000)" in caplog.text
