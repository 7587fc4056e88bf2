"""Ghost clipping against a brute-force loop: one float64 backward pass per example.

Every layer rule (both branches of the cost model), the clipped sums of both strategies with
groups and with physical chunks, the discriminators of every method, and the refusals.
"""

import copy
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpsynth.models import dcgan, gswgan_networks
from dpsynth.mechanisms import ghost
from dpsynth.mechanisms.dpsgd import GradientSanitizer, private_module

RTOL = 1e-5


class Reuse(nn.Module):
    """One Linear applied twice per example (its per-example gradient is the sum of both calls)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(torch.tanh(self.fc(x)))


class Tokens(nn.Module):
    """Embedding with repeated indices and a padding index, then LayerNorm and a Linear over tokens."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 4, padding_idx=0)
        self.norm = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, idx):
        return self.fc(self.norm(self.emb(idx)))


class Images(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, stride=2, padding=1, dilation=1)
        self.dil = nn.Conv2d(3, 4, 2, padding=1, dilation=2)
        self.gn = nn.GroupNorm(2, 4)
        self.up = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.up(F.leaky_relu(self.gn(self.dil(F.leaky_relu(self.conv(x))))))


class Oblong(nn.Module):
    """Non-square kernels, strides, paddings and dilations (rows and columns must not be mixed up)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))
        self.up = nn.ConvTranspose2d(3, 2, (2, 3), stride=(1, 2), padding=(0, 1), dilation=(2, 1), bias=False)

    def forward(self, x):
        return self.up(torch.tanh(self.conv(x)))


def cases():
    g = torch.Generator().manual_seed(0)
    return {
        "linear": (nn.Linear(6, 3), (torch.randn(5, 6, generator=g),)),
        "linear_reused": (Reuse(), (torch.randn(5, 3, generator=g),)),
        "tokens": (Tokens(), (torch.tensor([[1, 2, 1, 0], [3, 3, 3, 3], [0, 0, 4, 1], [2, 4, 2, 1], [1, 1, 0, 2]]),)),
        "images": (Images(), (torch.randn(5, 2, 7, 7, generator=g),)),
        "oblong": (Oblong(), (torch.randn(5, 2, 7, 6, generator=g),)),
        "dcgan_d": (dcgan.Discriminator(num_classes=3, width=4), (torch.randn(5, 1, 28, 28, generator=g),
                                                                   torch.tensor([0, 2, 1, 1, 0]))),
        "dcgan_d32": (dcgan.Discriminator(num_classes=3, channels=3, image_size=32, width=4),
                      (torch.randn(5, 3, 32, 32, generator=g), torch.tensor([0, 2, 1, 1, 0]))),
        "dpac_classifier": (gswgan_networks.Classifier(num_classes=3, width=4), (torch.randn(5, 1, 28, 28, generator=g),)),
    }


def per_example_loss(out):
    """A nonlinear per-example loss of any output shape."""
    return (out.reshape(out.shape[0], -1) ** 2).sum(1) + out.reshape(out.shape[0], -1).sin().sum(1)


def brute_force(model, inputs, params):
    """(n, len(params)) per-example gradients, the obvious way."""
    n = inputs[0].shape[0]
    rows = []
    for i in range(n):
        loss = per_example_loss(model(*(t[i:i + 1] for t in inputs))).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        rows.append([torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)])
    return rows


def ghost_norms(model, inputs):
    wrapped = ghost.GhostClipping(model)
    losses = per_example_loss(wrapped(*inputs))
    n = wrapped._output_grads(losses, keep_graph=False)
    norms, _ = wrapped._norms(n)
    wrapped.clear()
    return norms


RULES = ["cost_model", "always_ghost", "always_instantiate", "always_keep"]


def force(rule, monkeypatch):
    """Every branch of the per-layer choice (ghost norm; instantiated, dropped or kept), in chunks of 2 examples."""
    if rule == "cost_model":
        return
    monkeypatch.setattr(ghost, "use_ghost_norm", lambda T, p, d: rule == "always_ghost")
    monkeypatch.setattr(ghost, "keep_instantiated", lambda n, p, d, stored: rule == "always_keep")
    monkeypatch.setattr(ghost, "chunk_size", lambda n, per_example: 2)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("case", list(cases()))
def test_per_example_norms_match_brute_force(case, rule, monkeypatch):
    force(rule, monkeypatch)
    torch.manual_seed(1)
    model, inputs = cases()[case]
    model = model.double()
    inputs = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    params = list(model.parameters())
    expected = brute_force(model, inputs, params)
    norms = ghost_norms(model, inputs)
    for j, p in enumerate(params):
        want = torch.stack([row[j].pow(2).sum() for row in expected])
        torch.testing.assert_close(norms[id(p)], want, rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("mode,grouped", [("ghost", False), ("ghost", True), ("ghost_two_pass", False)])
@pytest.mark.parametrize("case", ["images", "oblong", "dcgan_d", "tokens"])
def test_clipped_sum_matches_brute_force_with_chunks(case, mode, grouped, rule, monkeypatch):
    force(rule, monkeypatch)
    torch.manual_seed(2)
    model, inputs = cases()[case]
    model = model.double()
    inputs = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    params = list(model.parameters())
    groups = [params[::2], params[1::2]] if grouped else [params]
    bounds = [0.3, 0.05] if grouped else [0.1]
    rows = brute_force(model, inputs, params)
    index = {id(p): j for j, p in enumerate(params)}
    expected = []
    for group, bound in zip(groups, bounds):
        acc = [torch.zeros_like(p) for p in group]
        for row in rows:
            norm = torch.sqrt(sum(row[index[id(p)]].pow(2).sum() for p in group))
            factor = min(1.0, bound / (float(norm) + 1e-6))
            for a, p in zip(acc, group):
                a += factor * row[index[id(p)]]
        expected.append(acc)
    assert any(torch.sqrt(sum(r[index[id(p)]].pow(2).sum() for p in groups[0])) > bounds[0] for r in rows)

    wrapped = private_module(model, mode)
    san = GradientSanitizer(groups, max_grad_norm=bounds, noise_multiplier=0.0, expected_batch_size=1.0,
                            module=wrapped)
    for chunk in (slice(0, 2), slice(2, 5)):  # one logical batch in two physical chunks
        san.accumulate(per_example_loss(wrapped(*(t[chunk] for t in inputs))))
    san.finalize()
    for group, acc in zip(groups, expected):
        for p, want in zip(group, acc):
            torch.testing.assert_close(p.grad, want, rtol=RTOL, atol=1e-10)
        assert all(getattr(p, "grad_sample", None) is None for p in group)


def test_bookkeeping_and_two_pass_agree_with_ew_in_float32():
    """The fast path on the real discriminator, float32: the same clipped sum as Opacus' expanded weights."""
    torch.manual_seed(3)
    D0 = dcgan.Discriminator(num_classes=10, width=8)
    x, y = torch.randn(12, 1, 28, 28), torch.randint(0, 10, (12,))
    grads = {}
    for mode in ("ew", "ghost", "ghost_two_pass"):
        D = copy.deepcopy(D0)
        wrapped = private_module(D, mode)
        san = GradientSanitizer(list(D.parameters()), max_grad_norm=0.05, noise_multiplier=0.0,
                                expected_batch_size=12.0, module=wrapped)
        san.accumulate(F.softplus(wrapped(x, y)))
        san.finalize()
        grads[mode] = [p.grad for p in D.parameters()]
    for mode in ("ghost", "ghost_two_pass"):
        for a, b in zip(grads[mode], grads["ew"]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_layer_outputs_are_not_held():
    """The engine records an output's autograd edge, not the output: the graph alone decides when it is freed."""
    model = ghost.GhostClipping(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)))  # Tanh saves its result
    seen = []
    model._module[0].register_forward_hook(lambda layer, inputs, out: seen.append(weakref.ref(out)))
    losses = model(torch.randn(5, 3)).view(-1)
    assert seen[0]() is None
    sums = model.clipped_sums(losses, [list(model.parameters())], [1.0])
    assert all(s.abs().sum() > 0 for s in sums[0])


def test_gswgan_spectral_norm_is_refused_by_name():
    with pytest.raises(ValueError, match="conv1.*spectral-norm"):
        ghost.GhostClipping(gswgan_networks.Discriminator(num_classes=3, width=4))


def test_unsupported_layer_is_refused_by_name():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    with pytest.raises(ValueError, match="'1' \\(BatchNorm2d\\)"):
        ghost.GhostClipping(model)
    with pytest.raises(ValueError, match="groups=1"):
        ghost.GhostClipping(nn.Conv2d(2, 2, 3, groups=2))


def test_two_pass_refuses_groups_and_bad_losses():
    model = nn.Linear(3, 1)
    wrapped = private_module(model, "ghost_two_pass")
    san = GradientSanitizer([[model.weight], [model.bias]], max_grad_norm=[1.0, 1.0], noise_multiplier=0.0,
                            expected_batch_size=1.0, module=wrapped)
    with pytest.raises(ValueError, match="one group"):
        san.accumulate(wrapped(torch.randn(4, 3)).view(-1))
    with pytest.raises(ValueError, match="grad_sample_mode"):
        private_module(model, "fast")
    san = GradientSanitizer([model.weight, model.bias], max_grad_norm=1.0, noise_multiplier=0.0,
                            expected_batch_size=1.0, module=wrapped)
    with pytest.raises(ValueError, match="losses"):
        san.accumulate(wrapped(torch.randn(4, 3)))  # (4, 1): not one loss per example
    outsider = nn.Parameter(torch.zeros(2))
    san = GradientSanitizer([model.weight, model.bias, outsider], max_grad_norm=1.0, noise_multiplier=0.0,
                            expected_batch_size=1.0, module=wrapped)
    with pytest.raises(ValueError, match=r"shapes \[\(2,\)\] are not"):
        san.accumulate(wrapped(torch.randn(4, 3)).view(-1))


def gp_unit_losses(D, real, fake, y, rho, gp_weight=10.0):
    """dp-GAN's per-unit critic loss: D(fake) − D(real) + λ(‖∇_x̂ D(x̂)‖ − 1)², one entry per unit."""
    x_hat = (rho * real + (1 - rho) * fake).requires_grad_(True)
    (gx,) = torch.autograd.grad(D(x_hat, y).sum(), x_hat, create_graph=True)
    penalty = ((gx.flatten(1).pow(2).sum(1) + 1e-12).sqrt() - 1) ** 2
    return D(fake, y) - D(real, y) + gp_weight * penalty


class MLPCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(3, 6)
        self.fc1, self.fc2 = nn.Linear(6, 5), nn.Linear(5, 1)

    def forward(self, x, y):
        return self.fc2(torch.tanh(self.fc1(x.flatten(1) + self.emb(y)))).view(-1)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("critic", ["dcgan_d", "mlp"])
def test_gradient_penalty_units_match_brute_force(critic, rule, monkeypatch):
    """Second order: each unit's gradient includes the penalty's path through ∇_x D; clipped per group."""
    force(rule, monkeypatch)
    torch.manual_seed(4)
    if critic == "dcgan_d":
        D, shape = dcgan.Discriminator(num_classes=3, width=4).double(), (5, 1, 28, 28)
    else:
        D, shape = MLPCritic().double(), (5, 1, 2, 3)
    real, fake = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)
    y, rho = torch.tensor([0, 2, 1, 1, 0]), torch.rand(5, 1, 1, 1, dtype=torch.float64)
    params = list(D.parameters())
    groups, bounds = [params[:3], params[3:]], [0.5, 2.0]
    expected = [[torch.zeros_like(p) for p in g] for g in groups]
    for i in range(5):
        s = slice(i, i + 1)
        grads = torch.autograd.grad(gp_unit_losses(D, real[s], fake[s], y[s], rho[s]).sum(), params)
        by_param = dict(zip(map(id, params), grads))
        for group, bound, acc in zip(groups, bounds, expected):
            norm = float(torch.sqrt(sum(by_param[id(p)].pow(2).sum() for p in group)))
            for a, p in zip(acc, group):
                a += min(1.0, bound / (norm + 1e-6)) * by_param[id(p)]

    wrapped = ghost.GhostClipping(D, second_order=True)
    san = GradientSanitizer(groups, max_grad_norm=bounds, noise_multiplier=0.0, expected_batch_size=1.0,
                            module=wrapped)
    for chunk in (slice(0, 3), slice(3, 5)):
        san.accumulate(gp_unit_losses(wrapped, real[chunk], fake[chunk], y[chunk], rho[chunk]))
    san.finalize()
    for group, acc in zip(groups, expected):
        for p, want in zip(group, acc):
            torch.testing.assert_close(p.grad, want, rtol=RTOL, atol=1e-10)
    with pytest.raises(ValueError, match="two-pass"):
        ghost.GhostClipping(MLPCritic(), strategy="two_pass", second_order=True)
