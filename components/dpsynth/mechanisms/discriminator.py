"""DP-SGD on the discriminator (critic): DPGAN of Bie et al. and dp-GAN of Zhang et al.

Each step Poisson-samples records at q = B/n; every example's parameter gradient of D is clipped (to C, or
group by group to c_j), the clipped gradients are summed, N(0, (σC)²) — per group N(0, (σ c_j)²) — is added
once, and the sum divided by the expected batch size. The k groups of one step share its sample, so they
fold into one Poisson-subsampled Gaussian event of multiplier σ/√k (add/remove adjacency); DPGAN has one group.
The generator reads the data only through D: its steps are post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpsynth.mechanisms.mechanism import Mechanism

if TYPE_CHECKING:
    from dpsynth.config import RunConfig
    from dpsynth.mechanisms.dpsgd import GradientSanitizer
    from dpsynth.privacy.plan import PrivacyPlan


@dataclass(frozen=True)
class DiscriminatorDPSGD(Mechanism):
    """DPGAN's mechanism (Bie et al., Algorithm 1): one clip group; B real and B fake examples clipped each,
    so the expected batch is 2B. The paper's account is the sound one (``privacy.accounting`` plays no part)."""

    examples_per_record: int = 2  # examples clipped per sampled record: DPGAN a real and a fake; dp-GAN one unit

    def num_groups(self, cfg: RunConfig) -> int:
        """k, the clip groups of one step."""
        return 1

    def published_account(self, cfg: RunConfig) -> bool:
        """Whether the paper's (unsound) account is planned and guarded instead (``as_published``)."""
        return False

    def plan(self, cfg: RunConfig, n: int) -> PrivacyPlan:
        """σ per group as configured, or calibrated so that the warm-up's releases (when configured) and
        train.steps events spend ≤ ε; ``event`` the sound per-step event (σ/√k); as_published (dp-GAN only):
        ``published_event`` the paper's per-step event (σ), which ``guard`` then guards instead."""
        from dpsynth.errors import PrivacyError
        from dpsynth.warmup import releases as warmup_releases
        from dpsynth.privacy import BudgetGuard, MechanismEvent, calibrate_noise, check_delta
        from dpsynth.privacy.plan import PrivacyPlan

        p, t, k = cfg.privacy, cfg.train, self.num_groups(cfg)
        check_delta(p.delta, n)
        q = t.batch_size / n
        if q > 1:
            raise PrivacyError(f"train.batch_size: {t.batch_size} exceeds the {n} training records")
        published = self.published_account(cfg)
        prefix = warmup_releases.prefix(cfg, accountant=p.accountant)
        sigma = p.noise_multiplier
        if sigma is None:
            base = calibrate_noise(target_epsilon=p.epsilon, delta=p.delta, sample_rate=q, steps=t.steps,
                                   accountant=p.accountant, prefix=prefix)
            sigma = base if published else base * math.sqrt(k)
        event = MechanismEvent(sampling="poisson", sample_rate=q, noise_multiplier=sigma / math.sqrt(k),
                               sensitivity="add_remove")
        published_event = event.with_noise(sigma) if published else None
        guard = BudgetGuard(target_epsilon=p.epsilon, delta=p.delta, accountant=p.accountant,
                            event=published_event or event)
        steps = min(t.steps, guard.remaining(prefix))
        if steps < 1:
            raise PrivacyError(f"privacy.epsilon: {p.epsilon} does not allow a single step at noise multiplier "
                               f"{guard.event.noise_multiplier:.4g} and sample rate {q:.4g}; raise epsilon or the "
                               "noise multiplier")
        return PrivacyPlan(event=event, steps=steps, guard=guard, noise_multiplier=sigma, releases=k,
                           published_event=published_event, prefix=prefix.events)

    def published_epsilon(self, cfg: RunConfig, plan: PrivacyPlan, steps: int) -> float | None:
        """The paper's (unsound) account of ``steps`` steps under as_published (dp-GAN: the plan's published
        event, by its guard); None otherwise."""
        from dpsynth.privacy import MechanismTrace

        if plan.published_event is None:
            return None
        return plan.guard.spent(MechanismTrace([plan.published_event.with_count(steps)])) if steps else 0.0

    def sanitizer(self, cfg: RunConfig, plan: PrivacyPlan, params, *, randomness, trace, module=None
                  ) -> GradientSanitizer:
        """The step's sanitizer over ``params`` (one list, or one list per clip group): σ per group from the
        plan, the expected batch of ``examples_per_record``·B; it records ``plan.event`` in ``trace`` at every
        noisy release (``finalize``)."""
        from dpsynth.mechanisms.dpsgd import GradientSanitizer

        return GradientSanitizer(params, max_grad_norm=cfg.privacy.max_grad_norm,
                                 noise_multiplier=plan.noise_multiplier,
                                 expected_batch_size=self.examples_per_record * cfg.train.batch_size,
                                 randomness=randomness, module=module, trace=trace, event=plan.event)

    def statement(self, cfg: RunConfig, plan: PrivacyPlan, n: int) -> dict:
        from dpsynth.warmup import releases as warmup_releases
        from dpsynth.privacy.statement import REPLACE_BY_GROUP_PRIVACY, statement

        return statement(
            adjacency=f"add/remove one record: every step Poisson-samples records at q = B/n = "
                      f"{plan.event.sample_rate:.6g}; {REPLACE_BY_GROUP_PRIVACY}.",
            noise=f"σ·C: N(0, (σC)²) per coordinate on the sum of per-example gradients clipped to C (sensitivity "
                  f"C), σ = {plan.event.noise_multiplier:.6g}.{warmup_releases.statement(cfg)}")


@dataclass(frozen=True)
class GroupedCriticDPSGD(DiscriminatorDPSGD):
    """dp-GAN's mechanism (Zhang et al., Algorithm 3): each sampled record is one (real, fake, interpolate)
    unit of the WGAN-GP critic loss; its gradient is clipped group by group (§4.1–4.2: groups and bounds
    from public data, or fixed); k groups. ``privacy.accounting=as_published`` reproduces the paper's
    parallel-composition account (k groups as one release of σ), guarded and reported beside the sound one."""

    examples_per_record: int = 1

    def num_groups(self, cfg: RunConfig) -> int:
        """k for this config's critic (the DCGAN critic's parameter names do not depend on the image's size,
        channels or classes)."""
        import torch

        from dpsynth.models.dcgan import Discriminator
        from dpsynth.mechanisms import grouping

        with torch.random.fork_rng(devices=[]):  # a throw-away critic: the caller's RNG stays where it was
            D = Discriminator(num_classes=2, channels=1, image_size=28, width=cfg.train.d_width)
        names = [name for name, _ in D.named_parameters()]
        return grouping.num_groups(names, strategy=cfg.zhang.grouping, k=cfg.zhang.num_groups)

    def published_account(self, cfg: RunConfig) -> bool:
        return cfg.privacy.accounting != "sound"

    def statement(self, cfg: RunConfig, plan: PrivacyPlan, n: int) -> dict:
        """What dp-GAN's (ε, δ) means; ``unprotected`` names the sensitive records used as public, if any."""
        from dpsynth.data.public import describe as public_source_statement, unprotected_statement
        from dpsynth.warmup import releases as warmup_releases
        from dpsynth.privacy.statement import REPLACE_BY_GROUP_PRIVACY, statement

        return statement(
            adjacency=f"add/remove one record (one real/fake/interpolate unit): every critic step Poisson-samples "
                      f"records at q = B/n = {plan.event.sample_rate:.6g}; {REPLACE_BY_GROUP_PRIVACY}.",
            noise=f"σ·c_j: clip group j gets N(0, (σ c_j)²) with per-group sensitivity c_j; the k = {plan.releases} "
                  f"groups of one step fold to σ/√k = {plan.event.noise_multiplier:.6g}.{warmup_releases.statement(cfg)}",
            assumptions=["the pre-training and clipping bounds use public records only: " + public_source_statement(cfg)],
            unprotected=unprotected_statement(cfg))


DPGAN = DiscriminatorDPSGD(
    sampled="records, Poisson at q = B/n, each step; B fresh fakes beside them",
    sampling="poisson", clipped="parameter_gradients",
    fold="nothing: one group, one release per step", noise="σ·C on the sum of the clipped per-example gradients")

ZHANG = GroupedCriticDPSGD(
    sampled="records, Poisson at q = B/n, each critic step; each record one (real, fake, interpolate) unit",
    sampling="poisson", clipped="parameter_gradients",
    fold="the k clip groups of one step: σ/√k", noise="σ·c_j on clip group j's sum")
