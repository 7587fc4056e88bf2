"""The torch classifiers of the evaluation and the loop that trains them.

CNN and MLP as GS-WGAN's supplement (C.3) describes them: the CNN has two convolutional
hidden layers of 32 and 64 kernels with dropout and ReLU, the MLP one hidden layer of 100
ReLU units. ``resnet`` is a small ResNet (He et al. 2016; three stages of one basic block, 16/32/64 channels, global
average pooling: ResNet-8) trained with augmentation (a random crop of the 4-pixel padded image; a horizontal flip only
when asked, since glyphs and digits are not mirror-invariant), the standard classifier DPImageBench scores with.
``fit`` keeps the epoch with the best accuracy on a validation set when one is
given; the evaluate stage only ever passes held-out *generated* data there, so no model is
selected on real (possibly sensitive) data.

``ReferenceClassifier`` is the CNN trained on real reference data for about ``evaluate.feature_steps`` batches
(:func:`reference_epochs`; no selection): its penultimate features are the space of ``fid_classifier`` and
the JS score, its class probabilities give the Inception Score (as GS-WGAN and dp-GAN use a
dataset classifier), and it is real2gen's CNN.
"""

from __future__ import annotations

import copy
import math
import sys

import numpy as np
import torch
from torch import nn

from dpsynth.data import ImageDataset


def pixels(ds: ImageDataset) -> torch.Tensor:
    """N×C×H×W float32 in [-1, 1]."""
    return ds.to_tensors()[0]


class CNN(nn.Module):
    def __init__(self, *, channels: int, image_size: int, num_classes: int, feature_dim: int = 128):
        super().__init__()
        side = image_size // 4
        self.body = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
            nn.Flatten(), nn.Linear(64 * side * side, feature_dim), nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Dropout(0.5), nn.Linear(feature_dim, num_classes))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class MLP(nn.Module):
    def __init__(self, *, channels: int, image_size: int, num_classes: int, hidden: int = 100):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Identity() if stride == 1 and cin == cout else
                     nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + self.skip(x))


class ResNet(nn.Module):
    """A small ResNet: a 3×3 stem, stages of ``blocks`` basic blocks at ``widths`` channels (stride 2 between
    stages), global average pooling, a linear head. Any image size (the pooling is global)."""

    def __init__(self, *, channels: int, image_size: int, num_classes: int, widths=(16, 32, 64), blocks: int = 1):
        super().__init__()
        layers, cin = [nn.Conv2d(channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()], widths[0]
        for i, w in enumerate(widths):
            for b in range(blocks):
                layers.append(_Block(cin, w, 2 if i and not b else 1))
                cin = w
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(cin, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


ARCHITECTURES = {"cnn": CNN, "mlp": MLP, "resnet": ResNet}
AUGMENTED = frozenset({"resnet"})  # trained on augmented batches (``augment``)
PAD = 4  # the random crop's padding, pixels


def augment(x: torch.Tensor, gen: torch.Generator, *, flip: bool) -> torch.Tensor:
    """Each image of the batch ``x`` cropped at a random offset from its ``PAD``-pixel padding (edge pixels
    repeated) and, with ``flip``, mirrored left-right with probability ½."""
    n, _, h, w = x.shape
    padded = nn.functional.pad(x, (PAD,) * 4, mode="replicate")
    dy, dx = torch.randint(0, 2 * PAD + 1, (2, n), generator=gen)
    out = torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])
    if flip:
        mirror = torch.rand(n, generator=gen) < 0.5
        out[mirror] = out[mirror].flip(-1)
    return out


def build(name: str, ds: ImageDataset, *, seed: int) -> nn.Module:
    """A fresh ``name`` classifier for images shaped like ``ds``'s, initialized from ``seed``."""
    h, w, c = ds.shape
    torch.manual_seed(seed)
    return ARCHITECTURES[name](channels=c, image_size=h, num_classes=ds.num_classes)


@torch.no_grad()
def apply(fn, x: torch.Tensor, *, batch_size: int = 1000) -> torch.Tensor:
    return torch.cat([fn(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]) if len(x) else fn(x)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((apply(model, x).argmax(1) == y).float().mean())


def settle_batch_norm(model: nn.Module, x: torch.Tensor, gen: torch.Generator, *, limit: int = 2048,
                      batch_size: int = 256) -> None:
    """The batch-norm layers' statistics recomputed as plain averages over up to ``limit`` training images (in
    train mode, no gradient): after few steps their running averages still hold their start values, and a model
    that learnt its task predicts one class in eval mode (600 MNIST records, 30 steps: 0.49 accurate in train mode,
    0.12 in eval). A model without batch norm (the CNN, the MLP) is left as it is."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches below
    model.train()
    idx = torch.randperm(len(x), generator=gen)[:limit]
    with torch.no_grad():
        for part in idx.split(batch_size):
            model(x[part])
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    model.eval()


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, seed: int,
        validation: tuple[torch.Tensor, torch.Tensor] | None = None, batch_size: int = 128, lr: float = 1e-3,
        desc: str | None = None, augmented: bool = False, flip: bool = False) -> dict:
    """Adam on cross-entropy for ``epochs`` passes (``augmented``: each batch through ``augment``); with
    ``validation``, the model ends at the epoch of best validation accuracy. Returns what was chosen. With ``desc``, a progress bar of that name on
    stderr (batches, rate, time left), as the training phases draw (``dpsynth -q`` hides it)."""
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    best = (-1.0, 0, None)
    quiet = {} if desc else {"disable": True}  # shown: TQDM_DISABLE (dpsynth -q) still hides it
    bar = tqdm(total=epochs * math.ceil(len(x) / batch_size), desc=desc, unit="batch", file=sys.stderr,
               mininterval=1.0, dynamic_ncols=True, **quiet)
    for epoch in range(1, epochs + 1):
        model.train()
        for idx in torch.randperm(len(x), generator=gen).split(batch_size):
            batch = augment(x[idx], gen, flip=flip) if augmented else x[idx]
            loss = nn.functional.cross_entropy(model(batch), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            bar.update()
        settle_batch_norm(model, x, gen)
        if validation is not None:
            acc = accuracy(model, *validation)
            if acc > best[0]:
                best = (acc, epoch, copy.deepcopy(model.state_dict()))
    bar.close()
    model.eval()
    if validation is None:
        return {"epochs": epochs, "selected_epoch": epochs, "selection": "none (fixed epochs)"}
    model.load_state_dict(best[2])
    return {"epochs": epochs, "selected_epoch": best[1], "validation_accuracy": best[0],
            "selection": "best epoch on held-out generated data"}


def reference_epochs(records: int, *, steps: int, batch_size: int) -> int:
    """Whole epochs of ``records`` that make about ``steps`` batches: ``ceil(steps × batch_size / records)``, at most
    ``steps``, so the batches never exceed 2 × ``steps``, or one epoch. (Uncapped, a reference smaller than one batch trained
    ``steps × batch_size / records`` one-batch epochs: 1,372 for 7 records where 150 batches were meant.)"""
    return max(1, min(math.ceil(steps * batch_size / records), steps))


class ReferenceClassifier:
    """The CNN trained on real reference data: features, class probabilities, predictions."""

    def __init__(self, reference: ImageDataset, *, steps: int, seed: int, batch_size: int = 64):
        x, y = reference.to_tensors()
        self.shape, self.num_classes = reference.shape, reference.num_classes
        self.model = build("cnn", reference, seed=seed)
        epochs = reference_epochs(len(reference), steps=steps, batch_size=batch_size)
        self.training = fit(self.model, x, y, epochs=epochs, seed=seed, batch_size=batch_size,
                            desc="evaluate: reference CNN on real records")

    def features(self, ds: ImageDataset) -> np.ndarray:
        return apply(self.model.features, pixels(ds)).double().numpy()

    def features_and_probabilities(self, ds: ImageDataset) -> tuple[np.ndarray, np.ndarray]:
        """Both in one pass over ``ds``."""
        h = apply(self.model.features, pixels(ds))
        with torch.no_grad():
            p = torch.softmax(self.model.head(h), 1)
        return h.double().numpy(), p.double().numpy()

    def probabilities(self, ds: ImageDataset) -> np.ndarray:
        return apply(lambda b: torch.softmax(self.model(b), 1), pixels(ds)).double().numpy()

    def predict(self, ds: ImageDataset) -> np.ndarray:
        return self.probabilities(ds).argmax(1)
