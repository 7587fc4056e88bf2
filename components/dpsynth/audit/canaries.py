"""The empirical audit's canaries and stand-ins: the white-box canaries in a method's own sanitizer (Dirac
gradients in DP-SGD's per-example gradients, :class:`GradientCanaries`; signed pixels in GS-WGAN's sanitized input
gradients, :class:`InputGradientCanaries`), the black-box out-of-distribution records (:class:`InputCanaries`) and
their scores, Private Evolution's histogram-bin canaries (:func:`vote_canaries`), and the public stand-in the audit
runs train on (:func:`stand_in`, :func:`stand_in_trainer`). What each attack scores: docs/privacy.md, "The empirical
audit's run, attacks and bound".
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch

from dpsynth.errors import ConfigError
from dpsynth.methods import registry

CANARY_SCALE = 1e3  # a canary's raw gradient norm, in units of the clip bound C (clipping must cut it)
BLACK_BOX_SHARE = 5  # at most n / 5 black-box canaries: about n / 10 join the n stand-in records
GENERATED = 1000  # samples of the released generator a black-box canary is compared with (GS-WGAN, DPAC)
ATTACKS = {
    "gradient": "white-box Dirac gradient canaries in the DP-SGD sanitizer's per-example gradients, scored by "
                "the privatized gradient at their coordinate",
    "input_gradient": "white-box input-gradient canaries: a signed Dirac direction on every sanitized per-sample "
                      "gradient ∂ℓ/∂G(z) of their shard's iterations, scored by the releases at their pixel",
    "votes": "white-box histogram-bin canaries: each canary record the only voter for a candidate of its own, "
             "scored by the sum of its bin's noisy votes over the audited rounds (Private Evolution)",
    "discriminator": "black-box input canaries (blocky out-of-distribution images, random labels) among the "
                     "training records, scored by the final private discriminator's output on them",
    "generator": "black-box input canaries (blocky out-of-distribution images, random labels) among the shards' "
                 "records, scored by minus their distance to the nearest sample of their label from the released "
                 "generator (GAN-Leaks)",
}
# the black-box score each white-box kind goes with: only DP-SGD's discriminator is a private output
BLACK_BOX = {"gradient": "discriminator", "input_gradient": "generator"}


# --- attack 1, white-box: DP-SGD's per-example gradients (DPGAN, dp-GAN) -------------------------------
class GradientCanaries:
    """m Dirac canaries on distinct coordinates of ``params`` (the sanitizer's parameters).

    ``included`` (the secret ½ coins) and every step's Poisson coins come from ``randomness``; the
    coordinates are public (they only say where to look)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], *, m: int, sample_rate: float, randomness):
        self.params = list(params)
        sizes = [p.numel() for p in self.params]
        total = sum(sizes)
        if m > total:
            raise ConfigError(f"audit.canaries: {m} canaries need as many distinct coordinates; the "
                              f"discriminator has {total} parameters")
        self.m, self.sample_rate, self.randomness = m, sample_rate, randomness
        self.coords = torch.randperm(total, generator=torch.Generator().manual_seed(public_seed()))[:m]
        self.offsets = np.cumsum([0, *sizes])
        self.included = randomness.poisson_mask(m, 0.5).cpu()
        self.scores = torch.zeros(m, dtype=torch.float64)

    def join(self, norm: float) -> bool:
        """Set ``p.grad_sample`` to the per-example gradients (``norm`` on the canary's coordinate) of this
        step's sampled canaries; False (nothing set) when none was sampled."""
        joined = (self.included & self.randomness.poisson_mask(self.m, self.sample_rate).cpu()).nonzero().flatten()
        if len(joined) == 0:
            return False
        coords = self.coords[joined]
        for j, p in enumerate(self.params):
            rows = torch.zeros(len(coords), p.numel(), dtype=p.dtype, device=p.device)
            here = (coords >= self.offsets[j]) & (coords < self.offsets[j + 1])
            rows[here.nonzero().flatten(), coords[here] - int(self.offsets[j])] = norm
            p.grad_sample = rows.view(len(coords), *p.shape)
        return True

    def at_coords(self, tensors: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """The canaries' coordinates of per-parameter tensors (None: zeros), in float64."""
        flat = [torch.zeros(p.numel(), dtype=torch.float64) if t is None else
                t.detach().reshape(-1).to("cpu", torch.float64) for p, t in zip(self.params, tensors)]
        return torch.cat(flat)[self.coords]

    def observe(self, known) -> None:
        """Add each canary's coordinate of the step's privatized gradient (``p.grad``), less ``known`` (the
        data records' part of it, at the same coordinates), to its score."""
        self.scores += self.at_coords([p.grad for p in self.params]) - known


class _SanitizerWithCanaries:
    """The trainer's own sanitizer; once per step, after the data records' chunks and before the noise,
    the step's sampled canaries join as one more chunk of per-example gradients (``p.grad_sample``), which
    the sanitizer clips and sums with the records' (one clip per example, one noise draw per step).

    The auditor of its own audit run subtracts the stand-in records' part: it reads the sanitizer's running
    clipped sum just before the canaries join (white-box; none of it depends on the canaries' coins, and
    the Poisson analysis of a canary holds given everything else), so a canary's score is its coordinate of
    the output less that sum. What is left is the canaries' clipped gradients and the noise: the white-box
    setting of Nasr et al. 2023. The records take the trainer's own ``train.grad_sample_mode`` (ghost
    clipping in the default recipe); the canaries, as per-example gradients, take the sanitizer's
    ``grad_sample`` path."""

    def __init__(self, sanitizer, canaries: GradientCanaries):
        self._inner, self._canaries = sanitizer, canaries

    def accumulate(self, losses=None) -> None:
        self._inner.accumulate(losses)  # the data records, by the trainer's own path

    def finalize(self) -> None:
        inner = self._inner
        running = {id(p): acc for group, sums in zip(inner.groups, inner._sums or ()) for p, acc in zip(group, sums)}
        known = self._canaries.at_coords([running.get(id(p)) for p in self._canaries.params])
        known /= inner.expected_batch_size
        if self._canaries.join(CANARY_SCALE * max(inner.bounds)):  # dp-GAN's bounds adapt: 1000 × the largest
            inner.accumulate()
        inner.finalize()
        self._canaries.observe(known)

    def __getattr__(self, name):
        return getattr(self._inner, name)


# --- attack 1, white-box: the sanitized input gradient ∂ℓ/∂G(z) (GS-WGAN, DPAC) --------------------------
class InputGradientCanaries:
    """m canaries of a shard-sampled input-gradient mechanism: canary i lives in shard ``shard[i]`` (public,
    balanced over the K shards) and owns pixel ``pixel[i]`` (distinct within its shard). ``included``: the
    secret ½ coins. Each release gives every canary fresh public signs s_ij = ±1 over the B rows, half of
    each (0 on an odd row out): the rows' common part at a pixel cancels in a score, and so does, on
    average, a canary of another shard that shares the pixel."""

    def __init__(self, *, m: int, num_shards: int, releases: int, image_numel: int, randomness):
        self.rng = torch.Generator().manual_seed(public_seed())
        self.m = m
        self.shard = torch.randperm(m, generator=self.rng) % num_shards
        self.pixel = torch.empty(m, dtype=torch.long)
        for k in range(num_shards):
            mine = (self.shard == k).nonzero().flatten()
            if len(mine) > image_numel:
                raise ConfigError(f"audit.canaries: {m} canaries over {num_shards} shards put {len(mine)} in one "
                                  f"shard, more than its releases' {image_numel} coordinates; at most "
                                  f"{num_shards * image_numel}")
            self.pixel[mine] = torch.randperm(image_numel, generator=self.rng)[:len(mine)]
        half = releases // 2
        self.pattern = torch.tensor([1.0] * half + [-1.0] * half + [0.0] * (releases % 2), dtype=torch.float64)
        self.included = randomness.poisson_mask(m, 0.5).cpu()
        self.scores = torch.zeros(m, dtype=torch.float64)

    def signs(self) -> torch.Tensor:
        """(m, B): a fresh public permutation of the balanced pattern for each canary."""
        order = torch.rand(self.m, len(self.pattern), generator=self.rng).argsort(dim=1)
        return self.pattern[order]

    def inject(self, grads: torch.Tensor, shard: int, norm: float, signs: torch.Tensor) -> torch.Tensor:
        """``grads`` (B × image) plus, on every row j, ``norm``·s_ij on pixel p_i of each included canary of
        ``shard``."""
        mine = (self.included & (self.shard == shard)).nonzero().flatten()
        rows = grads.flatten(1).clone()
        rows[:, self.pixel[mine].to(rows.device)] += norm * signs[mine].T.to(rows.device, rows.dtype)
        return rows.view_as(grads)

    def observe(self, released: torch.Tensor, signs: torch.Tensor) -> None:
        """Add Σ_j s_ij · release[j, p_i] to canary i's score: the release and the public design only."""
        flat = released.detach().flatten(1).to("cpu", torch.float64)
        self.scores += (flat[:, self.pixel] * signs.T).sum(0)


class _InputSanitizerWithCanaries:
    """GS-WGAN's own :class:`~dpsynth.mechanisms.dpsgd.InputGradientSanitizer` (clip each row, add noise, record the
    iteration's event), with the included canaries of the drawn shard added to its input rows and its
    output observed. ``shard`` is set by the trainer's per-shard hook (``generator_loss(k)``) just before:
    the mechanism's own secret choice decides whose canaries join, as it decides whose records do; the
    score never reads it."""

    def __init__(self, sanitizer, canaries: InputGradientCanaries):
        self._inner, self._canaries, self.shard = sanitizer, canaries, None

    def __call__(self, grads: torch.Tensor) -> torch.Tensor:
        if self.shard is None:
            raise RuntimeError("audit run: a release without the iteration's shard")
        signs = self._canaries.signs()
        grads = self._canaries.inject(grads, self.shard, CANARY_SCALE * self._inner.clip_norm, signs)
        self.shard = None
        released = self._inner(grads)
        self._canaries.observe(released, signs)
        return released

    def __getattr__(self, name):
        return getattr(self._inner, name)


def public_seed() -> int:
    return int.from_bytes(np.random.default_rng().bytes(8), "little") >> 1


def attach_white_box(kind: str, trainer, m: int):
    """The white-box canaries of ``kind`` in ``trainer``'s sanitizer; they keep the scores."""
    if kind == "gradient":
        canaries = GradientCanaries(list(trainer.state.D.parameters()), m=m, sample_rate=trainer.event.sample_rate,
                                    randomness=trainer.state.mechanism)
        trainer.sanitizer = _SanitizerWithCanaries(trainer.sanitizer, canaries)
        return canaries
    channels, size = trainer.spec["channels"], trainer.spec["image_size"]
    canaries = InputGradientCanaries(m=m, num_shards=trainer.K, releases=trainer.plan.releases,
                                     image_numel=channels * size * size, randomness=trainer.state.mechanism)
    sanitizer = trainer.sanitizer = _InputSanitizerWithCanaries(trainer.sanitizer, canaries)
    loss_for = trainer.generator_loss

    def generator_loss(k: int):  # the per-shard hook of GS-WGAN's iteration: tells the wrapper which shard drew
        sanitizer.shard = k
        return loss_for(k)

    trainer.generator_loss = generator_loss
    return canaries


# --- attack 2, black-box: out-of-distribution records -------------------------------------------------
class InputCanaries:
    """m records unlike the stand-in: a random 4 × 4 binary pattern blown up to the image size, a random
    label (public), each among the training records by a secret ½ coin (``included``)."""

    def __init__(self, m: int, image_shape: Sequence[int], num_classes: int, *, randomness):
        from dpsynth.data.dataset import ImageDataset

        rng = np.random.default_rng(public_seed())
        h, w, c = (int(d) for d in image_shape)
        blocks = rng.integers(0, 2, (m, 4, 4, c), dtype=np.uint8) * np.uint8(255)
        images = blocks[:, (np.arange(h) * 4) // h][:, :, (np.arange(w) * 4) // w]
        data = ImageDataset(record_ids=[f"canary-{i}" for i in range(m)], labels=rng.integers(0, num_classes, m),
                            images=np.ascontiguousarray(images), splits=None, num_classes=num_classes,
                            source="black-box canaries")
        self.m = m
        self.images, self.labels = data.to_tensors()
        self.included = randomness.poisson_mask(m, 0.5).cpu()
        self.slot = torch.from_numpy(rng.integers(0, 2**31, m))  # public; mod K: the shard of a shard method's canary


def add_records(method: registry.Method, trainer, canaries: InputCanaries) -> None:
    """The included black-box canaries join the audit run's training records, after the plan was made from
    the stand-in's n (so σ and q are the real run's; Poisson sampling reaches every record at rate q)."""
    x, y = canaries.images[canaries.included], canaries.labels[canaries.included]
    if method.pretrain == "shard":  # each into one shard (public, uniform: as a keyed hash puts a record)
        where = canaries.slot[canaries.included] % trainer.K
        trainer.shards = [(torch.cat([xs, x[where == k].to(xs.device)]), torch.cat([ys, y[where == k].to(ys.device)]))
                          for k, (xs, ys) in enumerate(trainer.shards)]
        return
    trainer.images = torch.cat([trainer.images, x.to(trainer.device)])
    trainer.labels = torch.cat([trainer.labels, y.to(trainer.device)])
    trainer.n = len(trainer.images)


@torch.no_grad()
def black_box_scores(kind: str, trainer, canaries: InputCanaries, *, seed: int) -> np.ndarray:
    """Higher: more likely a member. ``discriminator``: D's output (logit or critic value) on the canary and
    its label; ``generator``: minus the distance to the nearest of ``GENERATED`` samples of its label."""
    if kind == "discriminator":
        private = getattr(trainer.state, "D_private", None)
        if hasattr(private, "disable_hooks"):  # a plain forward: record nothing for the sanitizer (run is over)
            private.disable_hooks()
        D = trainer.state.D.eval()
        return torch.cat([D(x.to(trainer.device), y.to(trainer.device)).reshape(-1).double().cpu()
                          for x, y in zip(canaries.images.split(1024), canaries.labels.split(1024))]).numpy()
    from dpsynth.evaluation.mia import nearest_distances

    G = trainer.generator()[0].eval()  # the generator the method releases (GS-WGAN: the EMA copy)
    rng = torch.Generator(device=trainer.device).manual_seed(seed)
    labels = torch.arange(GENERATED, device=trainer.device) % trainer.num_classes
    samples = torch.cat([G.sample(len(part), labels=part, generator=rng)[0] for part in labels.split(500)])
    d = nearest_distances(canaries.images.flatten(1), canaries.labels, samples.flatten(1).cpu(), labels.cpu())
    return -d.numpy()


# --- the audit run -----------------------------------------------------------------------------------
def stand_in(n: int, image_shape: Sequence[int], num_classes: int, *, seed: int = 0, name: str = "stand-in"):
    """A public stand-in of the training data's shape: n uniform-noise images (H, W, C), uniform labels."""
    from dpsynth.data.dataset import ImageDataset

    rng = np.random.default_rng(seed)
    h, w, c = (int(d) for d in image_shape)
    return ImageDataset(record_ids=[f"{name}-{i}" for i in range(n)],
                        labels=rng.integers(0, num_classes, n).astype(np.int64),
                        images=rng.integers(0, 256, (n, h, w, c), dtype=np.uint8),
                        splits=None, num_classes=num_classes, source="public stand-in (uniform noise)")


def stand_in_trainer(cfg, *, n: int, image_shape: Sequence[int], num_classes: int, directory: str,
                     mechanism_seed: int | None = None):
    """The method's trainer on a stand-in of n records, built as the train stage builds it but for its
    pre-training runs, writing only under ``directory`` and tracking nothing; no canaries yet (the benchmark
    times it alone as the reference). The private warm-up is not run: its releases have audit runs of their
    own (:func:`audit_warmup_release`), and the generator fit after them is post-processing."""
    method = registry.get(cfg.train.method)
    cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, dir=directory),
                              tracking=dataclasses.replace(cfg.tracking, enabled=False),
                              warmup=dataclasses.replace(cfg.warmup, steps=0))
    data = stand_in(n, image_shape, num_classes, seed=cfg.train.seed)
    cls = method.trainer
    if method.pretrain == "shard":  # K shards, record i in shard i mod K; D_k from initialisation
        K = cfg.partition.num_shards
        return cls(cfg, [data.subset(np.arange(k, len(data), K)) for k in range(K)], mechanism_seed=mechanism_seed)
    if method.pretrain == "public":  # dp-GAN: its public records, a second stand-in (bounds, groups)
        z = cfg.zhang
        public = None
        if z.adaptive_clipping or z.grouping == "clustering":
            public = stand_in(max(z.public_batch_size, 2), data.shape, data.num_classes, seed=cfg.train.seed + 1,
                              name="stand-in-public")
        return cls(cfg, data, public=public, mechanism_seed=mechanism_seed)
    return cls(cfg, data, mechanism_seed=mechanism_seed)


# --- Private Evolution's histograms (mechanisms/private_evolution.py) -------------------------------------------
STAND_IN_BINS = 16  # the stand-in records' own candidates (their votes never touch a canary's bin)
STAND_IN_RECORDS = 500  # at most this many stand-in records vote beside the canaries


def vote_canaries(m: int, *, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The public design of the histogram audit: features of m canary records (canary i: the unit vector e_i) and of
    up to :data:`STAND_IN_RECORDS` stand-in records (uniform in the last :data:`STAND_IN_BINS` coordinates), and
    the candidates' features (candidate i: e_i, the canaries' bins first). Every candidate and record is of class 0,
    so each canary is the only record nearest to its own bin. Returns (canaries, stand-ins, candidates)."""
    d = m + STAND_IN_BINS
    eye = np.eye(d, dtype=np.float32)
    rng = np.random.default_rng(seed)
    stand_in = np.zeros((min(n, STAND_IN_RECORDS), d), np.float32)
    stand_in[:, m:] = rng.random((len(stand_in), STAND_IN_BINS))
    return eye[:m], stand_in / np.linalg.norm(stand_in, axis=1, keepdims=True), eye
