"""The sanitized generator gradient: GS-WGAN (Chen, Orekondy & Fritz 2020), DP-GAN-DPAC, federated GS-WGAN.

Each iteration draws one shard of K without replacement (rate 1/K); only the per-sample gradient
g_i = ∂ℓ_i/∂G(z_i) the generator receives through its sample is clipped to C and noised, N(0, σ²C²) per
release (the paper's M_{σ,C}); replacing one record moves a release by ≤ 2C, which the without-replacement
accountant charges for ``sensitivity="replace_one"``. An iteration's releases all read the drawn shard, so
they fold into ONE event of multiplier σ/√releases: B releases (GS-WGAN, DPAC), n_dis·B in the federated
protocol, whose server sees every round's releases. ``privacy.noise_multiplier`` is the per-release σ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpsynth.mechanisms.mechanism import Mechanism

if TYPE_CHECKING:
    from dpsynth.config import RunConfig
    from dpsynth.privacy.events import MechanismTrace
    from dpsynth.privacy.plan import PrivacyPlan

ACCOUNTANT = "wor"  # whatever privacy.accountant says: shard sampling needs the without-replacement bound
PRIVACY_UNIT = ("client: neighbouring datasets differ in one client's entire shard "
                "(and hence also at record level: in one record)")  # the federated GS-WGAN's

SHARD_STATE_ASSUMPTION = (
    "shard-state assumption: each shard's discriminator D_k trains (non-privately, in the sensitive zone) only "
    "in the iterations that draw shard k, so its hidden state depends on which earlier iterations drew k. The "
    "without-replacement account (rate 1/K) treats every iteration as a fresh draw and assumes this hidden "
    "selection history gives an adversary nothing beyond the releases; the account with the shard choice "
    "revealed below does not need the assumption.")

# What the federated guarantee against the server rests on (issue #33 item 7): the ranks share one host and account.
SERVER_ASSUMPTION = (
    "Against the server: it is the account of what the server receives (the client choice it makes and every "
    "sanitized release). The server and the K clients run as ranks of one torchrun job, on one host, as one "
    "operating-system user, and each client's shard, warm D_k and checkpoints (D_k, its optimizer and its secret "
    "noise coins, under sensitive/train/checkpoints/clients/) are files that the server's process could read. "
    "The guarantee assumes the server process runs dpsynth's code, which opens none of them; a server whose code "
    "or operator reads the clients' files is not covered (clients on separate hosts or accounts are not built).")


def shard_adjacency(num_shards: int, what: str = "shard") -> str:
    """GS-WGAN's neighbouring relation: add/remove one record at rate 1/K (not replace-one at 1/K)."""
    from dpsynth.privacy.statement import REPLACE_BY_GROUP_PRIVACY

    return (f"add/remove one record: a record's {what} is a keyed hash of its id, so adding or removing it changes "
            f"one {what} of K = {num_shards}; each iteration draws one {what} without replacement (rate 1/K = "
            f"{1 / num_shards:.6g}) and the drawn {what}'s releases move by ≤ 2C (the trace's replace_one event is "
            f"this {what}-level relation). Replacing a record can change two {what}s (rate 2/K), which this ε "
            f"does not state directly: {REPLACE_BY_GROUP_PRIVACY}.")


def noise_convention(releases: int, plan: PrivacyPlan) -> str:
    return (f"σ·C per sanitized release (clip C), σ = {plan.noise_multiplier:.6g}; the accountant charges the "
            f"replaced shard's sensitivity 2C (so σ/2 per release in units of the sensitivity), and the {releases} "
            f"releases of one iteration fold to σ/√{releases} = {plan.event.noise_multiplier:.6g}. (The authors' "
            "code adds σ·2C.)")


@dataclass(frozen=True)
class ShardGeneratorGradient(Mechanism):
    """GS-WGAN's and DPAC's mechanism: B releases per iteration, of the rank (or process) holding D_k.
    ``privacy.accounting=as_published`` reproduces the authors' account (each of the T·B releases separately
    subsampled) only to compare: ``guard`` is then None and the sound ε is reported, not enforced."""

    def releases(self, cfg: RunConfig) -> int:
        """The sanitized releases one iteration folds."""
        return cfg.gswgan.batch_size

    def accountant(self, cfg: RunConfig) -> str:
        return ACCOUNTANT

    def reported_noise_multiplier(self, plan: PrivacyPlan) -> float:
        return plan.noise_multiplier  # per-release σ (the trace records the iteration's folded σ/√releases)

    def plan(self, cfg: RunConfig, n: int) -> PrivacyPlan:
        """``event`` one iteration (rate 1/K, σ/√releases, without replacement, replace-one); ``noise_multiplier``
        σ, the noise std / C of each sanitized release; under as_published ``published_epsilon`` the authors'
        (unsound) account of ``steps`` iterations."""
        from dpsynth.errors import ConfigError, PrivacyError
        from dpsynth.warmup import releases as warmup_releases
        from dpsynth.privacy import BudgetGuard, calibrate_noise, check_delta, fold_releases, gswgan_event
        from dpsynth.privacy.plan import PrivacyPlan

        p, B, T, K = cfg.privacy, self.releases(cfg), cfg.train.steps, cfg.partition.num_shards
        check_delta(p.delta, n)
        sigma = p.noise_multiplier
        if p.accounting == "as_published":
            if sigma is None:
                raise ConfigError("privacy.noise_multiplier: as_published accounting reproduces a paper's run; "
                                  "set the paper's σ (e.g. 1.07) instead of calibrating")
            event = gswgan_event(noise_multiplier=sigma, batch_size=B, num_shards=K)

            def published(steps: int) -> float:
                return self._as_published(cfg, sigma, steps)

            lo, hi = 0, T  # largest steps ≤ T with the published ε ≤ target (ε grows with steps)
            if published(T) <= p.epsilon:
                lo = T
            while hi - lo > 1 and lo < T:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if published(mid) <= p.epsilon else (lo, mid)
            if lo < 1:
                raise PrivacyError(f"privacy.epsilon: {p.epsilon} does not allow one iteration even as published")
            return PrivacyPlan(event=event, steps=lo, guard=None, noise_multiplier=sigma, releases=B,
                               published_epsilon=published(lo))
        prefix = warmup_releases.prefix(cfg, accountant=ACCOUNTANT)  # the private warm-up's releases, when configured
        if sigma is None:
            event_sigma = calibrate_noise(target_epsilon=p.epsilon, delta=p.delta, sample_rate=1.0 / K, steps=T,
                                          accountant=ACCOUNTANT, sampling="without_replacement",
                                          sensitivity="replace_one", prefix=prefix)
            sigma = event_sigma * math.sqrt(B)
            while fold_releases(sigma, B) < event_sigma:  # never less noise than calibrated, to the last ulp
                sigma = math.nextafter(sigma, math.inf)
        event = gswgan_event(noise_multiplier=sigma, batch_size=B, num_shards=K)
        guard = BudgetGuard(target_epsilon=p.epsilon, delta=p.delta, accountant=ACCOUNTANT, event=event)
        steps = min(T, guard.remaining(prefix))
        if steps < 1:
            raise PrivacyError(f"privacy.epsilon: {p.epsilon} does not allow a single iteration at per-sample noise "
                               f"multiplier {sigma:.4g} (B = {B}, K = {K}); raise epsilon or the noise")
        return PrivacyPlan(event=event, steps=steps, guard=guard, noise_multiplier=sigma, releases=B,
                           prefix=prefix.events)

    def published_epsilon(self, cfg: RunConfig, plan: PrivacyPlan, steps: int) -> float | None:
        """The authors' (unsound) account of ``steps`` iterations under as_published; None otherwise."""
        if cfg.privacy.accounting != "as_published":
            return None
        return self._as_published(cfg, plan.noise_multiplier, steps)

    def _as_published(self, cfg: RunConfig, sigma: float, steps: int) -> float:
        from dpsynth.privacy import as_published_epsilon

        return as_published_epsilon(noise_multiplier=sigma, batch_size=self.releases(cfg),
                                    num_shards=cfg.partition.num_shards, steps=steps, delta=cfg.privacy.delta)

    def sanitizer(self, cfg: RunConfig, plan: PrivacyPlan, *, randomness, trace):
        """M_{σ,C} on each of an iteration's releases, σ per release from the plan; it records ``plan.event`` (the
        releases folded) in ``trace`` at every iteration and refuses a call with another number of releases."""
        from dpsynth.mechanisms.dpsgd import InputGradientSanitizer

        return InputGradientSanitizer(clip_norm=cfg.privacy.max_grad_norm, noise_multiplier=plan.noise_multiplier,
                         randomness=randomness, trace=trace, event=plan.event, releases=plan.releases)

    def statement(self, cfg: RunConfig, plan: PrivacyPlan, n: int) -> dict:
        """Add/remove adjacency at 1/K, the shard-state assumption, and beside it the account with the shard
        choice revealed (no amplification by the choice)."""
        from dpsynth.warmup import releases as warmup_releases
        from dpsynth.privacy.statement import revealed_choice_account, statement

        K = cfg.partition.num_shards
        revealed = revealed_choice_account(plan.event, plan.steps, num_shards=K, delta=cfg.privacy.delta,
                                           prefix=plan.prefix)
        return statement(
            adjacency=shard_adjacency(K), noise=noise_convention(plan.releases, plan) + warmup_releases.statement(cfg),
            assumptions=[SHARD_STATE_ASSUMPTION],
            accounts=[{"against": "an adversary who sees every iteration's shard choice (no shard-state assumption)",
                       **revealed}])


@dataclass(frozen=True)
class FederatedGeneratorGradient(ShardGeneratorGradient):
    """The federated protocol's mechanism (supplement, Algorithm 2): client k sanitizes the B gradients of each
    of n_dis rounds on its own rank; the server, which holds the trace, sees all n_dis·B releases, so one
    iteration folds them all. Sound accounting only."""

    n_dis: int = 5  # the critic rounds per iteration when ``train.n_d`` is unset (the paper's; the registry's default)

    def releases(self, cfg: RunConfig) -> int:
        rounds = cfg.train.n_d if cfg.train.n_d is not None else self.n_dis
        return rounds * cfg.gswgan.batch_size

    def plan(self, cfg: RunConfig, n: int) -> PrivacyPlan:
        from dpsynth.errors import ConfigError

        if cfg.privacy.accounting != "sound":
            raise ConfigError("privacy.accounting: federated GS-WGAN has no published account to reproduce here")
        return super().plan(cfg, n)

    def privacy_record(self, cfg: RunConfig) -> dict:
        """Client-level: the unit is a client's whole shard; δ < 1/K is the client-level reading of δ."""
        K = cfg.partition.num_shards
        return {"unit": PRIVACY_UNIT, "clients": K, "delta_below_one_over_clients": cfg.privacy.delta < 1 / K}

    def sanitizer(self, cfg: RunConfig, plan: PrivacyPlan, *, randomness, trace):
        raise NotImplementedError("federated GS-WGAN: each client sanitizes on its own rank and the server's "
                                  "Receipts (this module) record the event")

    def statement(self, cfg: RunConfig, plan: PrivacyPlan, n: int) -> dict:
        """Two guarantees: against everyone but the server (the released generator; rate 1/K amplification,
        under the shard-state assumption), and against the server, which picks the client each iteration and
        so sees the choice: no 1/K amplification (:func:`revealed_choice_account`)."""
        from dpsynth.privacy.statement import revealed_choice_account, statement

        K = cfg.partition.num_shards
        server = revealed_choice_account(plan.event, plan.steps, num_shards=K, delta=cfg.privacy.delta)
        return statement(
            adjacency=shard_adjacency(K, "client") + " The audited ε is the guarantee against everyone except the "
            "server (who sees only the released generator and what is sampled from it).",
            noise=noise_convention(plan.releases, plan),
            assumptions=[SHARD_STATE_ASSUMPTION.replace("shard's discriminator", "client's discriminator"),
                         SERVER_ASSUMPTION],
            accounts=[{"against": "the server (it picks the client of every iteration, so the choice gives no "
                                  "amplification; it also sees every sanitized release)", **server}])


GSWGAN = ShardGeneratorGradient(
    sampled="one shard of K per iteration, without replacement (rate 1/K); B latents and labels, never records",
    sampling="without_replacement", clipped="input_gradients",
    fold="the B releases of one iteration: σ/√B", noise="σ·C per release; replace-one sensitivity 2C")

FEDERATED = FederatedGeneratorGradient(
    sampled="one client of K per iteration, without replacement (rate 1/K), chosen by the server",
    sampling="without_replacement", clipped="input_gradients",
    fold="the n_dis·B releases of one iteration's rounds: σ/√(n_dis·B)",
    noise="σ·C per release, added on the client; replace-one sensitivity 2C")


class Receipts:
    """The federated server's accountant hook (:class:`FederatedGeneratorGradient`). The clients sanitize (and draw
    the noise) in their own processes, so the server, which holds the trace, counts the sanitized releases it
    receives and, once an iteration's are all in, records the one event that folds them (σ/√(n_dis·B)); an
    iteration with any other count is refused."""

    def __init__(self, trace: MechanismTrace, event, *, releases: int):
        self.trace, self.event, self.releases, self.count = trace, event, releases, 0

    def received(self, released):
        self.count += len(released)
        return released

    def end_iteration(self) -> None:
        from dpsynth.errors import PrivacyError

        count, self.count = self.count, 0
        if count != self.releases:
            raise PrivacyError(f"federated server: {count} sanitized releases received in one iteration, but its "
                               f"event folds {self.releases} (n_dis·B); refusing to account for them otherwise")
        self.trace.record(self.event)
