"""The warm-up's DP-Lloyd groups (#32): k groups per class found by private k-means on the polarity release's
unit-norm feature; each iteration one full-batch Gaussian event of sensitivity C, in the plan, the trace, the
statement and the audit."""

import json
import math
from pathlib import Path

import pytest
import torch
from opacus.accountants import RDPAccountant

from dpsynth.audit.stage import mechanism_check
from dpsynth.errors import ConfigError
from dpsynth.mechanisms import central_images as ci
from dpsynth.mechanisms import warmup_releases
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.privacy import MechanismTrace
from dpsynth.training import warmup
from tests.methods.test_warmup import tiny  # the same tiny warm-up config
from tests.methods.test_warmup_polarity import coloured_squares

LLOYD = ("warmup.intensity_noise_multiplier=20", "warmup.groups=3", "warmup.groups_iterations=2",
         "warmup.groups_noise_multiplier=4")


def test_one_record_moves_one_group_of_an_iteration_by_at_most_the_clip():
    x, y = coloured_squares(40)
    for size in (ci.LLOYD_SIZE, None):  # the pooled Lloyd steps and the full-resolution last one
        f = ci.lloyd_features(x, size)
        assert torch.allclose(f.norm(dim=1), torch.ones(len(f), dtype=f.dtype))
        centroids = ci.lloyd_init(2, 3, shape=(16, 16))
        groups = ci.lloyd_assign(ci.lloyd_features(x), y, centroids, k=3)
        assert torch.equal(groups // 3, y)  # a record's group is one of its own class's
        full = ci.lloyd_sums(f, groups, num_groups=6, clip=10.0)
        for i in range(6):  # brute force: remove record i, recompute the query (public centroids unchanged)
            keep = torch.arange(len(x)) != i
            g = ci.lloyd_assign(ci.lloyd_features(x[keep]), y[keep], centroids, k=3)
            moved = (full - ci.lloyd_sums(f[keep], g, num_groups=6, clip=10.0)).norm(dim=1)
            assert int((moved > 1e-12).sum()) == 1
            assert moved.max() == pytest.approx(10.0)  # ‖[f·C/√2, C/√2]‖ = C exactly (unit f)


def test_every_iteration_adds_noise_of_std_sigma_times_the_clip():
    x, y = coloured_squares(60)
    seen = []
    ci.lloyd_groups(x, y, num_classes=2, k=3, iterations=3, clip=10.0, noise_multiplier=4.0,
                    randomness=MechanismRandomness(seed=1), observe=lambda t, noisy, query: seen.append((noisy, query)))
    assert len(seen) == 3
    assert seen[0][0].shape[1] == ci.LLOYD_SIZE ** 2 + 1 and seen[2][0].shape[1] == 16 * 16 + 1
    noise = torch.cat([(noisy - query).flatten() for noisy, query in seen])
    # hand computation: std σ·C = 40 on every coordinate (n = 6 · (65 + 65 + 257) = 2,322 draws: ±3 % at 2 SE)
    assert noise.std().item() == pytest.approx(4.0 * 10.0, rel=0.06)
    assert abs(noise.mean().item()) < 3 * 40 / math.sqrt(len(noise))


def test_without_noise_the_groups_split_a_class_by_its_shapes():
    x, y = coloured_squares(300)
    grey = x.mean(1, keepdim=True)
    y = torch.zeros_like(y)  # one class holding both shapes: two groups should find them
    means, counts = ci.lloyd_groups(grey, y, num_classes=1, k=2, iterations=3, clip=10.0, noise_multiplier=0.0)
    assert sorted(counts.tolist()) == pytest.approx([150.0, 150.0], abs=30)
    assert means.shape == (2, 256)


def test_the_iterations_are_events_planned_traced_accounted_and_audited(tmp_path, small_mnist):
    cfg = tiny(tmp_path, *LLOYD)
    assert warmup.style_slots(cfg) == 3
    assert warmup_releases.release_names(cfg) == ["intensity_histogram", "class_means", "lloyd_groups_1",
                                                  "lloyd_groups_2"]
    result = DPGANTrainer(cfg, small_mnist).train()
    events = json.loads(Path(result.trace_path).read_text())["events"]
    planned = MechanismTrace(warmup_releases.events(cfg)).events
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert trace.events[:len(planned)] == planned  # the trace opens with the plan
    assert [(e["sampling"], e["noise_multiplier"], e["count"]) for e in events[:3]] == [
        ("full_batch", 20.0, 1), ("full_batch", 5.0, 1), ("full_batch", 4.0, 2)]
    ref = RDPAccountant()  # an independent account of the same history
    ref.history = [(20.0, 1.0, 1), (5.0, 1.0, 1), (4.0, 1.0, 2), (events[3]["noise_multiplier"], 32 / 600, 6)]
    assert result.epsilon == pytest.approx(ref.get_epsilon(1e-4), rel=1e-6)
    assert result.epsilon <= 8
    assert mechanism_check(cfg, trace, 600)["passed"]
    # audited as if one iteration fewer had been released: refused
    assert not mechanism_check(tiny(tmp_path / "b", *LLOYD[:-2], "warmup.groups_iterations=1",
                                    "warmup.groups_noise_multiplier=4"), trace, 600)["passed"]
    assert "DP-Lloyd" in warmup_releases.statement(cfg)


def test_the_iterations_count_against_the_budget(tmp_path):
    from dpsynth.errors import PrivacyError
    cfg = tiny(tmp_path, *LLOYD[:-2], "warmup.groups_iterations=8", "warmup.groups_noise_multiplier=0.5")
    with pytest.raises(PrivacyError, match="warmup.groups"):
        warmup_releases.prefix(cfg, accountant="rdp")


def test_release_gives_k_slots_per_class(tmp_path, small_mnist):
    x, y = small_mnist.to_tensors()
    cfg = tiny(tmp_path, *LLOYD, "warmup.variations=2", "warmup.variations_noise_multiplier=50", "train.latent_dim=9")
    trace = MechanismTrace()
    slots, directions = warmup.release(cfg, x, y, num_classes=small_mnist.num_classes,
                                       randomness=MechanismRandomness(), trace=trace)
    assert tuple(slots.shape) == (3 * small_mnist.num_classes, *x.shape[1:])
    assert [(e.noise_multiplier, e.count) for e in trace.events] == [(20.0, 1), (5.0, 1), (4.0, 2), (50.0, 1)]
    assert trace.events == MechanismTrace(warmup_releases.events(cfg)).events  # what was released is what was planned


def test_a_sparse_group_takes_its_classes_largest_slot():
    shapes = torch.randn(6, 16, dtype=torch.float64)
    counts = torch.tensor([300.0, 3.0, 100.0, 2.0, 1.0, 0.0])  # class 0: group 1 near empty; class 1: all are
    means = torch.full((2, 1, 4, 4), 0.3)
    slots = warmup.group_slots(shapes, counts, means, centre=0.5, spread=0.2)
    assert torch.equal(slots[1], slots[0]) and not torch.equal(slots[2], slots[0])
    assert all(torch.equal(slots[i], means[1]) for i in (3, 4, 5))


def test_the_groups_need_the_histogram_and_replace_polarity_and_styles(tmp_path):
    with pytest.raises(ConfigError, match="warmup.groups"):
        tiny(tmp_path, "warmup.groups=3")
    with pytest.raises(ConfigError, match="warmup.groups"):
        tiny(tmp_path, *LLOYD, "warmup.polarity_noise_multiplier=3")
    with pytest.raises(ConfigError, match="warmup.groups"):
        tiny(tmp_path, *LLOYD, "warmup.styles=2")
    assert warmup_releases.release_names(tiny(tmp_path, "warmup.intensity_noise_multiplier=20")) == [
        "intensity_histogram", "class_means"]  # off by default: nothing changes
