"""Private Evolution's trainer in the one loop: T rounds, T full-batch events, a painter release bound to the
trace; a run stopped after a round resumes from its checkpoint to the same T events."""

from __future__ import annotations

import json

import numpy as np
import torch

from dpsynth.config import load_config
from dpsynth.data import ImageDataset
from dpsynth.methods import registry
from dpsynth.prior.figures import masks, random_figures
from dpsynth.prior.paint import paint
from dpsynth.prior.release import FigurePainter
from dpsynth.training.artifacts import load_generator
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)


def tiny_rgb(n: int = 60, classes: int = 3, size: int = 16) -> ImageDataset:
    rng = np.random.default_rng(5)
    images = paint(masks(random_figures(rng, n), size), rng, channels=3)
    return ImageDataset(record_ids=[f"r{i:03d}" for i in range(n)], labels=np.arange(n) % classes, images=images,
                        splits=None, num_classes=classes, source="test")


def config(out, *extra):
    return load_config(overrides=["train.method=private-evolution", "data.num_classes=3", "evolution.rounds=3",
                                  "evolution.candidates=5", "privacy.delta=1e-3", "tracking.enabled=false",
                                  "output.log_every=0", "output.sample_every=0", f"output.dir={out}", *extra])


def test_rounds_events_and_the_painter_release(tmp_path):
    cfg = config(tmp_path / "out", "output.checkpoint_every=0")
    result = registry.get("private-evolution").trainer(cfg, tiny_rgb()).train()
    assert result.steps == 3 and result.stopped_by == "steps" and result.sample_rate == 1.0
    (event,) = json.loads((tmp_path / "out" / "trace.json").read_text())["events"]
    assert (event["sampling"], event["count"], event["sample_rate"]) == ("full_batch", 3, 1.0)
    painter, privacy = load_generator(str(tmp_path / "out" / "generator.pt"))
    assert isinstance(painter, FigurePainter) and privacy["trace_steps"] == 3
    assert [len(f) for f in painter.figures] == [5, 5, 5]
    assert all(abs(w.sum() - 1) < 1e-9 for w in painter.weights())
    x, y = painter.sample(6, generator=torch.Generator().manual_seed(0))
    assert tuple(x.shape) == (6, 3, 16, 16) and y.tolist() == [0, 1, 2, 0, 1, 2]


def test_a_stopped_run_resumes_from_its_checkpoint(tmp_path):
    cfg = config(tmp_path / "out", "output.checkpoint_every=1")
    trainer_class = registry.get("private-evolution").trainer
    assert trainer_class(cfg, tiny_rgb()).train(stop_after=1) is None  # one round, its checkpoint
    resumed = trainer_class(cfg, tiny_rgb())
    result = resumed.train()
    assert result.steps == 3 and len(resumed.state.population.histograms) == 3
    (event,) = json.loads((tmp_path / "out" / "trace.json").read_text())["events"]
    assert event["count"] == 3


def test_the_records_take_the_configured_feature_and_the_statement_names_it(tmp_path):
    from dpsynth.mechanisms import private_evolution as pe
    from dpsynth.mechanisms.histograms import PRIVATE_EVOLUTION

    data = tiny_rgb()
    assert load_config(overrides=["train.method=private-evolution"]).evolution.feature == "hybrid"  # the default
    for feature in ("plane", "hybrid", "segmenter"):
        cfg = config(tmp_path / feature, f"evolution.feature={feature}")
        trainer = registry.get("private-evolution").trainer(cfg, data)
        np.testing.assert_array_equal(trainer.state.records, pe.FEATURES[feature](data.images))
        text = json.dumps(PRIVATE_EVOLUTION.statement(cfg, trainer.plan, len(data)))
        assert ("segmenter" in text) == (feature != "plane"), feature
    assert not np.allclose(pe.FEATURES["plane"](data.images), pe.FEATURES["segmenter"](data.images))
