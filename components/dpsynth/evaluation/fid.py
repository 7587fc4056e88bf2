"""Fréchet distance between real and generated feature distributions (Heusel et al. 2017):
‖μ_r − μ_g‖² + tr(Σ_r + Σ_g − 2 (Σ_r Σ_g)^½), computed as pytorch-fid computes it.

Which features decide the name, and nothing else does:

* ``fid``: the 2048-d pool3 features of pytorch-fid's Inception-v3 (``pt_inception-2015-12-05``
  weights), read from ``evaluate.inception_weights``. No weights can be downloaded at run time,
  so an image that wants FID bakes the extractor in at build time, e.g.::

      pip install pytorch-fid torchvision   # in a throwaway build stage, with network access
      python - <<'EOF'
      import torch
      from pytorch_fid.inception import InceptionV3
      m = InceptionV3([InceptionV3.BLOCK_INDEX_BY_DIM[2048]], resize_input=True, normalize_input=True).eval()
      torch.jit.trace(lambda x: m(x)[0], torch.rand(2, 3, 299, 299)).save("/opt/dpsynth/inception-pool3.pt")
      EOF

  and sets ``evaluate.inception_weights=/opt/dpsynth/inception-pool3.pt``. The file must be a
  TorchScript module (or a ``torch.export`` archive named ``*.pt2``) taking N×3×H×W floats in [0, 1] (it resizes to 299 and normalizes itself,
  as pytorch-fid's ``InceptionV3`` does) and returning N×2048 (or N×2048×1×1) features.
  Grayscale images are repeated to three channels, as GS-WGAN (supp. C.3) and pytorch-fid do.
* ``fid_classifier``: when no weights are at that path (the default here), the same distance
  in the penultimate-layer features of a CNN trained on the real reference data
  (:class:`dpsynth.evaluation.classifiers.ReferenceClassifier`). Its values are not comparable
  with published FIDs and are never reported as FID.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import numpy as np
import torch
from scipy import linalg

from dpsynth.data import ImageDataset
from dpsynth.errors import ConfigError
from dpsynth.evaluation.classifiers import ReferenceClassifier, apply

INCEPTION_DIM = 2048


def statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (unbiased) covariance of N×D features, in float64."""
    f = np.asarray(features, dtype=np.float64)
    return f.mean(0), np.cov(f, rowvar=False)


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray, *,
                     eps: float = 1e-6) -> float:
    """The Fréchet distance of two Gaussians (pytorch-fid's ``calculate_frechet_distance``)."""
    mu1, mu2 = np.atleast_1d(mu1), np.atleast_1d(mu2)
    sigma1, sigma2 = np.atleast_2d(sigma1), np.atleast_2d(sigma2)
    diff = mu1 - mu2
    with warnings.catch_warnings():  # a singular product is handled below, as pytorch-fid does
        warnings.simplefilter("ignore", linalg.LinAlgWarning)
        covmean = linalg.sqrtm(sigma1.dot(sigma2))
        if not np.isfinite(covmean).all():  # add eps to the diagonals
            offset = np.eye(sigma1.shape[0]) * eps
            covmean = linalg.sqrtm((sigma1 + offset).dot(sigma2 + offset))
    if np.iscomplexobj(covmean):
        if not np.allclose(np.diagonal(covmean).imag, 0, atol=1e-3):
            raise ValueError(f"Fréchet distance: imaginary component {np.max(np.abs(covmean.imag))}")
        covmean = covmean.real
    return float(diff.dot(diff) + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean))


def distance(real: np.ndarray, generated: np.ndarray) -> float:
    return frechet_distance(*statistics(real), *statistics(generated))


class InceptionFeatures:
    """pytorch-fid's pool3 features from a TorchScript extractor at ``path`` (see the module docstring)."""

    name = "fid"

    def __init__(self, path: str | Path):
        path = Path(path)
        try:
            if path.suffix == ".pt2":  # torch.export archive
                self.module = torch.export.load(str(path)).module()
            else:
                self.module = torch.jit.load(str(path), map_location="cpu").eval()
        except Exception as exc:  # noqa: BLE001 - any load failure is a bad setting
            raise ConfigError(f"evaluate.inception_weights: {path} is not a TorchScript module or "
                              f"torch.export archive ({exc})") from None
        self.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        out = self._embed(torch.rand(2, 3, 32, 32))
        if out.shape != (2, INCEPTION_DIM):
            raise ConfigError(f"evaluate.inception_weights: {path} returns features of shape {tuple(out.shape)} "
                              f"for 2 images; pytorch-fid's pool3 features are 2×{INCEPTION_DIM}")
        self.source = f"Inception-v3 pool3 (TorchScript {path}, sha256 {self.sha256[:16]})"

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = self.module(x)
        if isinstance(out, (list, tuple)):
            out = out[0]
        return out.reshape(len(x), -1)

    def features(self, ds: ImageDataset) -> np.ndarray:
        x = (ds.to_tensors()[0] + 1) / 2  # [0, 1]
        if x.shape[1] == 1:
            x = x.repeat(1, 3, 1, 1)
        return apply(self._embed, x, batch_size=200).double().numpy()


class ClassifierFeatures:
    """Penultimate features of the reference classifier: the ``fid_classifier`` space."""

    name = "fid_classifier"

    def __init__(self, classifier: ReferenceClassifier, *, note: str):
        self.classifier = classifier
        self.source = f"penultimate layer of a CNN trained on the real reference data ({note})"

    def features(self, ds: ImageDataset) -> np.ndarray:
        return self.classifier.features(ds)


def feature_space(weights: str | None, classifier: ReferenceClassifier) -> InceptionFeatures | ClassifierFeatures:
    """Inception pool3 when ``weights`` names an existing file, else the reference classifier's features."""
    if weights and Path(weights).is_file():
        return InceptionFeatures(weights)
    note = "evaluate.inception_weights unset" if not weights else f"no Inception weights at {weights}"
    return ClassifierFeatures(classifier, note=note)
