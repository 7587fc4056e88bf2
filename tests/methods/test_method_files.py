"""A method file holds its paper's algorithm (#35): what every method shares — a trainer's checkpointed state, the
public seeds, the pre-training files, the shards spread over ranks, the networks built from the configuration, the
pre-training runs — lives in one place outside it."""

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


# each method file: its paper's steps as functions over a state dataclass (#35); the trainer an adapter over them
STEPS = {  # file: (its state dataclass, its step functions: each takes the state first)
    "dpgan": ("DPGANState", ("d_step", "g_step")),
    "zhang": ("ZhangState", ("d_step", "g_step")),
    "gswgan": ("GSWGANState", ("critic_step", "g_step")),  # private: the generator's gradient (g_step)
    "dpac": ("GSWGANState", ("train_classifier", "generator_loss")),  # GS-WGAN's state and steps, and C
    "gswgan_federated": ("ServerState", ("g_step",)),
}


@pytest.mark.parametrize("name", STEPS)
def test_a_method_file_holds_its_step_functions_over_a_state_dataclass(name):
    import dataclasses
    import importlib
    import inspect

    module = importlib.import_module(f"dpsynth.methods.{name}")
    state, steps = STEPS[name]
    assert dataclasses.is_dataclass(getattr(module, state, None)), f"methods/{name}.py: no state dataclass {state}"
    for step in steps:
        fn = getattr(module, step, None)
        assert inspect.isfunction(fn) and fn.__module__ == module.__name__, f"methods/{name}.py: no function {step}"
        assert next(iter(inspect.signature(fn).parameters)) == "state", f"{name}.{step}: takes the state first"


def test_the_federated_client_is_its_state_and_its_update_a_function():
    import dataclasses

    from dpsynth.methods import gswgan_federated

    assert dataclasses.is_dataclass(gswgan_federated.Client) and callable(gswgan_federated.client_update)
    assert checkpoint.state_fields(gswgan_federated.Client) == ("D", "opt", "data_rng", "rng", "randomness")


def test_a_trainer_holds_no_flags_of_one_method():
    """The Trainer base keeps what every method uses: a flag or hook of one method lives with that method (its
    state), and which methods train data-parallel is their Method's (``Method.data_parallel``)."""
    from dpsynth.methods import registry
    from dpsynth.training.loop import Trainer

    gone = ("KEEPS_SNAPSHOTS", "DATA_PARALLEL", "SPREAD_STATE", "STATE", "warmup_records", "final_params",
            "method_state", "load_method_state")
    from dpsynth.methods.gswgan_federated import FederatedServer

    for cls in (Trainer, FederatedServer, *(m.trainer for m in registry.METHODS.values())):
        assert not [g for g in gone if hasattr(cls, g)], f"{cls.__name__}: {[g for g in gone if hasattr(cls, g)]}"
    assert set(registry.data_parallel_methods()) < set(registry.METHODS)
    for name, m in registry.METHODS.items():  # each trainer names its method; its Method says if it is data-parallel
        assert (FederatedServer if m.federated else m.trainer).NAME == name


def test_a_state_dataclass_round_trips_through_capture_state():
    """``checkpoint.capture_state`` / ``restore_state``: the fields in order, but the transient ones; a field
    named TORCH_RNG stands for the global CPU generator."""
    import dataclasses

    @dataclasses.dataclass(eq=False, kw_only=True)
    class State:
        count: int = 0
        net: torch.nn.Module
        rng: torch.Generator
        torch_rng: None = None
        view: object = dataclasses.field(default=None, metadata=checkpoint.TRANSIENT)

    a = State(net=torch.nn.Linear(3, 2), rng=torch.Generator().manual_seed(1), count=3, view="a view")
    torch.randn(3, generator=a.rng)
    saved = checkpoint.capture_state(a)
    assert list(saved) == ["count", "net", "rng", checkpoint.TORCH_RNG]
    expect_rng, expect_global = torch.rand(2, generator=a.rng), torch.rand(2)
    b = State(net=torch.nn.Linear(3, 2), rng=torch.Generator().manual_seed(2))
    checkpoint.restore_state(b, saved)
    assert b.count == 3 and b.view is None
    assert all(torch.equal(x, y) for x, y in zip(a.net.state_dict().values(), b.net.state_dict().values()))
    assert torch.equal(torch.rand(2, generator=b.rng), expect_rng) and torch.equal(torch.rand(2), expect_global)
