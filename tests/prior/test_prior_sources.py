"""The prior never draws the sources of the confirmation sets (docs/prior.md): no module of
``components/dpsynth/prior/`` (nor the public segmenter's training script) names the photographs or the MNIST
digits that ``mnist-photo`` is made of."""

from pathlib import Path

import dpsynth.prior

FORBIDDEN = ("china.jpg", "flower.jpg", "grace_hopper", "load_sample_image", "sample_data", "get_sample_data",
             "mnist", "idx3")


def test_the_prior_names_no_confirmation_source():
    folder = Path(dpsynth.prior.__file__).parent
    sources = {p.name: p.read_text().lower() for p in folder.rglob("*.py")}
    script = Path(__file__).resolve().parents[2] / "scripts" / "train_segmenter.py"  # the segmenter's training
    sources[script.name] = script.read_text().lower()
    assert sources
    found = {(name, word) for name, text in sources.items() for word in FORBIDDEN if word in text}
    assert not found, f"the prior names a confirmation set's source: {sorted(found)}"
