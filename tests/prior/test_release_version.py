"""A released FigurePainter records the prior version that paints it (#51): a file of another version (or one
written before versions were recorded, version 1) is refused by name, not painted by today's painter."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.prior import VERSION
from dpsynth.prior.figures import random_figures
from dpsynth.prior.release import FigurePainter
from dpsynth.training.artifacts import build_generator


def painter() -> FigurePainter:
    rng = np.random.default_rng(0)
    figures = [random_figures(rng, 3) for _ in range(2)]
    return FigurePainter.from_figures(figures, [np.full(3, 1 / 3)] * 2, image_size=16, channels=3)


def test_the_model_record_names_the_version_and_rebuilds():
    p = painter()
    model = p.describe()
    assert model["prior_version"] == VERSION
    q = build_generator(model)
    q.load_state_dict(p.state_dict())
    assert q.describe() == model


@pytest.mark.parametrize("old", [None, "1"])
def test_a_file_of_another_prior_version_is_refused(old):
    model = painter().describe()
    if old is None:
        del model["prior_version"]  # written before versions were recorded: version 1's painter
    else:
        model["prior_version"] = old
    with pytest.raises(ValueError, match="^model.prior_version: .*version 1"):
        build_generator(model)
