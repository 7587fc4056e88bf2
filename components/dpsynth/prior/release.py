"""Private Evolution's release as a generator: the last round's figures and their thresholded noisy votes, painted.

:class:`FigurePainter` holds only released quantities — the figures of every class's last population (parameters
of :mod:`dpsynth.prior.figures`, derived from the released histograms by post-processing with a public seed) and
their weights (the last round's noisy votes, thresholded and normalised) — and draws samples from them with the
public painter (:func:`dpsynth.prior.paint.paint_figures`): a figure drawn by its weight, varied by a small step, painted in the prior's
random colours. No record is an argument of anything here.

It is a ``torch.nn.Module`` with the generator interface the stages use (``num_classes``, ``sample(n, labels=,
generator=)``, ``describe()``), so that the ``dpsynth.generator/1`` file (:mod:`dpsynth.training.artifacts`) binds
it to the mechanism trace, and the audit, sample and evaluate stages treat it as any other release. Its state is
tensors only (``torch.load(weights_only=True)`` reads it back):

* ``parts``: int64 P × 5, one row per part of every figure: (figure, kind, glyph, font, erase);
* ``params``: float64 P × L, each part's numbers, padded with +inf (a part's numbers are finite; NaN padding
  would make a state unequal to itself under ``torch.equal``);
* ``sizes``: int64, the number of figures of each class; ``weights``: float64, every figure's weight.

>>> import numpy as np
>>> from dpsynth.prior.figures import random_figures
>>> rng = np.random.default_rng(0)
>>> figs = [random_figures(rng, 3), random_figures(rng, 2)]
>>> p = FigurePainter.from_figures(figs, [np.full(3, 1 / 3), np.array([1.0, 0.0])], image_size=8, channels=3)
>>> q = FigurePainter(**{k: v for k, v in p.describe().items() if k != "class"}); _ = q.load_state_dict(p.state_dict())
>>> q.figures == figs, [w.tolist() for w in q.weights()] == [w.tolist() for w in p.weights()]
(True, True)
>>> x, y = q.sample(4, labels=torch.tensor([0, 1, 0, 1]), generator=torch.Generator().manual_seed(0))
>>> tuple(x.shape), bool(x.min() >= -1 and x.max() <= 1), y.tolist()
((4, 3, 8, 8), True, [0, 1, 0, 1])
"""

from __future__ import annotations

import numpy as np
import torch

from dpsynth.prior import VERSION
from dpsynth.prior.figures import GLYPHS, KINDS, Figure, Part
from dpsynth.prior.paint import paint_figures

CLASS = "dpsynth.prior.release.FigurePainter"  # its name in a generator file (artifacts.GENERATOR_CLASSES)


def _encode(figures: list[list[Figure]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, params = [], []
    for i, fig in enumerate(f for pop in figures for f in pop):
        for part in fig:
            rows.append((i, KINDS.index(part.kind), GLYPHS.index(part.glyph) if part.glyph else -1, part.font,
                         int(part.erase)))
            params.append(part.p)
    width = max((len(p) for p in params), default=0)
    table = np.full((len(params), width), np.inf)
    for r, p in enumerate(params):
        table[r, :len(p)] = p
    sizes = torch.tensor([len(pop) for pop in figures], dtype=torch.int64)
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 5), torch.from_numpy(table), sizes


def _decode(parts: torch.Tensor, params: torch.Tensor, sizes: torch.Tensor) -> list[list[Figure]]:
    flat: list[list[Part]] = [[] for _ in range(int(sizes.sum()))]
    for (i, kind, glyph, font, erase), p in zip(parts.tolist(), params.numpy()):
        flat[i].append(Part(kind=KINDS[kind], p=tuple(float(v) for v in p[np.isfinite(p)]),
                            glyph=GLYPHS[glyph] if glyph >= 0 else "", font=font, erase=bool(erase)))
    out, at = [], 0
    for n in sizes.tolist():
        out.append([tuple(f) for f in flat[at:at + n]])
        at += n
    return out


class FigurePainter(torch.nn.Module):
    """The released figures of every class and their weights, and the painter that samples from them."""

    def __init__(self, *, num_classes: int, channels: int, image_size: int, jitter: float = 0.05,
                 prior_version: str = "1"):
        # the prior version whose painter drew the release: a file written before versions were recorded is
        # version 1's; another version's painter would paint other images from the same released figures
        if prior_version != VERSION:
            raise ValueError(f"model.prior_version: this generator file was released with the public prior's "
                             f"version {prior_version}, and this dpsynth paints version {VERSION} (docs/prior.md); "
                             f"sample it with the dpsynth that released it")
        super().__init__()
        self.prior_version = prior_version
        self.num_classes, self.channels, self.image_size, self.jitter = num_classes, channels, image_size, jitter
        self.register_buffer("parts", torch.zeros(0, 5, dtype=torch.int64))
        self.register_buffer("params", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("sizes", torch.zeros(num_classes, dtype=torch.int64))
        self.register_buffer("weights_flat", torch.zeros(0, dtype=torch.float64))
        self.figures: list[list[Figure]] = [[] for _ in range(num_classes)]

    @classmethod
    def from_figures(cls, figures: list[list[Figure]], weights: list[np.ndarray], *, image_size: int,
                     channels: int, jitter: float = 0.05) -> FigurePainter:
        painter = cls(num_classes=len(figures), channels=channels, image_size=image_size, jitter=jitter,
                      prior_version=VERSION)
        parts, params, sizes = _encode(figures)
        painter.load_state_dict({"parts": parts, "params": params, "sizes": sizes,
                                 "weights_flat": torch.from_numpy(np.concatenate(weights).astype(np.float64))})
        return painter

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """The released state (its shapes vary with the figures): every buffer replaced, the figures decoded."""
        missing = {"parts", "params", "sizes", "weights_flat"} - set(state_dict)
        extra = set(state_dict) - {"parts", "params", "sizes", "weights_flat"}
        if missing or (strict and extra):
            raise RuntimeError(f"FigurePainter state: missing {sorted(missing)}, unexpected {sorted(extra)}")
        for name in ("parts", "params", "sizes", "weights_flat"):
            setattr(self, name, state_dict[name].detach().clone())
        if len(self.sizes) != self.num_classes or int(self.sizes.sum()) != len(self.weights_flat):
            raise RuntimeError(f"FigurePainter state: {len(self.sizes)} classes of {self.sizes.tolist()} figures "
                               f"for {self.num_classes} classes and {len(self.weights_flat)} weights")
        self.figures = _decode(self.parts, self.params, self.sizes)
        return torch.nn.modules.module._IncompatibleKeys([], [])

    def weights(self) -> list[np.ndarray]:
        """Each class's figure weights (summing to 1)."""
        bounds = np.cumsum([0, *self.sizes.tolist()])
        w = self.weights_flat.numpy()
        return [w[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def describe(self) -> dict:
        """Its ``model`` record in a generator file: the class and its keywords."""
        return {"class": CLASS, "num_classes": self.num_classes, "channels": self.channels,
                "image_size": self.image_size, "jitter": self.jitter, "prior_version": self.prior_version}

    @torch.no_grad()
    def sample(self, n: int, *, labels: torch.Tensor | None = None, generator: torch.Generator | None = None):
        """``n`` images in [-1, 1] (N × C × H × W float32) and their labels (classes balanced when None); the
        painter's coins seeded from ``generator`` (public)."""
        labels = torch.arange(n) % self.num_classes if labels is None else labels.to("cpu", torch.int64)
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator).item())
        x = paint_figures(self.figures, self.weights(), labels.numpy(), size=self.image_size, channels=self.channels,
                          rng=np.random.default_rng(seed), jitter=self.jitter)
        return torch.from_numpy(x).permute(0, 3, 1, 2).float().div(127.5).sub(1.0), labels
