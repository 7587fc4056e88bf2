"""Federated GS-WGAN: clients answer with sanitized gradients only, every round's release is accounted,
and the multi-process run (server and clients in their own processes, gloo on loopback) is the
in-process reference, byte for byte, moving exactly the bytes its protocol describes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth import storage
from dpsynth.data import ImageDataset, import_source, write_parquet
from dpsynth.errors import ConfigError
from dpsynth.mechanisms.generator_gradient import FEDERATED, GSWGAN
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.methods.gswgan_federated import (
    Client,
    client_update,
    FederatedGSWGANTrainer,
    FederatedServer,
)
from dpsynth.models.gswgan_networks import Discriminator
from dpsynth.privacy import MechanismTrace, gswgan_event
from dpsynth.stages.audit import mechanism_check
from dpsynth.stages.partition import assign
from tests.jobs import descendants, kill_at_checkpoint
from tests.ledger_fixtures import assert_charged_once
from tests.methods.gswgan_helpers import K, MNIST, record_owner, run_federated, tiny, warm_files, watch_inputs
from tests.privacy.test_without_replacement import autodp_mechanism_epsilon
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")

B, N_DIS, IMAGE = 16, 2, 1 * 28 * 28  # tiny(): gswgan.batch_size, train.n_d (n_dis); MNIST is 1×28×28


def test_all_n_dis_rounds_of_releases_are_folded(tmp_path, shards):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=16.0", "train.n_d=4")  # B = 16: 64 releases per iteration
    result = FederatedGSWGANTrainer(cfg, shards).train()
    (event,) = json.loads(Path(result.trace_path).read_text())["events"]
    assert event["noise_multiplier"] == pytest.approx(16.0 / 8) and event["count"] == 6
    assert event["sample_rate"] == pytest.approx(1 / K) and event["sensitivity"] == "replace_one"
    assert result.epsilon == pytest.approx(autodp_mechanism_epsilon([(1 / K, 2.0, 6)], delta=1e-4), rel=1e-3)
    with pytest.raises(ConfigError, match="privacy.accounting"):
        FederatedGSWGANTrainer(tiny(tmp_path, "privacy.noise_multiplier=1.0", "privacy.accounting=as_published"),
                               shards)


def test_client_returns_clipped_noised_gradients_of_its_own_critic(tmp_path, shards):
    cfg = tiny(tmp_path, "privacy.max_grad_norm=0.001")
    images, labels = (t for t in shards[2].to_tensors())
    torch.manual_seed(0)
    D = Discriminator(num_classes=10, width=4)
    client = Client(D=D, opt=torch.optim.Adam(D.parameters()), images=images, labels=labels,
                    data_rng=torch.Generator().manual_seed(0), rng=torch.Generator().manual_seed(1),
                    randomness=MechanismRandomness(device=images.device, secure_mode=False))
    fakes, y = torch.rand(16, 1, 28, 28) * 2 - 1, torch.arange(16) % 10
    owner = record_owner(shards)
    seen, handle = watch_inputs((Discriminator,))
    try:
        clipped = client_update(client, fakes, y, cfg=cfg, noise_multiplier=0.0)
    finally:
        handle.remove()
    assert {owner[r.numpy().tobytes()] for _, x in seen for r in x if r.numpy().tobytes() in owner} == {2}
    assert clipped.flatten(1).norm(dim=1).max() <= 0.001 * (1 + 1e-5)
    D.eval()  # the gradient the client clipped is its updated critic's, w.r.t. the fakes it was sent
    x = fakes.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(-D(x, y).sum(), x)
    direction = grad.flatten(1) / grad.flatten(1).norm(dim=1, keepdim=True)
    torch.testing.assert_close(clipped.flatten(1), 0.001 * direction, rtol=1e-4, atol=1e-9)
    noisy = client_update(client, fakes, y, cfg=cfg, noise_multiplier=50.0)
    assert noisy.std().item() == pytest.approx(50 * 0.001, rel=0.1)


# --- the server and two clients as the ranks of one gloo job ------------------------------------


@pytest.fixture(scope="module")
def two_shards() -> list[ImageDataset]:
    ds = import_source(str(MNIST)).subset(np.arange(400))
    where = assign(ds.record_ids, key="test", heldout_fraction=0.0, num_shards=2)
    return [ds.subset(np.flatnonzero(where == k)) for k in range(2)]


TWO = ("partition.num_shards=2", "privacy.noise_multiplier=8.0")  # the two-client runs' settings


@pytest.fixture(scope="module")
def two_warm(two_shards, tmp_path_factory) -> dict[int, bytes]:
    """Each client's pre-trained D_k (the bytes of its file), read-only."""
    tmp = tmp_path_factory.mktemp("two-warm")
    return warm_files(tiny(tmp, *TWO), two_shards, tmp)


@pytest.fixture(scope="module")
def reference(two_shards, two_warm, tmp_path_factory):
    """The in-process reference's uninterrupted run (mechanism seed 5), which every run on ranks must equal."""
    return FederatedGSWGANTrainer(tiny(tmp_path_factory.mktemp("reference"), *TWO), two_shards, warm=two_warm,
                                  mechanism_seed=5).train()


def test_the_ranks_are_the_in_process_reference_and_move_the_protocol_bytes(tmp_path, two_shards, two_warm,
                                                                           reference):
    overrides, warm = TWO, two_warm
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the server logs to MLflow
    result = dataclasses.asdict(run_federated(
        tiny(tmp_path / "ranks", *overrides, "tracking.enabled=true", f"tracking.uri={uri}"), two_shards, warm=warm,
        mechanism_seed=5))

    got = torch.load(result["generator_path"], weights_only=True)
    want = torch.load(reference.generator_path, weights_only=True)
    assert got["state_dict"].keys() == want["state_dict"].keys()
    for name, tensor in want["state_dict"].items():
        assert torch.equal(got["state_dict"][name], tensor), name
    assert Path(result["trace_path"]).read_text() == Path(reference.trace_path).read_text()

    (event,) = json.loads(Path(result["trace_path"]).read_text())["events"]
    assert event["count"] == 6 and event["sample_rate"] == pytest.approx(1 / 2)
    assert event["noise_multiplier"] == pytest.approx(8.0 / (N_DIS * B) ** 0.5)  # n_dis·B = 32 releases folded
    assert result["epsilon"] == pytest.approx(autodp_mechanism_epsilon([(1 / 2, 8.0 / 32 ** 0.5, 6)], delta=1e-4),
                                              rel=1e-3)

    # per round: control int64[1], fakes float32[B,1,28,28], labels int64[B] out; float32[B,1,28,28] back
    to_clients, from_clients = N_DIS * (8 + B * IMAGE * 4 + B * 8), N_DIS * B * IMAGE * 4
    assert (to_clients, from_clients) == (100624, 100352)
    fed = result["details"]
    assert fed["transport"] == "torch.distributed/gloo"
    assert fed["bytes_per_iteration_to_clients"] == to_clients
    assert fed["bytes_per_iteration_from_clients"] == from_clients
    assert fed["bytes_per_iteration"] == to_clients + from_clients and fed["bytes_at_stop"] == 2 * 8

    recorded = json.loads(Path(tmp_path / "ranks" / "result.json").read_text())
    assert recorded == result and recorded["details"]["privacy_unit"] == "client" and recorded["details"]["clients"] == 2
    assert recorded["details"]["delta_below_one_over_clients"] is True  # δ = 1e-4 < 1/2
    assert got["privacy"]["unit"].startswith("client") and got["privacy"]["clients"] == 2

    from mlflow import MlflowClient

    run = MlflowClient(uri).get_run(result["mlflow_run_id"])
    assert run.data.params["derived.privacy_unit"] == "client" and run.data.params["derived.clients"] == "2"
    assert run.data.params["derived.bytes_per_iteration"] == str(to_clients + from_clients)
    assert run.data.metrics["bytes_per_iteration_to_clients"] == to_clients
    assert run.data.metrics["bytes_per_iteration_from_clients"] == from_clients
    assert FederatedServer.MLFLOW_KEYS.undeclared(metrics=run.data.metrics, params=run.data.params) == []


def test_the_ranks_resume_clients_and_all_as_the_reference_does(tmp_path, two_shards, two_warm, reference):
    """Stopped after 3 iterations (checkpoints at 2: the server's, and each client's own D_k, optimizer, RNGs and
    noise coins), resumed on fresh ranks (fresh coins, then the checkpoints'): the uninterrupted reference run,
    bit for bit, and the same bytes per iteration."""
    overrides, warm, full = TWO, two_warm, reference
    cfg = tiny(tmp_path / "split", *overrides, "output.checkpoint_every=2")
    assert run_federated(cfg, two_shards, warm=warm, mechanism_seed=5, stop_after=3) is None
    clients = tmp_path / "split" / "checkpoints" / "clients"
    assert sorted(p.name for p in clients.iterdir()) == ["client-0-4.pt", "client-1-4.pt"]  # round 4 = step 2
    (clients / "client-0-100.pt").write_bytes(b"left by an earlier, longer run")  # removed at the next save
    resumed = run_federated(cfg, two_shards, warm=warm)
    assert Path(resumed.trace_path).read_text() == Path(full.trace_path).read_text()
    a, b = (torch.load(r.generator_path, weights_only=True)["state_dict"] for r in (full, resumed))
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert resumed.details["bytes_per_iteration"] == 100624 + 100352  # the counts resume with the step
    assert sorted(p.name for p in clients.iterdir()) == [  # each client keeps its last two: rounds 8 and 12
        "client-0-12.pt", "client-0-8.pt", "client-1-12.pt", "client-1-8.pt"]


def test_the_reference_resumes_clients_and_all(tmp_path, two_shards, two_warm, reference):
    full = reference
    cfg = tiny(tmp_path / "split", *TWO, "output.checkpoint_every=2")
    assert FederatedGSWGANTrainer(cfg, two_shards, warm=two_warm, mechanism_seed=5).train(stop_after=3) is None
    resumed = FederatedGSWGANTrainer(cfg, two_shards, warm=two_warm).train()
    assert Path(resumed.trace_path).read_text() == Path(full.trace_path).read_text()
    a, b = (torch.load(r.generator_path, weights_only=True)["state_dict"] for r in (full, resumed))
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_job_of_another_size_than_k_plus_one_is_refused(monkeypatch, tmp_path, two_shards):
    from dpsynth.distributed.federation import launch
    from dpsynth.methods.federated_processes import FederatedProcesses

    cfg = tiny(tmp_path, "partition.num_shards=2", method="gswgan_federated")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"^partition.num_shards: .*3 ranks.*WORLD_SIZE=2 \(--nproc-per-node\)"):
        launch(cfg)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(TypeError, match="never the data"):  # the server is given n, never a shard
        FederatedProcesses(cfg, two_shards)
    with pytest.raises(ConfigError, match="^train.method: .*rank 0 of a torchrun job"):
        FederatedProcesses(cfg, 400)


def test_audit_checks_the_folded_event_at_rate_one_over_k(tmp_path, shards):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=4.0", method="gswgan_federated")
    folded = MechanismTrace()
    folded.record(gswgan_event(noise_multiplier=4.0, batch_size=N_DIS * B, num_shards=K), count=6)
    assert mechanism_check(cfg, folded, n=600)["passed"]
    centralized = MechanismTrace()  # GS-WGAN's σ/√B: the other n_dis − 1 rounds' releases left out
    centralized.record(gswgan_event(noise_multiplier=4.0, batch_size=B, num_shards=K), count=6)
    assert centralized == GSWGAN.events(cfg, 600)  # what GS-WGAN's plan would pass
    assert not mechanism_check(cfg, centralized, n=600)["passed"]
    too_long = MechanismTrace()
    too_long.record(gswgan_event(noise_multiplier=4.0, batch_size=N_DIS * B, num_shards=K), count=7)
    assert not mechanism_check(cfg, too_long, n=600)["passed"]
    calibrated = tiny(tmp_path, method="gswgan_federated")  # σ calibrated to ε = 50 on the folded event
    reference = FederatedGSWGANTrainer(tiny(tmp_path, method="gswgan_federated"), shards).plan.event
    trace = MechanismTrace()
    trace.record(reference, count=6)
    assert mechanism_check(calibrated, trace, n=600)["passed"]


# --- through the stages -------------------------------------------------------------------------


# The quick tier runs the train stage's federated job on forked ranks (the reads test below: a fresh interpreter per
# rank costs seconds of CPU) and runs torchrun itself once, on a job that fails (a client's error); this test, the
# stage starting a torchrun job that succeeds (rank 0's outcome read back from its stdout), is in the slow tier with
# the other whole torchrun jobs below.
@pytest.mark.slow
def test_stages_partition_pretrain_train_audit(pretrained, stage_ledger):
    from tests.stages.helpers import stage

    run, source = pretrained()  # partition and pretrain (each exited 0), as they left the run directory
    assert stage("train", run, str(source), *FEDERATED_STAGE) == 0
    assert_trained_and_audited(run, source, stage_ledger)


def assert_trained_and_audited(run, source, stage_ledger) -> None:
    """What partition, pretrain and the federated train stage left in ``run`` (2 clients, 4 iterations on 3 ranks,
    charged once); then the audit stage, which passes it by the federated plan and statement."""
    from tests.stages.helpers import manifest, stage

    warm = manifest(run, "sensitive", "pretrain")
    assert sorted(o["shard"] for o in warm["outputs"] if o["role"] == "discriminator") == [0, 1]
    trained = manifest(run, "sensitive", "train")
    assert trained["status"] == "succeeded"
    assert trained["details"]["method"] == "gswgan_federated" and trained["details"]["steps"] == 4
    assert trained["details"]["ranks"] == 3  # the server and 2 clients: the job's ranks
    assert all(e["sample_rate"] == pytest.approx(1 / 2) for e in trained["privacy"]["events"])
    result = json.loads(storage.read_bytes([o["uri"] for o in trained["outputs"] if o["role"] == "result"][0]))
    assert result["details"]["privacy_unit"] == "client"
    assert_charged_once(stage_ledger, trained)
    assert result["details"]["bytes_per_iteration"] == 2 * (8 + 2 * 16 * 784 * 4 + 16 * 8)
    assert stage("audit", run, str(source), *FEDERATED_STAGE) == 0
    audit = manifest(run, "sensitive", "audit")
    report = json.loads(storage.read_bytes([o["uri"] for o in audit["outputs"] if o["uri"].endswith(".json")][0]))
    assert [c["name"] for c in report["checks"] if not c["passed"]] == []
    assert {c["name"] for c in report["checks"]} >= {"plan", "accounting"}  # the trace is the federated plan …
    assert any(a.startswith("Against the server") for a in report["statement"]["assumptions"])  # … and statement


FEDERATED_STAGE = ("train.method=gswgan_federated", "partition.num_shards=2", "gswgan.d_width=4", "gswgan.g_width=4",
                   "gswgan.latent_dim=8", "gswgan.batch_size=16", "train.n_d=2", "gswgan.pretrain_iterations=2",
                   "train.steps=4", "privacy.epsilon=50")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """Partition and pretrain (2 clients, tiny) run once for the module, in a ledger of their own (neither charges);
    each call puts a fresh copy of that run directory in place: returns (run directory, source)."""
    from tests.stages.helpers import pristine_run

    source = tmp_path_factory.mktemp("federated-source") / "mnist400.parquet"
    write_parquet(import_source(str(MNIST)).subset(np.arange(400)), source)
    restore = pristine_run(tmp_path_factory, str(source), "partition", "pretrain", overrides=FEDERATED_STAGE)
    return lambda: (restore(), source)


def _stage_run_dir(pretrained, *extra):
    """A run directory after partition and pretrain; the train stage's settings (``extra`` last), as --set values."""
    from tests.stages.helpers import TINY

    run, source = pretrained()
    return run, (f"data.uri={source}", *TINY, *FEDERATED_STAGE, *extra)


def test_the_stage_server_reads_no_shard_and_each_client_only_its_own(tmp_path, pretrained, stage_ledger):
    """The train stage on the job's 3 ranks (rank 0 train.run, ranks 1 and 2 train.follow, as torchrun runs
    `dpsynth train --run-dir`): the server opens no shard and no warm D_k, not even to hash it; client k opens
    shard k and D_k only; the stage trains (one charge) with the details of 3 ranks, and the audit stage passes it."""
    from tests.methods.distributed_workers import run_ranks
    from tests.methods.gswgan_helpers import stage_rank_reads
    from tests.stages.helpers import manifest

    run, overrides = _stage_run_dir(pretrained, "output.checkpoint_every=2")
    shard_files = [str(Path(o["uri"]).resolve()) for o in manifest(run, "sensitive", "partition")["outputs"]
                   if o["role"] == "shard"]
    warm = {int(o["shard"]): str(Path(o["uri"]).resolve()) for o in manifest(run, "sensitive", "pretrain")["outputs"]
            if o["role"] == "discriminator"}
    assert len(shard_files) == 2 and sorted(warm) == [0, 1]
    run_ranks(3, tmp_path, stage_rank_reads, str(run), overrides, str(tmp_path))
    opened = [set(json.loads((tmp_path / f"rank{r}.json").read_text())) for r in range(3)]
    private = set(shard_files) | set(warm.values())
    assert opened[0] & private == set()
    for k in (0, 1):
        assert opened[k + 1] & private == {shard_files[k], warm[k]}
    source = overrides[0].removeprefix("data.uri=")  # _stage_run_dir's first setting
    assert_trained_and_audited(run, source, stage_ledger)


def test_a_failing_client_fails_the_job_with_its_error_and_nothing_is_released(pretrained, stage_ledger, capfd):
    """Client 1's warm D_k altered after the pretrain: client 1 (rank 2) refuses it; torchrun stops the job
    and `dpsynth train --run-dir` (which started it; here in this process, the job's ranks in their own) exits
    non-zero with the client's error; the train stage wrote no outputs and the release zone is empty."""
    from tests.stages.helpers import dpsynth, manifest, release_files

    run, overrides = _stage_run_dir(pretrained)
    (d_1,) = [o["uri"] for o in manifest(run, "sensitive", "pretrain")["outputs"]
              if o["role"] == "discriminator" and int(o["shard"]) == 1]
    Path(d_1).write_bytes(b"not a discriminator")
    capfd.readouterr()
    code = dpsynth("train", "--run-dir", run, *[a for o in overrides for a in ("--set", o)])
    stderr = capfd.readouterr().err  # this process's and the job's (torchrun's ranks write to the same stderr)
    assert code == 2, stderr[-3000:]
    assert f"{d_1}: its sha256" in stderr and "differs from the one its manifest records" in stderr  # client 1's own error
    assert "federated job (server and 2 clients under torchrun) failed" in stderr
    train_dir = run / "sensitive" / "train"
    assert not (train_dir / "manifest.json").exists() and not (train_dir / "result.json").exists()
    assert not (train_dir / "generator.pt").exists() and release_files(run) == []
    (attempt,) = stage_ledger.history("mnist600")  # rank 0's one attempt; no private step was taken
    assert attempt["epsilon_spent"] is None and attempt["steps"] == 0


@pytest.mark.slow
def test_a_job_killed_after_a_checkpoint_resumes_and_finishes_the_trace(pretrained, stage_ledger):
    """`dpsynth train --run-dir` (which starts the 3-rank torchrun job) SIGKILLed with all its processes after the
    first checkpoint; run again, the job resumes the server's and each client's checkpoint and finishes: one
    event of 60 iterations, the ε of an independent account; the killed attempt, then one that adopted it."""
    import os
    import subprocess
    import sys

    from tests.stages.helpers import manifest

    run, overrides = _stage_run_dir(pretrained, "train.steps=60", "output.checkpoint_every=5")
    argv = [sys.executable, "-m", "dpsynth", "train", "--run-dir", str(run), *[a for o in overrides for a in ("--set", o)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ckpt = run / "sensitive" / "train" / "checkpoints" / "last.pt"
    kill_at_checkpoint(argv, ckpt, env=env, timeout_s=240)
    step_at_kill = torch.load(ckpt, weights_only=False)["step"]
    assert 0 < step_at_kill < 60 and not (run / "sensitive" / "train" / "result.json").exists()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    trained = manifest(run, "sensitive", "train")
    (event,) = trained["privacy"]["events"]
    assert trained["details"]["steps"] == 60 and event["count"] == 60 and trained["details"]["ranks"] == 3
    assert trained["privacy"]["epsilon"] == pytest.approx(
        autodp_mechanism_epsilon([(1 / 2, event["noise_multiplier"], 60)], delta=1e-4), rel=1e-3)
    killed, resumed = stage_ledger.history("mnist600")  # the killed job's attempt, then the resumption
    assert killed["status"] == "committed" and killed["epsilon_spent"] == killed["epsilon_reserved"]
    assert resumed["status"] == "committed" and resumed["resumes_id"] == killed["id"]


@pytest.mark.slow
def test_a_stopped_stage_stops_its_torchrun_job(pretrained, stage_ledger):
    """SIGTERM (a task's time limit) to the one-process `dpsynth train --run-dir` while its job trains: it stops
    torchrun, which stops the ranks; no process of the job is left running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run, overrides = _stage_run_dir(pretrained, "train.steps=100000", "output.checkpoint_every=5",
                                    "privacy.noise_multiplier=50", "privacy.epsilon=1000")
    argv = [sys.executable, "-m", "dpsynth", "train", "--run-dir", str(run), *[a for o in overrides for a in ("--set", o)]]
    job = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    ckpt = run / "sensitive" / "train" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 240
    while not ckpt.exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
    assert ckpt.exists(), "no checkpoint appeared"
    processes = descendants(job.pid)
    assert len(processes) >= 4  # torchrun's agent and the 3 ranks
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=120) != 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in processes):
        time.sleep(0.2)
    assert [pid for pid in processes if Path(f"/proc/{pid}").exists()] == []


def test_the_method_is_wired_into_config_stages_and_airflow():
    from typing import get_args, get_type_hints

    from dpsynth.config import TrainConfig
    from dpsynth.methods import registry

    assert "gswgan_federated" in get_args(get_type_hints(TrainConfig)["method"])
    fed, central = registry.get("gswgan_federated"), registry.get("gswgan")
    assert fed.sections == ("gswgan",) and fed.pretrain == "shard"
    assert fed.pretrain_function is central.pretrain_function  # each client warms its own D_k as GS-WGAN does
    assert fed.mechanism is FEDERATED and central.mechanism is GSWGAN
    # the Airflow form offers what the registry knows, through the exported config schema
    path = Path(__file__).resolve().parents[2] / "pipelines" / "airflow" / "dags" / "dpsynth_config.schema.json"
    schema = json.loads(path.read_text())
    assert set(schema["$defs"]["TrainConfig"]["properties"]["method"]["enum"]) == {*registry.METHODS, "auto"}


def test_the_server_records_one_event_per_iteration_of_received_releases():
    from dpsynth.errors import PrivacyError
    from dpsynth.mechanisms.generator_gradient import Receipts

    trace = MechanismTrace()
    event = gswgan_event(noise_multiplier=2.0, batch_size=2 * 4, num_shards=3)
    receipts = Receipts(trace, event, releases=2 * 4)  # n_dis = 2 rounds of B = 4
    for iteration in range(1, 3):
        for _ in range(2):
            receipts.received(torch.zeros(4, 1, 2, 2))
        assert trace.steps == iteration - 1
        receipts.end_iteration()
        assert trace == MechanismTrace([event.with_count(iteration)])
    receipts.received(torch.zeros(4, 1, 2, 2))  # one round short: refused, nothing recorded
    with pytest.raises(PrivacyError, match="4 sanitized releases"):
        receipts.end_iteration()
    assert trace.steps == 2
