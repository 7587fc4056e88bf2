"""The warm-up shows its phases as the private steps do (#32 item 5): its releases in the log, the
generator fit as a progress bar with its step count and time left (stderr: the terminal and the task log)."""

import torch

from dpsynth.models.dcgan import Generator
from dpsynth.warmup import fit as warmup
from dpsynth.warmup import releases as warmup_releases


def fit(progress: bool, steps: int = 7) -> None:
    G = Generator(num_classes=2, width=8, latent_dim=8)
    warmup.fit_generator(G, -torch.ones(2, 1, 28, 28), steps=steps, batch_size=4, lr=1e-3,
                         generator=torch.Generator().manual_seed(0), progress=progress)


def test_the_generator_fit_draws_a_bar_with_its_steps(capsys):
    fit(progress=True)
    err = capsys.readouterr().err
    assert "warm-up generator fit" in err and "7/7" in err
    fit(progress=False)
    assert "warm-up generator fit" not in capsys.readouterr().err  # library callers (tests, benchmarks) stay quiet


def test_the_releases_are_named_in_the_order_of_the_trace():
    from dpsynth.config import load_config

    for path, names in (("configs/dpgan-digits-cpu.yaml", ["class_means", "styles", "variations"]),
                        ("configs/dpgan-mnist-cpu.yaml", ["intensity_histogram", "class_means", "variations", "styles"]),
                        ("configs/dpgan-generic-cpu.yaml", ["intensity_histogram", "class_means", "polarity_shapes", "variations"])):
        cfg = load_config(path)
        assert warmup_releases.release_names(cfg) == names and len(warmup_releases.events(cfg)) == len(names)
