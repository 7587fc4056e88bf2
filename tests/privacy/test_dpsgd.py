"""The sanitizer against a brute-force per-example loop, and its noise against its nominal scale."""

import math

import pytest
import torch
from opacus.grad_sample.utils import prepare_module
from torch import nn

from dpsynth.privacy.dpsgd import GradientSanitizer


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(3, 4)
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.fc = nn.Linear(3 * 4, 1)

    def forward(self, x, y):
        e = self.emb(y.view(-1, 1)).view(-1, 1, 2, 2)
        h = torch.relu(self.conv(torch.cat([x, e], dim=1)))
        return self.fc(h.flatten(1)).view(-1)


def brute_force(model, x, y, groups, bounds):
    """Clip each example's gradient group by group, the slow obvious way."""
    sums = [[torch.zeros_like(p) for p in g] for g in groups]
    for i in range(len(x)):
        model.zero_grad()
        model(x[i:i + 1], y[i:i + 1]).sum().pow(2).backward()
        for g, c, acc in zip(groups, bounds, sums):
            norm = math.sqrt(sum(p.grad.pow(2).sum().item() for p in g))
            factor = min(1.0, c / (norm + 1e-6))
            for p, a in zip(g, acc):
                a += factor * p.grad
    return sums


@pytest.mark.parametrize("mode", ["hooks", "ew"])
@pytest.mark.parametrize("grouped", [False, True])
def test_clipping_matches_per_example_loop(mode, grouped):
    torch.manual_seed(0)
    model = Tiny()
    x, y = torch.randn(7, 1, 2, 2) * 3, torch.randint(0, 3, (7,))
    params = list(model.parameters())
    groups = [params[:2], params[2:]] if grouped else [params]
    bounds = [0.3, 0.7] if grouped else [0.5]
    expected = brute_force(model, x, y, groups, bounds)

    gsm = prepare_module(model, mode, loss_reduction="sum")
    san = GradientSanitizer(groups if grouped else params, max_grad_norm=bounds if grouped else bounds[0],
                            noise_multiplier=0.0, expected_batch_size=2.0)
    # two physical chunks of one logical batch
    gsm(x[:4], y[:4]).pow(2).sum().backward()
    san.accumulate()
    gsm(x[4:], y[4:]).pow(2).sum().backward()
    san.accumulate()
    san.finalize()
    for g, acc in zip(groups, expected):
        for p, a in zip(g, acc):
            torch.testing.assert_close(p.grad, a / 2.0, rtol=1e-4, atol=1e-6)
    # the clipping actually bit (otherwise the test would prove little)
    raw = brute_force(model, x, y, groups, [1e9] * len(groups))
    assert any(not torch.allclose(a, r) for ga, gr in zip(expected, raw) for a, r in zip(ga, gr))


def test_noise_has_the_nominal_scale():
    """With zero gradients, p.grad is pure noise: std σ·c_j / expected batch size, mean 0."""
    lin = nn.Linear(200, 100)
    gsm = prepare_module(lin, "hooks", loss_reduction="sum")
    sigma, bounds, ebs = 1.7, [0.5, 2.0], 4.0
    san = GradientSanitizer([[lin.weight], [lin.bias]], max_grad_norm=bounds, noise_multiplier=sigma,
                            expected_batch_size=ebs)
    (gsm(torch.zeros(3, 200)) * 0).sum().backward()
    san.accumulate()
    san.finalize()
    w = lin.weight.grad.flatten()
    # 20,000 draws: the sample std is within ±3% of the truth with overwhelming probability
    assert w.std().item() == pytest.approx(sigma * bounds[0] / ebs, rel=0.03)
    assert abs(w.mean().item()) < 4 * sigma * bounds[0] / ebs / math.sqrt(w.numel())
    assert lin.bias.grad.std().item() == pytest.approx(sigma * bounds[1] / ebs, rel=0.2)
    assert san.effective_noise_multiplier() == pytest.approx(sigma / math.sqrt(2))


def test_empty_batch_still_gets_noise():
    lin = nn.Linear(5, 3)
    san = GradientSanitizer(list(lin.parameters()), max_grad_norm=1.0, noise_multiplier=1.0,
                            expected_batch_size=1.0)
    san.finalize()
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


def test_rejects_bad_settings():
    lin = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="max_grad_norm"):
        GradientSanitizer(list(lin.parameters()), max_grad_norm=0.0, noise_multiplier=1.0, expected_batch_size=1)
    with pytest.raises(ValueError, match="noise_multiplier"):
        GradientSanitizer(list(lin.parameters()), max_grad_norm=1.0, noise_multiplier=-1, expected_batch_size=1)
