"""The private warm-up's releases as a mechanism (the ``warmup`` section): which Gaussian releases a configuration
makes, in the order of the trace, their events, the trace prefix they form before training, and what they are in a
privacy statement. The releases themselves are :mod:`dpsynth.warmup.central_images`'s; the generator fitted to
them (post-processing) is :mod:`dpsynth.warmup.fit`'s."""

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
    """What the warm-up's releases are, for a method's privacy statement ("" without a warm-up): one sentence per
    release, in the order of :func:`events` and numbered as the trace's events (the audit's trace table), each
    with its σ and sensitivity.

    >>> from dpsynth.config import load_config
    >>> print(statement(load_config(overrides=["warmup.central_images=true", "warmup.variations=0",
    ...                                          "warmup.noise_multiplier=5"])).strip())
    The private warm-up's release is the trace's event #0, one full-batch Gaussian (q = 1). #0, the class-mean release: each record moves the stacked class sums by ≤ C = 10, noise σ_w·C, σ_w = 5."""
    w = cfg.warmup
    if not w.central_images:
        return ""
    moved = ("moved along the two released variation directions that change its shape most"
             if w.styles_along_variations else "sheared and thickened or thinned")
    text = {  # name: (what it is, its sensitivity and noise, the symbol of its σ)
        "intensity_histogram": ("the intensity histogram", "each record's normalised 16-bin histogram of its pixel "
                                "intensities moves the sum by ≤ 1 in L2, noise σ_h per bin", "σ_h"),
        "class_means": ("the class-mean release", f"each record moves the stacked class sums by ≤ C = {w.clip:g}, "
                        "noise σ_w·C", "σ_w"),
        "polarity_shapes": ("the polarity-shape release", "each record's luminance less its own mean, scaled to norm "
                            "≤ 1 and signed by its third moment, in the group of its class and that sign (the record "
                            f"alone), moves the stacked group sums by ≤ C = {w.clip:g}, noise σ_p·C", "σ_p"),
        "styles": ("the style release", "each record, assigned to the nearest public template of its class (the "
                   f"released class mean {moved}), moves the stacked group sums by ≤ C = {w.clip:g}, noise σ_s·C",
                   "σ_s"),
        "variations": ("the variation release", "each record's residual around the released image of its nearest "
                       f"public template, clipped to C_v = {w.variations_clip:g}, adds r·rᵀ to its class's "
                       "second-moment matrix (upper triangle moved by ≤ C_v² in L2), noise σ_v·C_v² per entry"
                       + (" (the classes' matrices summed before the noise: one matrix, its directions every class's)"
                          if w.variations_shared else ""), "σ_v"),
    }
    releases = w.releases()
    k = len(releases)
    out = (f" The private warm-up's releases are the trace's events #0–#{k - 1}, each one full-batch Gaussian (q = 1)."
           if k > 1 else " The private warm-up's release is the trace's event #0, one full-batch Gaussian (q = 1).")
    for i, (name, sigma) in enumerate(releases):
        what, how, symbol = text[name]
        out += f" #{i}, {what}: {how}, {symbol} = {sigma:g}."
    return out


# the releases with a canary audit (every one: the intensity histogram and the polarity shapes too, #52 item 5)
RELEASES = ("intensity", "class_means", "polarity", "styles", "variations")


def release_names(cfg) -> list[str]:
    """The names of the releases this configuration makes, in the order of :func:`events` (for messages)."""
    return [name for name, _ in cfg.warmup.releases()]
