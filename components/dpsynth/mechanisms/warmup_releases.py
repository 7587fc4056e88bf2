"""The private warm-up's releases as a mechanism (the ``warmup`` section): which Gaussian releases a configuration
makes, in the order of the trace, their events, the trace prefix they form before training, and what they are in a
privacy statement. The releases themselves are :mod:`dpsynth.mechanisms.central_images`'s; the generator fitted to
them (post-processing) is :mod:`dpsynth.training.warmup`'s."""

from __future__ import annotations


def events(cfg) -> list:
    """The warm-up's mechanism events, in order: the intensity histogram (with
    ``warmup.intensity_noise_multiplier``), the class-mean release, then (with ``warmup.polarity_noise_multiplier``)
    the shape and the polarity-group releases, then the style release, then the variation release: each a
    full-batch Gaussian of add/remove sensitivity (its clip)."""
    from dpsynth.mechanisms.central_images import event_for

    if not cfg.warmup.central_images:
        return []
    return [event_for(sigma) for _, sigma in releases(cfg)]


def prefix(cfg, *, accountant):
    """The warm-up's events as the trace that precedes training (empty without one); refuses, naming the
    settings, when they alone spend ``privacy.epsilon`` under ``accountant``."""
    from dpsynth.errors import PrivacyError
    from dpsynth.privacy import MechanismTrace, get_accountant

    p, trace = cfg.privacy, MechanismTrace(events(cfg))
    if trace.steps:
        spent = get_accountant(accountant).epsilon(trace, delta=p.delta)
        if spent >= p.epsilon:
            raise PrivacyError(
                f"privacy.epsilon: {p.epsilon} is spent by the warm-up's releases alone (ε = {spent:.3g} at δ = "
                f"{p.delta:g}); set warmup.fit_epsilon=true, or warmup.variations=0 and warmup.styles=0 (class means "
                f"only), raise "
                f"warmup.noise_multiplier / warmup.styles_noise_multiplier / warmup.variations_noise_multiplier, "
                f"or raise privacy.epsilon")
    return trace


def statement(cfg) -> str:
    """What the warm-up's releases are, for a method's privacy statement ("" without a warm-up)."""
    w = cfg.warmup
    if not w.central_images:
        return ""
    out = ""
    if w.intensity_noise_multiplier is not None:
        out += (" The private warm-up's intensity histogram is one full-batch Gaussian (q = 1): each record's "
                "normalised 16-bin histogram of its pixel intensities moves the sum by ≤ 1 in L2, noise σ_h per bin.")
    out += (" The private warm-up's class-mean release is one full-batch Gaussian (q = 1): each record moves the "
            "stacked class sums by ≤ C, noise σ_w·C.")
    if w.polarity_noise_multiplier is not None:
        out += (" Its polarity-shape release is one more: each record's luminance less its own mean, scaled to norm "
                "≤ 1 and signed by its third moment, in the group of its class and that sign (the record alone), "
                "moves the stacked group sums by ≤ C, noise σ_p·C.")
    if w.styles:
        out += (" Its style release is one more: each record, assigned to the nearest public template of its "
                "class, moves the stacked group sums by ≤ C, noise σ_s·C.")
    if w.variations:
        out += (" Its variation release is one more: each record's residual around the released image of its "
                "nearest public template, clipped to C_v, adds r·rᵀ to its class's second-moment matrix (upper "
                "triangle moved by ≤ C_v² in L2), noise σ_v·C_v² per entry.")
        if w.variations_shared:
            out += " The classes' matrices are summed before the noise: one matrix, its directions every class's."
    return out


# what warmup.fit_epsilon leaves out, in this order (the last in the trace first): the setting that turns it off
LEFT_OUT = (("variations", "variations", 0), ("styles", "styles", 0),
            ("polarity_shapes", "polarity_noise_multiplier", None))
RELEASE_SHARE = 0.75  # warmup.fit_epsilon, where the releases as configured do not fit: their share of ε


def fit_epsilon(cfg):
    """``warmup.fit_epsilon``: the warm-up section refitted to ``privacy.epsilon``, from the configuration alone
    (public), so that every stage and the audit resolve the same releases:

    1. the releases as configured spend less than ε (under ``privacy.accountant``): kept as they are;
    2. else, with variations (and no styles): the releases are given :data:`RELEASE_SHARE` of ε, training the rest.
       Full-batch Gaussians compose as one Gaussian whose ρ = 1/(2σ²) is the sum of theirs, so ρ is split in
       closed form: the intensity histogram keeps its σ; the polarity shapes theirs, if with the histogram and
       the class means they take at most half of ρ, else they are left out; the class means take at most half of
       what is left (their σ raised if need be); the variation release, shared by every class
       (``variations_shared``: K times the signal for the same noise), takes the rest;
    3. else (or where nothing is left for the variations): releases are left out, the last in the trace first
       (:data:`LEFT_OUT`), until the rest spend less than ε.

    Where even the histogram and the class means do not fit, they stay: :func:`prefix` refuses, naming the settings.

    >>> from dpsynth.config import REPO_ROOT, load_config
    >>> cfg = load_config(REPO_ROOT / "configs/dpgan-generic-cpu.yaml", overrides=["privacy.epsilon=1"])
    >>> release_names(cfg), cfg.warmup.variations_shared, round(cfg.warmup.variations_noise_multiplier, 1)
    (['intensity_histogram', 'class_means', 'variations'], True, 7.8)
    """
    import dataclasses

    from dpsynth.errors import PrivacyError
    from dpsynth.mechanisms.central_images import event_for
    from dpsynth.privacy import MechanismTrace, calibrate_noise, get_accountant

    p, w = cfg.privacy, cfg.warmup
    accountant = get_accountant(p.accountant)

    def fits(section) -> bool:
        events = [event_for(sigma) for _, sigma in section_releases(section)]
        return accountant.epsilon(MechanismTrace(events), delta=p.delta) < p.epsilon

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
        if name in dict(section_releases(w)):
            w = dataclasses.replace(w, **{setting: off})
    return w


RELEASES = ("class_means", "styles", "variations")  # the releases with a canary audit, in order


def releases(cfg) -> list[tuple[str, float]]:
    """(name, σ) of every release this configuration makes, in the order of the trace."""
    return section_releases(cfg.warmup)


def section_releases(w) -> list[tuple[str, float]]:
    """(name, σ) of every release the ``warmup`` section ``w`` makes, in the order of the trace."""
    named = [("intensity_histogram", w.intensity_noise_multiplier)] * (w.intensity_noise_multiplier is not None)
    named += [("class_means", w.noise_multiplier)]
    named += [("polarity_shapes", w.polarity_noise_multiplier)] * (w.polarity_noise_multiplier is not None)
    named += [("styles", w.styles_noise_multiplier)] * bool(w.styles)
    return named + [("variations", w.variations_noise_multiplier)] * bool(w.variations)


def release_names(cfg) -> list[str]:
    """The names of the releases this configuration makes, in the order of :func:`events` (for messages)."""
    return [name for name, _ in releases(cfg)]
