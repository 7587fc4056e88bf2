"""Fréchet distance: closed forms, an eigenvalue reference and the naming rule (FID only with Inception); real vs
real ≈ 0 and real vs noise large in the reference classifier's features: tests/evaluation/test_real_and_noise.py."""

import numpy as np
import pytest
import torch

from dpsynth.errors import ConfigError
from dpsynth.evaluation import fid


def test_one_dimensional_gaussians():
    # W2² of N(m1, s1²) and N(m2, s2²) is (m1 - m2)² + (s1 - s2)²
    assert fid.frechet_distance(np.array([1.0]), np.array([[4.0]]), np.array([3.0]), np.array([[9.0]])) == pytest.approx(4 + 1)


def test_matches_the_eigenvalue_form():
    # tr((Σ1 Σ2)^½) = Σ √λ_i(Σ1 Σ2): the eigenvalues of a product of SPD matrices are real and positive
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 6)), rng.normal(size=(6, 6))
    s1, s2 = a @ a.T + np.eye(6), b @ b.T + np.eye(6)
    m1, m2 = rng.normal(size=6), rng.normal(size=6)
    want = ((m1 - m2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.sqrt(np.linalg.eigvals(s1 @ s2).real).sum()
    assert fid.frechet_distance(m1, s1, m2, s2) == pytest.approx(want, rel=1e-9)
    assert fid.frechet_distance(m1, s1, m1, s1) == pytest.approx(0, abs=1e-8)


@pytest.fixture(scope="module")
def classifier(mnist):
    """A reference CNN barely trained (one batch): the extractor tests below never compute its features (FID in the
    trained one's features, real vs real and vs noise: tests/evaluation/test_real_and_noise.py)."""
    from dpsynth.evaluation.classifiers import ReferenceClassifier

    return ReferenceClassifier(mnist.subset(np.arange(64)), steps=1, seed=0)


def test_without_weights_the_name_is_fid_classifier(tmp_path, classifier):
    missing = fid.feature_space(str(tmp_path / "absent.pt"), classifier)
    assert missing.name == "fid_classifier" and "no Inception weights at" in missing.source


class Pool3Stub(torch.nn.Module):
    """Stands in for a traced pytorch-fid InceptionV3 in the loading path only: N×3×H×W -> N×dim."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = torch.nn.Linear(3, dim)

    def forward(self, x):
        return self.proj(x.mean((2, 3)))[:, :, None, None]


def test_torchscript_extractor_at_the_configured_path(tmp_path, classifier, mnist):
    path = tmp_path / "pool3.pt"
    torch.jit.script(Pool3Stub(fid.INCEPTION_DIM)).save(str(path))
    space = fid.feature_space(str(path), classifier)
    assert space.name == "fid" and space.source.startswith("Inception-v3 pool3")
    f = space.features(mnist.subset(np.arange(10)))  # grayscale repeated to 3 channels
    assert f.shape == (10, fid.INCEPTION_DIM)


def test_an_extractor_of_another_width_is_refused(tmp_path, classifier):
    path = tmp_path / "wrong.pt"
    torch.jit.script(Pool3Stub(64)).save(str(path))
    with pytest.raises(ConfigError, match="evaluate.inception_weights"):
        fid.feature_space(str(path), classifier)
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="evaluate.inception_weights"):
        fid.feature_space(str(tmp_path / "junk.pt"), classifier)
