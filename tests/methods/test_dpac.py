"""DP-GAN-DPAC: the sequential fresh classifier, the combined loss sanitized once, batch size B, accounting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dpsynth.methods import dpac as dpac_module
from dpsynth.methods import gswgan as gswgan_module
from dpsynth.methods.dpac import DPACTrainer, balanced_labels, train_classifier
from dpsynth.models.gswgan_networks import Classifier
from tests.methods.gswgan_helpers import K, record_owner, tiny, watch_inputs
from tests.privacy.test_without_replacement import autodp_mechanism_epsilon
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")


def test_balanced_labels():
    assert torch.bincount(balanced_labels(32, 10)).tolist() == [4, 4] + [3] * 8


def test_classifier_is_fresh_and_trained_on_fakes_then_on_its_shard(tmp_path, shards):
    cfg = tiny(tmp_path, "dpac.n_f=3", "dpac.n_r=4", "dpac.start_iteration=0")
    trainer = DPACTrainer(cfg, shards)
    owner = record_owner(shards)
    initial = []
    seen, handle = watch_inputs((Classifier,))
    first = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda m, args: initial.append([p.detach().clone() for p in m.parameters()])
        if isinstance(m, Classifier) and len(seen) in (1, 8) else None)
    try:
        C0, C1 = (train_classifier(trainer.state, trainer.shards[1], cfg=cfg, spec=trainer.spec, iteration=trainer.step)
                  for _ in range(2))
    finally:
        handle.remove()
        first.remove()
    assert len(seen) == 2 * (3 + 4)
    fakes, reals = [x for _, x in seen[:3]], [x for _, x in seen[3:7]]
    assert all(torch.equal(f, fakes[0]) for f in fakes)  # one fixed fake batch, n_f times
    assert all(row.numpy().tobytes() not in owner for row in fakes[0])
    for x in reals:  # then n_r real batches of B records, all from shard 1
        assert len(x) == 16 and {owner[row.numpy().tobytes()] for row in x} == {1}
    # the second classifier does not start from the first one's trained weights
    trained = [p.detach() for p in C0.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(initial[1], trained))
    assert C1 is not C0


def test_generator_loss_is_combined_before_sanitization(tmp_path, shards, monkeypatch):
    cfg = tiny(tmp_path, "dpac.beta=0.3", "dpac.start_iteration=1", "train.steps=2")
    trainer = DPACTrainer(cfg, shards)
    calls = []
    real_step = gswgan_module.sanitized_generator_step

    def spy(G, opt, loss, **kwargs):
        calls.append((loss, kwargs))
        return real_step(G, opt, loss, **kwargs)

    monkeypatch.setattr(gswgan_module, "sanitized_generator_step", spy)
    C = {}
    monkeypatch.setattr(dpac_module, "train_classifier", lambda *a, **kw: C.setdefault("c", train_classifier(*a, **kw)))
    trainer.train_step()  # before t_c: the WGAN loss alone
    trainer.train_step()  # from t_c: β·(−D) + (1 − β)·CE, one loss, so one sanitized release per sample
    x = torch.randn(16, 1, 28, 28)
    y = torch.arange(16) % 10
    D = trainer.state.D.eval()  # as in the generator step: spectral norm estimates fixed
    with torch.no_grad():
        torch.testing.assert_close(calls[0][0](x, y), -D(x, y))
        expected = 0.3 * -D(x, y) + 0.7 * F.cross_entropy(C["c"](x), y, reduction="none")
        torch.testing.assert_close(calls[1][0](x, y), expected)
    for _, kwargs in calls:  # the generator step keeps B (the authors' code uses 1000)
        assert kwargs["batch_size"] == cfg.gswgan.batch_size == 16


def test_dpac_trace_is_gswgans_mechanism(tmp_path, shards):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=8.0", "train.method=dpac")
    result = DPACTrainer(cfg, shards).train()
    (event,) = json.loads(Path(result.trace_path).read_text())["events"]
    assert event["count"] == 6 and event["noise_multiplier"] == pytest.approx(8.0 / 4)
    assert event["sample_rate"] == pytest.approx(1 / K) and event["sampling"] == "without_replacement"
    assert result.epsilon == pytest.approx(autodp_mechanism_epsilon([(1 / K, 2.0, 6)], delta=1e-4), rel=1e-3)
