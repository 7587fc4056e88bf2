"""The warm-up's intensity histogram (#32): a first private release that decides whether the warm-up's images are
cleaned as ink on a dark background; accounted, audited and noised like the other releases."""

import json
from pathlib import Path

import pytest
import torch
from opacus.accountants import RDPAccountant

from dpsynth.warmup import fit as warmup
from dpsynth.warmup import releases as warmup_releases
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.privacy import MechanismTrace
from dpsynth.warmup import central_images as ci
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.stages.audit import mechanism_check
from tests.warmup.test_warmup import tiny  # the same tiny warm-up config


def test_one_record_moves_the_histogram_query_by_at_most_one():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(50, 3, 8, 8, generator=g) * 2 - 1
    full = ci.intensity_sums(x)
    for i in range(5):
        without = ci.intensity_sums(torch.cat([x[:i], x[i + 1:]]))
        assert (full - without).norm() <= 1 + 1e-12
    assert full.sum() == pytest.approx(50)  # each record's histogram sums to 1


def test_two_tone_tells_ink_on_black_from_other_images(small_mnist):
    x, _ = small_mnist.to_tensors()
    assert warmup.two_tone(ci.intensity_sums(x) / len(x))
    assert not warmup.two_tone(ci.intensity_sums(-x) / len(x))  # dark ink on light paper
    assert not warmup.two_tone(ci.intensity_sums(torch.rand(20, 3, 8, 8) * 2 - 1) / 20)


def test_the_histogram_is_the_first_event_accounted_and_audited(tmp_path, small_mnist):
    cfg = tiny(tmp_path, "warmup.intensity_noise_multiplier=20")
    result = DPGANTrainer(cfg, small_mnist).train()
    events = json.loads(Path(result.trace_path).read_text())["events"]
    assert [(e["sampling"], e["noise_multiplier"]) for e in events[:2]] == [("full_batch", 20.0), ("full_batch", 5.0)]
    ref = RDPAccountant()  # an independent account of the same history
    ref.history = [(20.0, 1.0, 1), (5.0, 1.0, 1), (events[2]["noise_multiplier"], 32 / 600, 6)]
    assert result.epsilon == pytest.approx(ref.get_epsilon(1e-4), rel=1e-6)
    assert result.epsilon <= 8
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert mechanism_check(cfg, trace, 600)["passed"]
    # audited as if the histogram had not been released (unaccounted): refused
    assert not mechanism_check(tiny(tmp_path / "b"), trace, 600)["passed"]
    assert "intensity histogram" in warmup_releases.statement(cfg)


def test_images_that_are_not_two_tone_are_not_cleaned(tmp_path, small_mnist):
    x, y = small_mnist.to_tensors()
    x = -x  # dark ink on light paper: clean() would make the paper black
    cfg = tiny(tmp_path, "warmup.intensity_noise_multiplier=20", "warmup.noise_multiplier=0.05")
    trace = MechanismTrace()
    slots, _, _ = warmup.release(cfg, x, y, num_classes=small_mnist.num_classes, randomness=MechanismRandomness(),
                              trace=trace)
    assert trace.steps == 2  # the histogram, then the class means
    assert slots.mean() > 0  # the paper stays light
    cleaned, _, _ = warmup.release(tiny(tmp_path, "warmup.noise_multiplier=0.05"), x, y, num_classes=small_mnist.num_classes,
                                randomness=MechanismRandomness(), trace=MechanismTrace())
    assert cleaned.mean() < slots.mean()


def test_the_histogram_needs_the_mechanism_randomness(small_mnist):
    x, _ = small_mnist.to_tensors()
    from dpsynth.errors import PrivacyError
    with pytest.raises(PrivacyError, match="randomness"):
        ci.intensity_histogram(x, noise_multiplier=20, randomness=None)


def test_sums_taken_around_the_centre_keep_light_images_light():
    x = torch.full((40, 3, 16, 16), 0.6)  # light grey: [0, 1] value 0.8, L2 norm 0.8·√768 ≈ 22 > C/√2
    y = torch.zeros(40, dtype=torch.long)
    plain = ci.central_images(x, y, num_classes=1, clip=10.0, noise_multiplier=0.0)
    centred = ci.central_images(x, y, num_classes=1, clip=10.0, noise_multiplier=0.0, centre=0.75)
    assert float(plain.mean()) < 0  # shrunk towards black by the clip
    assert float(centred.mean()) == pytest.approx(0.6, abs=1e-6)
    h = torch.zeros(16); h[12] = 1.0
    assert warmup.mean_intensity(h) == pytest.approx(12.5 / 16)
