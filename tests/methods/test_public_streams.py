"""GS-WGAN / DPAC: the public streams (train.seed: real batches, latents, interpolation weights) do not depend
on a shard's size (issue #33, item 1).

A shard may hold s < B records. If its critic steps drew s latents, s interpolation weights or a permutation of
s from the streams every shard and the generator step share, one record more or less in that shard would shift
every later latent of G — a dependence on the data that no sanitized release covers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsynth.methods.dpac import DPACTrainer
from dpsynth.methods.gswgan import GSWGANTrainer
from tests.methods.gswgan_helpers import K, shards_drawn, tiny
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha:UserWarning")

SMALL = 10  # records of the small shard: fewer than B = 16


def streams_after_each_iteration(cfg, shards, trainer_class, steps: int):
    """(data_rng state, latent rng state) after every iteration, and the shard each iteration drew."""
    trainer = trainer_class(cfg, shards, mechanism_seed=7)  # the same secret coins for both datasets
    states = []
    with shards_drawn() as drawn:
        for _ in range(steps):
            trainer.train_step()
            states.append((trainer.state.data_rng.get_state(), trainer.state.rng.get_state()))
    return states, drawn


@pytest.mark.parametrize("method", ["gswgan", "dpac"])
def test_one_record_of_a_small_shard_leaves_the_public_streams_unchanged(tmp_path, shards, method):
    cfg = tiny(tmp_path, "dpac.start_iteration=0", method=method)
    assert cfg.gswgan.batch_size > SMALL and len(shards) == K
    trainer_class = DPACTrainer if method == "dpac" else GSWGANTrainer
    with_x = [shards[0].subset(np.arange(SMALL)), *shards[1:]]
    without_x = [shards[0].subset(np.arange(SMALL - 1)), *shards[1:]]  # the neighbour: one record fewer
    a, drawn_a = streams_after_each_iteration(cfg, with_x, trainer_class, steps=4)
    b, drawn_b = streams_after_each_iteration(cfg, without_x, trainer_class, steps=4)
    assert drawn_a == drawn_b and 0 in drawn_a  # the small shard was drawn (the same secret choices)
    for t, ((data_a, rng_a), (data_b, rng_b)) in enumerate(zip(a, b)):
        moved = [name for name, x, y in (("real-batch", data_a, data_b), ("latent", rng_a, rng_b)) if not torch.equal(x, y)]
        assert not moved, f"iteration {t}: the {' and '.join(moved)} stream(s) depend on the shard's size"
