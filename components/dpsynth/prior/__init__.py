"""The public prior: images rendered by code, from a public seed, that no sensitive record ever touches.

:mod:`dpsynth.prior.figures` draws figures (the masks of filled and outlined polygons, ellipses, strokes and Latin
letters and digits from the DejaVu fonts matplotlib ships) as small genomes of parts, and varies them;
:mod:`dpsynth.prior.paint` paints a mask into an image of the user's public schema (channels, size) in random
colours, fill textures and gradient backgrounds. Private Evolution
(:mod:`dpsynth.mechanisms.private_evolution`) moves this prior towards the user's images: what it is, for a
privacy statement, is :data:`STATEMENT`.

The prior never renders the glyphs of :data:`dpsynth.prior.figures.EXCLUDED` (the Greek letters and the symbols
of the Unicode "Miscellaneous Symbols" and "Dingbats" blocks), so that image sets drawn from those glyphs can
confirm what the prior could not have seen (docs/prior.md).
"""

STATEMENT = (
    "The public prior is rendered by code from a public seed and reads no record: masks of filled and outlined "
    "polygons, ellipses, strokes, and Latin letters and digits in the DejaVu fonts that ship with matplotlib "
    "(never Greek letters or the symbols of the Unicode Miscellaneous Symbols and Dingbats blocks), each painted in "
    "random colours and fill textures on random gradient backgrounds (dpsynth.prior, version "
    "{version})."
)
VERSION = "1"

__all__ = ["STATEMENT", "VERSION"]
