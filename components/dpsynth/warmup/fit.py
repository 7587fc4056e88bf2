"""The private warm-up any method can run before its private training (``warmup`` section): the releases in the
trace's order on the training records (:func:`release`), the generator fitted to them (:func:`fit_generator`,
post-processing), and the two run together by a trainer before its first step (:func:`warm_up`).

After Li et al., "From Easy to Hard: Building a Shortcut for Differentially Private Image
Synthesis" (2025): first learn the easy, low-sensitivity part of the data — each class's mean
image, released once by a Gaussian mechanism (:mod:`dpsynth.warmup.central_images`, one event in
the mechanism trace, composed with training by the same accountant) — then spend the private
training steps on the hard part.

With ``warmup.intensity_noise_multiplier`` = σ_h a release comes first that knows nothing of the images'
content: the dataset's histogram of pixel intensities (:func:`dpsynth.warmup.central_images.intensity_histogram`,
one more Gaussian event). From it, post-processing: whether the images are ink on a dark background
(:func:`two_tone`; only then are the released images cleaned by :func:`clean`), and their mean intensity, around
which the class and style sums are taken (the clip then no longer pulls light or colour images towards black).
Without it (the digit recipe) the images are always cleaned and the sums taken around black.

With ``warmup.styles`` = s > 0 a second release follows: s × s public templates per class (the
released class mean sheared and thickened or thinned on an s × s grid) split every class into groups
by each record's nearest template, and the groups' means are released the same way (one more
Gaussian event; :func:`dpsynth.warmup.central_images.style_images`). A group whose noisy count is
below ``MIN_COUNT`` is mostly noise: its slot gets the class mean instead (post-processing). With
``warmup.styles_max_noise`` = τ so does a group whose mean's noise std (σ_s·C over its noisy count) exceeds
τ times its image's peak above the background floor: a faint group mean (thin strokes) is stretched to
white by :func:`clean`, and its noise with it.

With ``warmup.styles_along`` = variations the templates need no knowledge of what the images show: each class
mean moved along the two directions of variation that change its shape most (:func:`variation_templates`: each
direction less its smooth part, so that a change of overall brightness or colour splits no class), which the
variation release (below) then gives first, taken around the class means; the style release follows it in the trace.

With ``warmup.polarity_noise_multiplier`` = σ_p (for images whose colours vary: a class of shapes in random colours
has a flat grey mean) a release follows the class means instead of styles
(:func:`dpsynth.warmup.central_images.polarity_shapes`): the means of a feature every record computes alone (its
luminance less its own mean, unit norm, signed so its rarer tone is bright) over every class's two groups, shape
lighter or darker than the rest (that sign). Drawn grey around the histogram's mean intensity, lighter or darker by
its spread (:func:`polarity_slots`), they are the generator's two slots per class.

With ``warmup.variations`` = r > 0 a third release follows: every class's r main directions of variation
around its released images (:func:`dpsynth.warmup.central_images.variation_directions`: the Gaussian
mechanism on each class's residual second-moment matrix, sensitivity clip², then its top eigenvectors —
post-processing). They carry what a handful of images per class cannot: the many small ways a digit is
written. Coordinates 8 … 7 + r of z weigh them (``VARIATION_LATENT``). With ``warmup.variations_shared`` the
classes' matrices are summed before the noise and every class gets the same directions (at a low ε: the signal
of every record for the noise of one matrix); ``warmup.fit_epsilon`` chooses it where the per-class release does
not fit (:func:`dpsynth.warmup.epsilon.fit_epsilon`).

The generator is fitted to the released images under deformations that its latent code chooses:
the first six coordinates of z pick a rotation, shear, scale, shift and stroke width, and G(z, y)
regresses onto the class-y image deformed that way. With styles the generator has one slot per style
group (``dcgan.Generator(styles=…)``, the seventh coordinate of z picks it) and each slot is fitted
to its group's image. That reads only the released
means, so it is post-processing and costs no further privacy; it leaves G producing varied,
digit-shaped images for every class, from which private training starts.

>>> means = -torch.ones(2, 1, 28, 28); means[1, :, 10:18, 12:16] = 1.0
>>> x = deform(means[torch.tensor([0, 1, 1])], torch.rand(3, 6, generator=torch.Generator().manual_seed(0)))
>>> tuple(x.shape), bool(x[0].eq(-1).all()), bool(x[1].gt(-1).any())
((3, 1, 28, 28), True, True)
"""

from __future__ import annotations

import logging
import math
import sys
import time

import torch
import torch.nn.functional as F

from dpsynth import termination
from dpsynth.models.dcgan import LATENT_CONTROLS, deform  # noqa: F401  (z[:, :6] choose the deformation)
VARIATION_LATENT = 7  # z[:, 7:7 + r] weigh the variation directions (z[:, 6] picks the style slot)
MIN_COUNT = 20.0  # a style group with fewer (noisy) records is dropped: its mean is mostly noise
FLOOR = 0.15  # on [0, 1]: what :func:`clean` makes background
_log = logging.getLogger("dpsynth.train")  # the warm-up speaks as the train stage does


def release(cfg, images: torch.Tensor, labels: torch.Tensor, *, num_classes: int, randomness,
            trace, canaries=None, observe=None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The warm-up's releases on the training records (``images`` in [-1, 1], ``labels``), with the
    mechanism's secret coins, each recording its event in ``trace`` (the order of :func:`dpsynth.warmup.releases.events`): returns
    the images of the generator's slots (one per class, or per (class, style) with styles, class-major),
    the variation directions (None without them) — what :func:`fit_generator` fits G to (it moves them to
    G's device: the releases are computed on the CPU, :mod:`dpsynth.warmup.central_images`) — and the
    released intensity histogram (None without it; :func:`match_tones` reads it).

    For the empirical audit's run only (:mod:`dpsynth.audit.empirical`, on a public stand-in, never
    released): ``canaries`` = (name, images, labels), records that join the data of the release ``name``
    (of :data:`dpsynth.warmup.releases.RELEASES`) alone, and ``observe(name, noisy, query)``, which sees each release's raw output
    and its noiseless query."""
    from dpsynth.warmup import central_images

    w = cfg.warmup

    def data(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if canaries is None or canaries[0] != name:
            return images, labels
        return torch.cat([images, canaries[1].to(images)]), torch.cat([labels, canaries[2].to(labels)])

    def seen(name: str):
        return None if observe is None else (lambda noisy, query: observe(name, noisy, query))

    tidy, centre, spread, hist = clean, 0.0, None, None
    if w.intensity_noise_multiplier is not None:  # clean only two-tone images: ink on a dark background
        hist = central_images.intensity_histogram(data("intensity")[0], noise_multiplier=w.intensity_noise_multiplier,
                                                  randomness=randomness, trace=trace, observe=seen("intensity"))
        tidy = clean if two_tone(hist) else (lambda x: x)
        centre = mean_intensity(hist)  # the releases' sums are taken around it (post-processing: public)
        spread = intensity_spread(hist)
    means, class_counts = central_images.central_images(
        *data("class_means"), num_classes=num_classes, clip=w.clip, noise_multiplier=w.noise_multiplier,
        randomness=randomness, trace=trace, with_counts=True, observe=seen("class_means"), centre=centre)
    means = tidy(means)
    slots, slot_classes = means, torch.arange(num_classes)  # one image per slot, and its class
    if w.polarity_noise_multiplier is not None:  # two slots per class: shape lighter / darker than around it
        shapes, counts = central_images.polarity_shapes(
            *data("polarity"), num_classes=num_classes, clip=w.clip, noise_multiplier=w.polarity_noise_multiplier,
            randomness=randomness, trace=trace, observe=seen("polarity"))
        slots = tidy(polarity_slots(shapes, counts, means, centre=centre, spread=spread))
        slot_classes = torch.arange(num_classes).repeat_interleave(2)

    def variations(centres: torch.Tensor, centre_classes: torch.Tensor) -> torch.Tensor:
        # residuals around each record's nearest released image of its class (public by now)
        return central_images.variation_directions(
            *data("variations"), centres, centre_classes, class_counts, rank=w.variations, clip=w.variations_clip,
            noise_multiplier=w.variations_noise_multiplier, randomness=randomness, trace=trace,
            observe=seen("variations"), shared=w.variations_shared)

    directions = None
    if w.styles_along_variations:  # the directions first, around the class means: the templates move along them
        directions = variations(means, torch.arange(num_classes))
    if w.styles:
        templates, slot_classes = (variation_templates(means, directions, w.styles) if directions is not None
                                   else style_templates(means, w.styles))
        styles, counts = central_images.style_images(
            *data("styles"), templates, slot_classes, clip=w.clip, noise_multiplier=w.styles_noise_multiplier,
            randomness=randomness, trace=trace, observe=seen("styles"), centre=centre)
        keep = keep_styles(styles, counts, sum_noise=w.styles_noise_multiplier * w.clip, max_noise=w.styles_max_noise)
        slots = fill_styles(tidy(styles), keep, means)
    if w.variations and directions is None:
        directions = variations(slots, slot_classes)
    return slots, directions, hist


FIT_STEPS_PER_TRAIN_STEP, FIT_STEPS_MAX = 40, 4000


def fit_steps(cfg) -> int:
    """How many steps the generator's fit runs: ``warmup.steps``, or when it is null 40 × ``train.steps``, at most
    4,000 (the shipped recipes, 100 or more private steps: 4,000; a 12-step trial: 480)."""
    steps = cfg.warmup.steps
    return steps if steps is not None else min(FIT_STEPS_MAX, FIT_STEPS_PER_TRAIN_STEP * cfg.train.steps)


def style_slots(cfg) -> int:
    """How many style slots per class the generator needs: s × s with styles, 2 with polarity groups, else 1."""
    w = cfg.warmup
    if w.central_images and w.polarity_noise_multiplier is not None:
        return 2
    return w.styles ** 2 if w.central_images and w.styles else 1


def style_templates(means: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Public templates from released class means (K×C×H×W in [-1, 1]): each mean sheared and
    thickened/thinned on a ``levels`` × ``levels`` grid; returns (templates, their classes)."""
    grid = torch.linspace(0.1, 0.9, levels)
    u = torch.full((levels * levels, 6), 0.5)
    u[:, 1] = grid.repeat_interleave(levels)  # shear
    u[:, 5] = grid.repeat(levels)             # stroke width
    k = len(u)
    templates = deform(means.repeat_interleave(k, 0), u.repeat(len(means), 1))
    return templates, torch.arange(len(means)).repeat_interleave(k)


def shape_directions(directions: torch.Tensor, keep: int = 2) -> torch.Tensor:
    """The ``keep`` released directions (K×r×C×H×W, each scaled by its spread) that change a class's *shape* most:
    each direction less its smooth part (on every channel, its least-squares fit by a plane a + b·x + c·y: a change of
    overall brightness, colour or a gradient across the image), ranked by the norm of what is left (its spread
    times the share of it that is not smooth). Returns K×keep×C×H×W, those remainders. Post-processing of the
    variation release. Where a class's first direction is a change of overall brightness (the paper's tone in
    ``letters``: cosine 0.99 with the flat image), style groups along it would split the class by brightness,
    which the variation release carries already, not by shape.

    >>> d = torch.tensor([[[[[1.0, 1.0, 1.0]]], [[[0.3, 0.0, -0.3]]], [[[0.0, 0.5, 0.0]]]]])  # flat, ramp, bump
    >>> [round(v, 4) for v in shape_directions(d, 1).flatten().tolist()]  # the bump less its plane: by hand
    [-0.1667, 0.3333, -0.1667]
    """
    k, r, c, h, w = directions.shape
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    basis = torch.stack([torch.ones(h * w), xx.flatten(), yy.flatten()], 1).to(directions)  # hw × 3
    flat = directions.reshape(k, r, c, h * w)
    rest = flat - (flat @ torch.linalg.pinv(basis).T) @ basis.T  # less its least-squares plane
    order = rest.flatten(2).norm(dim=2).argsort(dim=1, descending=True, stable=True)[:, :keep]  # k × keep
    return torch.take_along_dim(rest, order[:, :, None, None], dim=1).reshape(k, keep, c, h, w)


def variation_templates(means: torch.Tensor, directions: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Public templates from released class means (K×C×H×W in [-1, 1]) and variation directions (K×r×C×H×W, each
    scaled by its released spread, r >= 2): each mean moved by a·P[0] + b·P[1], where P are the two directions
    that change its shape most (:func:`shape_directions`), a and b on ``levels`` even steps of [−1, 1] (one spread
    either side), clamped to [-1, 1]; returns (K·levels² templates, class-major, a major and b minor; their
    classes). With three levels, a record's nearest template splits its class at half a spread along each
    direction (about 31 / 38 / 31 % of a Gaussian class on each): post-processing of both releases.

    >>> means = torch.zeros(1, 1, 1, 3)  # directions: flat (the largest spread), a bump, a larger ripple
    >>> d = torch.tensor([[[[[0.5, 0.5, 0.5]]], [[[0.0, 0.3, 0.0]]], [[[0.2, -0.4, 0.2]]]]])
    >>> t, k = variation_templates(means, d, 2)  # P0 the ripple, P1 the bump less its plane [-0.1, 0.2, -0.1]
    >>> [[round(v, 4) for v in row] for row in t.flatten(1).tolist()], k.tolist()
    ([[-0.1, 0.2, -0.1], [-0.3, 0.6, -0.3], [0.3, -0.6, 0.3], [0.1, -0.2, 0.1]], [0, 0, 0, 0])
    """
    k = levels * levels
    a = torch.linspace(-1, 1, levels)
    coef = torch.stack([a.repeat_interleave(levels), a.repeat(levels)], 1).to(means)  # k × 2
    shape = shape_directions(directions.to(means))
    moved = torch.einsum("nr,nr...->n...", coef.repeat(len(means), 1), shape.repeat_interleave(k, 0))
    templates = (means.repeat_interleave(k, 0) + moved).clamp(-1, 1)
    return templates, torch.arange(len(means)).repeat_interleave(k)


def keep_styles(styles: torch.Tensor, counts: torch.Tensor, *, sum_noise: float,
                max_noise: float | None) -> torch.Tensor:
    """Which released style groups keep their image (the others get their class mean): a noisy count of at
    least MIN_COUNT and, with ``max_noise`` = τ, a mean whose noise std — ``sum_noise`` (σ_s·C, the std on
    every coordinate of the group sums) over the noisy count, in [0, 1] units — is at most τ times the
    image's peak above FLOOR (what :func:`clean` stretches to white). ``styles`` in [-1, 1], before clean."""
    keep = counts >= MIN_COUNT
    if max_noise is not None:
        peak = ((styles + 1) / 2).flatten(1).amax(1) - FLOOR
        keep &= sum_noise / counts.clamp(min=1.0) <= max_noise * peak
    return keep


def fill_styles(styles: torch.Tensor, keep: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    """The images for the generator's style slots (class-major, ``len(styles) // len(means)`` per class):
    each released style image where ``keep`` (:func:`keep_styles`), else its class mean."""
    per_class = len(styles) // len(means)
    fallback = means.repeat_interleave(per_class, 0)
    return torch.where(keep.view(-1, *[1] * (styles.dim() - 1)), styles, fallback)


DARK_SHARE, MID_SHARE = 0.5, 0.2  # two-tone: ≥ half the pixels in the darkest bins, ≤ 1/5 in the middle half


def two_tone(hist: torch.Tensor) -> bool:
    """Whether a released intensity histogram (shares of ``len(hist)`` equal bins on [0, 1]) is ink on a dark
    background, what :func:`clean` assumes: at least DARK_SHARE of the pixels below FLOOR and at most MID_SHARE
    in [1/4, 3/4). Post-processing of the release.

    >>> h = torch.zeros(16); h[0], h[15] = 0.8, 0.2; two_tone(h), two_tone(torch.full((16,), 1 / 16))
    (True, False)
    """
    b = len(hist)
    edges = torch.arange(b, dtype=torch.float32) / b  # each bin's lower edge
    dark = hist[edges + 1 / b <= FLOOR + 1e-9].sum()
    mid = hist[(edges >= 0.25) & (edges < 0.75)].sum()
    return bool(dark >= DARK_SHARE and mid <= MID_SHARE)


def mean_intensity(hist: torch.Tensor) -> float:
    """The mean pixel intensity (on [0, 1]) of a released histogram: bin shares times bin centres."""
    b = len(hist)
    return float((hist * (torch.arange(b, dtype=hist.dtype) + 0.5) / b).sum())


def intensity_spread(hist: torch.Tensor) -> float:
    """The standard deviation of the pixel intensities (on [0, 1]) of a released histogram (bin centres)."""
    b = len(hist)
    centres = (torch.arange(b, dtype=hist.dtype) + 0.5) / b
    return float((hist * (centres - mean_intensity(hist)) ** 2).sum().sqrt())


KEEP_SHARE = 0.1  # a polarity group with less than this share of its class's (noisy) records takes the other's slot


def polarity_slots(shapes: torch.Tensor, counts: torch.Tensor, means: torch.Tensor, *, centre: float,
                   spread: float) -> torch.Tensor:
    """The generator's two slots per class from the released polarity shapes (2K × H·W, class-major, polarity +
    then −; :func:`dpsynth.warmup.central_images.polarity_shapes`) and their noisy counts: each drawn grey, the
    shape (:func:`smooth`) lighter (+) or darker (−) than ``centre``, as far as a record of pixel spread ``spread``
    deviates (norm spread·√(H·W), the shapes being means of unit vectors). A group with fewer than MIN_COUNT noisy records,
    or under KEEP_SHARE of its class's, takes its class's other slot, or with neither its class mean (``means``,
    K×C×H×W in [-1, 1]). Post-processing of released values; returns 2K×C×H×W in [-1, 1]."""
    k, c, h, w = means.shape
    sign = torch.tensor([1.0, -1.0]).repeat(k).view(-1, 1, 1, 1)
    drawn = (centre + sign * spread * math.sqrt(h * w) * smooth(shapes.float().view(2 * k, 1, h, w))).clamp(0, 1)
    drawn = (drawn * 2 - 1).expand(-1, c, -1, -1)
    total = counts.view(k, 2).sum(1).repeat_interleave(2)
    keep = (counts >= MIN_COUNT) & (counts >= KEEP_SHARE * total)
    other = torch.arange(2 * k) ^ 1
    shape = (-1, 1, 1, 1)
    fallback = torch.where(keep[other].view(shape), drawn[other], means.repeat_interleave(2, 0))
    return torch.where(keep.view(shape), drawn, fallback)


def histogram_quantiles(hist: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The intensities (on [-1, 1]) below which the shares ``p`` of the pixels lie, for a released histogram of
    ``len(hist)`` equal bins on [0, 1], each bin's pixels spread evenly over it. Post-processing of the release.

    >>> h = torch.zeros(4); h[0], h[3] = 0.75, 0.25
    >>> histogram_quantiles(h, torch.tensor([0.0, 0.375, 0.75, 0.875, 1.0])).tolist()
    [-1.0, -0.75, -0.5, 0.75, 1.0]
    """
    b = len(hist)
    cdf = torch.cat([torch.zeros(1), hist.double().cpu().cumsum(0)])
    cdf = cdf / cdf[-1].clamp(min=1e-12)
    edges = torch.linspace(0, 1, b + 1, dtype=torch.float64)
    j = torch.searchsorted(cdf, p.double().cpu()).clamp(1, b)  # the first bin whose cumulative share reaches p
    lo, hi = cdf[j - 1], cdf[j]
    inside = torch.where(hi > lo, (p.double().cpu() - lo) / (hi - lo).clamp(min=1e-12), torch.ones_like(lo))
    return ((edges[j - 1] + inside.clamp(0, 1) / b) * 2 - 1).float()


TONE_MAX_SLOPE = 4.0  # the tone map's steepest segment: the contrast layer tanh(4x)/tanh(4)'s slope at 0 (≈ 4.0)


def match_tones(G, hist: torch.Tensor, *, generator: torch.Generator, n: int = 2000) -> None:
    """Set G's tone layer (``dcgan.Generator(tone=True)``) so that the pixels of its images have the released
    intensity histogram ``hist``: its knots map the quantiles of G's own pixels (n images, classes balanced, drawn
    with ``generator``; the layer the identity while they are drawn) to the histogram's
    (:func:`histogram_quantiles`) at the same TONE_KNOTS + 1 shares, no segment steeper than TONE_MAX_SLOPE. It reads
    only G and a released value: post-processing, no privacy spent."""
    device = G.tone_x.device
    k = len(G.tone_x) - 1  # TONE_KNOTS segments
    G.tone_x.copy_(torch.linspace(-1, 1, k + 1))
    G.tone_y.copy_(torch.linspace(-1, 1, k + 1))
    with torch.no_grad():
        y = torch.arange(n, device=device) % G.num_classes
        z = torch.randn(n, G.latent_dim, device=device, generator=generator)
        pixels = G(z, y).flatten().float().cpu()
    p = torch.linspace(0, 1, k + 1)
    src = torch.quantile(pixels, p).clamp(-1, 1)  # torch.quantile takes up to 16M values: n·C·H·W ≤ 6.2M
    src[0], src[-1] = -1.0, 1.0
    step = 1e-4 * torch.arange(k + 1)  # strictly increasing: ties (saturated pixels) become steep, not undefined
    src = torch.cummax(src - step, 0).values + step
    src = (src + 1) * 2 / (src[-1] + 1) - 1  # the nudges may push the last knot past 1: back onto [-1, 1]
    dst = torch.cummax(histogram_quantiles(hist, p), 0).values
    dst[0], dst[-1] = -1.0, 1.0
    # no segment steeper than TONE_MAX_SLOPE: where G draws nearly one grey (a flat class mean, little signal) the
    # match would stretch its small differences, noise included, over the histogram's whole range; the capped map
    # is anchored at the median share and clamped to [-1, 1]
    rise = torch.minimum(dst.diff(), TONE_MAX_SLOPE * src.diff())
    y = torch.cat([torch.zeros(1), rise.cumsum(0)])
    y = (y - y[k // 2] + dst[k // 2]).clamp(-1, 1)
    G.tone_x.copy_(src.to(device))
    G.tone_y.copy_(y.to(device))


def smooth(x: torch.Tensor) -> torch.Tensor:
    """A binomial blur ([1, 4, 6, 4, 1] / 16 along each side, std 1 pixel; edges repeated) of N×C×H×W images: a
    released mean is smooth, its noise white, so this keeps the one and averages the other (post-processing)."""
    k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0], dtype=x.dtype) / 16
    c = x.shape[1]
    x = F.conv2d(F.pad(x, (2, 2, 0, 0), mode="replicate"), k.view(1, 1, 1, 5).repeat(c, 1, 1, 1), groups=c)
    return F.conv2d(F.pad(x, (0, 0, 2, 2), mode="replicate"), k.view(1, 1, 5, 1).repeat(c, 1, 1, 1), groups=c)


def clean(means: torch.Tensor, *, floor: float = FLOOR) -> torch.Tensor:
    """Post-process noisy central images: pixels below ``floor`` (on [0, 1]) become background and
    each class is stretched so its brightest pixel is white."""
    m = (means + 1) / 2
    m = (m - floor).clamp(min=0)
    m = m / m.flatten(1).amax(1).clamp(min=1e-6).view(-1, *[1] * (m.dim() - 1))
    return m * 2 - 1


def vary(images: torch.Tensor, y: torch.Tensor, z: torch.Tensor, directions: torch.Tensor | None) -> torch.Tensor:
    """``images`` (of classes ``y``) moved along their class's variation directions, weighed by
    z[:, 7:7 + r]; unchanged without directions."""
    if directions is None:
        return images
    r = directions.shape[1]
    a = z[:, VARIATION_LATENT:VARIATION_LATENT + r]
    return (images + torch.einsum("nr,nr...->n...", a, directions[y])).clamp(-1, 1)


def fit_generator(G, images: torch.Tensor, *, steps: int, batch_size: int, lr: float,
                  generator: torch.Generator, directions: torch.Tensor | None = None, progress: bool = False) -> float:
    """Regress G(z, y) onto ``deform(vary(image), Φ(z[:, :6]))`` for ``steps`` Adam steps, the image the one
    of class y's slot that z picks (``images``: G.num_classes × G.styles, class-major), moved along class
    y's variation ``directions`` (num_classes × r × C×H×W) when given; returns the last loss. ``progress``: a
    progress bar on stderr (steps, rate, time left), as the private steps have."""
    needed = LATENT_CONTROLS if directions is None else VARIATION_LATENT + directions.shape[1]
    if G.latent_dim < needed:
        raise ValueError(f"warmup: the generator's latent_dim must be >= {needed}")
    styles = getattr(G, "styles", 1)
    if len(images) != G.num_classes * styles:
        raise ValueError(f"warmup: {len(images)} images for {G.num_classes} classes × {styles} style slots")
    device = next(G.parameters()).device
    images = images.to(device)
    directions = directions.to(device) if directions is not None else None
    warps = getattr(G, "warp", False)
    fitted = G.canonical if warps or getattr(G, "contrast", 0) or getattr(G, "tone", False) else G  # before G's fixed layers
    opt = torch.optim.Adam(G.parameters(), lr=lr, betas=(0.5, 0.999))
    loss = torch.tensor(float("nan"))
    from tqdm import tqdm

    quiet = {} if progress else {"disable": True}  # shown: TQDM_DISABLE (dpsynth -q) still hides it
    for _ in tqdm(range(steps), desc="warm-up generator fit", unit="step", file=sys.stderr, mininterval=1.0,
                  dynamic_ncols=True, **quiet):
        y = torch.randint(0, G.num_classes, (batch_size,), device=device, generator=generator)
        z = torch.randn(batch_size, G.latent_dim, device=device, generator=generator)
        with torch.no_grad():
            pick = y * styles + (G.slot(z) if styles > 1 else 0)
            target = vary(images[pick], y, z, directions)
            if not warps:
                target = deform(target, 0.5 * (1 + torch.erf(z[:, :LATENT_CONTROLS] / math.sqrt(2))))
        # a warping G (Generator(warp=True)) deforms its canonical image itself, and a contrast layer sharpens
        # it: fit the canonical one (the released images, blurred strokes, are what G draws before its contrast)
        loss = F.mse_loss(fitted(z, y), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss.detach())


def warm_up(cfg, G, images: torch.Tensor, labels: torch.Tensor, *, num_classes: int, randomness, trace,
            generator: torch.Generator) -> None:
    """The private warm-up before the first step (a trainer's ``warm_up``, when ``warmup.central_images`` is on): the
    central-image releases on the training records (``images`` in [-1, 1], ``labels``), with the mechanism's secret
    coins ``randomness``, each recording its event in ``trace`` (:func:`release`); then ``G`` fitted to them with its
    latent stream ``generator`` (:func:`fit_generator`, and :func:`match_tones` for a tone layer: post-processing)."""
    from dpsynth.warmup import releases

    w = cfg.warmup
    started = time.monotonic()
    fit = fit_steps(cfg)
    _log.info("warm-up: %d private release(s) of central images (%s), then %d generator fit steps (%s)",
              len(releases.events(cfg)), ", ".join(releases.release_names(cfg)), fit,
              "warmup.steps" if w.steps is not None else "null warmup.steps: 40 × train.steps, at most 4,000")
    if images.shape[1] > 1 and w.polarity_noise_multiplier is None:  # the channel count is public (the schema)
        _log.warning("colour images and no polarity release (warmup.polarity_noise_multiplier): the generator's "
                     "slots are class means, flat grey where a class's colours vary (recipes without it scored at "
                     "chance on the colour sets measured: docs/results.md); configs/dpgan-generic-cpu.yaml's "
                     "polarity release keeps shapes in any colour")
    with termination.deferred():  # the releases and their events in the trace end whole
        slots, directions, hist = release(cfg, images, labels, num_classes=num_classes, randomness=randomness,
                                          trace=trace)
    _log.info("warm-up: released in %.0f s; fitting the generator to them (post-processing)",
              time.monotonic() - started)
    fit_generator(G, slots, steps=fit, batch_size=w.batch_size, lr=w.lr, generator=generator,
                  directions=directions, progress=True)
    if getattr(G, "tone", False):  # G's pixels take the released histogram's tones (post-processing)
        match_tones(G, hist, generator=generator)
