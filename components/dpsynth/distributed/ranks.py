"""One DP-SGD mechanism spread over the ranks of a ``torch.distributed`` job (``torchrun``).

It holds :class:`Ranks` (each rank's part of the records and its Poisson mask) and :class:`NoiseOnRankZero`
(the noise drawn once, on rank 0, before one SUM all-reduce). Why the privacy semantics are exactly one
process's, and why the noise is rank 0's alone: docs/privacy.md, "One DP-SGD mechanism over many ranks".
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch

from dpsynth.errors import ConfigError

# the variables torchrun (torch.distributed.elastic) sets for every worker
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job: rank ``rank`` of ``world_size`` (one process: 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that draws the noise and writes the trace, checkpoints and artifacts."""
        return self.rank == 0

    def part(self, n: int) -> tuple[int, int]:
        """This rank's contiguous share ``[lo, hi)`` of ``range(n)`` (sizes differ by at most one)."""
        return self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size

    def poisson_take(self, randomness, n: int, rate: float) -> torch.Tensor:
        """This rank's part of one Poisson-sampled logical batch of ``range(n)``: each record of its part
        independently with probability ``rate``, from this rank's own coins. One process: the plain
        ``randomness.poisson_mask(n, rate)``."""
        lo, hi = self.part(n)
        mask = randomness.poisson_mask(hi - lo, rate)
        if not self.distributed:
            return mask
        return mask.nonzero().squeeze(1) + lo

    def share(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's contiguous share (first dimension) of tensors every rank holds in full."""
        if not self.distributed:
            return tensors
        lo, hi = self.part(len(tensors[0]))
        return tuple(t[lo:hi] for t in tensors)

    def mechanism_seed(self, seed: int | None) -> int | None:
        """Tests' replay seed made distinct per rank (None: every rank draws its own from OS entropy)."""
        return None if seed is None else seed + self.rank

    def place(self, device: torch.device) -> torch.device:
        """A CUDA device resolves to this rank's local GPU (``LOCAL_RANK``)."""
        if self.distributed and device.type == "cuda" and device.index is None:
            return torch.device("cuda", self.local_rank)
        return device

    def reducer(self) -> "NoiseOnRankZero | None":
        """What the sanitizer needs to form the one noisy sum of the job (None in one process)."""
        return NoiseOnRankZero(self) if self.distributed else None

    def from_main(self, value):
        """Rank 0's ``value`` on every rank (one broadcast; ``value`` itself in one process): for what every rank
        must hold exactly as rank 0 holds it, e.g. clip bounds chosen from public data — a rank clipping to a
        larger bound than the one rank 0 scales the noise by would exceed the sensitivity the account assumes
        (on GPUs, non-deterministic kernels can make ranks' own computations of them differ)."""
        return self.from_rank(0, value)

    def from_rank(self, src: int, value):
        """Rank ``src``'s ``value`` on every rank (the others pass anything, e.g. None)."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = [value if self.rank == src else None]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def owner(self, index: int, count: int) -> int:
        """The rank whose contiguous block of ``range(count)`` (:meth:`part`) holds ``index``."""
        return max(r for r in range(self.world_size) if r * count // self.world_size <= index)

    def agree(self, what: str, value) -> None:
        """Refuse to train unless every rank holds the same ``value`` (the settings, n, the plan)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        values = [None] * self.world_size
        dist.all_gather_object(values, value)
        if any(v != values[0] for v in values):
            raise ConfigError(f"{what}: the ranks of this job disagree ({values}); every rank needs the same "
                              "configuration and data")


SINGLE = Ranks()


class NoiseOnRankZero:
    """The sanitizer's reducer: rank 0 adds the step's noise to its local sum, then one SUM all-reduce
    of every rank's (flattened) sums gives each rank Σ_r S_r + N(0, σ²C²)."""

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.bytes_per_step = 0  # bytes one rank sends into the all-reduce per logical step

    @property
    def adds_noise(self) -> bool:
        return self.ranks.is_main

    @torch.no_grad()
    def all_reduce(self, tensors: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        self.bytes_per_step = flat.numel() * flat.element_size()
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def env_ranks(environ=None) -> Ranks:
    """The ranks torchrun gave this process (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); one process without them."""
    environ = os.environ if environ is None else environ
    if "WORLD_SIZE" not in environ:
        return SINGLE
    try:
        rank, world, local = (int(environ.get(k, "0")) for k in ENV)
    except ValueError as e:
        raise ConfigError(f"{'/'.join(ENV)}: not integers ({e}); launch with torchrun") from None
    if world > 1 and "RANK" not in environ:
        raise ConfigError(f"RANK: WORLD_SIZE={world} is set but RANK is not (a torchrun rank has both); launch with "
                          "torchrun, or unset WORLD_SIZE")
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ConfigError(f"RANK/WORLD_SIZE: rank {rank} of world size {world} is not a valid rank; launch with torchrun")
    return Ranks(rank=rank, world_size=world, local_rank=local)


def init_process_group(device: torch.device, *, timeout_s: float = 1800.0) -> Ranks:
    """Join the job torchrun started (NCCL on CUDA, gloo on CPU); one process when ``WORLD_SIZE`` ≤ 1."""
    ranks = env_ranks()
    if not ranks.distributed:
        return SINGLE
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(ranks.local_rank)
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return current()


def current() -> Ranks:
    """This process's ranks in the initialised process group (:data:`SINGLE` without one)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return SINGLE
    return Ranks(rank=dist.get_rank(), world_size=dist.get_world_size(),
                 local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def shutdown(*, barrier: bool = False) -> None:
    """Leave the job. ``barrier``: first wait until every rank is leaving too (the path where all ranks succeeded).
    Without it a rank that finishes early closes its connections while another still holds the group, and gloo
    may abort that one at its own exit ("terminate called without an active exception", seen in a CI run when
    rank 1 left at once on a reused stage while rank 0 was writing the stage's outcome). Not after a failure: the
    other ranks may be inside a collective that this rank will never join, and torchrun stops them anyway."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if barrier and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
