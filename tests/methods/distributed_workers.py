"""The ranks of tests/distributed/test_distributed.py: module-level functions (a fork server starts them),
each a rank of a gloo job on CPU. Workers write what the test compares to files under the test's tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from dpsynth.distributed import data_parallel


# The modules a rank uses, imported once per test process by the fork server that forks the ranks: a spawned
# rank is a fresh interpreter that imports torch, dpsynth and MLflow (most of a small job's time, several seconds
# of CPU per rank); a forked one starts from the server's imports and nothing else (no test's state: the server
# forked from nothing but a fresh interpreter that imported these).
PRELOAD = [
    __name__, "tests.methods.gswgan_helpers", "dpsynth.config", "dpsynth.data", "dpsynth.methods.dpgan",
    "dpsynth.methods.zhang", "dpsynth.methods.gswgan", "dpsynth.methods.dpac", "dpsynth.methods.federated_processes",
    "dpsynth.cli", "dpsynth.stages.train", "dpsynth.runner.run", "mlflow", "mlflow.store.db.utils",
    "tests.mlflow_template",
    "torch._dynamo",  # what torch.optim imports on a process's first optimizer: about 1 CPU-second, once per rank
    # imported by a rank on first use (the accountants import Opacus lazily, MLflow its SQL store on a first run):
    # each a fresh import in every forked rank otherwise (Opacus alone 2.75 CPU-s)
    "opacus", "mlflow.store.tracking.sqlalchemy_store", "pyarrow.dataset", "git", "tests.conftest",
]


def _start(world: int, store: str, fn, args, *, join: bool = True):
    """``fn(rank, *args)`` on ``world`` new processes of one gloo group, forked by the fork server; each rank gets
    this process's environment as it is now (the server's is the one it started with). ``join``: wait for them
    (an exception in a rank raised here); else their ``torch.multiprocessing`` context."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts (the first call), ignored after
    return mp.start_processes(_entry, args=(world, store, dict(os.environ), fn, args), nprocs=world, join=join,
                              start_method="forkserver")


def run_ranks(world: int, tmp: Path, fn, *args) -> None:
    """Run ``fn(rank, *args)`` on ``world`` new ranks of one gloo process group (a file store in ``tmp``)."""
    store = Path(tmp) / f"pg-{fn.__name__}-{os.getpid()}-{len(list(Path(tmp).glob('pg-*')))}"
    _start(world, str(store), fn, args)


def start_ranks(world: int, tmp: Path, fn, *args) -> Forked:
    """:func:`run_ranks` without waiting for the ranks."""
    store = Path(tmp) / f"pg-{fn.__name__}-{os.getpid()}-{len(list(Path(tmp).glob('pg-*')))}"
    return Forked(_start(world, str(store), fn, args, join=False).processes)


def start_process(fn, *args) -> Forked:
    """``fn(*args)`` in one new process forked by the fork server, in no process group: a command that must run in
    a process of its own (to be killed, say), without a fresh interpreter's imports."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(PRELOAD)
    process = multiprocessing.get_context("forkserver").Process(target=_alone, args=(dict(os.environ), fn, args))
    process.start()
    return Forked([process])


class Forked:
    """Processes the fork server started, as one job with ``subprocess.Popen``'s ``pid`` (the first one's),
    ``poll``, ``send_signal``, ``kill`` and ``wait``: it has failed once one of them has (as a torchrun job has),
    succeeded once all have."""

    def __init__(self, processes: list):
        self.processes, self.pid = processes, processes[0].pid

    def poll(self) -> int | None:
        codes = [p.exitcode for p in self.processes]
        return next((c for c in codes if c not in (0, None)), None if None in codes else 0)

    def send_signal(self, signum: int) -> None:
        for p in self.processes:
            if p.exitcode is None:
                os.kill(p.pid, signum)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def wait(self) -> int | None:
        for p in self.processes:
            p.join()
        return self.poll()


def run_ranks_many(world: int, tmp: Path, jobs: list) -> None:
    """``run_ranks`` for several ``(fn, *args)`` on the same ranks, one after the other in the same process group."""
    store = Path(tmp) / f"pg-many-{os.getpid()}-{len(list(Path(tmp).glob('pg-*')))}"
    _start(world, str(store), _in_turn, (jobs,))


def _in_turn(rank: int, jobs: list) -> None:
    for fn, *args in jobs:
        fn(rank, *args)
        dist.barrier()


def _alone(environ: dict, fn, args) -> None:
    os.environ.clear()
    os.environ.update(environ, OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from tests import mlflow_template

    mlflow_template.install()
    fn(*args)


def _entry(rank: int, world: int, store: str, environ: dict, fn, args) -> None:
    os.environ.clear()
    os.environ.update(environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from tests import mlflow_template

    mlflow_template.install()  # a rank's new MLflow store: the test process's migrated schema (its environment)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        fn(rank, *args)
    finally:
        if dist.is_initialized():  # `dpsynth train` (cli_rank) leaves the group itself
            dist.destroy_process_group()


def mnist600():
    import numpy as np

    from dpsynth.data import import_source
    from tests.conftest import MNIST

    return import_source(str(MNIST)).subset(np.arange(600))


def tiny(out, *extra):
    from dpsynth.config import load_config

    return load_config(overrides=[
        f"output.dir={out}", "tracking.enabled=false", "train.d_width=4", "train.g_width=4",
        "train.latent_dim=8", "train.batch_size=32", "train.steps=8", "train.n_d=2",
        "output.checkpoint_every=2", "output.sample_every=0", "output.log_every=0", "privacy.epsilon=50",
        "privacy.delta=1e-4", "partition.key=dpsynth-partition-v1", "data.num_classes=10", *extra])


def record_takes(trainer) -> list[list[int]]:
    """Wrap the trainer's Poisson masks: each step's sampled records as global indices (appended)."""
    takes: list[list[int]] = []
    draw = trainer.state.mechanism.poisson_mask
    lo, _ = trainer.dist.part(trainer.n)

    def recorded(n, rate):
        mask = draw(n, rate)
        takes.append((mask.nonzero().squeeze(1) + lo).tolist())
        return mask

    trainer.state.mechanism.poisson_mask = recorded
    return takes


def noiseless(trainer) -> None:
    """The test seam: clipped sums only — a noiseless sanitizer that records nothing (with the run's event
    it would refuse to release σ = 0)."""
    s = trainer.sanitizer
    s.noise_multiplier, s.trace, s.event = 0.0, None, None


def steps_without_noise(rank: int, tmp: str, steps: int) -> None:
    """(a) ``steps`` discriminator steps (and the generator steps between them) with the noise off."""
    from dpsynth.methods.dpgan import DPGANTrainer

    t = DPGANTrainer(tiny(Path(tmp) / f"out{rank}"), mnist600(), mechanism_seed=11)
    data_parallel.join(t)  # what the loop does first: steps are taken here without it
    noiseless(t)
    takes = record_takes(t)
    for _ in range(steps):
        t.train_step()
    torch.save({"takes": takes, "D": t.state.D.state_dict(), "G": t.state.G.state_dict()}, Path(tmp) / f"rank{rank}.pt")


def noise_draws(rank: int, tmp: str, sigma: float, bound: float, draws: int, seed: int) -> None:
    """(b) ``draws`` logical steps of an empty batch: every rank's privatized gradient is the job's noise."""
    from dpsynth.distributed.ranks import current
    from dpsynth.mechanisms.dpsgd import GradientSanitizer
    from dpsynth.mechanisms.randomness import MechanismRandomness

    torch.manual_seed(0)
    layer = torch.nn.Linear(40, 25)
    ranks = current()
    sanitizer = GradientSanitizer(list(layer.parameters()), max_grad_norm=bound, noise_multiplier=sigma,
                                  expected_batch_size=1.0, randomness=MechanismRandomness(seed=ranks.mechanism_seed(seed)))
    sanitizer.reducer = ranks.reducer()
    out = []
    for _ in range(draws):
        sanitizer.finalize()
        out.append(torch.cat([p.grad.reshape(-1) for p in layer.parameters()]))
    torch.save({"noise": torch.stack(out), "bytes": sanitizer.reducer.bytes_per_step}, Path(tmp) / f"noise{rank}.pt")


def train_in_own_dirs(rank: int, tmp: str) -> None:
    """(c) a whole run, warm-up, checkpoints, grids and MLflow included; rank r is given output.dir out<r>
    and its own MLflow store, so anything a rank other than 0 writes would show."""
    from dpsynth.methods.dpgan import DPGANTrainer

    tmp = Path(tmp)
    cfg = tiny(tmp / f"out{rank}", "output.sample_every=4", "output.log_every=2", "tracking.enabled=true",
               f"tracking.uri=sqlite:///{tmp}/mlflow{rank}.db", "warmup.central_images=true", "warmup.steps=3")
    t = DPGANTrainer(cfg, mnist600())
    result = t.train()
    torch.save({"result": result, "D": t.state.D.state_dict(), "G": t.state.G.state_dict(), "trace": t.trace.to_dict()},
               tmp / f"final{rank}.pt")


def train_shared_dir(rank: int, tmp: str, stop_after) -> None:
    """(d) ranks training in one output.dir (resuming the checkpoint there), to the end or ``stop_after``."""
    from dpsynth.methods.dpgan import DPGANTrainer

    tmp = Path(tmp)
    t = DPGANTrainer(tiny(tmp / "out"), mnist600())
    t.train(stop_after=stop_after)
    torch.save({"D": t.state.D.state_dict(), "G": t.state.G.state_dict(), "trace": t.trace.to_dict(), "step": t.step,
                "mechanism": t.state.mechanism.state_dict()}, tmp / f"shared{rank}.pt")


# --- dp-GAN (Zhang): the same, with parameter groups and per-unit fakes ------------------------------------
def zhang_tiny(out, *extra):
    """A tiny dp-GAN run: 10 % of the 600 records public (the partition's keyed split), clip groups by clustering
    with adaptive bounds from the public records (both recomputed every step)."""
    from dpsynth.config import load_config

    return load_config(overrides=[
        f"output.dir={out}", "tracking.enabled=false", "train.method=zhang", "train.d_width=4", "train.g_width=4",
        "train.latent_dim=8", "train.batch_size=32", "train.steps=8", "data.heldout_fraction=0",
        "data.public_fraction=0.1", "data.public_fraction_unprotected=true", "zhang.public_batch_size=16",
        "zhang.num_groups=3", "train.n_d=2", "output.checkpoint_every=4", "output.sample_every=0",
        "output.log_every=0", "privacy.epsilon=50", "privacy.delta=1e-4",
        "partition.key=dpsynth-partition-v1", "data.num_classes=10", *extra])


def zhang_data(cfg):
    """(public, private) records of mnist600 under ``cfg``'s public split."""
    from dpsynth.data.assignment import public_mask

    ds = mnist600()
    mask = public_mask(ds, cfg)
    return ds.subset(mask), ds.subset(~mask)


def record_units(trainer) -> tuple[list, list]:
    """Wrap the trainer's unit coins: each step's latents and interpolation weights (appended). With the noise
    off, the latents are the only standard normal draws of a step."""
    latents, rhos = [], []
    normal, uniform = trainer.state.mechanism.standard_normal, trainer.state.mechanism.uniform

    def recorded_normal(shape, **kw):
        out = normal(shape, **kw)
        latents.append(out)
        return out

    def recorded_uniform(shape):
        out = uniform(shape)
        rhos.append(out)
        return out

    trainer.state.mechanism.standard_normal, trainer.state.mechanism.uniform = recorded_normal, recorded_uniform
    return latents, rhos


def zhang_steps_without_noise(rank: int, tmp: str, steps: int, mode: str) -> None:
    """(a) ``steps`` critic steps (and the generator steps between them), noise off, groups from public data."""
    from dpsynth.methods.zhang import ZhangTrainer

    cfg = zhang_tiny(Path(tmp) / f"out{rank}", f"train.grad_sample_mode={mode}")
    public, private = zhang_data(cfg)
    t = ZhangTrainer(cfg, private, public=public, mechanism_seed=11)
    data_parallel.join(t)  # what the loop does first: steps are taken here without it
    noiseless(t)
    takes = record_takes(t)
    latents, rhos = record_units(t)
    for _ in range(steps):
        t.train_step()
    torch.save({"takes": takes, "latents": latents, "rhos": rhos, "D": t.state.D.state_dict(), "G": t.state.G.state_dict(),
                "groups": t.state.groups, "bounds": t.sanitizer.bounds, "g_steps": t.g_steps},
               Path(tmp) / f"zrank{rank}.pt")


def zhang_noise(rank: int, tmp: str, draws: int, seed: int) -> None:
    """(b) ``draws`` critic steps on empty batches (every rank samples no record): each step's privatized
    gradient is the job's noise; D does not move (its optimizer step is replaced by a capture)."""
    from dpsynth.methods.zhang import ZhangTrainer

    cfg = zhang_tiny(Path(tmp) / f"out{rank}", "zhang.grouping=weight_bias", "privacy.noise_multiplier=2.0")
    public, private = zhang_data(cfg)
    t = ZhangTrainer(cfg, private, public=public, mechanism_seed=seed)
    data_parallel.join(t)  # what the loop does first: steps are taken here without it
    t.state.mechanism.poisson_mask = lambda n, rate: torch.zeros(n, dtype=torch.bool)
    captured = []
    t.state.opt_d.step = lambda: captured.append({"grads": [p.grad.clone() for p in t.state.D.parameters()],
                                            "bounds": list(t.sanitizer.bounds)})
    for _ in range(draws):
        t.train_step()
    names = [n for n, _ in t.state.D.named_parameters()]
    torch.save({"captured": captured, "names": names, "groups": t.state.groups, "sigma": t.plan.noise_multiplier,
                "latent_dim": t.state.G.latent_dim, "bytes": t.sanitizer.reducer.bytes_per_step},
               Path(tmp) / f"znoise{rank}.pt")


def zhang_train_shared_dir(rank: int, tmp: str, stop_after) -> None:
    """(d) ranks training dp-GAN in one output.dir (resuming the checkpoint there), to the end or ``stop_after``."""
    from dpsynth.methods.zhang import ZhangTrainer

    tmp = Path(tmp)
    cfg = zhang_tiny(tmp / "out", "zhang.grouping=weight_bias", "privacy.noise_multiplier=3.0")
    public, private = zhang_data(cfg)
    t = ZhangTrainer(cfg, private, public=public)
    t.train(stop_after=stop_after)
    torch.save({"D": t.state.D.state_dict(), "G": t.state.G.state_dict(), "trace": t.trace.to_dict(), "step": t.step,
                "bounds": t.sanitizer.bounds, "mechanism": t.state.mechanism.state_dict()}, tmp / f"zshared{rank}.pt")


# --- the pipeline's train stage on 2 ranks (tests/distributed/test_train_torchrun.py) ---------------------------
def train_stage(rank: int, tmp: str, run_dirs: list[str], overrides: list[str]) -> None:
    """Rank 0 runs the train stage in ``run_dirs[0]`` (its MLflow store and ledger under ``tmp``); rank 1
    follows it from ``run_dirs[1]``, a copy of the same upstream outputs, with an MLflow store and a ledger of
    its own, so anything rank 1 wrote (files, runs, ledger rows) would show."""
    from dpsynth.config import load_config
    from dpsynth.runner import run as pipeline
    from dpsynth.stages import train
    from dpsynth.stages.protocol import StageContext

    cfg = load_config(overrides=[*overrides, "tracking.enabled=true", f"tracking.uri=sqlite:///{tmp}/mlflow{rank}.db",
                                 f"ledger.url=sqlite:///{tmp}/ledger{rank}.db"])
    ctx = StageContext.create(cfg, run_dir=run_dirs[rank], pipeline_run_id="torchrun-stage")
    if rank == 0:
        outcome = pipeline.run_stage(ctx, "train")
        Path(tmp, "outcome.json").write_text(json.dumps({"status": outcome.status, "manifest": outcome.manifest}))
    else:
        train.follow(ctx)


# --- GS-WGAN / DPAC: the K shards and their discriminators spread over the ranks ----------------------------
def gswgan_tiny(out, *extra):
    """A tiny GS-WGAN run on 3 shards (2 ranks: rank 0 holds shard 0, rank 1 shards 1 and 2)."""
    from tests.methods.gswgan_helpers import tiny as gswgan_config

    return gswgan_config(out, "output.checkpoint_every=2", "train.steps=8", *extra)


def gswgan_shards():
    """mnist600 cut into 3 contiguous shards of 200 records."""
    import numpy as np

    ds = mnist600()
    return [ds.subset(np.arange(200 * k, 200 * (k + 1))) for k in range(3)]


def gswgan_steps(rank: int, tmp: str, method: str, steps: int) -> None:
    """(a, b) ``steps`` iterations with the noise off, then ``steps`` with it on (mechanism seed fixed: rank 0's
    stream is one process's): the generator's gradient at each step (a linear function of the release), the
    shards drawn, the models and this rank's discriminators. The test's own process runs it as the one-process
    reference (rank 0 of 1)."""
    from dpsynth.methods import registry
    from tests.methods.gswgan_helpers import shards_drawn

    out = {}
    for noise in (False, True):
        cfg = gswgan_tiny(Path(tmp) / f"out{rank}-{noise}", f"train.method={method}")
        t = registry.get(method).trainer(cfg, gswgan_shards(), mechanism_seed=12)
        data_parallel.join(t)  # what the loop does first: steps are taken here without it
        if not noise:
            noiseless(t)
        grads = []
        step = t.state.opt_g.step
        t.state.opt_g.step = lambda: (grads.append([p.grad.clone() for p in t.state.G.parameters()]), step())
        with shards_drawn() as drawn:  # by the rank holding the drawn shard only
            for _ in range(steps):
                t.train_step()
        out[noise] = {"grads": grads, "drawn": drawn, "G": t.state.G.state_dict(), "G_ema": t.state.G_ema.state_dict(),
                      "d_states": t.state.d_states, "opt_states": t.state.opt_states, "own": list(t.own),
                      "trace": t.trace.to_dict(), "bytes": t.sanitizer.reducer.bytes_per_step if t.sanitizer.reducer else 0}
    torch.save(out, Path(tmp) / f"gsteps{rank}.pt")


def gswgan_train_shared_dir(rank: int, tmp: str, method: str, stop_after) -> None:
    """(d) ranks training GS-WGAN / DPAC in one output.dir (resuming the checkpoint there); mechanism seed
    fixed so that the run can be compared with an uninterrupted one."""
    from dpsynth.methods import registry

    tmp = Path(tmp)
    cfg = gswgan_tiny(tmp / "out", f"train.method={method}")
    t = registry.get(method).trainer(cfg, gswgan_shards(), mechanism_seed=12)
    t.train(stop_after=stop_after)
    torch.save({"G": t.state.G.state_dict(), "G_ema": t.state.G_ema.state_dict(), "trace": t.trace.to_dict(), "step": t.step,
                "d_states": t.state.d_states, "own": list(t.own)}, tmp / f"gshared{rank}.pt")


def gswgan_train_stage(rank: int, tmp: str, run_dirs: list[str], overrides: list[str]) -> None:
    """:func:`train_stage` for GS-WGAN, each rank recording which shard files and pre-trained discriminators it
    read (``reads<rank>.json``)."""
    from dpsynth import storage
    from dpsynth.stages import train

    reads = []
    read_parquet, read_bytes = train.read_parquet, storage.read_bytes
    train.read_parquet = lambda uri, *a, **k: (reads.append(str(uri)), read_parquet(uri, *a, **k))[1]
    storage.read_bytes = lambda uri, *a, **k: (reads.append(str(uri)), read_bytes(uri, *a, **k))[1]
    try:
        train_stage(rank, tmp, run_dirs, overrides)
    finally:
        train.read_parquet, storage.read_bytes = read_parquet, read_bytes
        Path(tmp, f"reads{rank}.json").write_text(json.dumps(reads))


def stopped_on_one_rank(rank: int, tmp: str, signalled: int, at_step: int) -> None:
    """Rank ``signalled`` alone gets SIGTERM right after its step ``at_step`` (what a rank whose pod is stopped first
    sees); every rank runs the one loop and records how it ended and at which step (``stop<rank>.json``)."""
    import signal

    from dpsynth import termination
    from dpsynth.methods.dpgan import DPGANTrainer
    from dpsynth.training import loop

    termination.install()
    t = DPGANTrainer(tiny(Path(tmp) / "out", "train.steps=12", "output.checkpoint_every=5"), mnist600(),
                     mechanism_seed=11)
    step = t.train_step

    def train_step():
        step()
        if rank == signalled and t.step == at_step:
            os.kill(os.getpid(), signal.SIGTERM)

    t.train_step = train_step
    try:
        loop.train(t)
        how = "finished"
    except termination.Terminated as e:
        how = f"terminated {e.code}"
    except Exception as e:  # noqa: BLE001 - what the test reports
        how = f"failed: {type(e).__name__}: {str(e)[:200]}"
    (Path(tmp) / f"stop{rank}.json").write_text(json.dumps({"how": how, "step": t.step}))


# --- `dpsynth train` itself on each rank: what `torchrun -m dpsynth train ...` runs, forked ------------------
def cli_rank(rank: int, tmp: str, argv: list[str], log: str | None = None) -> None:
    """``dpsynth.cli.main(argv)`` as rank ``rank`` of the job (torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK;
    the process group already joined, as :func:`dpsynth.distributed.ranks.init_process_group` finds it); this
    rank's stdout, stderr and exit code in ``cli<rank>.out``, ``.err``, ``.code`` under ``tmp``. With ``log``:
    stdout and stderr appended to that file (a node's log: every rank's output, as under torchrun), and the exit
    code is this process's."""
    import sys

    from dpsynth.cli import main

    tmp = Path(tmp)
    for stream, fd, suffix in ((sys.stdout, 1, "out"), (sys.stderr, 2, "err")):
        stream.flush()
        path, flags = (log, os.O_APPEND) if log else (tmp / f"cli{rank}.{suffix}", os.O_TRUNC)
        target = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
        os.dup2(target, fd)  # this process's own descriptors: a forked rank's, not the test's
        os.close(target)
    try:
        code = main([str(a) for a in argv])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    (tmp / f"cli{rank}.code").write_text(str(code))
    if log and code:
        raise SystemExit(code)


def cli_ranks(world: int, tmp: Path, argv: list[str]) -> list[tuple[int, str, str]]:
    """``dpsynth ARGV`` on ``world`` forked ranks of one job: each rank's (exit code, stdout, stderr)."""
    run_ranks(world, tmp, cli_rank, str(tmp), [str(a) for a in argv])
    tmp = Path(tmp)
    return [(int((tmp / f"cli{r}.code").read_text()), (tmp / f"cli{r}.out").read_text(),
             (tmp / f"cli{r}.err").read_text()) for r in range(world)]
