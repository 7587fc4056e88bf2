"""DP-SGD trainers data-parallel over the ranks of one ``torchrun`` job (the mechanism:
:mod:`dpsynth.privacy.distributed`): DPGAN and dp-GAN (Zhang), the trainers with ``DATA_PARALLEL = True``.

    torchrun --standalone --nproc-per-node 2 -m dpsynth train --config run.yaml

Every rank builds the same trainer (same settings, same data, same ``train.seed``, so the same
initial G and D; :func:`join` refuses a job whose ranks disagree, and hands the trainer's sanitizer
the reducer that forms the job's one noisy sum). Per private step each rank Poisson-samples its part
of the records (:meth:`~dpsynth.privacy.distributed.Ranks.poisson_take`) and clips per example into
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
"""

from __future__ import annotations

from dpsynth.errors import ConfigError
from dpsynth.privacy import distributed
from dpsynth.privacy.distributed import SINGLE, current  # noqa: F401  (the trainer's ranks)

MECHANISM = "mechanism"  # the state key of the trainer's secret coins: never sent to another rank
METHODS = ("dpgan", "zhang")  # the methods that train on several ranks so far (Trainer.DATA_PARALLEL)


def launch(cfg) -> distributed.Ranks:
    """Join the torchrun job (when there is one) for ``dpsynth train`` (with or without ``--run-dir``: the
    stage, :mod:`dpsynth.stages.train`); refuse a method that does not train data-parallel."""
    ranks = distributed.env_ranks()
    if not ranks.distributed:
        return distributed.SINGLE
    if cfg.train.method not in METHODS:
        raise ConfigError(f"train.method: {cfg.train.method!r} trains in one process only; under torchrun "
                          f"(WORLD_SIZE={ranks.world_size}) only {', '.join(METHODS)} runs data-parallel")
    from dpsynth.methods.core import resolve_device

    return distributed.init_process_group(ranks.place(resolve_device(cfg.train.device)))


def shutdown(*, barrier: bool = False) -> None:
    distributed.shutdown(barrier=barrier)


def join(trainer) -> None:
    """A data-parallel trainer's ``__init__``, once its sanitizer is built: the sanitizer forms the job's one
    noisy sum (noise on rank 0, one all-reduce of the clipped sums), and every rank checks that all ranks hold
    the same settings, n and plan. A no-op in one process."""
    trainer.sanitizer.reducer = trainer.dist.reducer()
    trainer.dist.agree("the run's settings, records and plan", (trainer.cfg.fingerprint(), trainer.n,
                                                                trainer.total_steps))


def sync_state(trainer) -> None:
    """Every rank takes rank 0's state (models, optimizers, latent RNGs, n_D schedule, trace), all but its
    secret coins: each rank keeps its own. A no-op in one process."""
    if not trainer.dist.distributed:
        return
    import torch.distributed as dist

    box = [{k: v for k, v in trainer.state_dict().items() if k != MECHANISM} if trainer.dist.is_main else None]
    dist.broadcast_object_list(box, src=0)
    if not trainer.dist.is_main:
        trainer.load_state_dict({**box[0], MECHANISM: trainer.mechanism.state_dict()})


def follow(trainer, *, stop_after: int | None = None) -> None:
    """A rank other than 0: the trainer's loop, step for step with rank 0's (the same collectives in the
    same order), writing nothing."""
    if trainer.dist.is_main:
        raise RuntimeError("follow: rank 0 runs the trainer's own loop")
    cfg = trainer.cfg
    sync_state(trainer)  # rank 0's, after it resumed its checkpoint (if any)
    if cfg.warmup.central_images and trainer.trace.steps == 0:
        sync_state(trainer)  # rank 0 ran the private warm-up: its G, latent RNG and trace
    while trainer.step < trainer.total_steps:  # dpsynth.methods.loop.train's loop, without its writes
        if stop_after is not None and trainer.step >= stop_after:
            return None
        if not trainer.can_step():
            break
        trainer.train_step()
    return None
