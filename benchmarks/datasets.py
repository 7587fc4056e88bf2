"""Procedural image datasets for the generality benchmark (`utility.py dataset NAME`): not digits, made here.

Each dataset is drawn deterministically from a seed (numpy's PCG64 and PIL's drawing; glyphs from the DejaVu
fonts that matplotlib ships, so no download) and written as an image folder (``DIR/CLASS/NNNNN.png``), the
input a user brings to ``dpsynth data import``. Their roles are fixed here, before any result: recipes may be
chosen on the DEVELOPMENT sets; no setting is ever chosen on a CONFIRMATION set (it is scored last).
letters-rgb came later (#32, after the confirmation sets had been scored): the only other RGB development set,
shapes-rgb, turns its shapes through every angle, so no class template can show its shape, and an RGB set of
upright objects was missing to choose the RGB settings on.

| name | role | mode, size | classes | what varies |
|---|---|---|---|---|
| letters | development | grey 28×28 | 10 capital letters | 8 fonts, size, rotation, shift; dark ink on light paper, noise |
| shapes | development | grey 32×32 | 10 outline/filled shapes | size, rotation, position, fill texture, stroke, noisy background |
| shapes-rgb | development | RGB 32×32 | 10 shapes | the same, in random colours on coloured gradient backgrounds |
| letters-rgb | development | RGB 32×32 | 10 capital letters | 8 fonts, size, rotation, shift, in random colours and fill textures on coloured gradient backgrounds |
| symbols-rgb | confirmation | RGB 32×32 | 12 font symbols (♠ ★ ☂ ♪ ✈ …) | font, size, rotation, shift, colours, background texture |
| greek | confirmation | grey 28×28 | 10 Greek letters | font, size, rotation, shift, stroke brightness, light noise |
| symbols | confirmation | grey 32×32 | the 12 symbols of symbols-rgb | font, size, rotation, shift (symbols-rgb's), stroke brightness, light noise (greek's look): grey objects, not letters |
| letters-texture | development | RGB 32×32 | 10 capital letters | 8 fonts, size, rotation, shift; the letter cut out of one procedural texture (fractal coloured noise or a collage of random rectangles and ellipses), lightened or darkened away from the ground, laid with a soft shadow on another |
| mnist-photo | confirmation | RGB 32×32 | 10 handwritten digits | MNIST test digits (real handwriting) cut out of one photograph crop and laid, with a drop shadow, on another (three photographs that ship in scikit-learn and matplotlib) |

The benchmarks draw them through ``utility.generality`` (``dataset=NAME``); by hand:
``write_folder("letters", "/tmp/letters", n=6000, seed=0)`` writes one folder per class.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

DEVELOPMENT, CONFIRMATION = "development", "confirmation"


def _font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts/ttf"


FONTS = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSerif.ttf",
         "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf"]
_font_cache: dict = {}


def _font(name: str, size: int):
    key = (name, size)
    if key not in _font_cache:
        _font_cache[key] = ImageFont.truetype(str(_font_dir() / name), size)
    return _font_cache[key]


def _glyph_mask(text: str, rng, *, size: int, fonts: list[str], scale=(0.55, 0.8), rotate=15.0, shift=0.1) -> Image.Image:
    """An L-mode mask (255 = ink) of ``text`` in a random font, size, rotation and position, ``size`` pixels square."""
    big = size * 4
    font = _font(fonts[rng.integers(len(fonts))], int(big * rng.uniform(*scale)))
    canvas = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(canvas)
    l, t, r, b = draw.textbbox((0, 0), text, font=font)
    draw.text(((big - (r - l)) / 2 - l, (big - (b - t)) / 2 - t), text, fill=255, font=font)
    canvas = canvas.rotate(rng.uniform(-rotate, rotate), resample=Image.BILINEAR,
                           translate=tuple(rng.uniform(-shift, shift, 2) * big))
    return canvas.resize((size, size), Image.LANCZOS)


def _shape_mask(kind: int, rng, *, size: int) -> Image.Image:
    """An L-mode mask of shape ``kind`` (0..9), random scale, rotation, position, filled or outlined."""
    big = size * 4
    canvas = Image.new("L", (big, big), 0)
    d = ImageDraw.Draw(canvas)
    cx, cy = big / 2 + rng.uniform(-0.12, 0.12, 2) * big
    r = big * rng.uniform(0.22, 0.38)
    rot = rng.uniform(0, 2 * math.pi)
    width = max(2, int(r * rng.uniform(0.12, 0.3)))
    filled = rng.random() < 0.5

    def poly(k, radii):
        pts = [(cx + radii[i % len(radii)] * math.cos(rot + 2 * math.pi * i / k),
                cy + radii[i % len(radii)] * math.sin(rot + 2 * math.pi * i / k)) for i in range(k)]
        if filled:
            d.polygon(pts, fill=255)
        else:
            d.line(pts + pts[:1], fill=255, width=width, joint="curve")

    if kind == 0:  # circle (ellipse)
        a = r * rng.uniform(0.8, 1.0)
        box = [cx - r, cy - a, cx + r, cy + a]
        d.ellipse(box, fill=255) if filled else d.ellipse(box, outline=255, width=width)
    elif kind == 1:  # square
        poly(4, [r])
    elif kind == 2:  # triangle
        poly(3, [r])
    elif kind == 3:  # five-pointed star
        poly(10, [r, r * 0.45])
    elif kind == 4:  # plus / cross
        w = r * rng.uniform(0.25, 0.4)
        for ang in (rot, rot + math.pi / 2):
            dx, dy = math.cos(ang), math.sin(ang)
            d.line([(cx - r * dx, cy - r * dy), (cx + r * dx, cy + r * dy)], fill=255, width=int(w))
    elif kind == 5:  # ring (always hollow, thick)
        d.ellipse([cx - r, cy - r, cx + r, cy + r], outline=255, width=max(width, int(r * 0.3)))
    elif kind == 6:  # hexagon
        poly(6, [r])
    elif kind == 7:  # crescent
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
        o = r * 0.55
        d.ellipse([cx - r + o * math.cos(rot), cy - r + o * math.sin(rot), cx + r + o * math.cos(rot),
                   cy + r + o * math.sin(rot)], fill=0)
    elif kind == 8:  # arrow
        dx, dy = math.cos(rot), math.sin(rot)
        tip = (cx + r * dx, cy + r * dy)
        d.line([(cx - r * dx, cy - r * dy), tip], fill=255, width=width + 2)
        for s in (-1, 1):
            a = rot + math.pi + s * 0.5
            d.line([tip, (tip[0] + 0.6 * r * math.cos(a), tip[1] + 0.6 * r * math.sin(a))], fill=255, width=width + 2)
    else:  # 9: two parallel bars (equals sign)
        for s in (-1, 1):
            ox, oy = -math.sin(rot) * r * 0.35 * s, math.cos(rot) * r * 0.35 * s
            d.line([(cx - r * math.cos(rot) + ox, cy - r * math.sin(rot) + oy),
                    (cx + r * math.cos(rot) + ox, cy + r * math.sin(rot) + oy)], fill=255, width=int(r * 0.28))
    return canvas.resize((size, size), Image.LANCZOS)


def _texture(rng, size: int) -> np.ndarray:
    """A fill texture in [0, 1], size × size: flat, stripes, checks or smooth noise."""
    kind = rng.integers(4)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    if kind == 0:
        return np.ones((size, size))
    if kind == 1:
        a, f = rng.uniform(0, math.pi), rng.uniform(0.5, 1.2)
        return 0.6 + 0.4 * (np.sin(f * (xx * math.cos(a) + yy * math.sin(a))) > 0)
    if kind == 2:
        p = rng.integers(3, 6)
        return 0.6 + 0.4 * (((xx // p) + (yy // p)) % 2)
    noise = Image.fromarray((rng.random((size // 4, size // 4)) * 255).astype(np.uint8)).resize((size, size), Image.BICUBIC)
    return 0.5 + 0.5 * np.asarray(noise) / 255.0


def _background(rng, size: int, colour: bool) -> np.ndarray:
    """Backgrounds for the RGB sets: a colour gradient plus smooth and pixel noise, size × size × 3 in [0, 1]."""
    c0, c1 = rng.random(3), rng.random(3)
    a = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1)
    t = np.clip(0.5 + (xx - 0.5) * math.cos(a) + (yy - 0.5) * math.sin(a), 0, 1)[..., None]
    bg = c0 * (1 - t) + c1 * t
    blob = np.asarray(Image.fromarray((rng.random((size // 8, size // 8)) * 255).astype(np.uint8))
                      .resize((size, size), Image.BICUBIC)) / 255.0
    bg = bg + 0.15 * (blob[..., None] - 0.5) + rng.normal(0, 0.04, (size, size, 3))
    return np.clip(bg, 0, 1) if colour else bg.mean(-1)


def _distinct_colour(rng, bg: np.ndarray) -> np.ndarray:
    """A random colour at least 0.45 (Euclidean, RGB in [0, 1]) from the background's mean colour."""
    mean = bg.reshape(-1, 3).mean(0)
    for _ in range(50):
        c = rng.random(3)
        if np.linalg.norm(c - mean) >= 0.45:
            return c
    return 1 - mean


LETTERS = "ABCDEFGHKR"  # the classes of letters and letters-rgb


def letters(rng, label: int) -> np.ndarray:
    m = np.asarray(_glyph_mask(LETTERS[label], rng, size=28, fonts=FONTS)) / 255.0
    paper, ink = rng.uniform(0.65, 0.95), rng.uniform(0.0, 0.3)
    img = paper * (1 - m) + ink * m + rng.normal(0, 0.03, m.shape)
    return np.clip(img * 255, 0, 255).astype(np.uint8)


def shapes(rng, label: int) -> np.ndarray:
    m = np.asarray(_shape_mask(label, rng, size=32)) / 255.0
    fg = rng.uniform(0.55, 1.0) * _texture(rng, 32)
    bg = np.clip(rng.uniform(0.0, 0.35) + _background(rng, 32, False) * 0.3 - 0.15, 0, 1)
    img = bg * (1 - m) + fg * m
    return np.clip(img * 255, 0, 255).astype(np.uint8)


def _in_colour(rng, mask: Image.Image) -> np.ndarray:
    """``mask`` (L-mode, 255 = shape) in a random textured colour on a coloured gradient background, uint8 RGB."""
    m = (np.asarray(mask) / 255.0)[..., None]
    bg = _background(rng, m.shape[0], True)
    fg = _distinct_colour(rng, bg) * _texture(rng, m.shape[0])[..., None]
    return np.clip((bg * (1 - m) + fg * m) * 255, 0, 255).astype(np.uint8)


def shapes_rgb(rng, label: int) -> np.ndarray:
    return _in_colour(rng, _shape_mask(label, rng, size=32))


def letters_rgb(rng, label: int) -> np.ndarray:
    return _in_colour(rng, _glyph_mask(LETTERS[label], rng, size=32, fonts=FONTS))


SYMBOLS = "♠♣♥♦★☂♪✈☎⚓☯☀"


def symbols_rgb(rng, label: int) -> np.ndarray:
    fonts = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf"]
    return _in_colour(rng, _glyph_mask(SYMBOLS[label], rng, size=32, fonts=fonts, scale=(0.7, 1.0), rotate=25))


def symbols(rng, label: int) -> np.ndarray:
    """``symbols``: symbols-rgb's objects (spade, umbrella, note, plane, phone, anchor, …: glyphs of the Unicode
    blocks the prior never draws) as grey images, painted as ``greek`` is: a bright figure on a dark ground."""
    fonts = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf"]
    return _bright_on_dark(rng, _glyph_mask(SYMBOLS[label], rng, size=32, fonts=fonts, scale=(0.7, 1.0), rotate=25))


GREEK = "αβγδεζηθλπ"


def _bright_on_dark(rng, mask: Image.Image) -> np.ndarray:
    """A grey glyph set's look (``greek``, ``symbols``): a bright figure on a dark ground, light noise."""
    m = np.asarray(mask) / 255.0
    img = rng.uniform(0.0, 0.15) + m * rng.uniform(0.6, 1.0) + rng.normal(0, 0.05, m.shape)
    return np.clip(img * 255, 0, 255).astype(np.uint8)


def greek(rng, label: int) -> np.ndarray:
    return _bright_on_dark(rng, _glyph_mask(GREEK[label], rng, size=28, fonts=FONTS, scale=(0.6, 0.9)))


def _procedural_texture(rng, size: int) -> np.ndarray:
    """A photo-like texture made by code, size × size × 3 in [0, 1], for the development set ``letters-texture``:
    fractal value noise (octaves of bicubically upsampled random grids, each a random colour) or a collage of
    random rectangles and ellipses in random colours, smallest last, softened."""
    if rng.random() < 0.5:
        img = np.zeros((size, size, 3))
        amp = 1.0
        for cells in (2, 4, 8, 16):
            grid = (rng.random((cells, cells)) * 255).astype(np.uint8)
            layer = np.asarray(Image.fromarray(grid).resize((size, size), Image.BICUBIC)) / 255.0 - 0.5
            img += amp * layer[..., None] * (rng.random(3) * 2 - 0.5)
            amp *= rng.uniform(0.4, 0.7)
        img = rng.random(3) * 0.8 + 0.1 + img
    else:
        big = size * 2
        canvas = Image.new("RGB", (big, big), tuple(int(v) for v in rng.integers(0, 256, 3)))
        d = ImageDraw.Draw(canvas)
        for r in sorted(rng.uniform(0.05, 0.6, int(rng.integers(10, 40))) * big, reverse=True):
            x, y = rng.uniform(-0.1, 1.1, 2) * big
            box = [x - r, y - r * rng.uniform(0.3, 1.0), x + r, y + r * rng.uniform(0.3, 1.0)]
            fill = tuple(int(v) for v in rng.integers(0, 256, 3))
            d.rectangle(box, fill=fill) if rng.random() < 0.5 else d.ellipse(box, fill=fill)
        canvas = canvas.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.5))).resize((size, size), Image.LANCZOS)
        img = np.asarray(canvas, dtype=np.float64) / 255.0
    return np.clip(img, 0, 1)


def letters_texture(rng, label: int) -> np.ndarray:
    """``letters-texture``: a capital letter cut out of one procedural texture, lightened or darkened away from the
    ground's luminance, laid with a soft drop shadow on another (the construction of ``mnist-photo`` with textures
    made by code in place of its photographs and fonts in place of handwriting: a development set of its look)."""
    big = 32 * 4
    mask = _glyph_mask(LETTERS[label], rng, size=big, fonts=FONTS, scale=(0.6, 0.9))
    m = (np.asarray(mask.resize((32, 32), Image.LANCZOS)) / 255.0)[..., None]
    shadow = np.asarray(mask.filter(ImageFilter.GaussianBlur(6)).resize((32, 32), Image.LANCZOS)) / 255.0
    dy, dx = rng.integers(1, 3, 2) * rng.choice([-1, 1], 2)
    shadow = np.roll(shadow, (int(dy), int(dx)), axis=(0, 1))[..., None]
    ground, figure = _procedural_texture(rng, 32), _procedural_texture(rng, 32)
    if ground.mean() > 0.5:
        figure = figure * rng.uniform(0.2, 0.45)
    else:
        figure = 1 - (1 - figure) * rng.uniform(0.2, 0.45)
    ground = ground * (1 - 0.6 * np.clip(shadow * 1.5, 0, 1))
    return np.clip((ground * (1 - m) + figure * m) * 255, 0, 255).astype(np.uint8)


def _photographs() -> list[np.ndarray]:
    """The three photographs that ship in installed packages (no download): scikit-learn's ``china.jpg`` and
    ``flower.jpg`` (``load_sample_images``) and matplotlib's ``grace_hopper.jpg``, as float RGB in [0, 1]. The
    prior (components/dpsynth/prior/) must never draw them (docs/prior.md)."""
    import matplotlib.cbook
    import sklearn.datasets

    paths = [Path(sklearn.datasets.__file__).parent / "images" / f for f in ("china.jpg", "flower.jpg")]
    paths.append(Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)))
    return [np.asarray(Image.open(p).convert("RGB"), dtype=np.float64) / 255.0 for p in paths]


def _photo_crop(rng, photos: list[np.ndarray], size: int) -> np.ndarray:
    """A random square crop (side 40–160 pixels) of a random photograph, resized to ``size``, maybe mirrored."""
    photo = photos[rng.integers(len(photos))]
    h, w, _ = photo.shape
    side = int(rng.integers(40, 161))
    top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
    crop = Image.fromarray((photo[top:top + side, left:left + side] * 255).astype(np.uint8))
    crop = np.asarray(crop.resize((size, size), Image.LANCZOS), dtype=np.float64) / 255.0
    return crop[:, ::-1] if rng.random() < 0.5 else crop


class MnistPhoto:
    """``mnist-photo``: a real handwritten MNIST test digit (``data/mnist``, the 10,000-record test set, each digit
    used at most once per drawn set) scaled, turned and shifted into 32 × 32, its stroke cut out of one photograph
    crop (lightened or darkened away from the background's luminance) and laid with a soft drop shadow on a crop of
    another: a look (photographic texture in both figure and ground, a shadow) that the prior's painter never makes.
    Stateful: each ``write_folder`` call draws from a fresh copy (``fresh()``), so no digit repeats within a set."""

    def __init__(self):
        self._pool = None

    def fresh(self) -> MnistPhoto:
        return MnistPhoto()

    def _load(self, rng):
        from dpsynth.data.importers import import_idx_dir

        ds = import_idx_dir(Path(__file__).resolve().parents[1] / "data/mnist")
        images, labels = ds.images[..., 0], ds.labels
        self._digits = images
        self._pool = {k: list(rng.permutation(np.flatnonzero(labels == k))) for k in range(10)}
        self._photos = _photographs()

    def __call__(self, rng, label: int) -> np.ndarray:
        if self._pool is None:
            self._load(rng)
        if not self._pool[label]:
            raise ValueError(f"mnist-photo: no unused MNIST test digit {label} left (draw fewer records)")
        digit = Image.fromarray(self._digits[self._pool[label].pop()])
        big = 32 * 4
        scale = rng.uniform(0.8, 1.1)
        side = int(big * scale)
        canvas = Image.new("L", (big, big), 0)
        canvas.paste(digit.resize((side, side), Image.BICUBIC), ((big - side) // 2, (big - side) // 2))
        canvas = canvas.rotate(rng.uniform(-15, 15), resample=Image.BILINEAR,
                               translate=tuple(rng.uniform(-0.08, 0.08, 2) * big))
        m = (np.asarray(canvas.resize((32, 32), Image.LANCZOS)) / 255.0)[..., None]
        shadow = np.asarray(canvas.filter(ImageFilter.GaussianBlur(6)).resize((32, 32), Image.LANCZOS)) / 255.0
        dy, dx = rng.integers(1, 3, 2) * rng.choice([-1, 1], 2)
        shadow = np.roll(shadow, (int(dy), int(dx)), axis=(0, 1))[..., None]
        ground, figure = _photo_crop(rng, self._photos, 32), _photo_crop(rng, self._photos, 32)
        lum = lambda a: a.mean()  # noqa: E731
        if lum(ground) > 0.5:  # the figure darker than a light ground, lighter than a dark one
            figure = figure * rng.uniform(0.2, 0.45)
        else:
            figure = 1 - (1 - figure) * rng.uniform(0.2, 0.45)
        ground = ground * (1 - 0.6 * np.clip(shadow * 1.5, 0, 1))
        img = ground * (1 - m) + figure * m
        return np.clip(img * 255, 0, 255).astype(np.uint8)


# name: (role, draw(rng, label) -> uint8 H×W[×3], class names)
DATASETS = {
    "letters": (DEVELOPMENT, letters, list(LETTERS)),
    "shapes": (DEVELOPMENT, shapes, ["circle", "square", "triangle", "star", "cross", "ring", "hexagon", "crescent",
                                     "arrow", "bars"]),
    "shapes-rgb": (DEVELOPMENT, shapes_rgb, ["circle", "square", "triangle", "star", "cross", "ring", "hexagon",
                                             "crescent", "arrow", "bars"]),
    "letters-rgb": (DEVELOPMENT, letters_rgb, list(LETTERS)),
    "letters-texture": (DEVELOPMENT, letters_texture, list(LETTERS)),
    "symbols-rgb": (CONFIRMATION, symbols_rgb, ["spade", "club", "heart", "diamond", "star", "umbrella", "note",
                                                "plane", "phone", "anchor", "yinyang", "sun"]),
    "symbols": (CONFIRMATION, symbols, ["spade", "club", "heart", "diamond", "star", "umbrella", "note", "plane",
                                        "phone", "anchor", "yinyang", "sun"]),
    "greek": (CONFIRMATION, greek, ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "lambda",
                                    "pi"]),
    "mnist-photo": (CONFIRMATION, MnistPhoto(), [str(d) for d in range(10)]),
}


def write_folder(name: str, root: str | Path, *, n: int, seed: int = 0) -> dict:
    """Draw ``n`` images of dataset ``name`` (classes balanced, in a seeded random order) into the image
    folder ``root/CLASS/NNNNN.png``; returns its description (role, shape, classes, sha256 of the pixels)."""
    role, draw, classes = DATASETS[name]
    draw = draw.fresh() if hasattr(draw, "fresh") else draw
    root = Path(root)
    rng = np.random.default_rng([seed, int.from_bytes(name.encode(), "little") % 2**32])
    labels = rng.permutation(np.arange(n) % len(classes))
    digest = hashlib.sha256()
    for c in classes:
        (root / f"{classes.index(c):02d}-{c}").mkdir(parents=True, exist_ok=True)
    shape = None
    for i, y in enumerate(labels):
        img = draw(rng, int(y))
        shape = img.shape
        digest.update(img.tobytes())
        Image.fromarray(img).save(root / f"{int(y):02d}-{classes[y]}" / f"{i:05d}.png")
    return {"dataset": name, "role": role, "records": n, "seed": seed, "shape": list(shape),
            "classes": classes, "pixels_sha256": digest.hexdigest()}
