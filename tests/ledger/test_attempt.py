"""Every training attempt is charged: a killed attempt (a process of its own, SIGKILLed: forked from the warm
interpreter of tests/methods/distributed_workers.py), its resumption and a fresh restart, and the refusals before
training (`dpsynth train` in this process: starting a Python process that imports torch costs more than a tiny run,
and nothing of a finished attempt is left in this process to be reused).

The reference is Opacus' RDP accountant on the steps that may have run, computed here independently of
dpsynth's accountants.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth.data import import_source, write_parquet
from dpsynth.ledger.store import Ledger
from tests.ledger_fixtures import kill_after_first_checkpoint
from tests.methods import distributed_workers as workers

MNIST = Path(__file__).resolve().parents[2] / "data" / "mnist"
# 40 steps: a process killed at its first checkpoint (step 10) still had 30 to go (over a CPU-second, far more than
# the 0.1 s between two looks for the checkpoint), and the resumption that finishes them stays cheap.
STEPS, EPSILON, DELTA = 40, 10.0, 1e-4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "mnist600.parquet"
    write_parquet(import_source(str(MNIST)).subset(np.arange(600)), str(path))
    return path


def train_args(data, out, url, *extra):
    settings = [f"data.uri={data}", f"output.dir={out}", "tracking.enabled=false", f"train.steps={STEPS}",
                "train.d_width=4", "train.g_width=4", "train.latent_dim=8", "train.batch_size=32",
                "output.checkpoint_every=10", "output.sample_every=0", f"privacy.epsilon={EPSILON}",
                f"privacy.delta={DELTA}", f"ledger.url={url}", "ledger.population_id=mnist600", "data.num_classes=10", *extra]
    return [sys.executable, "-m", "dpsynth.cli", "train", "--json", *[a for s in settings for a in ("--set", s)]]


def in_process(args: list[str], capsys) -> tuple[int, str, str]:
    """``dpsynth.cli.main`` on the argv of ``args`` (``[python, -m, dpsynth.cli, train, ...]``) in this process: the
    exit code, stdout and stderr."""
    from dpsynth.cli import main

    capsys.readouterr()
    code = main(args[3:])
    out = capsys.readouterr()
    return code, out.out, out.err


def refused(args: list[str], capsys) -> tuple[int, str]:
    """A refusal that comes before training: the exit code and stderr."""
    code, _, err = in_process(args, capsys)
    return code, err


def opacus_epsilon(steps: int, sigma: float, q: float) -> float:
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(DELTA)


def test_a_killed_attempt_then_its_resumption_are_charged_at_least_what_ran(tmp_path, data, capsys):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(url)
    ledger.set_budget("mnist600", epsilon=100.0, delta=1e-3, reason="test")
    out = tmp_path / "run"
    args = train_args(data, out, url)
    killed = workers.start_process(workers.cli_rank, 0, str(tmp_path), args[3:])  # `dpsynth train ...`
    ckpt = kill_after_first_checkpoint(killed, out)  # after its reservation and some steps
    (killed,) = ledger.history("mnist600")
    assert killed["status"] == "reserved"  # what SIGKILL leaves behind
    resumed_at = torch.load(ckpt, weights_only=False)["step"]
    assert 0 < resumed_at < STEPS

    code, out, err = in_process(args, capsys)  # the resumption
    assert code == 0, err
    result = json.loads(out)
    assert result["steps"] == STEPS
    first, second = ledger.history("mnist600")
    assert first["id"] == killed["id"] and first["status"] == "committed" and "adopted" in first["note"]
    assert second["status"] == "committed" and second["resumes_id"] == first["id"]
    assert not [r for r in ledger.history() if r["status"] == "reserved"]  # no stale reservation remains

    # what may have run: the killed attempt up to all its steps, then the STEPS - resumed_at added
    sigma, q = result["noise_multiplier"], result["sample_rate"]
    may_have_run = STEPS + (STEPS - resumed_at)
    reference = opacus_epsilon(may_have_run, sigma, q)
    total = ledger.balance("mnist600")["committed"]
    assert total >= reference, (total, reference)
    assert first["epsilon_spent"] == EPSILON  # the killed attempt: its whole reservation
    # the resumption: the steps it added, composed alone (within 1% of Opacus' RDP)
    assert second["epsilon_spent"] == pytest.approx(opacus_epsilon(STEPS - resumed_at, sigma, q), rel=0.01)
    assert second["epsilon_spent"] < EPSILON


def test_a_fresh_restart_is_charged_again(tmp_path, data, capsys):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(url)
    ledger.set_budget("mnist600", epsilon=25.0, delta=1e-3, reason="test")
    out = tmp_path / "run"
    short = ("train.steps=10",)
    for extra in ((), ("output.resume=false",)):  # the second discards the finished run's checkpoint
        code, stdout, err = in_process(train_args(data, out, url, *short, *extra), capsys)
        assert code == 0, err
    result = json.loads(stdout)
    reference = opacus_epsilon(10, result["noise_multiplier"], result["sample_rate"])
    first, second = ledger.history("mnist600")
    assert first["resumes_id"] is None and second["resumes_id"] is None
    assert first["epsilon_spent"] == pytest.approx(reference, rel=0.01)
    assert second["epsilon_spent"] == pytest.approx(reference, rel=0.01)
    assert ledger.balance("mnist600")["committed"] == pytest.approx(2 * reference, rel=0.01)
    # a third would exceed the 25: refused before it trains, with the command that raises the budget
    code, err = refused(train_args(data, tmp_path / "run3", url, *short), capsys)
    assert code == 2 and "cannot afford ε=10" in err and "set-budget" in err
    assert not (tmp_path / "run3" / "checkpoints").exists() and len(ledger.history("mnist600")) == 2


def test_training_needs_an_explicit_population_and_a_budget(tmp_path, data, capsys):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = train_args(data, tmp_path / "run", url)
    no_population = [a for a in args if a != "ledger.population_id=mnist600"]
    no_population = [a for i, a in enumerate(no_population) if not (a == "--set" and i + 1 < len(no_population)
                                                                     and no_population[i + 1] == "--set")]
    code, err = refused(no_population[:-1] if no_population[-1] == "--set" else no_population, capsys)
    assert code == 2 and "ledger.population_id: required" in err
    code, err = refused(args, capsys)
    assert code == 2 and "no budget for population 'mnist600'" in err
    assert "dpsynth ledger set-budget mnist600" in err and not (tmp_path / "run").exists()
