"""warmup.styles_along=variations: the style groups' templates are the class means moved along the two released
variation directions that change their shape most (no deformation family assumed), so the variation release comes
first in the trace, taken around the class means; accounted against Opacus' RDP accountant, audited, and left out
first by warmup.fit_epsilon."""

import json
from pathlib import Path

import pytest
import torch
from opacus.accountants import RDPAccountant

from dpsynth.stages.audit import mechanism_check
from dpsynth.config import REPO_ROOT, load_config
from dpsynth.errors import ConfigError
from dpsynth.warmup import central_images
from dpsynth.warmup import releases as warmup_releases
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.privacy import MechanismTrace
from dpsynth.warmup import fit as warmup
from tests.warmup.test_warmup import tiny as warmup_tiny

ALONG = ("warmup.styles=2", "warmup.styles_along=variations", "warmup.styles_noise_multiplier=3",
         "warmup.variations=2", "warmup.variations_noise_multiplier=4", "warmup.variations_clip=3")


def tiny(tmp_path, *extra):
    return warmup_tiny(tmp_path, "train.latent_dim=9", *extra)  # two directions: z[:, 7:9]


def test_the_variation_release_comes_before_the_style_release_and_both_are_accounted(tmp_path, small_mnist):
    cfg = tiny(tmp_path, *ALONG)
    assert [n for n, _ in cfg.warmup.releases()] == ["class_means", "variations", "styles"]
    result = DPGANTrainer(cfg, small_mnist).train()
    events = json.loads(Path(result.trace_path).read_text())["events"]
    assert [(e["sampling"], e["noise_multiplier"]) for e in events[:3]] == [
        ("full_batch", 5.0), ("full_batch", 4.0), ("full_batch", 3.0)]
    assert events[3]["sampling"] == "poisson" and events[3]["count"] == 6
    ref = RDPAccountant()  # independent account of the same history
    ref.history = [(5.0, 1.0, 1), (4.0, 1.0, 1), (3.0, 1.0, 1), (events[3]["noise_multiplier"], 32 / 600, 6)]
    assert result.epsilon == pytest.approx(ref.get_epsilon(1e-4), rel=1e-6)
    assert result.epsilon <= 8
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert mechanism_check(cfg, trace, 600)["passed"]
    # audited against the deformation templates' plan (styles before variations): the order differs, refused
    deformations = tiny(tmp_path, *ALONG, "warmup.styles_along=deformations")
    assert not mechanism_check(deformations, trace, 600)["passed"]
    said = warmup_releases.statement(cfg)  # the auditor's text numbers the releases as the recorded trace does
    assert "directions" in said
    for i, (what, event) in enumerate(zip(["class-mean", "variation", "style"], events[:3])):
        sentence = said.split(f" #{i}, the {what} release: ")[1].split(". #")[0].rstrip(".")
        assert sentence.endswith(f" = {event['noise_multiplier']:g}")


def test_each_record_joins_the_template_nearest_to_its_shape_coordinates_not_its_brightness():
    """Brute force: the released directions are a change of overall brightness (the largest spread, as the paper's
    tone in ``letters``) and two shape patterns with no smooth part; a record at the class mean plus b·flat +
    t0·P[0] + t1·P[1] joins the template of the levels nearest to t0 and t1 (three levels: −1, 0, 1; the
    boundaries at ±1/2), whatever its brightness b."""
    i, j = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    checker = (-1.0) ** (i + j)  # orthogonal to 1, x and y, and to the next
    rows = (-1.0) ** i * torch.tensor([1.0, -1.0, -1.0, 1.0])
    means = torch.zeros(1, 1, 4, 4)
    directions = torch.stack([0.5 * torch.ones(4, 4), 0.3 * checker, 0.15 * rows]).view(1, 3, 1, 4, 4)
    templates, classes = warmup.variation_templates(means, directions, 3)
    assert len(templates) == 9 and classes.tolist() == [0] * 9
    g = torch.Generator().manual_seed(0)
    t = torch.rand(200, 2, generator=g) * 3 - 1.5
    b = torch.rand(200, generator=g) - 0.5
    records = means + torch.einsum("nr,r...->n...", torch.cat([b[:, None], t], 1), directions[0])
    assert records.abs().max() <= 1  # nothing clamped
    got = central_images.nearest_template(records, torch.zeros(200, dtype=torch.long), templates, classes)
    level = lambda x: torch.where(x < -0.5, 0, torch.where(x > 0.5, 2, 1))  # noqa: E731
    assert got.tolist() == (3 * level(t[:, 0]) + level(t[:, 1])).tolist()


def test_the_style_slots_are_the_groups_released_means():
    """Noiseless (σ tiny), one class of two kinds of record along one direction: the two groups' slots are the two
    kinds, not their mean (what the class mean alone would give)."""
    cfg = load_config(overrides=["warmup.central_images=true", "warmup.noise_multiplier=1e-9", "warmup.clip=100",
                                 "warmup.variations=2", "warmup.variations_noise_multiplier=1e-9",
                                 "warmup.variations_clip=100", "warmup.styles=2", "warmup.styles_along=variations",
                                 "warmup.styles_noise_multiplier=1e-9", "train.latent_dim=9"])
    a, b = -torch.ones(1, 1, 8, 8), -torch.ones(1, 1, 8, 8)
    a[..., :4, :] = 1.0
    b[..., 4:, :] = 1.0
    images = torch.cat([a.repeat(50, 1, 1, 1), b.repeat(50, 1, 1, 1)])
    from dpsynth.mechanisms.randomness import MechanismRandomness

    slots, directions, _ = warmup.release(cfg, images, torch.zeros(100, dtype=torch.long), num_classes=1,
                                          randomness=MechanismRandomness(), trace=None)
    assert slots.shape == (4, 1, 8, 8) and directions.shape == (1, 2, 1, 8, 8)
    for kind in (a, b):  # each kind is one slot's image (clean stretches it, both are two-tone already)
        assert min(float((s - kind[0]).abs().max()) for s in slots) < 1e-3


def test_fit_epsilon_leaves_the_style_release_out_first():
    generic = REPO_ROOT / "configs" / "dpgan-generic-cpu.yaml"
    along = ["warmup.polarity_noise_multiplier=null", "warmup.styles=3", "warmup.styles_along=variations",
             "warmup.styles_noise_multiplier=1.5", "warmup.variations_noise_multiplier=0.64"]
    kept = load_config(generic, overrides=along)  # ε = 10: the releases fit as configured
    assert [n for n, _ in kept.warmup.releases()] == ["intensity_histogram", "class_means", "variations", "styles"]
    low = load_config(generic, overrides=[*along, "privacy.epsilon=1"])
    assert low.warmup.styles == 0 and low.warmup.variations_shared
    # what remains is refitted as the recipe without styles would be
    plain = load_config(generic, overrides=["warmup.polarity_noise_multiplier=null", "privacy.epsilon=1"])
    assert low.warmup.releases() == plain.warmup.releases()


def test_styles_along_variations_need_two_directions_and_are_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="warmup.styles_along"):
        tiny(tmp_path, "warmup.styles=2", "warmup.styles_along=variations", "warmup.variations=1")
