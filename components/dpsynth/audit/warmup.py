"""The empirical audit of the private warm-up's Gaussian releases (:mod:`dpsynth.warmup`): one audit run per release
of the warm-up's own code (:func:`audit_warmup_release`) with Dirac canary records on a stand-in that holds no other
record, read by the one-run bound, a noise test and a bound test, and its check (:func:`warmup_check`). It lives in
the audit's room, not the warm-up's: it reads the one-run bound and the mechanism's secret coins, which sit above the
warm-up (the configuration and every method's mechanism read the warm-up's releases).
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import torch

from dpsynth.audit.canaries import CANARY_SCALE, public_seed
from dpsynth.audit.statistics import guess_and_bound, verdict
from dpsynth.errors import ConfigError, PrivacyError

NOISE_TEST_ALPHA = 1e-6  # the noise test fails a release whose noise is this improbably small under the plan's σ


def audited_releases(cfg) -> list[tuple[str, float, float]]:
    """The warm-up's releases as (name, σ, scale): the noise std on every coordinate of the query is σ·scale
    (scale = C for the class, polarity and style sums, C_v² for the moment matrices, 1 for the intensity
    histogram's). :func:`pixel_bound` says how far one record may move a pixel's (a bin's) coordinate."""
    from dpsynth.warmup import releases as warmup_releases

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
    rng = torch.Generator().manual_seed(public_seed())
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
    from dpsynth.warmup.central_images import INTENSITY_BINS

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
    from dpsynth.warmup import fit as warmup
    from dpsynth.privacy import MechanismTrace, full_batch_gaussian, get_accountant
    from dpsynth.warmup import central_images
    from dpsynth.mechanisms.randomness import MechanismRandomness
    from scipy import stats  # imported where used (1.4 s): see dpsynth.audit.statistics.p_value

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
