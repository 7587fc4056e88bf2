"""A method file holds its paper's algorithm (#35): what every method shares — a trainer's checkpointed state, the
public seeds, the warm-start files, the shards spread over ranks, the networks built from the configuration, the
warm starts — lives in one place outside it."""

from pathlib import Path

import pytest
import torch

from dpsynth import methods
from dpsynth.training import checkpoint

METHOD_FILES = ("dpgan", "dpac", "gswgan", "gswgan_federated", "federated_processes", "zhang")


@pytest.mark.parametrize("name", METHOD_FILES)
def test_a_method_file_holds_only_its_algorithm(name):
    lines = (Path(methods.__path__[0]) / f"{name}.py").read_text().count("\n")
    assert lines <= 250, f"methods/{name}.py: {lines} lines; move what is not the paper's algorithm out of it"


def test_a_trainers_state_round_trips_through_capture_and_restore():
    """``checkpoint.capture`` / ``restore`` of what a trainer's STATE names: modules and optimizers by their
    state_dict, torch.Generators by their state, the global CPU generator (TORCH_RNG), plain values as they are."""

    class Owner:
        def __init__(self, seed: int):
            torch.manual_seed(seed)
            self.net = torch.nn.Linear(3, 2)
            self.opt = torch.optim.Adam(self.net.parameters())
            self.rng = torch.Generator().manual_seed(seed)
            self.count = seed

    names = ("net", "opt", "rng", "count", checkpoint.TORCH_RNG)
    a = Owner(1)
    a.net(torch.ones(1, 3)).sum().backward()
    a.opt.step()
    torch.randn(3, generator=a.rng)
    state = checkpoint.capture(a, names)
    assert list(state) == list(names)
    expect_rng, expect_global = torch.rand(2, generator=a.rng), torch.rand(2)

    b = Owner(2)
    checkpoint.restore(b, names, state)
    assert all(torch.equal(x, y) for x, y in zip(a.net.state_dict().values(), b.net.state_dict().values()))
    assert b.opt.state_dict()["state"].keys() == a.opt.state_dict()["state"].keys() and b.count == 1
    assert torch.equal(torch.rand(2, generator=b.rng), expect_rng) and torch.equal(torch.rand(2), expect_global)
