"""``warmup.fit_epsilon``: where the warm-up's releases as configured do not fit ``privacy.epsilon``, the section
refitted from ε alone (public: the configuration only). The configuration's validator
(:class:`dpsynth.config.RunConfig`) applies it, so every stage and the audit read the same releases."""

from __future__ import annotations

import dataclasses


# what warmup.fit_epsilon leaves out, in this order (the last in the trace first): the setting that turns it off
LEFT_OUT = (("variations", "variations", 0), ("styles", "styles", 0),
            ("polarity_shapes", "polarity_noise_multiplier", None))
RELEASE_SHARE = 0.75  # warmup.fit_epsilon, where the releases as configured do not fit: their share of ε


def fit_epsilon(w, p):
    """``warmup.fit_epsilon``: the warm-up section ``w`` (a :class:`dpsynth.config.WarmupConfig`) refitted to
    ``p.epsilon`` (``p`` its :class:`dpsynth.config.PrivacyConfig`), from the configuration alone (public);
    :class:`dpsynth.config.RunConfig`'s validator applies it, so every stage and the audit read the same releases:

    1. the releases as configured spend less than ε (under ``p.accountant``): kept as they are; else a style
       release along the variation directions (``styles_along_variations``: the last in the trace, and it needs the
       per-class directions) is left out first, and the rest kept where they then fit;
    2. else, with variations (and no styles): the releases are given :data:`RELEASE_SHARE` of ε, training the rest.
       Full-batch Gaussians compose as one Gaussian whose ρ = 1/(2σ²) is the sum of theirs, so ρ is split in
       closed form: the intensity histogram keeps its σ; the polarity shapes theirs, if with the histogram and
       the class means they take at most half of ρ, else they are left out; the class means take at most half of
       what is left (their σ raised if need be); the variation release, shared by every class
       (``variations_shared``: K times the signal for the same noise), takes the rest;
    3. else (or where nothing is left for the variations): releases are left out, the last in the trace first
       (:data:`LEFT_OUT`), until the rest spend less than ε.

    Where even the histogram and the class means do not fit, they stay: the warm-up's trace prefix
    (:func:`dpsynth.warmup.releases.prefix`) refuses, naming the settings.

    >>> from dpsynth.config import REPO_ROOT, load_config
    >>> cfg = load_config(REPO_ROOT / "configs/dpgan-generic-cpu.yaml", overrides=["privacy.epsilon=1"])
    >>> [n for n, _ in cfg.warmup.releases()], cfg.warmup.variations_shared, round(cfg.warmup.variations_noise_multiplier, 1)
    (['intensity_histogram', 'class_means', 'variations'], True, 7.8)
    """
    from dpsynth.errors import PrivacyError
    from dpsynth.privacy import MechanismTrace, calibrate_noise, full_batch_gaussian, get_accountant

    accountant = get_accountant(p.accountant)

    def fits(section) -> bool:
        events = [full_batch_gaussian(sigma) for _, sigma in section.releases()]
        return accountant.epsilon(MechanismTrace(events), delta=p.delta) < p.epsilon

    if fits(w):
        return w
    if w.styles_along_variations:  # the last release in the trace, and it needs the per-class directions: out first
        w = dataclasses.replace(w, styles=0)
        if fits(w):
            return w
    try:  # the σ of one full-batch Gaussian that spends the releases' share (None: none can be certified)
        sigma = calibrate_noise(target_epsilon=RELEASE_SHARE * p.epsilon, delta=p.delta, sample_rate=1.0, steps=1,
                                sampling="full_batch", accountant=p.accountant)
    except PrivacyError:
        sigma = None
    if w.variations and not w.styles and sigma is not None:
        total, rho = 1 / (2 * sigma ** 2), (lambda s: 1 / (2 * s ** 2))
        fixed = rho(w.intensity_noise_multiplier) if w.intensity_noise_multiplier is not None else 0.0
        polarity = w.polarity_noise_multiplier
        if polarity is not None and fixed + rho(polarity) + rho(w.noise_multiplier) > total / 2:
            polarity = None
        fixed += rho(polarity) if polarity is not None else 0.0
        means = min(rho(w.noise_multiplier), (total - fixed) / 2)
        left = total - fixed - means
        if left > 0:
            fitted = dataclasses.replace(
                w, polarity_noise_multiplier=polarity, noise_multiplier=max(w.noise_multiplier, (2 * means) ** -0.5),
                variations_noise_multiplier=(2 * left) ** -0.5, variations_shared=True)
            if fits(fitted):
                return fitted
    for name, setting, off in LEFT_OUT:
        if fits(w):
            break
        if name in dict(w.releases()):
            w = dataclasses.replace(w, **{setting: off})
    return w
