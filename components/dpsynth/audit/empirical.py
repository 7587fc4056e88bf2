"""Empirical privacy audit: a measured *lower* bound on ε, beside the accountant's upper bound.

It holds the audit run of a method's own trainer and sanitizer with canaries on a public stand-in, its two
attacks (white-box on the sanitizer's input, black-box on the records), :func:`epsilon_lower_bound` (Steinke,
Nasr & Jagielski 2023), :func:`audit_warmup_release`, :func:`comparison` and :func:`verdict`. What each attack
scores, why the bound holds at the stated confidence, and what the audit run costs: docs/privacy.md,
"The empirical audit's run, attacks and bound".
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Sequence

import numpy as np
import torch
from scipy import stats

from dpsynth.errors import ConfigError, PrivacyError
from dpsynth.methods import registry

CONFIDENCE = 0.95
# k = fraction · m / 2 canaries guessed "in" and as many "out"; the rest abstain (Bonferroni over these)
GUESS_FRACTIONS = (1.0, 0.5, 0.2, 0.1, 0.05, 0.02)
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


# --- the one-run bound ----------------------------------------------------------------------------
def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """An upper bound on P[≥ v of r guesses correct] for m canaries under an (ε, δ)-DP mechanism."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[B = v-1], P[B = v-2], …, P[B = 0]
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(tail + 2 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, *, delta: float, confidence: float = CONFIDENCE,
                        tolerance: float = 1e-6) -> float:
    """The largest ε (to ``tolerance``, rounded down) at which v correct of r guesses would have
    probability < 1 − confidence: the mechanism is not (ε, δ)-DP for any smaller ε, at that confidence."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence}")
    beta = 1 - confidence
    if p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < beta:
        lo, hi = hi, 2 * hi
        if hi > 1e3:  # v = r and δ = 0 with r huge: no finite ε explains it
            return math.inf
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_value(m, r, v, mid, delta) < beta else (lo, mid)
    return lo


def guess_and_bound(scores, included, *, delta: float, confidence: float = CONFIDENCE,
                    fractions: Sequence[float] = GUESS_FRACTIONS) -> dict:
    """Guess "in" for the k highest ``scores`` and "out" for the k lowest, for each k of the grid; the
    best ε_lower over the grid, each at confidence 1 − (1 − confidence)/|grid|."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    order = np.argsort(scores, kind="stable")
    per_k = 1 - (1 - confidence) / len(fractions)
    best = {"epsilon_lower": 0.0, "guesses": 0, "correct": 0}
    for f in fractions:
        k = max(1, int(f * m) // 2)
        correct = int(included[order[-k:]].sum() + (~included[order[:k]]).sum())
        eps = epsilon_lower_bound(m, 2 * k, correct, delta=delta, confidence=per_k)
        if eps > best["epsilon_lower"] or best["guesses"] == 0:
            best = {"epsilon_lower": eps, "guesses": 2 * k, "correct": correct}
    # the most this audit could prove (every guess right at the grid's best k): a gate at a larger ε cannot fail
    ceiling = max(epsilon_lower_bound(m, 2 * k, 2 * k, delta=delta, confidence=per_k)
                  for k in {max(1, int(f * m) // 2) for f in fractions})
    return {**best, "canaries": m, "confidence": confidence, "delta": delta, "guess_grid": list(fractions),
            "ceiling": ceiling}


def reachable_ceiling(m: int, reach: float, *, delta: float, confidence: float = CONFIDENCE,
                      fractions: Sequence[float] = GUESS_FRACTIONS) -> float:
    """The most an audit of m canaries can prove when an included canary leaves a trace only with probability
    ``reach`` (the sampling reaches it in some audited step: 1 − (1 − q)^steps): the bound of a perfect attack
    — every reached canary scored first, the rest (unreached, excluded) indistinguishable — with the expected
    counts. Below the all-correct ceiling when reach < 1: a sanitizer without noise cannot be caught above it."""
    per_k = 1 - (1 - confidence) / len(fractions)
    reached, excluded = reach * m / 2, m / 2
    rest = m - reached  # the scores a perfect attacker cannot tell apart
    best = 0.0
    for k in {max(1, int(f * m) // 2) for f in fractions}:
        ins = min(k, reached) + max(0.0, k - reached) * (m / 2 - reached) / rest
        outs = k * excluded / rest
        best = max(best, epsilon_lower_bound(m, 2 * k, min(2 * k, int(ins + outs)), delta=delta, confidence=per_k))
    return best


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
        self.coords = torch.randperm(total, generator=torch.Generator().manual_seed(_public_seed()))[:m]
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
        self.rng = torch.Generator().manual_seed(_public_seed())
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


def _public_seed() -> int:
    return int.from_bytes(np.random.default_rng().bytes(8), "little") >> 1


def _attach_white_box(kind: str, trainer, m: int):
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

        rng = np.random.default_rng(_public_seed())
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


def _add_records(method: registry.Method, trainer, canaries: InputCanaries) -> None:
    """The included black-box canaries join the audit run's training records, after the plan was made from
    the stand-in's n (so σ and q are the real run's; Poisson sampling reaches every record at rate q)."""
    x, y = canaries.images[canaries.included], canaries.labels[canaries.included]
    if method.warm_start == "shard":  # each into one shard (public, uniform: as a keyed hash puts a record)
        where = canaries.slot[canaries.included] % trainer.K
        trainer.shards = [(torch.cat([xs, x[where == k].to(xs.device)]), torch.cat([ys, y[where == k].to(ys.device)]))
                          for k, (xs, ys) in enumerate(trainer.shards)]
        return
    trainer.images = torch.cat([trainer.images, x.to(trainer.device)])
    trainer.labels = torch.cat([trainer.labels, y.to(trainer.device)])
    trainer.n = len(trainer.images)


@torch.no_grad()
def _black_box_scores(kind: str, trainer, canaries: InputCanaries, *, seed: int) -> np.ndarray:
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
    warm starts, writing only under ``directory`` and tracking nothing; no canaries yet (the benchmark
    times it alone as the reference). The private warm-up is not run: its releases have audit runs of their
    own (:func:`audit_warmup_release`), and the generator fit after them is post-processing."""
    method = registry.get(cfg.train.method)
    cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, dir=directory),
                              tracking=dataclasses.replace(cfg.tracking, enabled=False),
                              warmup=dataclasses.replace(cfg.warmup, steps=0))
    data = stand_in(n, image_shape, num_classes, seed=cfg.train.seed)
    cls = method.trainer
    if method.warm_start == "shard":  # K shards, record i in shard i mod K; D_k from initialisation
        K = cfg.partition.num_shards
        return cls(cfg, [data.subset(np.arange(k, len(data), K)) for k in range(K)], mechanism_seed=mechanism_seed)
    if method.warm_start == "public":  # dp-GAN: its public records, a second stand-in (bounds, groups)
        z = cfg.zhang
        public = None
        if z.adaptive_clipping or z.grouping == "clustering":
            public = stand_in(max(z.public_batch_size, 2), data.shape, data.num_classes, seed=cfg.train.seed + 1,
                              name="stand-in-public")
        return cls(cfg, data, public=public, mechanism_seed=mechanism_seed)
    return cls(cfg, data, mechanism_seed=mechanism_seed)


def audit_steps(cfg, total_steps: int) -> int:
    a = cfg.audit
    return total_steps if a.empirical == "full" else min(total_steps, a.quick_steps)


def comparison(method: registry.Method, accountant: str) -> str:
    """Why the canaries' ε_lower and the accounted ε of the audited steps measure the same thing."""
    if method.empirical_audit == "input_gradient":
        return (f"accounted by the `{accountant}` accountant, as the trained run: a canary is one record of one "
                "shard, so adding it changes only the iterations that draw its shard (rate 1/K, without "
                "replacement), each of whose B sanitized releases moves by ≤ 2C — the trace's replace_one event at "
                "the shard level, folded to σ/√B, exactly as for a record. The scores read the releases and the "
                "public canary design only, never the secret shard choice: an adversary who sees the choice is "
                "bound only by the revealed-choice account, not by this ε. The white-box canaries enter the "
                "gradients directly, not through D_k's training, so they do not test GS-WGAN's shard-state "
                "assumption; the black-box canaries, records of their shards, go through D_k and rest on it")
    return (f"accounted by the `{accountant}` accountant, as the trained run: a canary is one record, added or "
            "removed, joining each step by its own Poisson coin at rate q, its clipped gradient of norm ≤ C "
            "(dp-GAN: c_j per group) — the trace's add_remove event. The white-box score subtracts the stand-in "
            "records' clipped sum, which does not depend on the canaries' coins")


def _attack(kind: str, scores, included, *, delta: float, confidence: float) -> dict:
    bound = guess_and_bound(scores, included, delta=delta, confidence=confidence)
    return {"name": kind, "attack": ATTACKS[kind], **bound}


def run_audit(cfg, *, n: int, image_shape: Sequence[int], num_classes: int, mode: str | None = None,
              canaries: int | None = None, mechanism_seed: int | None = None) -> dict:
    """One audit run of ``cfg``'s method on a public stand-in with n records: ε_lower of both attacks and
    the accounted ε of the steps audited. ``mode``/``canaries`` override ``audit.empirical``/``audit.canaries``;
    ``mechanism_seed``: tests only."""
    import tempfile

    from dpsynth.privacy import MechanismTrace

    mode = mode or cfg.audit.empirical
    m = canaries or cfg.audit.canaries
    if mode not in ("quick", "full"):
        raise ConfigError(f"audit.empirical: an audit run needs 'quick' or 'full', got {mode!r}")
    method = registry.get(cfg.train.method)
    kind = method.empirical_audit
    if not kind:
        raise ConfigError(f"audit.empirical: the empirical audit supports train.method in "
                          f"{list(registry.empirical_audit_methods())}, not {cfg.train.method!r} (yet); "
                          "set audit.empirical=off")
    cfg = dataclasses.replace(cfg, audit=dataclasses.replace(cfg.audit, empirical=mode, canaries=m))
    if kind == "votes":
        return audit_votes(cfg, n=n, mechanism_seed=mechanism_seed)
    started = time.process_time()
    with tempfile.TemporaryDirectory(prefix="dpsynth-empirical-") as tmp:
        trainer = stand_in_trainer(cfg, n=n, image_shape=image_shape, num_classes=num_classes, directory=tmp,
                                   mechanism_seed=mechanism_seed)
        white = _attach_white_box(kind, trainer, m)
        black = InputCanaries(max(2, min(m, n // BLACK_BOX_SHARE)), image_shape, num_classes,
                              randomness=trainer.state.mechanism)
        _add_records(method, trainer, black)
        steps = audit_steps(cfg, trainer.total_steps)
        for _ in range(steps):  # the trainer's own step (train() adds checkpoints and logging)
            trainer.train_step()
        black_scores = _black_box_scores(BLACK_BOX[kind], trainer, black, seed=cfg.train.seed)
    audited = trainer.trace  # the sanitizer recorded each audited step's release itself
    if audited != MechanismTrace([trainer.event.with_count(steps)]):
        raise PrivacyError(f"audit run: {steps} steps audited, but the sanitizer recorded {audited!r}")
    p = cfg.privacy
    accountant = trainer.accountant.name
    accounted = trainer.accountant.epsilon(audited, delta=p.delta)
    each = 1 - (1 - cfg.audit.confidence) / 2  # two attacks: Bonferroni, so the larger bound holds at `confidence`
    attacks = [_attack(kind, white.scores.numpy(), white.included.numpy(), delta=p.delta, confidence=each),
               _attack(BLACK_BOX[kind], black_scores, black.included.numpy(), delta=p.delta, confidence=each)]
    reach = 1 - (1 - trainer.event.sample_rate) ** steps  # an included canary (or record) is ever sampled
    for a in attacks:  # what a perfect attack could prove at this sampling: the gate cannot fail above it
        a["ceiling"] = min(a["ceiling"], reachable_ceiling(a["canaries"], reach, delta=p.delta, confidence=each))
        a["reach"] = reach
    return {"epsilon_lower": max(a["epsilon_lower"] for a in attacks), "accounted_epsilon": accounted,
            "accountant": accountant, "canaries": m, "confidence": cfg.audit.confidence,
            "ceiling": max(a["ceiling"] for a in attacks), "attacks": attacks, "mode": mode,
            "method": cfg.train.method, "steps": steps, "noise_multiplier": trainer.event.noise_multiplier,
            "sample_rate": trainer.event.sample_rate, "comparison": comparison(method, accountant),
            "privacy_cost": "none: trained on a public stand-in of the same shape (uniform-noise images), "
                            "never on the sensitive records",
            "cpu_seconds": time.process_time() - started}


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


def audit_votes(cfg, *, n: int, mechanism_seed: int | None = None, noise_multiplier: float | None = None) -> dict:
    """One audit run of Private Evolution's histograms: the plan's σ and rounds (``noise_multiplier``: another σ,
    tests only), ``audit.canaries`` canary records each included by a secret ½ coin, voting by the mechanism's own
    :func:`~dpsynth.mechanisms.private_evolution.votes` beside the stand-in records, released by its own
    :func:`~dpsynth.mechanisms.private_evolution.noisy_votes` every round (each recorded in a trace); a canary's
    score is its bin's noisy votes summed over the rounds."""
    from dpsynth.mechanisms import private_evolution as pe
    from dpsynth.mechanisms.randomness import MechanismRandomness
    from dpsynth.privacy import MechanismTrace, get_accountant

    started = time.process_time()
    p, m = cfg.privacy, cfg.audit.canaries
    plan = pe.PRIVATE_EVOLUTION.plan(cfg, n)
    sigma = plan.noise_multiplier if noise_multiplier is None else noise_multiplier
    rounds = audit_steps(cfg, plan.steps)
    randomness = MechanismRandomness(secure_mode=p.secure_mode, seed=mechanism_seed)
    included = randomness.poisson_mask(m, 0.5).cpu().numpy()
    canaries, stand_in, candidates = vote_canaries(m, n=n, seed=_public_seed())
    records = np.concatenate([canaries[included], stand_in])
    labels = np.zeros(len(records), np.int64)
    trace, scores = MechanismTrace(), np.zeros(m)
    for _ in range(rounds):
        query = pe.votes(records, labels, candidates, np.zeros(len(candidates), np.int64))
        scores += pe.noisy_votes(query, noise_multiplier=sigma, randomness=randomness)[:m]
        trace.record(pe.full_batch_gaussian(plan.noise_multiplier))  # what the plan accounts for each round
    accountant = get_accountant(p.accountant)
    attack = _attack("votes", scores, included, delta=p.delta, confidence=cfg.audit.confidence)
    attack["reach"] = 1.0
    return {"epsilon_lower": attack["epsilon_lower"], "accounted_epsilon": accountant.epsilon(trace, delta=p.delta),
            "accountant": accountant.name, "canaries": m, "confidence": cfg.audit.confidence,
            "ceiling": attack["ceiling"], "attacks": [attack], "mode": cfg.audit.empirical,
            "method": cfg.train.method, "steps": rounds, "noise_multiplier": plan.noise_multiplier, "sample_rate": 1.0,
            "comparison": f"accounted by the `{accountant.name}` accountant, as the trained run: a canary is one "
                          "record, added or removed, its one vote in one bin of every round's histogram — the "
                          "trace's full-batch add_remove event of sensitivity 1",
            "privacy_cost": "none: canaries and stand-in records of a public design (unit vectors of the feature "
                            "space), never the sensitive records",
            "cpu_seconds": time.process_time() - started}


VERDICTS = ("passed", "failed", "inconclusive")


def verdict(lower: float, accounted: float, ceiling: float) -> str:
    """failed: ε_lower > the accounted ε; inconclusive: no audit of this size could have failed (the largest
    provable ε is ≤ the accounted ε), so it passed nothing; passed: it could have failed and did not."""
    if lower > accounted:
        return "failed"
    return "passed" if ceiling > accounted else "inconclusive"


def gate(result: dict) -> dict:
    """The check of one audit run of the training steps: fails when an attack's ε_lower > the accounted ε of
    the audited steps; ``verdict`` inconclusive (``passed`` None: neither) when it could not have failed."""
    lower, eps = result["epsilon_lower"], result["accounted_epsilon"]
    v = verdict(lower, eps, result["ceiling"])
    found = "; ".join(f"{a['name']}: ε_lower={a['epsilon_lower']:.4g} (m={a['canaries']}, {a['correct']}/"
                      f"{a['guesses']} guesses correct)" for a in result["attacks"])
    return {"name": "empirical", "passed": {"passed": True, "failed": False}.get(v), "verdict": v,
            "detail": (f"ε_lower={lower:.4g} ({100 * result['confidence']:.4g}% confidence over both attacks, "
                       f"{result['mode']}, {result['steps']} steps; {found}) {'≤' if v != 'failed' else '>'} accounted "
                       f"ε={eps:.4g} of the audited steps"
                       + ("" if v != "failed" else ": the code does not implement the accounted mechanism")
                       + ("" if v != "inconclusive" else
                          f"; INCONCLUSIVE: with m={result['canaries']} no audit can prove more than "
                          f"ε={result['ceiling']:.3g}{_reached(result)}, below the accounted ε (more canaries, or "
                          "audit a lower ε)"))}


def _reached(result: dict) -> str:
    reach = min((a.get("reach", 1.0) for a in result["attacks"]), default=1.0)
    return "" if reach >= 1 else f" when {reach:.0%} of the included canaries are ever sampled in {result['steps']} steps"


# --- the warm-up's Gaussian releases (training/warmup.py, mechanisms/central_images.py) -----------------------
NOISE_TEST_ALPHA = 1e-6  # the noise test fails a release whose noise is this improbably small under the plan's σ


def audited_releases(cfg) -> list[tuple[str, float, float]]:
    """The warm-up's releases as (name, σ, scale): the noise std on every coordinate of the query is σ·scale
    (scale = C for the class, polarity and style sums, C_v² for the moment matrices, 1 for the intensity
    histogram's). :func:`pixel_bound` says how far one record may move a pixel's (a bin's) coordinate."""
    from dpsynth.mechanisms import warmup_releases

    w = cfg.warmup
    if not w.central_images:
        return []
    every = {"class_means": (w.noise_multiplier, w.clip), "styles": (w.styles_noise_multiplier, w.clip),
             "variations": (w.variations_noise_multiplier, w.variations_clip ** 2),
             "intensity": (w.intensity_noise_multiplier, 1.0), "polarity": (w.polarity_noise_multiplier, w.clip)}
    on = {"class_means": True, "styles": bool(w.styles), "variations": bool(w.variations),
          "intensity": w.intensity_noise_multiplier is not None, "polarity": w.polarity_noise_multiplier is not None}
    return [(name, *every[name]) for name in warmup_releases.RELEASES if on[name]]


def pixel_bound(name: str, scale: float) -> float:
    """The most one record moves one pixel's coordinate of release ``name``: a record's [image, count] vector
    has norm ≤ C with its count coordinate C/√2, so its image part ≤ C/√2 (class, polarity and style sums); a
    residual r of norm ≤ C_v moves a diagonal entry by r_p² ≤ C_v² (moment matrices); a record's intensity
    histogram sums to 1, so it moves a bin by ≤ 1."""
    return scale if name in ("variations", "intensity") else scale / math.sqrt(2)


class _Observed(Exception):
    """Stops the warm-up once the audited release is out (the later ones are not audited by this run)."""


def dirac_records(m: int, image_shape: Sequence[int], num_classes: int, *, value: float, shared: bool = False):
    """m canary records (N×C×H×W in [-1, 1] units, far out of range), canary i of class i mod K (public) with
    one pixel p_i (distinct within its class, public) at ``value`` on [0, 1] and the rest background: the
    query's clipping must cut each to its bound. ``shared`` (a release summed over the classes): the pixels are
    distinct over all canaries, and there are at most as many canaries as pixels. Returns (images, labels, pixels)."""
    h, w, c = (int(d) for d in image_shape)
    d = h * w * c
    m = min(m, d) if shared else m
    labels = torch.arange(m) % num_classes
    per_class = -(-m // num_classes)
    if per_class > d:
        raise ConfigError(f"audit.canaries: {m} canaries over {num_classes} classes need {per_class} distinct "
                          f"pixels per class; the images have {d}")
    rng = torch.Generator().manual_seed(_public_seed())
    if shared:
        pixels = torch.randperm(d, generator=rng)[:m]
    else:
        pixels = torch.empty(m, dtype=torch.long)
        for k in range(num_classes):
            mine = (labels == k).nonzero().flatten()
            pixels[mine] = torch.randperm(d, generator=rng)[:len(mine)]
    images = torch.full((m, d), -1.0, dtype=torch.float64)
    images[torch.arange(m), pixels] = 2 * value - 1
    return images.view(m, c, h, w), labels, pixels


def flat_records(m: int, image_shape: Sequence[int], num_classes: int):
    """m ≤ bins canary records for the intensity histogram: canary i a flat image at the centre of bin i (so its
    own histogram is bin i alone, the most it can move it: 1), of class i mod K. Returns (images, labels, bins)."""
    from dpsynth.mechanisms.central_images import INTENSITY_BINS

    h, w, c = (int(d) for d in image_shape)
    bins = torch.arange(min(m, INTENSITY_BINS))
    value = (bins.double() + 0.5) / INTENSITY_BINS
    images = (2 * value - 1).view(-1, 1, 1, 1).expand(len(bins), c, h, w).contiguous()
    return images, bins % num_classes, bins


def audit_warmup_release(cfg, name: str, *, image_shape: Sequence[int], num_classes: int, canaries: int,
                         confidence: float, randomness=None) -> dict:
    """One audit run of the warm-up's release ``name``, by the warm-up's own code (:func:`warmup.release`) with
    the mechanism's secret coins, on a public stand-in that holds no record but the canaries (a Gaussian
    release's guarantee does not depend on the other records, and none need subtracting): m Dirac canary
    records at ``CANARY_SCALE`` × their bound, each included by a secret ½ coin, join that release alone (the
    releases before it see no canary, so the ones it reads — the templates — do not depend on the coins).
    Three tests of the raw output (before post-processing) against the plan's σ and bound:

    * the one-run bound (:func:`guess_and_bound`, at ``confidence``): canary i's score is the released sum at its
      pixel in its class's rows (the largest over the class's style groups; the moment matrices' diagonal):
      the release and the public design only;
    * the noise test: the output less the noiseless query, over all its independent coordinates, has a
      mean square that N(0, (σ·scale)²) noise would make smaller with probability < ``NOISE_TEST_ALPHA``
      (χ² with that many degrees of freedom): the noise is smaller than the plan's;
    * the bound: the noiseless query at an included canary's coordinate exceeds :func:`pixel_bound`
      (clipping missing or looser than accounted).

    The noise and bound tests can fail at any ε; the one-run bound only below its ceiling, which says so."""
    from dpsynth.training import warmup
    from dpsynth.privacy import MechanismTrace, full_batch_gaussian, get_accountant
    from dpsynth.mechanisms import central_images
    from dpsynth.mechanisms.randomness import MechanismRandomness

    started = time.process_time()
    spec = {n: (sigma, scale) for n, sigma, scale in audited_releases(cfg)}
    if name not in spec:
        raise ConfigError(f"audit.empirical: the warm-up has no {name!r} release in this configuration")
    sigma, scale = spec[name]
    randomness = randomness or MechanismRandomness()
    shared = name == "variations" and cfg.warmup.variations_shared  # one matrix over every class
    h, w, c = (int(d) for d in image_shape)
    if name == "intensity":  # one flat canary per bin, at the bin's centre: its histogram is that bin alone
        images, labels, pixels = flat_records(min(canaries, central_images.INTENSITY_BINS), image_shape, num_classes)
    elif name == "polarity":  # its features are luminance (H·W): a Dirac spike on every channel at one pixel
        images, labels, pixels = dirac_records(canaries, (h, w, 1), num_classes, value=CANARY_SCALE * scale)
        images = images.expand(-1, c, -1, -1).contiguous()
    else:
        images, labels, pixels = dirac_records(canaries, image_shape, num_classes, value=CANARY_SCALE * scale,
                                               shared=shared)
    canaries = len(labels)
    included = randomness.poisson_mask(canaries, 0.5).cpu()
    seen = {}

    def observe(release: str, noisy, query):
        if release == name:
            seen["noisy"], seen["query"] = noisy.detach().cpu().double(), query.detach().cpu().double()
            raise _Observed

    try:  # trace None: the audit run records nothing (its releases are never released)
        warmup.release(cfg, torch.empty(0, c, h, w), torch.empty(0, dtype=torch.long), num_classes=num_classes,
                       randomness=randomness, trace=None, canaries=(name, images[included], labels[included]),
                       observe=observe)
    except _Observed:
        pass
    if "noisy" not in seen:
        raise PrivacyError(f"audit run: the warm-up's {name} release was never observed")
    noisy, query = seen["noisy"], seen["query"]
    scores, at_canary = _warmup_scores(name, noisy, labels, pixels, num_classes), \
        _warmup_scores(name, query, labels, pixels, num_classes)
    if name == "variations":  # the independent coordinates: the upper triangles
        iu = torch.triu_indices(noisy.shape[1], noisy.shape[1])
        residual = (noisy - query)[:, iu[0], iu[1]]
    else:
        residual = noisy - query
    z = residual.flatten() / (sigma * scale)
    dof = z.numel()
    ratio = float(z.square().mean().sqrt())
    p_small = float(stats.chi2.cdf(float(z.square().sum()), dof))
    largest = float(at_canary[included].max()) if included.any() else 0.0
    bound = guess_and_bound(scores.numpy(), included.numpy(), delta=cfg.privacy.delta, confidence=confidence)
    # this release's own event (its σ, full batch), compared with this release's bound
    event = full_batch_gaussian(sigma)
    accountant = cfg.privacy.accountant if get_accountant(cfg.privacy.accountant).supports(event) else "rdp"
    accounted = get_accountant(accountant).epsilon(MechanismTrace([event]), delta=cfg.privacy.delta)
    bound_at = pixel_bound(name, scale)
    # 1e-6: the other canaries' residuals (background less the public centres) add their own tiny r_j(p)² to a
    # canary's diagonal entry, most of all in the shared release's one matrix; a missing or looser clip is ≥ √2×
    noise_ok, bound_ok = p_small >= NOISE_TEST_ALPHA, largest <= bound_at * (1 + 1e-6)
    one_run = verdict(bound["epsilon_lower"], accounted, bound["ceiling"])
    v = "failed" if one_run == "failed" or not noise_ok or not bound_ok else "passed"
    return {"name": f"warmup.{name}", "verdict": v, "epsilon_lower": bound["epsilon_lower"],
            "accounted_epsilon": accounted, "accountant": accountant, "ceiling": bound["ceiling"],
            "canaries": canaries, "guesses": bound["guesses"], "correct": bound["correct"], "confidence": confidence,
            "one_run": "conclusive" if one_run != "inconclusive" else "inconclusive (ε above its ceiling)",
            "noise_multiplier": sigma,
            "noise_test": {"passed": noise_ok, "noise_std_over_planned": ratio, "coordinates": dof,
                           "p_value_smaller": p_small, "alpha": NOISE_TEST_ALPHA},
            "bound_test": {"passed": bound_ok, "largest_canary_coordinate": largest, "bound": bound_at},
            "cpu_seconds": time.process_time() - started}


def _warmup_scores(name: str, out: torch.Tensor, labels: torch.Tensor, pixels: torch.Tensor,
                   num_classes: int) -> torch.Tensor:
    """Canary i's coordinate of a release's output: its class's row at its pixel (styles and polarity: the largest
    over its class's groups, which are class-major; variations: the diagonal entry; intensity: its bin)."""
    if name == "intensity":  # one vector of bins, a canary's pixel its bin
        return out[pixels]
    if name == "variations":  # shared: one matrix (1, D, D), every canary's
        return out[labels * (len(out) > 1), pixels, pixels]
    per_class = len(out) // num_classes
    rows = out[:, :-1].reshape(num_classes, per_class, -1)  # the count coordinate is every canary's: left out
    return rows[labels, :, pixels].amax(dim=1)


def warmup_check(result: dict) -> dict:
    """The check of one warm-up release's audit run."""
    nt, bt = result["noise_test"], result["bound_test"]
    failed = [why for ok, why in (
        (result["epsilon_lower"] <= result["accounted_epsilon"], "ε_lower above the accounted ε"),
        (nt["passed"], f"noise std {nt['noise_std_over_planned']:.4g} × the plan's σ·scale (p = {nt['p_value_smaller']:.3g} "
                       f"< {nt['alpha']:g}): the release adds less noise than accounted"),
        (bt["passed"], f"a canary moved a coordinate by {bt['largest_canary_coordinate']:.4g} > its bound "
                       f"{bt['bound']:.4g}: the query is not clipped as accounted")) if not ok]
    return {"name": f"empirical_{result['name']}", "passed": result["verdict"] == "passed", "verdict": result["verdict"],
            "detail": (f"ε_lower={result['epsilon_lower']:.4g} (m={result['canaries']}, {result['correct']}/"
                       f"{result['guesses']} correct; one-run bound {result['one_run']}, largest provable "
                       f"{result['ceiling']:.3g}) vs accounted ε={result['accounted_epsilon']:.4g} of this release; "
                       f"noise std {nt['noise_std_over_planned']:.4f} × planned over {nt['coordinates']} coordinates; "
                       f"largest canary coordinate {bt['largest_canary_coordinate']:.4g} ≤ bound {bt['bound']:.4g}"
                       if not failed else "; ".join(failed) + ": the code does not implement the accounted mechanism")}


# --- what the audit stage adds ----------------------------------------------------------------------
MLFLOW_METRICS = {
    "epsilon_lower_empirical": "one-run canary audits on public stand-ins (no sensitive record enters): the largest "
                               "of every audited part's bound",
    "epsilon_lower_white_box": "the training steps' white-box canaries' bound (same audit run)",
    "epsilon_lower_black_box": "the training steps' black-box canaries' bound (same audit run)",
    "epsilon_accounted_empirical": "ε of the audited training steps by the method's accountant (the plan)",
    "epsilon_lower_warmup": "the largest bound of the warm-up releases' canary audits (public stand-in)",
    "empirical_canaries": "audit.canaries (configuration)",
    "empirical_cpu_seconds": "CPU time of the audit runs (public stand-ins: data-independent)",
}


def mode_for(cfg) -> str | None:
    """The audit run's mode: ``auto`` (the default) is quick for the methods that have an empirical audit and
    none for the others; None: no audit run."""
    mode = cfg.audit.empirical
    if mode == "auto":
        return "quick" if registry.get(cfg.train.method).empirical_audit else None
    return None if mode == "off" else mode


def stage_audit(cfg, partition: dict) -> dict | None:
    """The audit stage's empirical step (None when it does not run): one audit run of the training steps and
    one per warm-up release, each with its check; ``verdict`` failed if any failed, else inconclusive if any
    is, else passed."""
    mode = mode_for(cfg)
    if mode is None:
        return None
    n, shape, classes = stand_in_shape(partition)
    return audit_all(cfg, n=n, image_shape=shape, num_classes=classes, mode=mode)


def audit_all(cfg, *, n: int, image_shape: Sequence[int], num_classes: int, mode: str) -> dict:
    """Every audit run of ``cfg``'s mechanism: the training steps (``mode``) and each warm-up release; the
    overall verdict and the checks (what :func:`stage_audit` returns; ``dpsynth audit empirical`` prints it)."""
    started = time.process_time()
    shape, classes = image_shape, num_classes
    releases = [name for name, _, _ in audited_releases(cfg)]
    # β = 1 − confidence split over the parts (Bonferroni): the largest of their bounds holds at `confidence`
    each = 1 - (1 - cfg.audit.confidence) / (1 + len(releases))
    training = run_audit(dataclasses.replace(cfg, audit=dataclasses.replace(cfg.audit, confidence=each)), n=n,
                         image_shape=shape, num_classes=classes, mode=mode)
    training = {**training, "name": "training", "check": gate(training)}
    training["verdict"] = training["check"]["verdict"]
    parts = [training]
    for name in releases:
        part = audit_warmup_release(cfg, name, image_shape=shape, num_classes=classes, canaries=cfg.audit.canaries,
                                    confidence=each)
        parts.append({**part, "check": warmup_check(part)})
    verdicts = {p["verdict"] for p in parts}
    overall = "failed" if "failed" in verdicts else "inconclusive" if "inconclusive" in verdicts else "passed"
    return {"verdict": overall, "epsilon_lower": max(p["epsilon_lower"] for p in parts),
            "canaries": cfg.audit.canaries, "confidence": cfg.audit.confidence, "mode": mode,
            "components": parts, "cpu_seconds": time.process_time() - started,
            "checks": [p["check"] for p in parts]}


def stand_in_shape(partition: dict) -> tuple[int, list[int], int]:
    """(n training records, image shape H×W×C, classes) from a partition manifest: public counts and shapes."""
    n = sum(o["rows"] for o in partition["outputs"] if o.get("role") == "shard")
    details = partition.get("details") or {}
    shape, classes = details.get("image_shape"), details.get("num_classes")
    if not n or not shape or not classes:
        raise ConfigError("audit.empirical: the partition manifest records no training records, image_shape "
                          "or num_classes; run dpsynth partition first")
    return n, shape, classes


def markdown(result: dict | None) -> str:
    """The report's section: the verdict, ε_lower beside ε per audited part, and the training steps' attacks."""
    if not result:
        return ("\n## Empirical audit\n\nNot run (audit.empirical=off, or the method has no empirical audit): "
                "no measured lower bound.\n")
    parts = "".join(
        f"| {p['name']} | **{p['verdict']}** | {p['epsilon_lower']:.4g} | {p['accounted_epsilon']:.4g} | "
        f"{p['ceiling']:.3g} | {p['canaries']} | " + (
            f"{p['mode']}, {p['steps']} steps, σ = {p['noise_multiplier']:.4g}, q = {p['sample_rate']:.4g}"
            if p["name"] == "training" else
            f"σ = {p['noise_multiplier']:.4g}; noise std {p['noise_test']['noise_std_over_planned']:.4f} × planned over "
            f"{p['noise_test']['coordinates']} coordinates; largest canary coordinate "
            f"{p['bound_test']['largest_canary_coordinate']:.4g} ≤ {p['bound_test']['bound']:.4g}; one-run bound "
            f"{p['one_run']}") + " |\n" for p in result["components"])
    out = ("\n## Empirical audit (one-run canary audits)\n\n"
           f"Verdict: **{result['verdict'].upper()}**. ε_lower = **{result['epsilon_lower']:.4g}** "
           f"({result['confidence']:.0%} confidence: each of the {len(result['components'])} parts at "
           f"{result['components'][0]['confidence']:.2%}), the largest over the audited parts, each against the "
           f"accounted ε of that part ({result['cpu_seconds']:.1f} CPU-s).\n\n"
           "| part | verdict | ε_lower | accounted ε | largest provable ε | canaries m | what was measured |\n"
           "|---|---|---|---|---|---|---|\n" + parts +
           "\npassed: the test could have failed and did not; failed: the code does not implement the accounted "
           "mechanism; inconclusive: with m canaries no one-run audit can prove an ε as large as the accounted "
           "one, so nothing was shown. Every warm-up release (intensity histogram, class means, polarity shapes, style "
           "groups, variation directions: those the configuration makes) has its audit run, and is also tested "
           "against the plan's σ and bound directly (noise and bound tests, which can fail at any ε); the intensity "
           "histogram's one-run bound has one canary per bin (16) and so little power, and its noise test 16 "
           "coordinates (it catches noise that is missing, not noise that is somewhat smaller).\n")
    training = next((p for p in result["components"] if p["name"] == "training"), None)
    if training:
        rows = "".join(f"| {a['name']} | {a['epsilon_lower']:.4g} | {a['ceiling']:.3g} | {a['canaries']} | "
                       f"{a['guesses']} | {a['correct']} | {a['attack']} |\n" for a in training["attacks"])
        out += ("\n### The training steps\n\n"
                "| attack | ε_lower | largest provable ε | canaries m | guesses | correct | how |\n"
                "|---|---|---|---|---|---|---|\n" + rows +
                f"\nWhat makes them comparable: {training['comparison']}.\n\n"
                f"Privacy cost of the audit runs: {training['privacy_cost']}; the warm-up releases' canaries join a "
                "stand-in that holds no other record.\n")
    return out


def log_mlflow(result: dict | None, *, tracking_uri: str | None = None, also: Sequence[str | None] = ()) -> None:
    """The empirical figures on the active (audit) MLflow run; its tags also on the runs ``also`` names."""
    if not result:
        return
    from dpsynth import tracking

    parts = {p["name"]: p for p in result["components"]}
    metrics = {"epsilon_lower_empirical": result["epsilon_lower"], "empirical_canaries": result["canaries"],
               "empirical_cpu_seconds": result["cpu_seconds"]}
    if "training" in parts:
        white, *black = parts["training"]["attacks"]  # Private Evolution's histograms: one white-box attack
        metrics.update({"epsilon_lower_white_box": white["epsilon_lower"],
                        "epsilon_accounted_empirical": parts["training"]["accounted_epsilon"]})
        if black:
            metrics["epsilon_lower_black_box"] = black[0]["epsilon_lower"]
    warm = [p["epsilon_lower"] for name, p in parts.items() if name.startswith("warmup.")]
    if warm:
        metrics["epsilon_lower_warmup"] = max(warm)
    tracking.log_run(tracking.LoggedKeys(metrics=MLFLOW_METRICS), metrics=metrics, tags=tracking.empirical_tags(result))
    for run_id in dict.fromkeys(r for r in also if r):
        tracking.log_run(None, tags=tracking.empirical_tags(result), run_id=run_id, tracking_uri=tracking_uri)
