"""dp-GAN (Zhang et al.): group clipping vs brute force, accounting vs autodp, public-only bounds and
pre-training, training, resume, the audit's invariants, and the pipeline stages end to end."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from autodp.mechanism_zoo import GaussianMechanism
from autodp.transformer_zoo import AmplificationBySampling, Composition

from dpsynth.config import load_config
from dpsynth.errors import ConfigError, DatasetError
from dpsynth.mechanisms.discriminator import ZHANG
from dpsynth.methods.pretraining import pretrain
from dpsynth.methods.networks import load_pretrained
from dpsynth.methods.zhang import ZhangTrainer, g_step, per_unit_gradients
from dpsynth.models.dcgan import Discriminator
from dpsynth.privacy import MechanismTrace
from dpsynth.mechanisms import grouping
from dpsynth.mechanisms.dpsgd import GradientSanitizer
from dpsynth.stages.audit import accounting_check, mechanism_check
from dpsynth.stages.partition import public_mask
from tests.ledger_fixtures import assert_charged_once
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

def tiny(tmp_path, *extra):
    return load_config(overrides=[
        f"output.dir={tmp_path}", "tracking.enabled=false", "train.d_width=4", "train.g_width=4",
        "train.latent_dim=8", "train.batch_size=32", "train.steps=8", "data.heldout_fraction=0",
        "data.public_fraction=0.1", "data.public_fraction_unprotected=true", "zhang.public_batch_size=16", "zhang.pretrain_iterations=2",
        "zhang.num_groups=3", "train.n_d=2", "output.checkpoint_every=4", "output.sample_every=0",
        "output.log_every=0", "privacy.epsilon=10", "privacy.delta=1e-4",
        "partition.key=dpsynth-partition-v1", "data.num_classes=10",  # no defaults: the demo's public key, MNIST's
        *extra,
    ])


def zhang_check(cfg, trace, n) -> dict:
    """The audit's plan check of ``trace`` as dp-GAN's (``tiny`` leaves train.method at its default)."""
    import dataclasses

    return mechanism_check(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, method="zhang")), trace, n)


def split(ds, cfg):
    mask = public_mask(ds, cfg)
    return ds.subset(mask), ds.subset(~mask)


def autodp_epsilon(*, sigma, groups, q, steps, delta):
    """Independent reference: k Gaussian releases of multiplier σ on one Poisson sample, composed over steps."""
    mech = Composition()([GaussianMechanism(sigma=sigma)], [groups]) if groups > 1 else GaussianMechanism(sigma=sigma)
    sampled = AmplificationBySampling(PoissonSampling=True)(mech, q, improved_bound_flag=True)
    return Composition()([sampled], [steps]).get_approxDP(delta)


# --- the per-unit gradient and group clipping, against a brute-force loop -------------------------


def brute_force(D, real, fake, y, rho, groups, bounds, gp_weight):
    """One unit at a time, by plain autograd: ℓ = D(fake) − D(real) + λ(‖∇x̂ D(x̂)‖ − 1)²; clip each group."""
    params = dict(D.named_parameters())
    sums = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(len(real)):
        x_hat = (rho[i] * real[i:i + 1] + (1 - rho[i]) * fake[i:i + 1]).requires_grad_(True)
        (gx,) = torch.autograd.grad(D(x_hat, y[i:i + 1]).sum(), x_hat, create_graph=True)
        loss = D(fake[i:i + 1], y[i:i + 1]).sum() - D(real[i:i + 1], y[i:i + 1]).sum() \
            + gp_weight * (gx.norm() - 1) ** 2
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
        for group, c in zip(groups, bounds):
            norm = math.sqrt(sum(grads[n].pow(2).sum().item() for n in group))
            for n in group:
                sums[n] += min(1.0, c / (norm + 1e-6)) * grads[n]
    return sums


@pytest.mark.parametrize("strategy", ["global", "weight_bias", "per_layer"])
def test_group_clipping_matches_brute_force(strategy):
    torch.manual_seed(0)
    D = Discriminator(num_classes=3, width=2)
    m = 5
    real, fake = torch.randn(m, 1, 28, 28), torch.randn(m, 1, 28, 28)
    y, rho = torch.randint(0, 3, (m,)), torch.rand(m).view(-1, 1, 1, 1)
    names = [n for n, _ in D.named_parameters()]
    groups = grouping.fixed_groups(names, strategy=strategy)
    bounds = [0.05 * (j + 1) for j in range(len(groups))]
    expected = brute_force(D, real, fake, y, rho, groups, bounds, gp_weight=10.0)

    params = dict(D.named_parameters())
    san = GradientSanitizer([[params[n] for n in g] for g in groups], max_grad_norm=bounds, noise_multiplier=0.0,
                            expected_batch_size=4.0)
    for chunk in (slice(0, 3), slice(3, 5)):  # two physical chunks of one logical batch
        for n, g in per_unit_gradients(D, real[chunk], fake[chunk], y[chunk], rho[chunk], gp_weight=10.0).items():
            params[n].grad_sample = g
        san.accumulate()
    san.finalize()
    for n, p in params.items():
        torch.testing.assert_close(p.grad, expected[n] / 4.0, rtol=1e-4, atol=1e-6)
    unclipped = brute_force(D, real, fake, y, rho, groups, [1e9] * len(groups), gp_weight=10.0)
    assert any(not torch.allclose(expected[n], unclipped[n]) for n in names)  # the bounds bit


def test_ghost_critic_step_equals_per_unit_gradients(tmp_path, small_mnist):
    """train.grad_sample_mode=ghost: the critic step (penalty, groups, chunks) moves D as torch.func's does."""
    steps = {}
    for mode in ("ew", "ghost"):
        cfg = tiny(tmp_path / mode, "zhang.grouping=per_layer", "zhang.adaptive_clipping=false",
                   "privacy.max_grad_norm=0.05", "train.physical_batch_size=7", f"train.grad_sample_mode={mode}")
        t = ZhangTrainer(cfg, small_mnist, mechanism_seed=11)
        t.train_step()  # one critic step (n_critic = train.n_d = 2)
        g_step(t.state, t.cfg.train.batch_size)
        t.train_step()
        steps[mode] = [p.detach().clone() for p in t.state.D.parameters()]
    for a, b in zip(steps["ew"], steps["ghost"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_units_latents_are_secret_coins_not_the_public_stream(tmp_path, small_mnist):
    """Each unit's z_i and ρ_i are fresh draws of the mechanism's secret coins: a critic step leaves the public
    latent stream (train.seed) where it was, whatever it sampled, so a later generator step's latents do not
    depend on how many records a step drew. With z_i read from that stream in sampling order (the code before),
    one more sampled record would shift the latent of every later unit, and the stream's position would record
    the batch sizes."""
    cfg = tiny(tmp_path, "zhang.grouping=weight_bias", "zhang.adaptive_clipping=false", "data.public_fraction=0")
    for rate in (0.02, 0.3):
        t = ZhangTrainer(cfg, small_mnist, mechanism_seed=3)
        before = t.state.rng.get_state()
        draw, shapes = t.state.mechanism.poisson_mask, []
        t.state.mechanism.poisson_mask = lambda n, _q, rate=rate, draw=draw: draw(n, rate)
        normal = t.state.mechanism.standard_normal
        t.state.mechanism.standard_normal = lambda shape, normal=normal, **kw: shapes.append(tuple(shape)) or normal(shape, **kw)
        t.train_step()  # one critic step (n_critic = train.n_d = 2)
        assert torch.equal(t.state.rng.get_state(), before)
        m = shapes[0][0]
        assert shapes[0] == (m, 8) and m > 0  # the units' latents: from the secret coins, one per sampled record


# --- accounting ------------------------------------------------------------------------------------


def test_k_groups_are_one_event_at_sigma_over_root_k(tmp_path, small_mnist):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=2.0", "zhang.grouping=per_layer", "train.steps=200",
               "privacy.epsilon=50")
    plan = ZHANG.plan(cfg, 540)
    assert plan.releases == 5 and plan.event.noise_multiplier == pytest.approx(2.0 / math.sqrt(5))
    assert (plan.event.sampling, plan.event.sensitivity) == ("poisson", "add_remove")
    trace = MechanismTrace([plan.event.with_count(200)])
    ours = plan.guard.accountant.epsilon(trace, delta=1e-4)
    ref = autodp_epsilon(sigma=2.0, groups=5, q=32 / 540, steps=200, delta=1e-4)
    assert ours == pytest.approx(ref, rel=5e-3)
    # per-group (parallel) composition would claim far less: that is the unsound as_published account
    assert autodp_epsilon(sigma=2.0, groups=1, q=32 / 540, steps=200, delta=1e-4) < ref / 2


def test_calibrated_sigma_spends_the_target_by_an_independent_account(tmp_path):
    cfg = tiny(tmp_path, "privacy.epsilon=2", "privacy.delta=1e-5", "train.steps=1000", "zhang.grouping=weight_bias")
    plan = ZHANG.plan(cfg, 10_000)
    assert plan.steps == 1000 and plan.releases == 2
    ref = autodp_epsilon(sigma=plan.noise_multiplier, groups=2, q=32 / 10_000, steps=1000, delta=1e-5)
    # calibration's 1% tolerance plus the accountants' conversions (autodp 1.984 here); forgetting
    # the √k fold would put autodp's account near 2·√2
    assert 2 * 0.95 < ref < 2 * 1.005


def test_as_published_reports_both_and_fails_the_audit(tmp_path, small_mnist):
    cfg = tiny(tmp_path, "privacy.accounting=as_published", "privacy.epsilon=3", "zhang.grouping=per_layer",
               "zhang.adaptive_clipping=false")
    public, private = split(small_mnist, cfg)
    trainer = ZhangTrainer(cfg, private, public=public)
    result = trainer.train()
    q = 32 / len(private)
    sigma = trainer.plan.noise_multiplier
    assert result.noise_multiplier == pytest.approx(sigma / math.sqrt(5))  # the trace stays sound
    assert result.epsilon_as_published_unsound == pytest.approx(
        autodp_epsilon(sigma=sigma, groups=1, q=q, steps=result.steps, delta=1e-4), rel=5e-3)
    assert result.epsilon_as_published_unsound <= 3 < result.epsilon
    # the sound account of the same run is over budget by the independent reference too
    assert autodp_epsilon(sigma=sigma, groups=5, q=q, steps=result.steps, delta=1e-4) > 3 * 2
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    check = zhang_check(cfg, trace, len(private))
    assert check["passed"], check  # the sound trace of the plan …
    assert not accounting_check(cfg)["passed"]  # … of an unsound account: never released


# --- public data only ------------------------------------------------------------------------------


def test_adaptive_bounds_never_see_a_private_record(tmp_path, small_mnist):
    cfg = tiny(tmp_path)
    public, private = split(small_mnist, cfg)
    clean = ZhangTrainer(cfg, private, public=public)
    poisoned = ZhangTrainer(cfg, private, public=public)
    poisoned.images = torch.full_like(poisoned.images, float("nan"))  # any private record would turn a bound NaN
    poisoned.labels = torch.full_like(poisoned.labels, 10**6)  # ... or fail the label embedding
    for t in (clean, poisoned):
        t.update_bounds()
    assert poisoned.state.groups == clean.state.groups and len(clean.state.groups) == 3
    assert poisoned.sanitizer.bounds == clean.sanitizer.bounds
    assert all(math.isfinite(c) and c > 0 for c in clean.sanitizer.bounds)
    # and the bounds do depend on the public records
    other = ZhangTrainer(cfg, private, public=public)
    other.public_images = -other.public_images
    other.update_bounds()
    assert other.sanitizer.bounds != clean.sanitizer.bounds


def test_grouping_needs_public_data(tmp_path, small_mnist):
    with pytest.raises(ConfigError, match="zhang.adaptive_clipping"):
        ZhangTrainer(tiny(tmp_path), small_mnist)
    with pytest.raises(ConfigError, match="zhang.grouping"):
        ZhangTrainer(tiny(tmp_path, "zhang.adaptive_clipping=false"), small_mnist)
    cfg = tiny(tmp_path, "zhang.adaptive_clipping=false", "zhang.grouping=weight_bias", "data.public_fraction=0")
    t = ZhangTrainer(cfg, small_mnist)  # fixed bounds, no public data needed
    assert t.sanitizer.bounds == [1.0, 1.0] and t.plan.releases == 2
    public, private = split(small_mnist, tiny(tmp_path))
    with pytest.raises(DatasetError, match="also private"):
        ZhangTrainer(tiny(tmp_path), small_mnist, public=public)  # public records inside the training set


def test_pretrain_refuses_private_records(tmp_path, small_mnist):
    cfg = tiny(tmp_path)
    public, private = split(small_mnist, cfg)
    out = str(tmp_path / "ws.pt")
    with pytest.raises(DatasetError, match=rf"data.public_fraction: {len(private)} of {len(private)} records .* not public"):
        pretrain(cfg, private, out_path=out)
    with pytest.raises(DatasetError, match=f"1 of {len(public) + 1} "):  # one private record among the public ones
        pretrain(cfg, small_mnist.subset(np.concatenate([np.flatnonzero(public_mask(small_mnist, cfg)),
                                                        [np.flatnonzero(~public_mask(small_mnist, cfg))[0]]])),
                   out_path=out)
    with pytest.raises(ConfigError, match="data.public_source"):  # no public data declared at all
        pretrain(tiny(tmp_path, "data.public_fraction=0"), public, out_path=out)
    assert not Path(out).exists()
    details = pretrain(cfg, public, out_path=out)
    assert details["public_records"] == len(public) and 20 <= len(public) <= 100 and details["iterations"] == 2
    state = load_pretrained(Path(out).read_bytes())
    trainer = ZhangTrainer(cfg, private, public=public, pretrained_state=state)
    assert trainer.pretrained
    for name, value in trainer.state.G.state_dict().items():
        assert torch.equal(value, state["G"][name])
    with pytest.raises(ConfigError, match="pre-training"):
        ZhangTrainer(tiny(tmp_path, "train.d_width=8"), private, public=public, pretrained_state=state)


# --- training --------------------------------------------------------------------------------------


def test_training_updates_g_and_records_the_trace(tmp_path, small_mnist):
    cfg = tiny(tmp_path)
    public, private = split(small_mnist, cfg)
    trainer = ZhangTrainer(cfg, private, public=public)
    g0 = {k: v.clone() for k, v in trainer.state.G.state_dict().items()}
    result = trainer.train()
    assert result.steps == 8 and result.generator_steps == 4 and result.stopped_by == "steps"
    assert any(not torch.equal(v, g0[k]) for k, v in trainer.state.G.state_dict().items())  # G is trained
    trace = MechanismTrace.from_json(Path(result.trace_path).read_text())
    (event,) = trace.events
    assert event.count == 8 and event.sample_rate == pytest.approx(32 / len(private))
    assert event.noise_multiplier == pytest.approx(trainer.plan.noise_multiplier / math.sqrt(3))
    assert result.epsilon <= 10
    saved = torch.load(result.generator_path, weights_only=False)
    assert saved["format"] == "dpsynth.generator/1" and saved["model"]["class"] == "dpsynth.models.dcgan.Generator"
    assert json.loads((tmp_path / "result.json").read_text())["details"]["num_groups"] == 3
    assert zhang_check(cfg, trace, len(private))["passed"]


def test_stops_before_the_budget_is_exceeded(tmp_path, small_mnist):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=3.0", "privacy.epsilon=2", "train.steps=1000",
               "zhang.adaptive_clipping=false", "zhang.grouping=weight_bias")
    public, private = split(small_mnist, cfg)
    trainer = ZhangTrainer(cfg, private, public=public)
    steps = trainer.total_steps
    assert 1 <= steps < 1000
    q = 32 / len(private)
    # the independent reference agrees: steps fit, steps + 1 do not (to autodp's ~0.1% conversion difference)
    assert autodp_epsilon(sigma=3.0, groups=2, q=q, steps=steps, delta=1e-4) <= 2 * 1.005
    assert autodp_epsilon(sigma=3.0, groups=2, q=q, steps=steps + 1, delta=1e-4) > 2 * 0.995


# Slow tier (#53 item 5): dp-GAN's resume runs quick in tests/methods/test_contract.py::test_resume_equals_an_uninterrupted_run[zhang]
# (same trace, steps, ε and generator, bit for bit; clip groups and adaptive bounds feed the generator's steps).
@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path, small_mnist):
    a, b = tmp_path / "a", tmp_path / "b"
    public, private = split(small_mnist, tiny(a))
    full = ZhangTrainer(tiny(a), private, public=public, mechanism_seed=5)
    full.train()
    first = ZhangTrainer(tiny(b), private, public=public, mechanism_seed=5)
    assert first.train(stop_after=4) is None
    second = ZhangTrainer(tiny(b), private, public=public)
    result = second.train()
    assert result.steps == 8
    for k, v in full.state.G.state_dict().items():
        torch.testing.assert_close(second.state.G.state_dict()[k], v)
    assert second.state.groups == full.state.groups and second.sanitizer.bounds == full.sanitizer.bounds
    assert second.trace == full.trace


def test_the_audit_catches_a_tampered_trace(tmp_path):
    """What dp-GAN's audit invariants checked (rate, folded σ, steps, events present), the plan check covers."""
    cfg = tiny(tmp_path, "privacy.noise_multiplier=2.0", "zhang.grouping=per_layer")
    plan = ZHANG.plan(cfg, 540)
    good = MechanismTrace([plan.event.with_count(8)])
    assert plan.releases == 5 and good == plan.trace and zhang_check(cfg, good, 540)["passed"]

    def passed(trace, n=540):
        return zhang_check(cfg, trace, n)["passed"]

    assert not passed(good, n=1000)  # the trace understates q
    assert not passed(MechanismTrace([plan.event.with_noise(2.0).with_count(8)]))  # σ not folded over the k groups
    assert not passed(MechanismTrace([plan.event.with_count(9)]))  # more steps than configured
    assert not passed(MechanismTrace([plan.event.with_count(7)]))  # fewer than the plan
    assert not passed(MechanismTrace())  # no events
    assert not passed(MechanismTrace([plan.event.with_count(4), plan.event.with_noise(1.0).with_count(4)]))


# --- the pipeline stages ---------------------------------------------------------------------------


def test_pipeline_partition_pretrain_train_audit_sample(tmp_path, small_mnist, stage_ledger):
    from dpsynth.data import write_parquet
    from tests.stages.helpers import manifest, stage

    src = tmp_path / "mnist600.parquet"
    write_parquet(small_mnist, src)
    run = tmp_path / "run"
    zhang = ("train.method=zhang", "data.public_source=sklearn:digits", "zhang.public_batch_size=16",
             "zhang.pretrain_iterations=2", "zhang.num_groups=3", "train.n_d=2", "train.steps=6")
    for name in ("partition", "pretrain", "train", "audit", "sample"):
        assert stage(name, run, str(src), *zhang) == 0, name
    part = manifest(run, "sensitive", "partition")
    public_rows = next(o["rows"] for o in part["outputs"] if o["role"] == "public")
    warm = manifest(run, "sensitive", "pretrain")
    assert [o["role"] for o in warm["outputs"]] == ["pretrain"] and warm["privacy"]["epsilon"] == 0
    assert warm["details"]["public_records"] == public_rows
    train = manifest(run, "sensitive", "train")
    assert train["details"]["steps"] == 6 and train["privacy"]["epsilon"] <= 10
    assert_charged_once(stage_ledger, train)
    assert json.loads((run / "sensitive" / "train" / "result.json").read_text())["details"]["pretrained"]
    audit = manifest(run, "sensitive", "audit")
    assert audit["status"] == "succeeded"
    report = json.loads((run / "sensitive" / "audit" / "audit.json").read_text())
    assert report["decision"] == "passed", report
    assert manifest(run, "release", "sample")["details"]  # the audited generator was released and sampled


def test_mlflow_gets_no_data_dependent_series(tmp_path, small_mnist):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = tiny(tmp_path / "out", "tracking.enabled=true", f"tracking.uri={uri}", "output.log_every=2",
               "privacy.accounting=as_published", "privacy.epsilon=30")
    public, private = split(small_mnist, cfg)
    result = ZhangTrainer(cfg, private, public=public).train()
    run = mlflow.MlflowClient(uri).get_run(result.mlflow_run_id)
    # ε, counts, the fixed mechanism, and G's loss on fresh fakes through the privatized critic: no batch
    # sizes, per-example norms, critic losses on private records, or bounds
    assert set(run.data.metrics) <= {"epsilon", "generator_steps", "g_loss", "noise_multiplier", "sample_rate",
                                     "epsilon_as_published_unsound"}
    assert run.data.metrics["epsilon_as_published_unsound"] == pytest.approx(result.epsilon_as_published_unsound)
    assert run.data.tags["dpsynth.accounting"] == "as_published"
    assert run.data.params["derived.num_groups"] == "3"


def test_pipeline_refuses_a_pretrain_without_public_data(tmp_path, small_mnist, capsys):
    from dpsynth.data import write_parquet
    from tests.stages.helpers import stage

    src = tmp_path / "mnist600.parquet"
    write_parquet(small_mnist, src)
    run = tmp_path / "run"
    assert stage("partition", run, str(src), "train.method=zhang") == 0  # no public data declared
    capsys.readouterr()
    assert stage("pretrain", run, str(src), "train.method=zhang") != 0
    assert "public" in capsys.readouterr().err
    assert not (run / "sensitive" / "pretrain" / "pretrained.pt").exists()
