"""The ResNet choice of the evaluation (#51 item 4): a named, validated classifier trained on augmented batches."""

import numpy as np
import pytest
import torch

from dpsynth.config import load_config
from dpsynth.errors import ConfigError
from dpsynth.evaluation import accuracy, classifiers


def test_a_bad_classifier_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="evaluate.classifier"):
        load_config(overrides=["evaluate.classifier=resnet50"])
    assert load_config(overrides=["evaluate.classifier=resnet"]).evaluate.classifier == "resnet"


def test_augment_crops_from_the_padding_and_flips_only_when_asked():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    gen = torch.Generator().manual_seed(0)
    outs = [classifiers.augment(x, gen, flip=False) for _ in range(20)]
    assert all(o.shape == x.shape for o in outs)
    assert any(not torch.equal(o, x) for o in outs)  # shifted crops
    # every crop is a window of the edge-padded image: no value outside the image's own
    assert all(set(o[0, 0].flatten().tolist()) <= set(x[0, 0].flatten().tolist()) for o in outs)
    # without flip a crop keeps left-right order: along a row of the padded image values never decrease
    assert all((o[:, :, :, 1:] >= o[:, :, :, :-1]).all() for o in outs)
    flipped = [classifiers.augment(x, gen, flip=True) for _ in range(20)]
    assert any((o[:, :, :, 1:] < o[:, :, :, :-1]).any() for o in flipped)


def test_the_resnet_learns_digits(mnist):
    cfg = load_config(overrides=["evaluate.classifier=resnet", "evaluate.resnet_epochs=6"])
    train, validation, test = mnist.subset(np.arange(600)), mnist.subset(np.arange(600, 700)), \
        mnist.subset(np.arange(1000, 1300))
    trained = accuracy.Trained("resnet", cfg, train, validation)
    assert isinstance(trained.model, classifiers.ResNet)
    assert trained.training["epochs"] == 6
    assert (trained.predict(test) == test.labels).mean() > 0.4  # chance: 0.1
