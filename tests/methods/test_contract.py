"""The contract every registered method keeps, checked for each entry of the registry.

A method added to :data:`dpsynth.methods.registry.METHODS` gets these checks with no new test code:
its trainer is built as the train stage builds it (``Trainer(cfg, data, **inputs)``, the inputs of its
pre-training kind, see :mod:`dpsynth.methods.registry`; the federated GS-WGAN's server as rank 0 of its K + 1
ranks, started by ``tests.methods.gswgan_helpers.run_federated``) on a tiny configuration, and

* the trace it writes is the registry's plan (``Method.mechanism.plan(cfg, n).trace``), and its ε ≤ the target;
* with a fixed noise multiplier and a budget that allows only 4 steps, it stops after 4 (``stopped_by="budget"``);
* an interrupted run resumed from its checkpoint is the uninterrupted run (same trace, same generator) —
  or, for a method whose ``train()`` takes no ``stop_after``, it refuses to start over a checkpoint,
  naming ``output.resume``;
* its generator file round-trips through :func:`dpsynth.training.artifacts.load_generator`: the loaded
  model gives the trained generator's outputs for the same z and y;
* its MLflow run holds only the keys it declares (``Trainer.MLFLOW_KEYS``), and no dataset hash, image or
  model; the run's artifacts live under ``tracking.artifact_location``.

The per-method modules keep what is particular to a paper (sanitizers against brute force, ε against
an independent accountant, shard isolation, the federated protocol).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth import tracking
from dpsynth.config import load_config
from dpsynth.errors import PrivacyError
from dpsynth.methods import registry
from dpsynth.training.artifacts import load_generator
from dpsynth.privacy import MechanismTrace
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")

METHODS = list(registry.METHODS)
K = 3  # shards (clients) of the shard-pre-trained methods
# One tiny configuration for every method: each reads its own sections and ignores the others.
# Steps: D steps (dpgan, zhang: 2 per G step) or G iterations (gswgan family) or rounds (Private Evolution: 6, so that
# a run stopped after 3 resumes for 3 more, each round over 20 candidate figures per class); a checkpoint every 3.
TINY = (
    "tracking.enabled=false", "train.steps=6", "privacy.epsilon=50", "privacy.delta=1e-4",
    "output.log_every=0", "output.sample_every=0", "output.checkpoint_every=3",
    "train.d_width=4", "train.g_width=4", "train.latent_dim=8", "train.batch_size=32", "train.n_d=2",
    f"partition.num_shards={K}", "gswgan.d_width=4", "gswgan.g_width=4", "gswgan.latent_dim=8",
    "gswgan.batch_size=16", "gswgan.pretrain_iterations=2",
    "dpac.c_width=4", "dpac.n_f=2", "dpac.n_r=2", "dpac.start_iteration=2",
    "data.heldout_fraction=0", "data.public_fraction=0.1", "data.public_fraction_unprotected=true",
    "zhang.public_batch_size=16", "zhang.pretrain_iterations=2", "zhang.num_groups=3",
    "evolution.rounds=6", "evolution.candidates=20",
    "partition.key=dpsynth-partition-v1", "data.num_classes=10",  # no defaults: the demo's public key, MNIST's
)


def tiny(out: Path, name: str, *extra: str):
    return load_config(overrides=[f"output.dir={out}", f"train.method={name}", *TINY, *extra])


def resumable(method: registry.Method) -> bool:
    """Whether the method's ``train()`` can stop part-way (``stop_after``) and resume from its checkpoint."""
    return "stop_after" in inspect.signature(method.trainer.train).parameters


@pytest.fixture(scope="module")
def inputs(small_mnist, tmp_path_factory):
    """name → (data, trainer inputs, n): what the train stage would hand the method's trainer, built
    with the method's own pre-training (on 600 MNIST records; shards and the public split as the
    partition stage draws them)."""
    from dpsynth.methods.networks import load_pretrained
    from dpsynth.stages.partition import assign, public_mask

    built = {}
    for name in METHODS:
        method = registry.get(name)
        cfg = tiny(tmp_path_factory.mktemp(f"warm-{name}"), name)
        out = Path(cfg.output.dir)
        if method.pretrain == "none":
            built[name] = (small_mnist, {}, len(small_mnist))
        elif method.pretrain == "shard":
            where = assign(small_mnist.record_ids, key="test", heldout_fraction=0.0, num_shards=K)
            shards = [small_mnist.subset(np.flatnonzero(where == k)) for k in range(K)]
            warm = {}
            for k, shard in enumerate(shards):
                method.pretrain_function(cfg, shard, shard_index=k, out_path=str(out / f"d{k}.pt"))
                warm[k] = (out / f"d{k}.pt").read_bytes()
            built[name] = (shards, {"warm": warm}, len(small_mnist))
        else:  # "public"
            mask = public_mask(small_mnist, cfg)
            public, private = small_mnist.subset(mask), small_mnist.subset(~mask)
            method.pretrain_function(cfg, public, out_path=str(out / "warm.pt"))
            state = load_pretrained((out / "warm.pt").read_bytes())
            built[name] = (private, {"public": public, "pretrained_state": state}, len(private))
    return built


def train(name, cfg, inputs, *, stop_after: int | None = None, **kwargs):
    data, method_inputs, _ = inputs[name]
    if name == "gswgan_federated":  # its trainer is rank 0 (the server, given n) of a job of K + 1 ranks
        from tests.methods.gswgan_helpers import run_federated

        return run_federated(cfg, data, stop_after=stop_after, **method_inputs, **kwargs)
    trainer = registry.get(name).trainer(cfg, data, **method_inputs, **kwargs)
    return trainer.train() if stop_after is None else trainer.train(stop_after=stop_after)


def trace_of(result) -> MechanismTrace:
    return MechanismTrace.from_json(Path(result.trace_path).read_text())


@pytest.fixture(scope="module")
def tracked(inputs, tmp_path_factory):
    """name → (config, result, MLflow client) of one tiny run per method, MLflow on, each in its own experiment
    (an artifact location belongs to the experiment) with its own artifact location."""
    from mlflow import MlflowClient

    runs = {}
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"  # one store: its schema is built once
    for name in METHODS:
        root = tmp_path_factory.mktemp(f"tracked-{name}")
        location = (root / "artifact-store").as_uri()
        cfg = tiny(root / "out", name, "tracking.enabled=true", f"tracking.uri={uri}",
                   f"tracking.experiment=contract-{name}",
                   f"tracking.artifact_location={location}", "output.log_every=2", "output.sample_every=4")
        runs[name] = (cfg, train(name, cfg, inputs), MlflowClient(uri))
    return runs


@pytest.mark.parametrize("name", METHODS)
def test_the_trace_is_the_plan_and_within_the_target(name, tracked, inputs):
    cfg, result, _ = tracked[name]
    plan = registry.get(name).mechanism.plan(cfg, inputs[name][2])
    trace = trace_of(result)
    assert trace == plan.trace
    assert trace.steps == plan.steps + sum(e.count for e in plan.prefix) and result.stopped_by == "steps"
    assert result.epsilon == pytest.approx(plan.guard.accountant.epsilon(trace, delta=cfg.privacy.delta), rel=1e-9)
    assert result.epsilon <= cfg.privacy.epsilon


# a multi-process method starts K + 1 ranks per run (forked, see distributed_workers.py): one such run (``tracked``)
# in the quick suite
SPAWNING = [pytest.param(n, marks=pytest.mark.slow) if n == "gswgan_federated" else n for n in METHODS]


@pytest.mark.parametrize("name", SPAWNING)
def test_training_stops_before_the_budget(name, inputs, tmp_path):
    """σ fixed; ε set between the ε of 4 and of 5 steps; train.steps far beyond: the run takes 4 steps."""
    n = inputs[name][2]
    fixed = ("privacy.noise_multiplier=2.0", "train.steps=100000", "output.checkpoint_every=0")
    plan = registry.get(name).mechanism.plan(tiny(tmp_path, name, *fixed), n)
    accountant, delta = plan.guard.accountant, 1e-4

    def epsilon(steps: int) -> float:
        return accountant.epsilon(MechanismTrace([*plan.prefix, plan.event.with_count(steps)]), delta=delta)

    target = (epsilon(4) + epsilon(5)) / 2
    cfg = tiny(tmp_path / "out", name, *fixed, f"privacy.epsilon={target!r}")
    try:
        registry.get(name).mechanism.plan(cfg, n)
    except PrivacyError:  # a plan that must run whole (Private Evolution: its rounds' schedule of variation steps):
        # a budget that funds 4 of its steps is refused, by the trainer too, before anything is trained or written
        with pytest.raises(PrivacyError, match="privacy.noise_multiplier"):
            train(name, cfg, inputs)
        assert not list((tmp_path / "out").glob("**/trace.json")) and not list((tmp_path / "out").glob("**/result.json"))
        return
    result = train(name, cfg, inputs)
    trace = trace_of(result)
    assert trace == MechanismTrace([*plan.prefix, plan.event.with_count(4)])
    assert result.stopped_by == "budget" and result.steps == 4
    assert result.epsilon <= target and accountant.epsilon(trace, delta=delta) <= target


@pytest.mark.parametrize("name", SPAWNING)
def test_resume_equals_an_uninterrupted_run(name, inputs, tmp_path):
    from dpsynth.errors import ConfigError

    method = registry.get(name)
    split = tiny(tmp_path / "split", name)
    if not resumable(method):  # it documents that it cannot resume: it refuses to start over a checkpoint
        checkpoints = tmp_path / "split" / "checkpoints"
        checkpoints.mkdir(parents=True)
        (checkpoints / "last.pt").write_bytes(b"an earlier attempt's checkpoint")
        with pytest.raises(ConfigError, match="output.resume"):
            train(name, split, inputs)
        assert not (tmp_path / "split" / "result.json").exists() and not (tmp_path / "split" / "trace.json").exists()
        return
    full = train(name, tiny(tmp_path / "full", name), inputs, mechanism_seed=5)
    assert train(name, split, inputs, mechanism_seed=5, stop_after=3) is None
    assert (tmp_path / "split" / "checkpoints").is_dir() and not (tmp_path / "split" / "trace.json").exists()
    resumed = train(name, split, inputs)  # no seed: the mechanism's coins continue from the checkpoint
    assert Path(resumed.trace_path).read_text() == Path(full.trace_path).read_text()
    assert (resumed.steps, resumed.generator_steps, resumed.epsilon) == (full.steps, full.generator_steps, full.epsilon)
    a, b = (torch.load(r.generator_path, weights_only=True)["state_dict"] for r in (full, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", METHODS)
def test_the_generator_file_round_trips(name, tracked):
    cfg, result, _ = tracked[name]
    saved = torch.load(result.generator_path, weights_only=True)
    generator, privacy = load_generator(result.generator_path)
    assert privacy["epsilon"] == result.epsilon and privacy["trace_steps"] == trace_of(result).steps
    # the state the trainer saved, byte for byte, in a model of the class the file names
    assert type(generator).__module__ + "." + type(generator).__name__ == saved["model"]["class"]
    state = generator.state_dict()
    assert state.keys() == saved["state_dict"].keys() and all(torch.equal(state[k], saved["state_dict"][k])
                                                              for k in state)
    # same z, y → same images: the loaded generator against a second load (fresh module, same file)
    again, _ = load_generator(result.generator_path)
    labels = torch.arange(20) % generator.num_classes
    x1, y1 = generator.sample(20, labels=labels, generator=torch.Generator().manual_seed(3))
    x2, y2 = again.sample(20, labels=labels, generator=torch.Generator().manual_seed(3))
    assert torch.equal(x1, x2) and torch.equal(y1, labels) and torch.equal(y2, labels)
    assert x1.shape[0] == 20 and x1.abs().max() <= 1 and x1.std() > 0


@pytest.mark.parametrize("name", METHODS)
def test_mlflow_gets_only_declared_keys_under_the_artifact_location(name, tracked, small_mnist):
    cfg, result, client = tracked[name]
    run = client.get_run(result.mlflow_run_id)
    declared = registry.get(name).trainer.MLFLOW_KEYS
    assert declared.undeclared(metrics=run.data.metrics, params=run.data.params) == []
    assert run.data.tags[tracking.TAG_METHOD] == name and run.data.tags[tracking.TAG_STAGE] == "train"
    assert run.info.artifact_uri.startswith(cfg.tracking.artifact_location)  # tracking.artifact_location honoured
    # nothing before the gate: no dataset hash, image or model on the train run
    assert "dpsynth.dataset_sha256" not in run.data.tags and tracking.TAG_DATASET_VERSION not in run.data.tags
    assert small_mnist.content_sha256() not in json.dumps([run.data.tags, run.data.params])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts <= {"config.yaml", "privacy"}
    assert not any(a.path.endswith((".png", ".pt", ".parquet")) for a in client.list_artifacts(run.info.run_id))


def test_no_trainer_records_a_private_step_by_hand():
    """Each release records its own event (the sanitizers, DP-SGD's and GS-WGAN's, through their one contract; the
    warm-up's central images), so a trainer cannot add noise without accounting for it. The federated server, whose clients
    sanitize in their own processes, records through its mechanism's Receipts: the folded event once an iteration's
    n_dis·B releases are in."""
    import ast

    from dpsynth import methods

    def records(tree) -> int:
        return sum(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record"
                   for node in ast.walk(tree))

    recorders = []
    for path in Path(methods.__path__[0]).glob("*.py"):
        module = ast.parse(path.read_text())
        classes = [n for n in ast.walk(module) if isinstance(n, ast.ClassDef)]
        recorders += [f"{path.stem}.{cls.name}" for cls in classes for _ in range(records(cls))]
        recorders += [path.stem] * (records(module) - sum(records(cls) for cls in classes))  # outside any class
    assert recorders == []
    # the sanitizers (DP-SGD's and GS-WGAN's) record through their one contract, RecordedRelease._record
    from dpsynth.mechanisms import dpsgd, generator_gradient

    tree = ast.parse(Path(generator_gradient.__file__).read_text())
    assert [c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and records(c)] == ["Receipts"]

    tree = ast.parse(Path(dpsgd.__file__).read_text())
    assert [f"{c.name}" for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and records(c)] == ["RecordedRelease"]
