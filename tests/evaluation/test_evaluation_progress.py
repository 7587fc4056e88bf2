"""The evaluation's classifier training shows its progress as the training phases do (#32 item 5): a bar named
after what is trained on what, with its batches and time left, on stderr (the terminal and the Airflow task log);
library callers that name nothing stay quiet."""

import torch

from dpsynth.evaluation import classifiers


def _fit(capsys, desc=None) -> str:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    x, y = torch.randn(40, 1, 4, 4), torch.randint(0, 2, (40,))
    classifiers.fit(model, x, y, epochs=3, seed=0, batch_size=10, desc=desc)
    return capsys.readouterr().err


def test_a_named_fit_draws_a_bar_with_its_batches(capsys):
    err = _fit(capsys, desc="evaluate: cnn on synthetic records")
    assert "evaluate: cnn on synthetic records" in err and "12/12" in err  # 3 epochs × 4 batches


def test_an_unnamed_fit_stays_quiet(capsys):
    assert "batch" not in _fit(capsys)


def test_the_reference_cnn_trains_about_feature_steps_batches_whatever_the_reference_size(capsys):
    """#55 item 11: 7 real reference records trained 1,372 one-batch epochs (150 × 64 / 7) where 150 batches
    were meant; references of a batch or more keep the epochs they had (ceil(150 × 64 / n))."""
    import numpy as np

    from dpsynth.data import ImageDataset

    assert classifiers.reference_epochs(7, steps=150, batch_size=64) == 150
    assert [classifiers.reference_epochs(n, steps=150, batch_size=64) for n in (64, 500, 1012, 20000)] == [
        150, 20, 10, 1]
    rng = np.random.default_rng(0)
    tiny = ImageDataset(record_ids=[str(i) for i in range(7)], labels=np.arange(7) % 2,
                        images=rng.integers(0, 256, (7, 28, 28, 1), dtype=np.uint8), splits=None, num_classes=2,
                        source="seven records")
    reference = classifiers.ReferenceClassifier(tiny, steps=20, seed=0)
    assert reference.training["epochs"] == 20
    assert "20/20" in capsys.readouterr().err  # its progress bar: 20 batches, not 20 × 64 / 7 = 183
