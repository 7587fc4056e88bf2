"""Empirical privacy audit: a measured *lower* bound on ε, beside the accountant's upper bound.

The accountant proves ε for the mechanism it was told about; nothing in the trace shows that the code
implements that mechanism (a sanitizer that clips after summing, noise added to the wrong buffer).
This module measures the other side, after Steinke, Nasr & Jagielski, "Privacy Auditing with One (1)
Training Run" (NeurIPS 2023, arXiv:2305.08846):

* an **audit run** of the method's own trainer and sanitizer, with m *canaries*, each included with
  probability ½ by a secret coin (:class:`~dpsynth.privacy.randomness.MechanismRandomness`);
* a score per canary, and guesses: the k highest scores "in", the k lowest "out", the rest abstain;
* :func:`epsilon_lower_bound`: the largest ε for which v correct guesses out of r would have
  probability < β = 1 − confidence under (ε, δ)-DP (their Theorem 3 with the δ term of their
  Appendix D, implemented here from the statement: P[≥ v correct] ≤ P[Binomial(r, q) ≥ v] +
  2mδ · max_{1≤i≤v} P[v − i ≤ Binomial(r, q) < v] / i, q = e^ε / (1 + e^ε)).

The number of guesses k is chosen from a fixed grid (:data:`GUESS_FRACTIONS`); the reported bound is
the best over the grid at confidence 1 − β/|grid| each (Bonferroni), so choosing k after seeing the
scores keeps the 95 % guarantee.

**White-box gradient canaries (DP-SGD discriminators: DPGAN, and dp-GAN of Zhang et al.'s critic).**
Canary i is a record whose per-example gradient is ``CANARY_SCALE`` times the largest clip bound in
use (C; dp-GAN's per-group bounds c_j) on one coordinate c_i of the discriminator's parameters
(a Dirac canary, coordinates distinct and random). In every step each included canary joins the
batch by its own Poisson coin at the trainer's rate q, exactly as a record does; its gradient is
appended to the per-example gradients the sanitizer (:class:`~dpsynth.privacy.dpsgd.GradientSanitizer`)
reads, so it is clipped, summed and noised by the same code as the data. The auditor sees each step's
privatized gradient (the mechanism's output) and scores canary i by the sum over steps of its
coordinate c_i, less the stand-in records' clipped part of it (see :class:`_SanitizerWithCanaries`). With a correct sanitizer a canary moves its coordinate by at most C/(2B) per step,
under noise σC/(2B); without noise or without clipping the canaries stand out and ε_lower exceeds ε.

**What the audit run costs.** It trains on a *public stand-in of the same shape* (n uniform-noise
images of the training data's size and channels, uniform labels), never on the sensitive records, so
it spends no privacy of the population and needs no ledger reservation; its σ, q, batch and steps are
the real run's (the same privacy plan from the same n). ``quick`` audits the first
``audit.quick_steps`` steps, ``full`` all of them; ε_lower is compared with the accounted ε of the
steps audited (the warm-up release, which the canaries never enter, is left out of both).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Sequence

import numpy as np
import torch
from scipy import stats

from dpsynth.config import EMPIRICAL_AUDIT_METHODS as SUPPORTED_METHODS
from dpsynth.errors import ConfigError, PrivacyError

CONFIDENCE = 0.95
# k = fraction · m / 2 canaries guessed "in" and as many "out"; the rest abstain (Bonferroni over these)
GUESS_FRACTIONS = (1.0, 0.5, 0.2, 0.1, 0.05, 0.02)
CANARY_SCALE = 1e3  # a canary's raw gradient norm, in units of the clip bound C (clipping must cut it)
ATTACK = "white-box Dirac gradient canaries, scored by the privatized gradient at their coordinate"


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


# --- white-box gradient canaries in the sanitizer's input -----------------------------------------
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

    def inject(self, norm: float) -> None:
        """Append the per-example gradients (``norm`` on the canary's coordinate) of this step's sampled
        canaries to every ``p.grad_sample``."""
        joined = (self.included & self.randomness.poisson_mask(self.m, self.sample_rate).cpu()).nonzero().flatten()
        coords = self.coords[joined]
        for j, p in enumerate(self.params):
            rows = torch.zeros(len(coords), p.numel(), dtype=p.dtype, device=p.device)
            here = (coords >= self.offsets[j]) & (coords < self.offsets[j + 1])
            rows[here.nonzero().flatten(), coords[here] - int(self.offsets[j])] = norm
            p.grad_sample = torch.cat([p.grad_sample, rows.view(len(coords), *p.shape)])

    def flat_grad(self):
        return torch.cat([p.grad.detach().reshape(-1).to("cpu", torch.float64) for p in self.params])[self.coords]

    def observe(self, known) -> None:
        """Add each canary's coordinate of the step's privatized gradient (``p.grad``), less ``known`` (the
        data records' part of it, at the same coordinates), to its score."""
        self.scores += self.flat_grad() - known


class _SanitizerWithCanaries:
    """The trainer's own sanitizer, with the canaries' gradients appended to its input once per step
    and the output read after ``finalize``; everything else is the sanitizer itself.

    The auditor of its own audit run knows the stand-in records and which of them each step sampled
    (none of it depends on the canaries' coins), so it subtracts their part: a second, noiseless
    sanitizer of the same class over the same groups and bounds sums the data records' clipped
    gradients, and a canary's score is its coordinate of the output less that sum. What is left is the
    canaries' clipped gradients and the noise: the white-box setting of Nasr et al. 2023."""

    def __init__(self, sanitizer, canaries: GradientCanaries):
        self._inner, self._canaries, self._pending, self._data = sanitizer, canaries, True, None

    def accumulate(self, losses=None) -> None:
        if losses is not None:  # the trainer hands per-example losses: backward fills grad_sample (ew/hooks)
            if losses.dim() != 1:
                raise ValueError(f"losses: need one loss per example, shape (batch,), got {tuple(losses.shape)}")
            losses.sum().backward()
        params = [p for g in self._inner.groups for p in g]
        if self._pending:
            self._data = type(self._inner)(self._inner.groups, max_grad_norm=self._inner.bounds, noise_multiplier=0,
                                           expected_batch_size=self._inner.expected_batch_size)
        samples = [p.grad_sample for p in params]
        self._data.accumulate()  # clears grad_sample: put it back for the real sanitizer
        for p, s in zip(params, samples):
            p.grad_sample = s
        if self._pending:  # 1000 × the largest bound in use, so clipping must cut it (dp-GAN's bounds adapt)
            self._canaries.inject(CANARY_SCALE * max(self._inner.bounds))
            self._pending = False
        self._inner.accumulate()

    def finalize(self) -> None:
        known = 0.0
        if self._data is not None:
            self._data.finalize()  # the data records' clipped sum / expected batch size, in p.grad
            known = self._canaries.flat_grad()
        self._inner.finalize()
        self._canaries.observe(known)
        self._pending, self._data = True, None

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _public_seed() -> int:
    return int.from_bytes(np.random.default_rng().bytes(8), "little") >> 1


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


def _trainer(cfg, data, *, mechanism_seed):
    """The method's trainer on the stand-in, its private step, and when its generator steps follow."""
    if cfg.train.method == "zhang":
        from dpsynth.methods.zhang import ZhangTrainer

        z = cfg.zhang
        public = None
        if z.adaptive_clipping or z.grouping == "clustering":  # its public data: a second stand-in
            public = stand_in(max(z.public_batch_size, 2), data.shape, data.num_classes, seed=cfg.train.seed + 1,
                              name="stand-in-public")
        t = ZhangTrainer(cfg, data, public=public, mechanism_seed=mechanism_seed)
        return t, t.D, t.critic_step, lambda: t.since_g >= z.n_critic
    from dpsynth.methods.dpgan import DPGANTrainer

    t = DPGANTrainer(cfg, data, mechanism_seed=mechanism_seed)
    return t, t.D, t.discriminator_step, lambda: t.since_g >= t.n_d.n_d


def audit_steps(cfg, total_steps: int) -> int:
    a = cfg.audit
    return total_steps if a.empirical == "full" else min(total_steps, a.quick_steps)


def run_audit(cfg, *, n: int, image_shape: Sequence[int], num_classes: int, mode: str | None = None,
              canaries: int | None = None, mechanism_seed: int | None = None) -> dict:
    """One audit run of ``cfg``'s method on a public stand-in with n records: ε_lower and the accounted
    ε of the steps audited. ``mode``/``canaries`` override ``audit.empirical``/``audit.canaries``;
    ``mechanism_seed``: tests only."""
    import tempfile

    from dpsynth.privacy import MechanismTrace, get_accountant

    mode = mode or cfg.audit.empirical
    m = canaries or cfg.audit.canaries
    if mode not in ("quick", "full"):
        raise ConfigError(f"audit.empirical: an audit run needs 'quick' or 'full', got {mode!r}")
    if cfg.train.method not in SUPPORTED_METHODS:
        raise ConfigError(f"audit.empirical: the empirical audit supports train.method in {list(SUPPORTED_METHODS)}, "
                          f"not {cfg.train.method!r} (yet); set audit.empirical=off")
    cfg = dataclasses.replace(cfg, audit=dataclasses.replace(cfg.audit, empirical=mode, canaries=m))
    started = time.process_time()
    with tempfile.TemporaryDirectory(prefix="dpsynth-empirical-") as tmp:
        # The canaries enter as per-example gradients, so the audit run takes the per-example path through
        # the same sanitizer (ghost clipping computes the same clipped sum without them: tests/privacy/
        # test_ghost.py checks that against brute force). The warm-up's generator fit is skipped: it is
        # post-processing and never touches the audited discriminator steps.
        mode_ = cfg.train.grad_sample_mode if cfg.train.grad_sample_mode in ("ew", "hooks") else "ew"
        run_cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, dir=tmp),
                                      tracking=dataclasses.replace(cfg.tracking, enabled=False),
                                      train=dataclasses.replace(cfg.train, grad_sample_mode=mode_),
                                      warmup=dataclasses.replace(cfg.warmup, steps=0))
        trainer, critic, private_step, generator_due = _trainer(
            run_cfg, stand_in(n, image_shape, num_classes, seed=cfg.train.seed), mechanism_seed=mechanism_seed)
        c = GradientCanaries(list(critic.parameters()), m=m, sample_rate=trainer.event.sample_rate,
                             randomness=trainer.mechanism)
        trainer.sanitizer = _SanitizerWithCanaries(trainer.sanitizer, c)
        steps = audit_steps(cfg, trainer.total_steps)
        for _ in range(steps):  # the trainer's own loop body (train() adds checkpoints and logging)
            private_step()
            if generator_due():
                trainer.generator_step()
    audited = trainer.trace  # the sanitizer recorded each audited step's release itself
    if audited != MechanismTrace([trainer.event.with_count(steps)]):
        raise PrivacyError(f"audit run: {steps} steps audited, but the sanitizer recorded {audited!r}")
    p = cfg.privacy
    accounted = get_accountant(p.accountant).epsilon(audited, delta=p.delta)
    result = guess_and_bound(c.scores.numpy(), c.included.numpy(), delta=p.delta, confidence=cfg.audit.confidence)
    return {**result, "mode": mode, "attack": ATTACK, "method": cfg.train.method, "steps": steps,
            "accounted_epsilon": accounted, "accountant": p.accountant,
            "noise_multiplier": trainer.event.noise_multiplier, "sample_rate": trainer.event.sample_rate,
            "privacy_cost": "none: trained on a public stand-in of the same shape (uniform-noise images), "
                            "never on the sensitive records",
            "cpu_seconds": time.process_time() - started}


def gate(result: dict) -> dict:
    """The audit check: fails when ε_lower > the accounted ε of the audited steps."""
    lower, eps = result["epsilon_lower"], result["accounted_epsilon"]
    ok = lower <= eps
    return {"name": "empirical", "passed": bool(ok),
            "detail": (f"ε_lower={lower:.4g} (m={result['canaries']}, {result['confidence']:.0%} confidence, "
                       f"{result['correct']}/{result['guesses']} guesses correct, {result['mode']}, {result['steps']} "
                       f"steps) {'≤' if ok else '>'} accounted ε={eps:.4g} of the audited steps"
                       + ("" if ok else ": the code does not implement the accounted mechanism")
                       + ("" if result["ceiling"] > eps else
                          f"; inconclusive: with m={result['canaries']} no audit can prove more than "
                          f"ε={result['ceiling']:.3g}, below the accounted ε (more canaries, or audit a lower ε)"))}


# --- what the audit stage adds ----------------------------------------------------------------------
MLFLOW_METRICS = {
    "epsilon_lower_empirical": "one-run canary audit on a public stand-in (no sensitive record enters)",
    "epsilon_accounted_empirical": "ε of the audited steps by the configured accountant (the plan)",
    "empirical_canaries": "audit.canaries (configuration)",
}


def stage_audit(cfg, partition: dict) -> dict | None:
    """The audit stage's empirical step (None when ``audit.empirical`` is off): the result, with its check."""
    if cfg.audit.empirical == "off":
        return None
    n, shape, classes = stand_in_shape(partition)
    result = run_audit(cfg, n=n, image_shape=shape, num_classes=classes)
    return {**result, "check": gate(result)}


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
    if not result:
        return ""
    return ("\n## Empirical audit (one-run canary audit)\n\n"
            f"| ε_lower ({result['confidence']:.0%}) | accounted ε (audited steps) | largest provable ε | canaries m "
            f"| guesses | correct | mode | steps | attack |\n|---|---|---|---|---|---|---|---|---|\n"
            f"| {result['epsilon_lower']:.4g} | {result['accounted_epsilon']:.4g} | {result['ceiling']:.3g} | "
            f"{result['canaries']} | "
            f"{result['guesses']} | {result['correct']} | {result['mode']} | {result['steps']} | {result['attack']} |\n\n"
            f"Privacy cost of the audit run: {result['privacy_cost']}.\n")


def tags(result: dict) -> dict[str, str]:
    """The MLflow tags of an empirical audit: on the audit run, the pipeline's parent run and the release."""
    from dpsynth import tracking

    return {tracking.TAG_EPSILON_LOWER: f"{result['epsilon_lower']:.4g}",
            tracking.TAG_EMPIRICAL_AUDIT: (f"m={result['canaries']}, {result['confidence']:.0%} confidence, "
                                           f"{result['mode']} ({result['steps']} steps), {result['attack']}; "
                                           f"accounted ε of those steps {result['accounted_epsilon']:.4g}")}


def log_mlflow(result: dict | None, *, tracking_uri: str | None = None, also: Sequence[str | None] = ()) -> None:
    """The empirical figures on the active (audit) MLflow run; its tags also on the runs ``also`` names."""
    if not result:
        return
    import mlflow

    mlflow.log_metrics({"epsilon_lower_empirical": result["epsilon_lower"],
                        "epsilon_accounted_empirical": result["accounted_epsilon"],
                        "empirical_canaries": result["canaries"]})
    mlflow.set_tags(tags(result))
    client = mlflow.MlflowClient(tracking_uri)
    for run_id in dict.fromkeys(r for r in also if r):
        for k, v in tags(result).items():
            client.set_tag(run_id, k, v)
