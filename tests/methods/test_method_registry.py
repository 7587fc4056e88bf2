"""One method registry: the config's methods, the stages' wiring and `dpsynth train`'s dispatch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args, get_type_hints

import pytest
import torch

from dpsynth.cli import main
from dpsynth.config import RunConfig, TrainConfig, load_config
from dpsynth.methods import registry
from dpsynth.methods.method import Audit
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(REPO.glob("configs/*-mnist-cpu.yaml"))
# toy sizes for every method's section (those a config does not use are ignored)
TINY = ["train.steps=2", "train.d_width=4", "train.g_width=4", "train.latent_dim=15", "train.batch_size=32",
        "privacy.delta=1e-4", "output.checkpoint_every=0", "output.sample_every=0", "output.log_every=0",
        "tracking.enabled=false", "gswgan.pretrain_iterations=1", "gswgan.batch_size=8", "gswgan.d_width=4",
        "gswgan.g_width=4", "zhang.pretrain_iterations=1"]


def test_the_config_literal_is_the_registry():
    from dpsynth import config
    from dpsynth.config import AUTO

    assert list(get_args(get_type_hints(TrainConfig)["method"])) == [*registry.METHODS, AUTO]
    assert list(config.METHODS) == list(registry.METHODS)
    # each method file declares its own Method, and the registry holds that very object
    assert [module.METHOD for module in registry.MODULES] == list(registry.METHODS.values())


def test_the_configuration_imports_no_method():
    """config.py is the ground floor: loading a configuration imports neither the registry nor a mechanism."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "components"), os.environ.get("PYTHONPATH", "")])}
    probe = ("import sys; from dpsynth.config import load_config; load_config(overrides=['train.method=zhang']); "
             "print(sorted(m for m in sys.modules if m.startswith(('dpsynth.methods', 'dpsynth.mechanisms'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=env).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", list(registry.METHODS))
def test_every_method_resolves_and_names_real_config_sections(name):
    m = registry.METHODS[name]
    assert m.name == name and registry.description(name)
    assert isinstance(m.trainer, type) and m.mechanism is not None
    assert m.mechanism is getattr(m.trainer, "MECHANISM", m.mechanism)  # the trainer plans with its Method's
    assert (m.pretrain_function is None) == (m.pretrain == "none")
    assert m.empirical_audit is None or isinstance(m.empirical_audit, Audit)
    assert not (m.data_parallel and m.federated)
    assert set(m.sections) <= set(RunConfig().to_dict())


def test_an_unknown_method_is_a_config_error():
    from dpsynth.errors import ConfigError

    with pytest.raises(ConfigError, match="train.method"):
        registry.get("dcgan")


def test_methods_know_nothing_of_the_stages():
    """Nothing under methods/, privacy/, models/, data/ imports dpsynth.stages (the import graph, by source,
    imports inside functions included). ``dpsynth train`` is a stage command (``runner/train_cli.py``)."""
    import ast

    offenders = []
    for folder in ("methods", "mechanisms", "privacy", "models", "data"):
        for path in (REPO / "components" / "dpsynth" / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if isinstance(node, ast.ImportFrom) and node.module == "dpsynth":
                    names = [f"dpsynth.{a.name}" for a in node.names]
                offenders += [f"{path.relative_to(REPO)}: {n}" for n in names
                              if n == "dpsynth.stages" or n.startswith("dpsynth.stages.")]
    assert offenders == []


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    import numpy as np

    from dpsynth.data import import_source, write_parquet

    path = tmp_path_factory.mktemp("source") / "mnist600.parquet"
    write_parquet(import_source(REPO / "data" / "mnist").subset(np.arange(600)), path)
    return str(path)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_dpsynth_train_trains_the_configured_method_or_refuses(config, tmp_path, source, capsys, monkeypatch):
    from tests.ledger_fixtures import budgeted_ledger

    ledger = budgeted_ledger(tmp_path, monkeypatch, load_config(config).ledger.population_id)
    out = tmp_path / "out"
    method = registry.resolve(load_config(config), channels=1).train.method  # MNIST is grey: auto picks dpgan
    # the warm-up's generator regression is post-processing (no event, no ε): 20 of the recipe's 4000 steps do
    fit = ["warmup.steps=20"] if method == "dpgan" else []
    argv = ["train", "--config", str(config), "--json", "--set", f"data.uri={source}",
            "--set", f"output.dir={out}", *[a for s in (*TINY, *fit) for a in ("--set", s)]]
    code = main(argv)
    captured = capsys.readouterr()
    if method == "dpgan":
        assert code == 0, captured.err
        result = json.loads(captured.out)
        assert result["steps"] == 2
        # DPGAN's mechanism (Poisson, add/remove) and DPGAN's generator, not another method's
        *warm, event = json.loads((out / "trace.json").read_text())["events"]
        assert event["sampling"] == "poisson" and event["sensitivity"] == "add_remove"
        # the shipped recipe opens with its private warm-up releases (full batch: class means, then style
        # groups and variation directions when configured; the trace merges equal consecutive ones), and
        # nothing else
        from dpsynth.warmup import releases as warmup_releases
        from dpsynth.privacy import MechanismTrace

        planned = MechanismTrace(warmup_releases.events(load_config(config))).events
        assert [(e["sampling"], e["noise_multiplier"], e["count"]) for e in warm] == \
            [("full_batch", e.noise_multiplier, e.count) for e in planned]
        assert torch.load(out / "generator.pt", weights_only=False)["model"]["class"] == "dpsynth.models.dcgan.Generator"
        (charged,) = ledger.history()  # the attempt, charged to the config's population
        assert charged["status"] == "committed" and charged["population_id"] == "mnist"
        assert 0 < charged["epsilon_spent"] <= charged["epsilon_reserved"]
    else:
        assert code == 2
        assert f"train.method: {method!r}" in captured.err and "dpsynth pipeline run" in captured.err
        assert not out.exists() or not any(out.iterdir())  # nothing trained, nothing written
        assert ledger.history() == []  # and nothing charged


def test_every_method_has_its_papers_discriminator_steps():
    """train.n_d's default (``Method.default_n_d``) is set for exactly the registry's GAN methods: Private Evolution
    has no discriminator; "adaptive" is DPGAN's alone."""
    gans = {name for name, m in registry.METHODS.items() if m.mechanism.clipped != "votes"}
    assert {name for name, m in registry.METHODS.items() if m.default_n_d is not None} == gans
    assert gans == set(registry.METHODS) - {"private-evolution"}
    assert [name for name, m in registry.METHODS.items() if m.default_n_d == "adaptive"] == ["dpgan"]


def test_no_code_compares_a_method_name_outside_the_methods_own_file():
    """Nothing in the package compares ``train.method`` (or any value) with a method's name, nor keeps a list of
    names: a stage, a command or a rule asks the method's object (its Method). The names are written once, in
    ``config.METHODS``; a method file may name itself; ``registry.for_schema``'s pick names two."""
    import ast

    from dpsynth import config

    names = set(config.METHODS)
    allowed = {("methods", f"{name.replace('-', '_')}.py") for name in names} | {("methods", "federated_processes.py")}
    offenders = []
    for path in sorted((REPO / "components" / "dpsynth").rglob("*.py")):
        where = path.relative_to(REPO / "components" / "dpsynth").parts
        if where == ("config.py",) or where[-2:] in allowed:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Compare, ast.Tuple, ast.List, ast.Set, ast.Dict)):
                consts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in names]
                if consts and not (where == ("methods", "registry.py") and isinstance(node, ast.Tuple)
                                   and consts == ["private-evolution", "dpgan"]):
                    offenders.append(f"{'/'.join(where)}:{node.lineno}: {consts}")
    assert offenders == []


def test_auto_picks_by_the_public_schema_and_resets_what_private_evolution_does_not_read():
    cfg = load_config(REPO / "configs" / "dpgan-mnist-cpu.yaml")
    assert cfg.train.method == "auto"
    grey, colour = registry.resolve(cfg, channels=1), registry.resolve(cfg, channels=3)
    assert grey == load_config(REPO / "configs" / "dpgan-mnist-cpu.yaml", overrides=["train.method=dpgan"])
    assert colour.train.method == "private-evolution" and not colour.warmup.central_images
    assert (colour.train.g_warp, colour.train.g_tone, colour.train.g_contrast) == (False, False, 0.0)
    assert registry.resolve(colour, channels=1) is colour  # only auto is resolved
    from dpsynth.errors import ConfigError

    with pytest.raises(ConfigError, match="train.method: 'auto'"):
        registry.get("auto")
