"""Figures of the public prior: small genomes of parts, drawn as masks, and their variations.

A :class:`Figure` is a tuple of :class:`Part`\\ s drawn in order onto a black canvas: a filled or outlined polygon
(regular, star-like or irregular), a filled or outlined ellipse, a stroke (a thick polyline), or a glyph (a Latin
letter, digit or ASCII sign in one of the DejaVu fonts matplotlib ships). A part after the first may *erase*
(draw black), which cuts holes and crescents. Coordinates are fractions of the canvas side, (0.5, 0.5) its centre.

Everything here is a function of a numpy ``Generator`` the caller seeds publicly, and of figures: no record is an
argument, so nothing here can read one.

>>> rng = np.random.default_rng(0)
>>> figs = random_figures(rng, 3)
>>> m = masks(figs, 16)
>>> m.shape, m.dtype, bool(m.max() <= 1.0 and m.min() >= 0.0)
((3, 16, 16), dtype('float32'), True)
>>> masks(figs, 16).tobytes() == m.tobytes()  # drawing is deterministic
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFont

KINDS = ("poly", "ellipse", "stroke", "glyph")
KIND_WEIGHTS = (0.3, 0.2, 0.15, 0.35)  # a random part's kind
PARTS_WEIGHTS = (0.55, 0.3, 0.15)  # a random figure's number of parts: 1, 2, 3
MAX_PARTS = 4
ERASE_SHARE = 0.2  # a part after the first erases (draws black) with this probability
GLYPHS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+=<>/?&%#@$"
FONTS = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSerif.ttf",
         "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf")
# Unicode blocks the prior never draws from: Greek and Coptic, Miscellaneous Symbols, Dingbats (image sets of those
# glyphs are what it cannot have seen)
EXCLUDED = ((0x0370, 0x03FF), (0x2600, 0x26FF), (0x2700, 0x27BF))
SUPERSAMPLE = 4  # masks are drawn this many times larger, then averaged down (anti-aliased edges)


def excluded(char: str) -> bool:
    """Whether ``char`` lies in a block of :data:`EXCLUDED`."""
    return any(lo <= ord(char) <= hi for lo, hi in EXCLUDED)


assert not any(excluded(c) for c in GLYPHS)


@dataclass(frozen=True)
class Part:
    """One part of a figure. ``p`` by ``kind``:

    * ``poly``: (cx, cy, R, θ, filled, width, r_1 … r_k): k vertices at angles θ + 2πi/k, radius R·r_i;
    * ``ellipse``: (cx, cy, rx, ry, θ, filled, width);
    * ``stroke``: (width, x_1, y_1, …, x_m, y_m): a polyline of m ≥ 2 points;
    * ``glyph``: (cx, cy, size, θ in degrees), ``glyph`` in :data:`GLYPHS`, ``font`` an index of :data:`FONTS`.

    ``filled`` > 0.5 fills the shape, else it is outlined ``width`` wide."""

    kind: str
    p: tuple[float, ...]
    glyph: str = ""
    font: int = 0
    erase: bool = False


Figure = tuple[Part, ...]


def random_part(rng: np.random.Generator, kind: str | None = None) -> Part:
    """A part drawn from the prior (``kind`` random by :data:`KIND_WEIGHTS` unless given)."""
    kind = kind or KINDS[rng.choice(len(KINDS), p=KIND_WEIGHTS)]
    cx, cy = 0.5 + rng.uniform(-0.15, 0.15, 2)
    filled, width = float(rng.random() < 0.6), rng.uniform(0.04, 0.13)
    if kind == "poly":
        k = int(rng.integers(3, 11))
        style = rng.random()
        if style < 0.4:
            radii = np.ones(k)
        elif style < 0.7:
            radii = np.where(np.arange(k) % 2 == 0, 1.0, rng.uniform(0.3, 0.7))
        else:
            radii = rng.uniform(0.4, 1.0, k)
        return Part("poly", (cx, cy, rng.uniform(0.15, 0.42), rng.uniform(0, 2 * math.pi), filled, width,
                             *radii.tolist()))
    if kind == "ellipse":
        rx = rng.uniform(0.12, 0.4)
        return Part("ellipse", (cx, cy, rx, rx * rng.uniform(0.5, 1.0), rng.uniform(0, math.pi), filled, width))
    if kind == "stroke":
        m = int(rng.integers(2, 5))
        pts = [0.5 + rng.uniform(-0.3, 0.3, 2)]
        for _ in range(m - 1):
            a = rng.uniform(0, 2 * math.pi)
            pts.append(np.clip(pts[-1] + rng.uniform(0.15, 0.45) * np.array([math.cos(a), math.sin(a)]), 0.05, 0.95))
        return Part("stroke", (rng.uniform(0.05, 0.14), *np.concatenate(pts).tolist()))
    return Part("glyph", (0.5 + rng.uniform(-0.08, 0.08), 0.5 + rng.uniform(-0.08, 0.08), rng.uniform(0.5, 0.95),
                          rng.uniform(-20, 20)), glyph=GLYPHS[rng.integers(len(GLYPHS))],
                font=int(rng.integers(len(FONTS))))


def random_figure(rng: np.random.Generator) -> Figure:
    """A figure drawn from the prior: 1–3 parts (:data:`PARTS_WEIGHTS`), each after the first erasing with
    probability :data:`ERASE_SHARE`."""
    n = 1 + int(rng.choice(len(PARTS_WEIGHTS), p=PARTS_WEIGHTS))
    parts = [random_part(rng)]
    for _ in range(n - 1):
        parts.append(replace(random_part(rng), erase=bool(rng.random() < ERASE_SHARE)))
    return tuple(parts)


def random_figures(rng: np.random.Generator, n: int) -> list[Figure]:
    """``n`` figures drawn from the prior."""
    return [random_figure(rng) for _ in range(n)]


def _vary_part(part: Part, step: float, rng: np.random.Generator) -> Part:
    p = np.array(part.p, dtype=np.float64)
    size = lambda v: v * math.exp(rng.normal(0, step))  # noqa: E731  (a multiplicative change)
    if part.kind in ("poly", "ellipse"):
        p[0:2] = np.clip(p[0:2] + rng.normal(0, step * 0.4, 2), 0.1, 0.9)
        if part.kind == "poly":
            p[2] = np.clip(size(p[2]), 0.08, 0.48)
            p[3] += rng.normal(0, step * math.pi / 2)
            p[6:] = np.clip(p[6:] * np.exp(rng.normal(0, step, len(p) - 6)), 0.15, 1.0)
            p[5] = np.clip(size(p[5]), 0.02, 0.2)
            if rng.random() < step / 2:
                p[4] = 1.0 - p[4]
        else:
            p[2], p[3] = np.clip(size(p[2]), 0.06, 0.48), np.clip(size(p[3]), 0.04, 0.48)
            p[4] += rng.normal(0, step * math.pi / 2)
            p[6] = np.clip(size(p[6]), 0.02, 0.2)
            if rng.random() < step / 2:
                p[5] = 1.0 - p[5]
    elif part.kind == "stroke":
        p[0] = np.clip(size(p[0]), 0.03, 0.2)
        p[1:] = np.clip(p[1:] + rng.normal(0, step * 0.4, len(p) - 1), 0.03, 0.97)
    else:
        p[0:2] = np.clip(p[0:2] + rng.normal(0, step * 0.3, 2), 0.25, 0.75)
        p[2] = np.clip(size(p[2]), 0.3, 1.1)
        p[3] = np.clip(p[3] + rng.normal(0, step * 40), -45, 45)
        if rng.random() < step / 2:
            return replace(part, p=tuple(p.tolist()), font=int(rng.integers(len(FONTS))))
    return replace(part, p=tuple(p.tolist()))


def vary(figure: Figure, step: float, rng: np.random.Generator) -> Figure:
    """A variation of ``figure``: every part's numbers moved by a step of relative size ``step`` (positions by
    ~0.4·step of the canvas, sizes by a factor e^N(0, step), angles by ~step·π/2), and with probability ``step``
    one change of structure: a random part added (at most :data:`MAX_PARTS`), one removed (at least one stays), or
    a glyph replaced by another."""
    parts = [_vary_part(part, step, rng) for part in figure]
    if rng.random() < step:
        change = rng.integers(3)
        if change == 0 and len(parts) < MAX_PARTS:
            parts.append(replace(random_part(rng), erase=bool(rng.random() < ERASE_SHARE)))
        elif change == 1 and len(parts) > 1:
            del parts[int(rng.integers(1, len(parts)))]
        else:
            glyphs = [i for i, part in enumerate(parts) if part.kind == "glyph"]
            if glyphs:
                i = glyphs[int(rng.integers(len(glyphs)))]
                parts[i] = replace(parts[i], glyph=GLYPHS[rng.integers(len(GLYPHS))])
    return tuple(parts)


def _font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts/ttf"


@lru_cache(maxsize=512)
def _font(index: int, px: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(_font_dir() / FONTS[index]), px)


def _ring(cx, cy, rx, ry, theta, n=48):
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    x, y = rx * np.cos(t), ry * np.sin(t)
    c, s = math.cos(theta), math.sin(theta)
    return list(zip((cx + c * x - s * y).tolist(), (cy + s * x + c * y).tolist()))


def _draw(canvas: Image.Image, part: Part) -> Image.Image:
    big = canvas.size[0]
    ink = 0 if part.erase else 255
    p = part.p
    if part.kind == "glyph":
        cx, cy, size, theta = p
        font = _font(part.font, max(4, int(round(size * big / 2)) * 2))
        g = Image.new("L", (big, big), 0)
        d = ImageDraw.Draw(g)
        left, top, right, bottom = d.textbbox((0, 0), part.glyph, font=font)
        d.text((cx * big - (right + left) / 2, cy * big - (bottom + top) / 2), part.glyph, fill=255, font=font)
        g = g.rotate(theta, resample=Image.BILINEAR, center=(cx * big, cy * big))
        return ImageChops.subtract(canvas, g) if part.erase else ImageChops.lighter(canvas, g)
    d = ImageDraw.Draw(canvas)
    if part.kind == "stroke":
        pts = [(x * big, y * big) for x, y in zip(p[1::2], p[2::2])]
        d.line(pts, fill=ink, width=max(1, int(p[0] * big)), joint="curve")
        return canvas
    if part.kind == "poly":
        cx, cy, r, theta, filled, width = p[:6]
        radii = p[6:]
        k = len(radii)
        pts = [((cx + r * radii[i] * math.cos(theta + 2 * math.pi * i / k)) * big,
                (cy + r * radii[i] * math.sin(theta + 2 * math.pi * i / k)) * big) for i in range(k)]
    else:
        cx, cy, rx, ry, theta, filled, width = p
        pts = [(x * big, y * big) for x, y in _ring(cx, cy, rx, ry, theta)]
    if filled > 0.5:
        d.polygon(pts, fill=ink)
    else:
        d.line(pts + pts[:1], fill=ink, width=max(1, int(width * big)), joint="curve")
    return canvas


def mask(figure: Figure, size: int) -> np.ndarray:
    """``figure`` drawn as a size × size float32 mask in [0, 1] (1 = figure), anti-aliased."""
    big = size * SUPERSAMPLE
    canvas = Image.new("L", (big, big), 0)
    for part in figure:
        canvas = _draw(canvas, part)
    return np.asarray(canvas.resize((size, size), Image.BOX), dtype=np.float32) / 255.0


def masks(figures: list[Figure], size: int) -> np.ndarray:
    """The masks of ``figures`` (N × size × size, float32 in [0, 1])."""
    return np.stack([mask(f, size) for f in figures]) if figures else np.zeros((0, size, size), np.float32)
