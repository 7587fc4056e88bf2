"""The mechanism's coins are secret: seeded from OS entropy, never from train.seed, never logged."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth.config import load_config
from dpsynth.mechanisms import randomness
from dpsynth.mechanisms.randomness import MechanismRandomness
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

def tiny(out, *extra):
    return load_config(overrides=[
        f"output.dir={out}", "tracking.enabled=false", "train.d_width=4", "train.g_width=4", "train.latent_dim=8",
        "train.batch_size=32", "train.steps=4", "train.n_d=2", "output.checkpoint_every=0", "output.sample_every=0",
        "output.log_every=0", "privacy.epsilon=50", "privacy.delta=1e-4", "train.seed=0", *extra])


def recording(trainer):
    """Wrap the trainer's mechanism so that every mask and noise draw is recorded (test side)."""
    seen = {"masks": [], "noise": []}
    mech = trainer.state.mechanism
    mask, normal = mech.poisson_mask, mech.standard_normal

    def poisson_mask(*a, **k):
        seen["masks"].append(mask(*a, **k).clone())
        return seen["masks"][-1]

    def standard_normal(*a, **k):
        seen["noise"].append(normal(*a, **k).clone())
        return seen["noise"][-1]

    mech.poisson_mask, mech.standard_normal = poisson_mask, standard_normal
    return seen


@pytest.mark.parametrize("secure", [False, True])
def test_two_dpgan_runs_with_the_same_train_seed_draw_different_noise_and_masks(tmp_path, small_mnist, secure):
    from dpsynth.methods import dpgan
    from dpsynth.methods.dpgan import DPGANTrainer

    runs = []
    for name in "ab":
        t = DPGANTrainer(tiny(tmp_path / name, f"privacy.secure_mode={str(secure).lower()}"), small_mnist)
        g0 = {k: v.clone() for k, v in t.state.G.state_dict().items()}
        latents = t.state.rng.get_state().clone()
        seen = recording(t)
        for _ in range(3):
            dpgan.d_step(t.state, t.draw(), t.sanitizer)
        runs.append((g0, latents, seen))
    (g_a, lat_a, a), (g_b, lat_b, b) = runs
    # train.seed still fixes initialisation and the latent stream ...
    assert all(torch.equal(g_a[k], g_b[k]) for k in g_a) and torch.equal(lat_a, lat_b)
    # ... but not the mechanism: 3 masks of 600 records at q = 32/600, and every noise tensor, differ
    assert len(a["masks"]) == len(b["masks"]) == 3 and len(a["noise"]) == len(b["noise"]) > 0
    assert all(not torch.equal(x, y) for x, y in zip(a["masks"], b["masks"]))
    assert all(not torch.equal(x, y) for x, y in zip(a["noise"], b["noise"]))


def test_gswgan_shard_choice_is_not_a_function_of_train_seed(tmp_path, small_mnist):
    from dpsynth.methods.gswgan import GSWGANTrainer
    from tests.methods.gswgan_helpers import shards_drawn

    shards = [small_mnist.subset(np.arange(k, 600, 4)) for k in range(4)]
    choices = []
    for name in "ab":
        cfg = tiny(tmp_path / name, "partition.num_shards=4", "gswgan.batch_size=8", "gswgan.d_width=4",
                   "gswgan.g_width=4", "gswgan.latent_dim=4", "train.n_d=1", "train.method=gswgan",
                   "privacy.noise_multiplier=4.0")
        t = GSWGANTrainer(cfg, shards)
        with shards_drawn() as loaded:
            for _ in range(24):
                t.train_step()
        choices.append(loaded)
    assert choices[0] != choices[1]  # equal by chance with probability 4^-24


def test_federated_client_choice_and_client_noise_are_secret(tmp_path, small_mnist):
    from dpsynth.methods.gswgan_federated import mechanism_seeds

    a, b = mechanism_seeds(None, 3), mechanism_seeds(None, 3)
    assert a != b and len(set(a[1])) == 3  # fresh per run, and one stream per client


def test_secure_mode_draws_are_standard_normal_and_never_replay():
    r = MechanismRandomness(secure_mode=True, seed=0)
    x = r.standard_normal((200_000,), dtype=torch.float64)
    # 200k draws: sample std within ±1 % and mean within 5 standard errors of N(0, 1)
    assert x.std().item() == pytest.approx(1.0, rel=0.01)
    assert abs(x.mean().item()) < 5 / math.sqrt(x.numel())
    # reseeded from os.urandom before every draw: the same injected seed does not replay
    assert not torch.equal(MechanismRandomness(secure_mode=True, seed=0).standard_normal((8,)),
                           MechanismRandomness(secure_mode=True, seed=0).standard_normal((8,)))
    m = r.poisson_mask(100_000, 0.25)
    assert m.float().mean().item() == pytest.approx(0.25, abs=0.01)


SEED = 5_123_456_789_012_345_678  # < 2**63, what the OS "returned" in the test below


def test_the_noise_seed_reaches_no_mlflow_record_and_no_file_outside_checkpoints(tmp_path, small_mnist,
                                                                                 monkeypatch):
    from mlflow import MlflowClient

    from dpsynth.methods.dpgan import DPGANTrainer

    monkeypatch.setattr(randomness.secrets, "randbits", lambda bits: SEED)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    cfg = tiny(out, "tracking.enabled=true", f"tracking.uri={uri}", "output.log_every=2",
               "output.checkpoint_every=2")
    trainer = DPGANTrainer(cfg, small_mnist)
    assert torch.equal(trainer.state.mechanism.poisson_mask(600, 0.5),  # the patched OS entropy really seeded it
                       torch.rand(600, generator=torch.Generator().manual_seed(SEED)) < 0.5)
    result = trainer.train()
    needles = [str(SEED), f"{SEED:x}", f"{SEED:X}"]

    client = MlflowClient(uri)
    run = client.get_run(result.mlflow_run_id)
    values = [*run.data.params.items(), *run.data.tags.items(), *((k, repr(v)) for k, v in run.data.metrics.items())]
    assert not [(k, v) for k, v in values if any(n in f"{k}={v}" for n in needles)]
    local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts")))
    files = [p for p in local.rglob("*") if p.is_file()]
    files += [p for p in out.rglob("*") if p.is_file() and "checkpoints" not in p.relative_to(out).parts]
    assert files and (out / "config.yaml") in files
    for path in files:
        data = path.read_bytes()
        assert not any(n.encode() in data for n in needles), path
