"""A SIGTERM under torchrun stops every rank at the same step (#53 item 2): the ranks agree on the stop flag after
each step (one all-reduce), so rank 0's checkpoint holds the step every rank stopped after, and no rank is left
waiting in a collective for one that has gone (which ended that rank with status 1). The ranks are in
tests/methods/distributed_workers.py (2 gloo processes on CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.methods import distributed_workers as workers

AT_STEP = 3  # not a checkpoint step (output.checkpoint_every=5): the stop writes its own checkpoint


@pytest.mark.parametrize("signalled", [0, 1])
def test_sigterm_on_one_rank_stops_every_rank_after_the_same_step(tmp_path, signalled):
    workers.run_ranks(2, tmp_path, workers.stopped_on_one_rank, str(tmp_path), signalled, AT_STEP)
    ended = [json.loads((tmp_path / f"stop{rank}.json").read_text()) for rank in (0, 1)]
    assert ended == [{"how": "terminated 143", "step": AT_STEP}] * 2, ended
    checkpoint = torch.load(tmp_path / "out" / "checkpoints" / "last.pt", weights_only=False)
    assert checkpoint["step"] == AT_STEP and checkpoint["trace"]["events"][-1]["count"] == AT_STEP
