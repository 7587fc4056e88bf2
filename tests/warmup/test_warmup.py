"""The private warm-up (central images) inside DPGAN training: accounted, audited, post-processing after."""

import json
from pathlib import Path

import pytest
import torch
from opacus.accountants import RDPAccountant

from dpsynth.methods.registry import load_config  # the configuration with its method's rules
from dpsynth.training import artifacts
from dpsynth.warmup import fit as warmup
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.privacy import MechanismTrace
from dpsynth.stages.audit import mechanism_check


def tiny(tmp_path, *extra):
    return load_config(overrides=[
        f"output.dir={tmp_path}", "tracking.enabled=false", "train.d_width=4", "train.g_width=4",
        "train.latent_dim=8", "train.batch_size=32", "train.steps=6", "train.n_d=2",
        "output.checkpoint_every=3", "output.sample_every=0", "output.log_every=0", "privacy.epsilon=8",
        "privacy.delta=1e-4", "warmup.central_images=true", "warmup.steps=4", "warmup.noise_multiplier=5", *extra,
    ])


def test_the_trace_opens_with_the_release_and_the_total_stays_in_budget(tmp_path, small_mnist):
    cfg = tiny(tmp_path)
    result = DPGANTrainer(cfg, small_mnist).train()
    events = json.loads(Path(result.trace_path).read_text())["events"]
    assert events[0] == {"sampling": "full_batch", "sample_rate": 1.0, "noise_multiplier": 5.0,
                         "sensitivity": "add_remove", "count": 1}
    assert events[1]["sampling"] == "poisson" and events[1]["count"] == 6
    # independent account (Opacus' RDP accountant): the release is a q = 1 Gaussian, then the steps
    ref = RDPAccountant()
    ref.history = [(5.0, 1.0, 1), (events[1]["noise_multiplier"], 32 / 600, 6)]
    eps = ref.get_epsilon(1e-4)
    assert result.epsilon == pytest.approx(eps, rel=1e-6)
    assert eps <= 8
    # the steps' noise was calibrated for what the warm-up left: without the release, less noise would do
    alone = DPGANTrainer(tiny(tmp_path / "b", "warmup.central_images=false"), small_mnist)
    assert events[1]["noise_multiplier"] > alone.event.noise_multiplier
    check = mechanism_check(cfg, MechanismTrace.from_json(Path(result.trace_path).read_text()), 600)
    assert check["passed"], check


def test_the_style_release_is_a_second_event_accounted_with_the_steps(tmp_path, small_mnist):
    cfg = tiny(tmp_path, "warmup.styles=2", "warmup.styles_noise_multiplier=3")
    result = DPGANTrainer(cfg, small_mnist).train()
    events = json.loads(Path(result.trace_path).read_text())["events"]
    assert [(e["sampling"], e["noise_multiplier"]) for e in events[:2]] == [("full_batch", 5.0), ("full_batch", 3.0)]
    assert events[2]["sampling"] == "poisson" and events[2]["count"] == 6
    ref = RDPAccountant()  # independent account of the same history
    ref.history = [(5.0, 1.0, 1), (3.0, 1.0, 1), (events[2]["noise_multiplier"], 32 / 600, 6)]
    assert result.epsilon == pytest.approx(ref.get_epsilon(1e-4), rel=1e-6)
    assert result.epsilon <= 8
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert mechanism_check(cfg, trace, 600)["passed"]
    # audited as if only the class means were released (the style release unaccounted): refused
    assert not mechanism_check(tiny(tmp_path), trace, 600)["passed"]


def test_the_audit_refuses_a_trace_without_the_configured_release(tmp_path, small_mnist):
    cfg = tiny(tmp_path, "warmup.central_images=false")
    result = DPGANTrainer(cfg, small_mnist).train()
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    check = mechanism_check(tiny(tmp_path), trace, 600)  # audited as if the warm-up was configured
    assert not check["passed"] and "event[0]" in check["detail"]


def test_resume_after_the_warm_up_does_not_release_again(tmp_path, small_mnist):
    cfg = tiny(tmp_path)
    DPGANTrainer(cfg, small_mnist).train(stop_after=3)
    resumed = DPGANTrainer(cfg, small_mnist).train()
    events = json.loads(Path(resumed.trace_path).read_text())["events"]
    assert [e["sampling"] for e in events] == ["full_batch", "poisson"] and events[1]["count"] == 6


def test_the_generator_learns_the_central_images_it_is_given():
    """Post-processing: fitted to two templates, G's samples of each class are nearest their own template."""
    from dpsynth.models.dcgan import Generator

    means = -torch.ones(2, 1, 28, 28)
    means[0, :, 6:22, 6:10] = 1.0   # a bar on the left
    means[1, :, 6:22, 18:22] = 1.0  # a bar on the right
    torch.manual_seed(0)
    G = Generator(num_classes=2, width=8, latent_dim=8)
    g = torch.Generator().manual_seed(0)
    warmup.fit_generator(G, means, steps=150, batch_size=32, lr=2e-3, generator=g)
    with torch.no_grad():
        x, y = G.sample(20, labels=torch.arange(20) % 2, generator=g)
    d = ((x[:, None] - means[None]) ** 2).flatten(2).mean(2)  # 20 × 2 distances
    assert (d.argmin(1) == y).all()


def test_the_generator_gives_every_style_slot_its_own_image():
    """Two slots of one class (a left bar, a right bar): z picks the slot, and G draws that slot's image."""
    from dpsynth.models.dcgan import Generator

    images = -torch.ones(2, 1, 28, 28)
    images[0, :, 6:22, 4:8] = 1.0
    images[1, :, 6:22, 20:24] = 1.0
    torch.manual_seed(0)
    G = Generator(num_classes=1, width=8, latent_dim=8, styles=2)
    g = torch.Generator().manual_seed(0)
    warmup.fit_generator(G, images, steps=100, batch_size=32, lr=2e-3, generator=g)
    with torch.no_grad():
        z = torch.randn(40, 8, generator=g)
        x = G(z, torch.zeros(40, dtype=torch.long))
    nearest = ((x[:, None] - images[None]) ** 2).flatten(2).mean(2).argmin(1)
    assert torch.equal(nearest, G.slot(z))
    assert 8 <= int(nearest.sum()) <= 32  # both slots drawn, neither rare


def test_a_style_group_with_too_few_records_gets_its_class_mean():
    styles = torch.stack([torch.full((1, 2, 2), float(v)) for v in range(4)])  # 2 classes × 2 slots
    counts = torch.tensor([50.0, 5.0, 30.0, -2.0])
    means = torch.stack([torch.full((1, 2, 2), -0.5), torch.full((1, 2, 2), 0.5)])
    keep = warmup.keep_styles(styles, counts, sum_noise=7.5, max_noise=None)
    images = warmup.fill_styles(styles, keep, means)
    assert [float(i.flatten()[0]) for i in images] == [0.0, -0.5, 2.0, 0.5]


def test_a_faint_style_group_whose_noise_would_be_stretched_to_white_gets_its_class_mean():
    """styles_max_noise τ: the noise std σ_s·C / n against τ × the image's peak above the floor (0.15)."""
    styles = torch.full((4, 1, 2, 2), -1.0)  # peaks on [0, 1]: 0.95, 0.95, 0.35, 0.35
    styles[:2, 0, 0, 0], styles[2:, 0, 0, 0] = 0.9, -0.3
    counts = torch.tensor([100.0, 30.0, 100.0, 400.0])
    # noise std 7.5 / n: 0.075, 0.25, 0.075, 0.019 against 0.3 × (0.8, 0.8, 0.2, 0.2) = 0.24, 0.24, 0.06, 0.06
    keep = warmup.keep_styles(styles, counts, sum_noise=7.5, max_noise=0.3)
    assert keep.tolist() == [True, False, False, True]
    assert warmup.keep_styles(styles, counts, sum_noise=7.5, max_noise=None).all()


def test_the_release_applies_styles_max_noise_from_the_config(tmp_path, small_mnist):
    """The wiring: a τ no group can meet gives every slot of a class the class mean; without τ the groups keep
    their own images."""
    from dpsynth.mechanisms.randomness import MechanismRandomness

    x, y = small_mnist.to_tensors()
    for extra, all_means in (("warmup.styles_max_noise=1e-9", True), (None, False)):
        cfg = tiny(tmp_path, "warmup.styles=2", "warmup.styles_noise_multiplier=3", *filter(None, [extra]))
        slots, _, _ = warmup.release(cfg, x, y, num_classes=small_mnist.num_classes,
                                  randomness=MechanismRandomness(seed=0), trace=MechanismTrace())
        per_class = slots.view(small_mnist.num_classes, 4, -1)
        assert bool((per_class == per_class[:, :1]).all()) is all_means


def test_colour_images_without_the_polarity_release_are_warned_of_naming_the_setting(tmp_path, small_mnist, caplog):
    """Class means of shapes in random colours are flat grey (the default recipe scored at chance on symbols-rgb): a
    warm-up on colour images without the polarity release says so once, in the trainer's log, naming the setting and
    the recipe made for them; grey images, or colour images with the release, get no such warning."""
    import dataclasses

    rgb = dataclasses.replace(small_mnist, images=small_mnist.images.repeat(3, axis=-1))
    polarity = ["warmup.intensity_noise_multiplier=20", "warmup.polarity_noise_multiplier=3"]
    for data, extra, warnings in ((rgb, [], 1), (small_mnist, [], 0), (rgb, polarity, 0)):
        caplog.clear()
        trainer = DPGANTrainer(tiny(tmp_path, *extra), data)
        with caplog.at_level("WARNING", logger="dpsynth.train"):
            trainer.warm_up()
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert [("warmup.polarity_noise_multiplier" in m and "dpgan-generic-cpu.yaml" in m) for m in said] == \
            [True] * warnings, said


def test_a_budget_the_warm_up_alone_exceeds_is_refused_naming_the_fields(tmp_path, small_mnist):
    from dpsynth.errors import PrivacyError

    cfg = tiny(tmp_path, "warmup.styles=2", "warmup.styles_noise_multiplier=1", "privacy.epsilon=1")
    with pytest.raises(PrivacyError, match="warmup.styles"):
        DPGANTrainer(cfg, small_mnist)


def test_the_variation_release_is_a_third_event_accounted_with_the_steps(tmp_path, small_mnist):
    cfg = tiny(tmp_path, "warmup.styles=2", "warmup.styles_noise_multiplier=3", "warmup.variations=1",
               "warmup.variations_noise_multiplier=4", "warmup.variations_clip=3")
    result = DPGANTrainer(cfg, small_mnist).train()
    events = json.loads(Path(result.trace_path).read_text())["events"]
    assert [(e["sampling"], e["noise_multiplier"]) for e in events[:3]] == [
        ("full_batch", 5.0), ("full_batch", 3.0), ("full_batch", 4.0)]
    assert events[3]["sampling"] == "poisson" and events[3]["count"] == 6
    ref = RDPAccountant()  # independent account of the same history
    ref.history = [(5.0, 1.0, 1), (3.0, 1.0, 1), (4.0, 1.0, 1), (events[3]["noise_multiplier"], 32 / 600, 6)]
    assert result.epsilon == pytest.approx(ref.get_epsilon(1e-4), rel=1e-6)
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert mechanism_check(cfg, trace, 600)["passed"]
    # audited as if no variation release was configured: refused (its ε would go unaccounted)
    unaccounted = tiny(tmp_path, "warmup.styles=2", "warmup.styles_noise_multiplier=3")
    assert not mechanism_check(unaccounted, trace, 600)["passed"]


def test_variations_need_latent_coordinates_and_are_refused_naming_the_field(tmp_path):
    from dpsynth.errors import ConfigError

    with pytest.raises(ConfigError, match="warmup.variations"):
        tiny(tmp_path, "warmup.variations=4")  # latent_dim 8 < 7 + 4


def test_the_generator_follows_the_variation_directions_its_latent_weighs():
    """One class, one image (a bar), one direction (a blob of ink near the top): G's ink there must rise
    with z[:, 7], the coordinate that weighs the direction."""
    from dpsynth.models.dcgan import Generator

    image = -torch.ones(1, 1, 28, 28)
    image[0, :, 10:22, 12:16] = 1.0
    direction = torch.zeros(1, 1, 1, 28, 28)
    direction[..., 3:9, 9:19] = 1.0
    torch.manual_seed(0)
    G = Generator(num_classes=1, width=8, latent_dim=8)
    g = torch.Generator().manual_seed(0)
    warmup.fit_generator(G, image, steps=150, batch_size=32, lr=2e-3, generator=g, directions=direction)
    with torch.no_grad():
        z = torch.randn(200, 8, generator=g)
        x = G(z, torch.zeros(200, dtype=torch.long))
    ink_top = x[:, 0, 2:10, 8:20].mean((1, 2))
    assert torch.corrcoef(torch.stack([ink_top, z[:, 7]]))[0, 1] > 0.5


def test_releases_at_the_same_sigma_merge_in_the_trace_and_still_pass_the_audit(tmp_path, small_mnist):
    """The trace merges consecutive equal releases (count = 2): the audit must read them as the two planned
    releases (it refused such a run before), and still refuse a third, unplanned one."""
    from dpsynth.privacy import full_batch_gaussian

    cfg = tiny(tmp_path, "warmup.styles=2", "warmup.styles_noise_multiplier=5")  # = warmup.noise_multiplier
    result = DPGANTrainer(cfg, small_mnist).train()
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert trace.events[0] == full_batch_gaussian(5.0).with_count(2)
    assert mechanism_check(cfg, trace, 600)["passed"]
    extra = MechanismTrace([full_batch_gaussian(5.0).with_count(3), *trace.events[1:]])
    assert not mechanism_check(cfg, extra, 600)["passed"]


def test_a_warping_generator_learns_its_images_and_is_saved_with_its_warp(tmp_path, small_mnist):
    """train.g_warp: the fit targets the canonical image (the warp deforms it), and the generator file
    records the warp, so the released generator draws what was trained."""
    from dpsynth.models.dcgan import Generator

    means = -torch.ones(2, 1, 28, 28)
    means[0, :, 6:22, 6:10] = 1.0
    means[1, :, 6:22, 18:22] = 1.0
    torch.manual_seed(0)
    G = Generator(num_classes=2, width=8, latent_dim=8, warp=True)
    g = torch.Generator().manual_seed(0)
    warmup.fit_generator(G, means, steps=150, batch_size=32, lr=2e-3, generator=g)
    with torch.no_grad():
        z, y = torch.randn(20, 8, generator=g), torch.arange(20) % 2
        canonical = G.canonical(z, y)
    d = ((canonical[:, None] - means[None]) ** 2).flatten(2).mean(2)
    assert (d.argmin(1) == y).all()

    cfg = tiny(tmp_path, "train.g_warp=true")
    result = DPGANTrainer(cfg, small_mnist).train()
    loaded, _ = artifacts.load_generator(result.generator_path)
    assert loaded.warp is True


def test_a_contrast_generator_fits_its_canonical_image_and_is_saved_with_its_contrast(tmp_path, small_mnist):
    """train.g_contrast: the fit targets the image before the contrast layer (the released images are blurred
    strokes: fitting G's sharpened output to them would teach the network to undo the layer), and the
    generator file records the contrast."""
    from dpsynth.models.dcgan import Generator

    means = -torch.ones(2, 1, 28, 28)
    means[0, :, 6:22, 6:10] = 0.6  # grey strokes, as noisy means are
    means[1, :, 6:22, 18:22] = 0.6
    fitted = {}
    for contrast in (0.0, 3.0):
        torch.manual_seed(0)
        G = Generator(num_classes=2, width=8, latent_dim=8, contrast=contrast)
        warmup.fit_generator(G, means, steps=200, batch_size=32, lr=2e-3, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            z, y = torch.zeros(2, 8), torch.arange(2)  # Φ(0) = ½: the identity deformation
            fitted[contrast] = G.canonical(z, y), G(z, y)
    torch.testing.assert_close(fitted[3.0][0], fitted[0.0][0])  # the same fit: the layer is bypassed
    stroke = means > 0
    assert fitted[3.0][1][stroke].mean() > fitted[0.0][1][stroke].mean() + 0.2  # and then drawn sharper

    cfg = tiny(tmp_path, "train.g_contrast=2.5")
    result = DPGANTrainer(cfg, small_mnist).train()
    loaded, _ = artifacts.load_generator(result.generator_path)
    assert loaded.contrast == 2.5


def test_g_contrast_is_refused_for_the_resnet_generator_naming_the_field(tmp_path):
    from dpsynth.errors import ConfigError

    with pytest.raises(ConfigError, match="train.g_contrast"):
        tiny(tmp_path, "train.g_contrast=2", "train.method=gswgan")
    with pytest.raises(ConfigError, match="train.g_contrast"):
        tiny(tmp_path, "train.g_contrast=-1")


def test_g_warp_is_refused_for_other_methods_naming_the_field(tmp_path):
    from dpsynth.errors import ConfigError

    with pytest.raises(ConfigError, match="train.g_warp"):
        tiny(tmp_path, "train.g_warp=true", "train.method=gswgan")


# --- the same warm-up before the other methods' private training -------------------------------------


def test_gswgan_and_dpac_warm_up_on_the_union_of_their_shards(tmp_path, shards, monkeypatch):
    from dpsynth.methods.registry import get
    from tests.methods.gswgan_helpers import tiny as gswgan_tiny

    # DPAC's warm-up is GS-WGAN's (inherited, under the same mechanism): GS-WGAN's run below is DPAC's path too
    dpac, gswgan = get("dpac"), get("gswgan")
    assert dpac.trainer.warm_up is gswgan.trainer.warm_up and dpac.mechanism is gswgan.mechanism
    method = "gswgan"

    # the variation release's one matrix shared by the classes (its event is the per-class release's; one 784 × 784
    # eigendecomposition instead of ten: the per-class one is test_the_variation_release_is_a_third_event_…'s)
    extra = ["warmup.central_images=true", "warmup.steps=4", "warmup.noise_multiplier=5",
             "warmup.variations=1", "warmup.variations_noise_multiplier=4", "warmup.variations_shared=true",
             "privacy.epsilon=30"]
    cfg = gswgan_tiny(tmp_path, *extra, method=method)
    seen = []
    real_release = warmup.release

    def spy(cfg_, images, labels, **kw):
        seen.append(len(images))
        return real_release(cfg_, images, labels, **kw)

    monkeypatch.setattr(warmup, "release", spy)
    result = get(method).trainer(cfg, shards).train()
    assert seen == [sum(len(s) for s in shards)]  # every shard's records, once
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert [(e.sampling, e.sensitivity, e.noise_multiplier) for e in trace.events[:2]] == [
        ("full_batch", "add_remove", 5.0), ("full_batch", "add_remove", 4.0)]
    assert trace.events[2].sampling == "without_replacement" and trace.events[2].count == 6
    assert result.epsilon <= 30
    # the iterations' noise was calibrated for what the warm-up left
    alone = gswgan_tiny(tmp_path / "b", "privacy.epsilon=30", method=method)
    from dpsynth.mechanisms.generator_gradient import GSWGAN
    assert trace.events[2].noise_multiplier > GSWGAN.plan(alone, 600).event.noise_multiplier
    assert mechanism_check(cfg, trace, 600)["passed"], mechanism_check(cfg, trace, 600)
    # audited as if there were no warm-up: refused
    assert not mechanism_check(alone, trace, 600)["passed"]


def test_the_warm_up_settings_a_method_cannot_take_are_refused_naming_the_field(tmp_path):
    from dpsynth.errors import ConfigError
    from tests.methods.gswgan_helpers import tiny as gswgan_tiny

    with pytest.raises(ConfigError, match="warmup.styles"):
        gswgan_tiny(tmp_path, "warmup.central_images=true", "warmup.styles=2")  # the paper's ResNet G
    with pytest.raises(ConfigError, match="train.g_warp"):
        gswgan_tiny(tmp_path, "train.g_warp=true")
    with pytest.raises(ConfigError, match="train.g_warp.*gswgan.latent_dim"):
        gswgan_tiny(tmp_path, "gswgan.generator=dcgan", "train.g_warp=true", "gswgan.latent_dim=4")
    with pytest.raises(ConfigError, match="gswgan.generator"):
        gswgan_tiny(tmp_path, "gswgan.generator=biggan")
    with pytest.raises(ConfigError, match="warmup.central_images"):
        gswgan_tiny(tmp_path, "warmup.central_images=true", method="gswgan_federated")
    with pytest.raises(ConfigError, match="gswgan.latent_dim"):
        gswgan_tiny(tmp_path, "warmup.central_images=true", "warmup.variations=2")


def test_zhang_warms_up_with_styles_and_the_warp(tmp_path, small_mnist):
    from dpsynth.methods.zhang import ZhangTrainer
    from tests.methods.test_zhang import split, tiny as zhang_tiny, zhang_check

    cfg = zhang_tiny(tmp_path, "warmup.central_images=true", "warmup.steps=4", "warmup.noise_multiplier=5",
                     "warmup.styles=2", "warmup.styles_noise_multiplier=3", "train.g_warp=true", "privacy.epsilon=10")
    public, private = split(small_mnist, cfg)
    result = ZhangTrainer(cfg, private, public=public).train()
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert [(e.sampling, e.noise_multiplier) for e in trace.events[:2]] == [("full_batch", 5.0), ("full_batch", 3.0)]
    assert trace.events[2].sampling == "poisson"
    # independent account (Opacus' RDP accountant) of the same history
    ref = RDPAccountant()
    ref.history = [(5.0, 1.0, 1), (3.0, 1.0, 1),
                   (trace.events[2].noise_multiplier, trace.events[2].sample_rate, trace.events[2].count)]
    assert result.epsilon == pytest.approx(ref.get_epsilon(1e-4), rel=1e-6)
    assert result.epsilon <= 10
    assert zhang_check(cfg, trace, len(private))["passed"]
    loaded, _ = artifacts.load_generator(result.generator_path)
    assert loaded.styles == 4 and loaded.warp is True


@pytest.mark.parametrize("method", ["gswgan", "dpac"])
def test_gswgan_and_dpac_with_the_dcgan_generator_warm_up_with_styles_and_the_warp(tmp_path, shards, method):
    from dpsynth.methods.registry import get
    from dpsynth.models.dcgan import Generator
    from tests.methods.gswgan_helpers import tiny as gswgan_tiny

    cfg = gswgan_tiny(tmp_path, "gswgan.generator=dcgan", "train.g_warp=true", "warmup.central_images=true",
                      "warmup.steps=4", "warmup.noise_multiplier=5", "warmup.styles=2",
                      "warmup.styles_noise_multiplier=4", "privacy.epsilon=30", method=method)
    trainer = get(method).trainer(cfg, shards)
    assert isinstance(trainer.state.G, Generator) and trainer.state.G.styles == 4 and trainer.state.G.warp
    result = trainer.train()
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert [(e.sampling, e.noise_multiplier) for e in trace.events[:2]] == [("full_batch", 5.0), ("full_batch", 4.0)]
    assert trace.events[2].sampling == "without_replacement" and trace.events[2].count == cfg.train.steps
    assert mechanism_check(cfg, trace, sum(len(s) for s in shards))["passed"]
    loaded, _ = artifacts.load_generator(result.generator_path)  # the release names the DCGAN class
    assert isinstance(loaded, Generator) and loaded.styles == 4 and loaded.warp is True
    images, _ = loaded.sample(10, labels=torch.arange(10), generator=torch.Generator().manual_seed(0))
    assert images.shape == (10, 1, 28, 28) and images.abs().max() <= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_warm_up_with_all_three_releases_trains_on_a_gpu(tmp_path, small_mnist):
    # found on an H100: the releases mixed the records' cuda tensors with CPU ones (torch.cat failed)
    cfg = tiny(tmp_path, "train.device=cuda", "warmup.styles=2", "warmup.styles_noise_multiplier=3",
               "warmup.variations=1", "warmup.variations_noise_multiplier=4", "warmup.variations_clip=3")
    result = DPGANTrainer(cfg, small_mnist).train()
    events = json.loads(Path(result.trace_path).read_text())["events"]
    assert [e["sampling"] for e in events] == ["full_batch"] * 3 + ["poisson"]
    assert result.epsilon <= 8
