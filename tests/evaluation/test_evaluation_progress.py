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
