"""The private warm-up's releases as a mechanism (the ``warmup`` section): which Gaussian releases a configuration
makes, in the order of the trace, their events, the trace prefix they form before training, and what they are in a
privacy statement. The releases themselves are :mod:`dpsynth.mechanisms.central_images`'s; the generator fitted to
them (post-processing) is :mod:`dpsynth.training.warmup`'s."""

from __future__ import annotations


def events(cfg) -> list:
    """The warm-up's mechanism events, in order: the intensity histogram (with
    ``warmup.intensity_noise_multiplier``), the class-mean release, then (with ``warmup.polarity_noise_multiplier``)
    the polarity-shape release, then the style release, then the variation release (with
    ``warmup.styles_along`` = variations, the variation release before the style release, whose templates move
    along its directions): each a full-batch Gaussian of add/remove sensitivity (its clip)."""
    from dpsynth.privacy import full_batch_gaussian

    if not cfg.warmup.central_images:
        return []
    return [full_batch_gaussian(sigma) for _, sigma in cfg.warmup.releases()]


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
    styles = ""
    if w.styles:
        styles = (" Its style release is one more: each record, assigned to the nearest public template of its "
                  "class" + (" (the released class mean moved along the two released variation directions that "
                             "change its shape most)" if w.styles_along_variations else "") +
                  ", moves the stacked group sums by ≤ C, noise σ_s·C.")
    out += "" if w.styles_along_variations else styles
    if w.variations:
        out += (" Its variation release is one more: each record's residual around the released image of its "
                "nearest public template, clipped to C_v, adds r·rᵀ to its class's second-moment matrix (upper "
                "triangle moved by ≤ C_v² in L2), noise σ_v·C_v² per entry.")
        if w.variations_shared:
            out += " The classes' matrices are summed before the noise: one matrix, its directions every class's."
    return out + (styles if w.styles_along_variations else "")


RELEASES = ("class_means", "styles", "variations")  # the releases with a canary audit, in order


def release_names(cfg) -> list[str]:
    """The names of the releases this configuration makes, in the order of :func:`events` (for messages)."""
    return [name for name, _ in cfg.warmup.releases()]
