"""GS-WGAN: the sanitizer against brute force, shard isolation, pre-training, accounting, resume, logging."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth.config import load_config
from dpsynth.errors import ConfigError
from dpsynth.methods.gswgan import GSWGANTrainer, sanitized_generator_step
from dpsynth.methods.pretraining import pretrain_shard
from dpsynth.mechanisms.generator_gradient import GSWGAN
from dpsynth.mechanisms.dpsgd import InputGradientSanitizer as Sanitizer, sanitize
from dpsynth.models.gswgan_networks import Classifier, Discriminator, Generator
from dpsynth.privacy import MechanismEvent, MechanismTrace
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.stages.audit import accounting_check, mechanism_check
from tests.methods.gswgan_helpers import K, record_owner, shards_drawn, tiny, warm_files, watch_inputs
from tests.privacy.test_without_replacement import autodp_acct, autodp_mechanism_epsilon
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")


# --- the sanitizer ------------------------------------------------------------------------------


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def test_generator_step_sanitizes_exactly_the_per_sample_image_gradients(float64):
    """Brute force, one sample at a time: clip ∂ℓ_i/∂x_i to C, add σC·noise, back-propagate /B through G."""
    torch.manual_seed(0)
    G = Generator(num_classes=10, width=2, latent_dim=4).eval()  # eval: spectral norm estimates stay fixed
    D = Discriminator(num_classes=10, width=2).eval().requires_grad_(False)
    B, sigma = 6, 0.7
    G0 = copy.deepcopy(G)
    draw = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 10, (B,), generator=draw)
    z = torch.randn(B, 4, generator=draw)
    noise = torch.randn(B, 28 * 28, generator=torch.Generator().manual_seed(2))  # the mechanism's coins
    norms = []
    for i in range(B):
        x_i = G0(z[i:i + 1], labels[i:i + 1]).detach().requires_grad_(True)
        norms.append(torch.autograd.grad(-D(x_i, labels[i:i + 1]).sum(), x_i)[0].norm().item())
    C = float(np.median(norms))  # some gradients are clipped, some are not
    assert min(norms) < C < max(norms)

    expected = [torch.zeros_like(p) for p in G0.parameters()]
    for i in range(B):
        x_i = G0(z[i:i + 1], labels[i:i + 1])
        leaf = x_i.detach().requires_grad_(True)
        g_i = torch.autograd.grad(-D(leaf, labels[i:i + 1]).sum(), leaf)[0]
        released = g_i * min(1.0, C / g_i.norm().item()) + sigma * C * noise[i].view_as(g_i)
        for acc, grad in zip(expected, torch.autograd.grad(x_i, list(G0.parameters()), grad_outputs=released / B)):
            acc += grad

    opt = torch.optim.SGD(G.parameters(), lr=1.0)
    sanitizer = Sanitizer(clip_norm=C, noise_multiplier=sigma, randomness=MechanismRandomness(seed=2))
    sanitized_generator_step(G, opt, lambda x, y: -D(x, y), batch_size=B, generator=torch.Generator().manual_seed(1),
                             sanitizer=sanitizer)
    for p, p0, g in zip(G.parameters(), G0.parameters(), expected):
        torch.testing.assert_close(p.grad, g, rtol=1e-9, atol=1e-12)  # what the optimizer stepped with
        torch.testing.assert_close(p0 - p, g, rtol=1e-7, atol=1e-10)  # SGD, lr 1: θ moved by exactly that


def test_sanitize_clips_each_row_and_adds_sigma_c_noise():
    gen = torch.Generator().manual_seed(0)
    scales = torch.logspace(-2, 2, 2000)
    grads = torch.randn(2000, 500, generator=gen) * scales[:, None] / np.sqrt(500)
    C, sigma = 1.5, 0.8
    clipped = torch.stack([g * min(1.0, C / g.norm().item()) for g in grads])
    out = sanitize(grads, clip_norm=C, noise_multiplier=0.0)
    torch.testing.assert_close(out, clipped, rtol=1e-5, atol=1e-7)
    assert out.norm(dim=1).max() <= C * (1 + 1e-5)
    noise = sanitize(grads, clip_norm=C, noise_multiplier=sigma) - clipped
    assert noise.std().item() == pytest.approx(sigma * C, rel=0.01)  # 10⁶ draws: std error ≈ 0.07 %
    assert abs(noise.mean().item()) < 0.005
    # the noise does not depend on the row's norm: same spread for the smallest and largest gradients
    assert noise[:200].std().item() == pytest.approx(noise[-200:].std().item(), rel=0.02)


# --- shard isolation --------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["gswgan", "dpac"])
def test_each_discriminator_sees_only_its_own_shard(tmp_path, shards, method):
    from dpsynth.methods.dpac import DPACTrainer

    cfg = tiny(tmp_path, "train.steps=8", method=method)
    owner = record_owner(shards)
    warm = {}
    for k, shard in enumerate(shards):  # the pre-training of D_k reads shard k alone
        seen, handle = watch_inputs((Discriminator,))
        try:
            path = tmp_path / f"warm-{k}.pt"
            pretrain_shard(cfg, shard, shard_index=k, out_path=str(path))
        finally:
            handle.remove()
        real = [owner[row.numpy().tobytes()] for _, x in seen for row in x if row.numpy().tobytes() in owner]
        assert real and set(real) == {k}
        warm[k] = path.read_bytes()

    trainer = (DPACTrainer if method == "dpac" else GSWGANTrainer)(cfg, shards, warm=warm)
    before = copy.deepcopy(trainer.state.d_states)
    per_iteration = []
    with shards_drawn() as loaded:  # which D_k is in the working module
        for _ in range(cfg.train.steps):
            seen, handle = watch_inputs((Discriminator, Classifier))
            try:
                trainer.train_step()
            finally:
                handle.remove()
            per_iteration.append((loaded[-1], seen))
    assert len(loaded) == cfg.train.steps
    for step, (k, seen) in enumerate(per_iteration):
        real = [owner[row.numpy().tobytes()] for _, x in seen for row in x if row.numpy().tobytes() in owner]
        assert real and set(real) == {k}, "a discriminator or classifier saw another shard's records"
        uses_classifier = any(name == "Classifier" for name, _ in seen)
        assert uses_classifier == (method == "dpac" and step >= cfg.dpac.start_iteration)
    drawn = set(loaded)
    for k in range(K):  # only drawn shards' discriminators moved
        same = all(torch.equal(before[k][n], trainer.state.d_states[k][n]) for n in before[k])
        assert same == (k not in drawn)


def test_pretrain_is_deterministic_per_shard(tmp_path, shards):
    cfg = tiny(tmp_path)
    details = pretrain_shard(cfg, shards[0], shard_index=0, out_path=str(tmp_path / "a.pt"))
    assert details["iterations"] == 2 and details["iterations_per_second"] > 0
    pretrain_shard(cfg, shards[0], shard_index=0, out_path=str(tmp_path / "b.pt"))
    pretrain_shard(cfg, shards[0], shard_index=1, out_path=str(tmp_path / "c.pt"))
    a, b, c = (torch.load(tmp_path / f"{n}.pt", weights_only=False) for n in "abc")
    assert a["format"] == "dpsynth.gswgan.discriminator/1" and a["shard"] == 0
    assert a["model"] == {"num_classes": 10, "channels": 1, "image_size": 28, "width": 4}
    assert all(torch.equal(a["state_dict"][n], b["state_dict"][n]) for n in a["state_dict"])
    assert not all(torch.equal(a["state_dict"][n], c["state_dict"][n]) for n in a["state_dict"])


def test_pretrain_file_for_another_shard_or_width_is_refused(tmp_path, shards):
    cfg = tiny(tmp_path)
    warm = warm_files(cfg, shards, tmp_path)
    with pytest.raises(ConfigError, match="shard 1"):
        GSWGANTrainer(cfg, shards, warm={0: warm[0], 1: warm[0]})
    with pytest.raises(ConfigError, match="shard 0"):
        GSWGANTrainer(tiny(tmp_path, "gswgan.d_width=8"), shards, warm={0: warm[0]})


# --- accounting -------------------------------------------------------------------------------


def test_trace_is_one_folded_event_per_iteration(tmp_path, shards):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=8.0")
    result = GSWGANTrainer(cfg, shards).train()
    trace = json.loads(Path(result.trace_path).read_text())
    (event,) = trace["events"]
    assert event == {"sampling": "without_replacement", "sample_rate": pytest.approx(1 / K),
                     "noise_multiplier": pytest.approx(8.0 / 4), "sensitivity": "replace_one", "count": 6}
    assert result.accountant == "wor" and result.accounting == "sound" and result.noise_multiplier == 8.0
    assert result.epsilon == pytest.approx(autodp_mechanism_epsilon([(1 / K, 2.0, 6)], delta=1e-4), rel=1e-3)
    assert mechanism_check(cfg, MechanismTrace.from_dict(trace), n=600)["passed"]


def paper(*extra):
    """The paper's MNIST setting: σ = 1.07, B = 32, K = 1000, T = 20k, δ = 1e-5, 60k records."""
    return load_config(overrides=["partition.num_shards=1000", "gswgan.batch_size=32", "train.steps=20000",
                                  "privacy.delta=1e-5", *extra])


def test_as_published_reproduces_the_papers_epsilon_and_stays_unsound():
    cfg = paper("privacy.noise_multiplier=1.07", "privacy.accounting=as_published", "privacy.epsilon=10")
    plan = GSWGAN.plan(cfg, 60_000)
    assert plan.steps == 20_000 and plan.guard is None
    assert plan.published_epsilon == pytest.approx(9.99, abs=0.01)  # GS-WGAN supplement C.1: ε = 10 budget
    assert plan.event.noise_multiplier == pytest.approx(1.07 / np.sqrt(32))
    # the sound account of the same run, by autodp: one subsampled event per iteration, Δ = 2C
    sound = autodp_acct([(1e-3, plan.event.noise_multiplier, 20_000)]).get_eps(1e-5)
    assert sound > 1e5
    with pytest.raises(ConfigError, match="privacy.noise_multiplier"):
        GSWGAN.plan(paper("privacy.accounting=as_published"), 60_000)


def test_calibration_is_in_per_release_units_and_spends_the_budget():
    cfg = paper("privacy.epsilon=3.4")
    plan = GSWGAN.plan(cfg, 60_000)
    sigma = plan.noise_multiplier
    assert plan.event.noise_multiplier == pytest.approx(sigma / np.sqrt(32), rel=1e-12)
    assert plan.steps == 20_000
    events = lambda s: [(1e-3, s / np.sqrt(32), 20_000)]  # noqa: E731
    assert autodp_mechanism_epsilon(events(sigma)) <= 3.4 * (1 + 1e-3)
    assert autodp_mechanism_epsilon(events(sigma * 0.97)) > 3.4
    # σ ≈ 7.5 in units of C is σ ≈ 3.8 in units of 2C (the authors' noise σ·2C): DESIGN.md's "σ ≈ 4, ε ≈ 3.4"
    assert autodp_mechanism_epsilon(events(4.0)) > 100  # per-release noise std 4C is far from enough


def test_training_stops_before_the_budget(tmp_path, shards):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=32.0", "privacy.epsilon=4", "train.steps=100000")
    plan = GSWGAN.plan(cfg, 600)
    T = plan.steps
    assert 1 < T < 100_000
    assert autodp_mechanism_epsilon([(1 / K, 8.0, T)], delta=1e-4) <= 4 * (1 + 1e-3)
    assert autodp_mechanism_epsilon([(1 / K, 8.0, T + 1)], delta=1e-4) > 4 * (1 - 1e-3)


def test_as_published_run_reports_both_and_is_marked_unsound(tmp_path, shards):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=1.07", "privacy.accounting=as_published", "privacy.epsilon=100")
    result = GSWGANTrainer(cfg, shards).train()
    assert result.accounting == "as_published" and result.epsilon_as_published_unsound is not None
    assert result.epsilon > result.epsilon_as_published_unsound  # the sound ε, recorded and reported
    saved = torch.load(result.generator_path, weights_only=False)["privacy"]
    assert saved["accounting"] == "as_published" and saved["sound"] is False
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert mechanism_check(cfg, trace, n=600)["passed"] and not accounting_check(cfg)["passed"]


def test_the_audit_catches_a_wrong_trace(tmp_path):
    """What GS-WGAN's audit invariants checked (sampling, rate 1/K, folded σ, steps, δ < 1/n), the plan check
    covers (and the audit's own delta check: the plan refuses δ ≥ 1/n)."""
    cfg = tiny(tmp_path, "privacy.noise_multiplier=8.0")
    good = MechanismEvent(sampling="without_replacement", sample_rate=1 / K, noise_multiplier=2.0,
                          sensitivity="replace_one", count=6)
    assert mechanism_check(cfg, MechanismTrace([good]), n=600)["passed"]
    bad = [MechanismEvent(sampling="poisson", sample_rate=1 / K, noise_multiplier=2.0, sensitivity="add_remove",
                          count=6),
           MechanismEvent(sampling="without_replacement", sample_rate=0.5, noise_multiplier=2.0,
                          sensitivity="replace_one", count=6),
           good.with_noise(8.0),  # the per-release σ, not folded
           good.with_count(7), good.with_count(5)]
    for event in bad:
        assert not mechanism_check(cfg, MechanismTrace([event]), n=600)["passed"], event
    check = mechanism_check(cfg, MechanismTrace([good]), n=20_000)
    assert not check["passed"] and "delta" in check["detail"]


def test_audit_recomputes_a_calibrated_noise_multiplier(tmp_path, shards):
    cfg = tiny(tmp_path)  # σ calibrated to ε = 50 over 6 iterations
    result = GSWGANTrainer(cfg, shards).train()
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    assert mechanism_check(cfg, trace, n=600)["passed"]
    weaker = MechanismTrace([e.with_noise(e.noise_multiplier * 0.9) for e in trace.events])
    assert not mechanism_check(cfg, weaker, n=600)["passed"]


# --- resume, release, logging -----------------------------------------------------------------


def test_released_generator_is_loadable_and_samples(tmp_path, shards):
    from dpsynth.stages.sample import load_generator

    result = GSWGANTrainer(tiny(tmp_path), shards).train()
    generator, privacy = load_generator(result.generator_path)
    assert isinstance(generator, Generator) and generator.num_classes == 10
    images, labels = generator.sample(20, labels=torch.arange(20) % 10, generator=torch.Generator().manual_seed(0))
    assert images.shape == (20, 1, 28, 28) and images.abs().max() <= 1 and labels.tolist() == [i % 10 for i in range(20)]
    assert privacy["accountant"] == "wor" and privacy["epsilon"] == result.epsilon


def test_mlflow_gets_no_per_step_private_values(tmp_path, shards):
    from mlflow import MlflowClient

    from dpsynth import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tiny(tmp_path / "out", "tracking.enabled=true", f"tracking.uri={uri}", "output.log_every=2",
               "output.sample_every=3")
    result = GSWGANTrainer(cfg, shards).train()
    run = MlflowClient(uri).get_run(result.mlflow_run_id)
    assert set(run.data.metrics) == {"epsilon"}  # declared keys and artifact_location: test_contract.py
    assert run.data.tags[tracking.TAG_ACCOUNTANT] == "wor"


def test_the_sanitizer_records_one_folded_event_per_iteration_and_refuses_a_mismatch():
    from dpsynth.errors import PrivacyError
    from dpsynth.privacy import fold_releases, gswgan_event

    B, sigma, C = 8, 1.5, 0.7
    event = gswgan_event(noise_multiplier=sigma, batch_size=B, num_shards=K)
    trace = MechanismTrace()
    sanitizer = Sanitizer(clip_norm=C, noise_multiplier=sigma, randomness=MechanismRandomness(seed=0), trace=trace,
                          event=event, releases=B)
    grads = torch.randn(B, 1, 4, 4) * 5
    for i in range(1, 4):
        released = sanitizer(grads)
        assert trace.steps == i and released.shape == grads.shape
    assert trace == MechanismTrace([event.with_count(3)])
    assert event.noise_multiplier == pytest.approx(sigma / np.sqrt(B)) == fold_releases(sigma, B)
    with pytest.raises(PrivacyError, match="2 releases given"):  # not the B releases its event folds
        sanitizer(grads[:2])
    assert trace.steps == 3
    with pytest.raises(PrivacyError, match="refusing to release"):  # the noise is not the event's
        Sanitizer(clip_norm=C, noise_multiplier=sigma / 2, randomness=MechanismRandomness(seed=0), trace=trace,
                  event=event, releases=B)
