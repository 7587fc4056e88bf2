"""DP trainers over the ranks of one ``torchrun`` job (the mechanism: :mod:`dpsynth.distributed.ranks`):
DPGAN and dp-GAN (Zhang) data-parallel, GS-WGAN and DPAC with their shards spread over the ranks — the methods
whose trainer says ``DATA_PARALLEL`` (their ``Method.data_parallel``).

    torchrun --standalone --nproc-per-node 2 -m dpsynth train --config run.yaml

Every rank builds the same trainer (same settings, same data, same ``train.seed``, so the same
initial G and D; :func:`join` refuses a job whose ranks disagree, and hands the trainer's sanitizer
the reducer that forms the job's one noisy sum). Per private step each rank Poisson-samples its part
of the records (:meth:`~dpsynth.distributed.ranks.Ranks.poisson_take`) and clips per example into
its sums — DPGAN adds its contiguous share of the B fakes (every rank draws all B from the shared
latent stream and keeps its share, so the logical batch is exactly one process's); dp-GAN's units
bring their own fakes, drawn from each rank's secret coins, and its k clip groups (the same on every
rank: chosen from public data and the shared models) are reduced group by group — then rank 0 adds
the noise (σ·C, or σ·c_j per group) and one all-reduce sums every rank's sums. Every rank applies
the same Adam update to D and then the same non-private generator step, so the models stay equal
without being sent.

Rank 0 is the job as the rest of dpsynth sees it: it alone holds the ledger attempt, the MLflow
run, the trace, the checkpoints and the artifacts. The other ranks (:func:`follow`) write nothing:
they receive rank 0's state after it resumed a checkpoint and after the private warm-up (which
rank 0 runs alone on the full data) — everything but rank 0's secret coins, which never leave it —
so a checkpoint written by N ranks resumes on M.

GS-WGAN / DPAC (their state's :data:`SPREAD` fields): rank r holds the contiguous block ``part(K)`` of the K shards and only
their discriminators and Adam states. Rank 0 draws the shard k from its secret coins and sends it; the rank
holding k runs the critic steps (and DPAC's classifier) and hands the shared latent and batch streams on; the B
per-sample gradients w.r.t. the fakes are clipped there, rank 0 adds the noise σC, and one all-reduce gives
every rank the release (the owner's clipped rows + rank 0's noise + zeros), so every rank takes the same
generator step. A checkpoint gathers every rank's discriminators to rank 0 (:func:`checkpoint_state`): the
file is one process's, and a resume scatters them to the ranks now holding them (:func:`sync_state`).
"""

from __future__ import annotations

import dataclasses

import torch

from dpsynth import termination
from dpsynth.errors import ConfigError
from dpsynth.distributed import ranks as distributed
from dpsynth.distributed.ranks import SINGLE, current  # noqa: F401  (the trainer's ranks)

MECHANISM = "mechanism"  # the state key of the trainer's secret coins: never sent to another rank
# metadata of a method's state field spread over the ranks: a dict {shard index: state}, each rank holding its own
# indices' (GS-WGAN: the discriminators and their Adam states); a checkpoint gathers them
SPREAD = {"spread": True}


def ranks(data_parallel: bool) -> distributed.Ranks:
    """A trainer's ranks: rank r of W when its method trains data-parallel (``Trainer.DATA_PARALLEL``) under
    torchrun; else 0 of 1 (a process group of another kind, e.g. the federated server's, is not a data-parallel job)."""
    return current() if data_parallel else SINGLE


def spread_fields(state) -> tuple[str, ...]:
    """The :data:`SPREAD` fields of a method's state dataclass."""
    return tuple(f.name for f in dataclasses.fields(state) if f.metadata.get("spread"))


def launch(cfg, methods: tuple[str, ...], device: torch.device, *, sharded: bool = False) -> distributed.Ranks:
    """Join the torchrun job (when there is one) for ``dpsynth train`` (with or without ``--run-dir``: the
    stage, :mod:`dpsynth.stages.train`); refuse a method that does not train data-parallel (not one of ``methods``,
    the registry's :func:`~dpsynth.methods.registry.data_parallel_methods`). ``device``: the run's (``train.device``
    resolved); ``sharded``: the method trains on the partition's shards (its registry entry's pre-training is "shard")."""
    ranks = distributed.env_ranks()
    if not ranks.distributed:
        return distributed.SINGLE
    if cfg.train.method not in methods:
        raise ConfigError(f"train.method: {cfg.train.method!r} trains in one process only; under torchrun "
                          f"(WORLD_SIZE={ranks.world_size}) only {', '.join(methods)} runs data-parallel")
    if sharded and cfg.warmup.central_images:
        raise ConfigError(f"warmup.central_images: {cfg.train.method}'s private warm-up reads every shard, and under "
                          f"torchrun (WORLD_SIZE={ranks.world_size}) each rank holds only its own; turn it off or "
                          "train in one process")
    return distributed.init_process_group(ranks.place(device))


def shutdown(*, barrier: bool = False) -> None:
    distributed.shutdown(barrier=barrier)


def join(trainer) -> None:
    """The wrapper, applied once by the loop (:func:`dpsynth.training.loop.train`) before anything else: the
    trainer's sanitizer forms the job's one noisy sum (noise on rank 0, one all-reduce of the clipped sums), and
    every rank checks that all ranks hold the same settings, n and plan. A no-op in one process."""
    if not trainer.dist.distributed:
        return
    trainer.sanitizer.reducer = trainer.dist.reducer()
    trainer.dist.agree("the run's settings, records and plan", (trainer.cfg.fingerprint(), trainer.n,
                                                                trainer.total_steps))


def spread(ranks: distributed.Ranks, shards: list, *, num_shards: int, device) -> tuple[range, list]:
    """The shards this rank holds (GS-WGAN, DPAC), the contiguous block ``part(K)`` of the K (all
    of them in one process), and every shard's (images, labels) on ``device``: None for those another rank holds.
    ``shards``: the K = ``partition.num_shards`` shards, ``None`` for those another rank holds."""
    K = len(shards)
    if K != num_shards:
        raise ConfigError(f"partition.num_shards: {num_shards}, but {K} shards were given")
    if K < ranks.world_size:
        raise ConfigError(f"partition.num_shards: {K} shards cannot be spread over {ranks.world_size} "
                          "ranks (every rank holds at least one); use more shards or fewer ranks")
    own = range(*ranks.part(K))
    if any(shards[k] is None for k in own):
        raise ConfigError(f"shards: this rank holds shards {own.start}..{own.stop - 1}, which were not given")
    return own, [tuple(t.to(device) for t in shards[k].to_tensors()) if k in own else None for k in range(K)]


def every_record(own: range, shards: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The union of the shards (images, labels), for the private warm-up; refused on a rank holding only some
    (refused before the job starts, :func:`launch`)."""
    if len(own) != len(shards):
        raise ConfigError("warmup.central_images: the private warm-up reads every shard; this rank holds "
                          f"{len(own)} of {len(shards)}")
    return torch.cat([x for x, _ in shards]), torch.cat([y for _, y in shards])


def hand_on(ranks: distributed.Ranks, owner: int, streams: list[torch.Generator], module: torch.nn.Module) -> None:
    """Every rank takes what rank ``owner`` (the holder of this step's shard) changed of the shared state: the
    public ``streams`` its steps drew from and ``module``'s buffers (e.g. G's spectral norms' power-iteration
    vectors, which its forward passes updated). A no-op in one process."""
    if not ranks.distributed:
        return
    with torch.no_grad():
        states, buffers = ranks.from_rank(owner, ([s.get_state() for s in streams],
                                                  {n: b.cpu() for n, b in module.named_buffers()}))
        for stream, state in zip(streams, states):
            stream.set_state(state)
        for name, b in module.named_buffers():
            b.copy_(buffers[name])


def sync_state(trainer) -> None:
    """Every rank takes rank 0's state (models, optimizers, latent RNGs, n_D schedule, trace), all but its
    secret coins: each rank keeps its own. The state's :data:`SPREAD` fields are not broadcast: rank 0 hands each
    rank the entries of that rank's indices it holds (all of them after resuming a checkpoint, none else) and
    keeps only its own. A no-op in one process."""
    if not trainer.dist.distributed:
        return
    import torch.distributed as dist

    ranks, own, spread = trainer.dist, trainer.state, spread_fields(trainer.state)
    state = trainer.state_dict() if ranks.is_main else {}
    box = [{k: v for k, v in state.items() if k != MECHANISM and k not in spread} if ranks.is_main else None]
    dist.broadcast_object_list(box, src=0)
    if not ranks.is_main:
        trainer.load_state_dict({**box[0], MECHANISM: own.mechanism.state_dict(),
                                 **{key: getattr(own, key) for key in spread}})
    for key in spread:
        held = getattr(own, key)
        parts = ([{i: v for i, v in held.items() if ranks.owner(i, trainer.K) == r} for r in range(ranks.world_size)]
                 if ranks.is_main else None)
        mine = [None]
        dist.scatter_object_list(mine, parts, src=0)
        setattr(own, key, mine[0] if ranks.is_main else {**held, **mine[0]})


def checkpoint_state(trainer) -> dict | None:
    """Rank 0's checkpoint: the trainer's state, with every rank's :data:`SPREAD` entries gathered to rank 0,
    so the file is one process's and resumes on any number of ranks. With spread state every rank calls it at
    the same step (a collective); None on the other ranks."""
    ranks, spread = trainer.dist, spread_fields(trainer.state)
    if not (ranks.distributed and spread):
        return trainer.state_dict() if ranks.is_main else None
    import torch.distributed as dist

    gathered = [None] * ranks.world_size if ranks.is_main else None
    dist.gather_object({key: getattr(trainer.state, key) for key in spread}, gathered, dst=0)
    if not ranks.is_main:
        return None
    state = trainer.state_dict()
    for key in spread:
        state[key] = {i: v for part in gathered for i, v in part[key].items()}
    return state


def stop_requested(trainer) -> bool:
    """Whether the job stops after this step: a SIGTERM has come to any of its ranks
    (:func:`dpsynth.termination.requested` on each, one MAX all-reduce), so that every rank stops, and rank 0
    checkpoints, after the same step. A rank that got none takes the stop as its own
    (:func:`dpsynth.termination.request`). Each rank checking only its own flag left one rank waiting in a
    collective for another that had gone (status 1). One process: its own flag."""
    stop = termination.requested()
    if not trainer.dist.distributed:
        return stop
    import torch.distributed as dist

    flag = torch.tensor([int(stop)], device=trainer.device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() and not stop:
        termination.request()
    return bool(flag.item())


def follow(trainer, *, stop_after: int | None = None) -> None:
    """A rank other than 0: the trainer's loop, step for step with rank 0's (the same collectives in the
    same order), writing nothing; a SIGTERM ends it after the step every rank agrees on (:func:`stop_requested`)."""
    if trainer.dist.is_main:
        raise RuntimeError("follow: rank 0 runs the trainer's own loop")
    o = trainer.cfg.output
    sync_state(trainer)  # rank 0's, after it resumed its checkpoint (if any)
    if trainer.cfg.warmup.central_images and trainer.trace.steps == 0:
        sync_state(trainer)  # rank 0 ran the private warm-up: its G, latent RNG and trace
        if o.checkpoint_every:
            checkpoint_state(trainer)  # rank 0 checkpoints the warm-up (spread state: gathered)
    with termination.deferred():  # dpsynth.training.loop.train's loop, without its writes
        while trainer.step < trainer.total_steps:
            if stop_after is not None and trainer.step >= stop_after:
                return None
            if not trainer.can_step():
                break
            trainer.train_step()
            if o.checkpoint_every and trainer.step % o.checkpoint_every == 0:
                checkpoint_state(trainer)
            if stop_requested(trainer):  # raised when the block ends, after rank 0's checkpoint of this step
                if o.checkpoint_every and trainer.step % o.checkpoint_every:
                    checkpoint_state(trainer)
                break
    return None
