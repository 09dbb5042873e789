"""Captions that depend on the image: the digit's name plus five measured properties, in one of five templates.

A caption can only be predicted from the image: besides the label word ("seven") it names five properties
measured on the pixels, each binned into three words at the *training set's* tertiles (`fit_thresholds`;
the corpus manifest stores them), so every property word is roughly a three-way coin flip without the image.

Measurements (`measure`; pixels x in [0, 1], ink mask = x >= 0.5 * max(x), rows r grow downwards, columns c):
- thickness  = 2 * ink area / ink boundary length (Crofton estimate, `crofton_perimeter`), the stroke width
               in pixels (a stroke of length L and width w has area L*w and boundary ~2L). Words: thin / medium /
               bold.
- slant      = -cov(c, r) / var(r) over the intensity-weighted pixels: columns moved per row going up, > 0
               when the top leans right. Words: leaning left / upright / leaning right.
- size       = bounding box of the ink mask, height * width / image area. Words: small / mid-sized / large.
- position   = (bounding-box centre row - (H - 1) / 2) / H, < 0 above the middle. Words: high / centred / low.
- ink        = median intensity of the pixels > 0 (the ink's darkness). Words: faint / grey / black.
An image without ink measures 0 everywhere.

Binning: with tertiles (lo, hi), a value < lo takes the first word, > hi the third, otherwise the middle one
(ties at a tertile, common for the integer-valued bounding boxes, go to the middle word).

Templates (`TEMPLATES`, one per caption, drawn by `numpy.random.default_rng(seed)`):
  0 "a {size} {thickness} {digit}, {slant}, sitting {position}, in {ink} ink."
  1 "the digit {digit}: {thickness} strokes, {ink} ink, {size}, {slant} and {position}."
  2 "{ink} ink draws a {thickness} {digit} that is {slant}; it is {size} and sits {position}."
  3 "here is a {size} {digit} written {position}, {slant}, with {thickness} {ink} strokes."
  4 "{digit}, {size} and {position}; the strokes are {thickness}, {ink} and {slant}."
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from plelab.errors import PlelabError

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
WORDS: dict[str, tuple[str, str, str]] = {
    "thickness": ("thin", "medium", "bold"),
    "slant": ("leaning left", "upright", "leaning right"),
    "size": ("small", "mid-sized", "large"),
    "position": ("high", "centred", "low"),
    "ink": ("faint", "grey", "black"),
}
PROPERTIES = tuple(WORDS)
TEMPLATES = (
    "a {size} {thickness} {digit}, {slant}, sitting {position}, in {ink} ink.",
    "the digit {digit}: {thickness} strokes, {ink} ink, {size}, {slant} and {position}.",
    "{ink} ink draws a {thickness} {digit} that is {slant}; it is {size} and sits {position}.",
    "here is a {size} {digit} written {position}, {slant}, with {thickness} {ink} strokes.",
    "{digit}, {size} and {position}; the strokes are {thickness}, {ink} and {slant}.",
)
INK_LEVEL = 0.5  # pixels at least this share of the image's darkest pixel count as ink for the shape measures


class CaptionError(PlelabError):
    """Images or labels that cannot be captioned (labels outside 0..9, thresholds missing a property)."""


def measure(images: np.ndarray) -> dict[str, np.ndarray]:
    """The five caption properties of each image (N, H, W), as float64 arrays (N,) keyed by property name."""
    images = np.asarray(images)
    if images.ndim != 3:
        raise CaptionError(f"images must have shape (N, H, W), got {images.shape}")
    x = images / 255.0 if images.dtype == np.uint8 else images.astype(np.float64)
    n, h, w = x.shape
    peak = x.max(axis=(1, 2), keepdims=True)
    mask = (x >= INK_LEVEL * peak) & (peak > 0)  # relative to the darkest pixel: shape does not depend on ink
    area = mask.sum(axis=(1, 2))
    boundary = crofton_perimeter(mask)
    thickness = np.divide(2.0 * area, boundary, out=np.zeros(n), where=boundary > 0)

    total = x.sum(axis=(1, 2))
    weights = np.divide(x, total[:, None, None], out=np.zeros_like(x), where=total[:, None, None] > 0)
    r = np.arange(h, dtype=np.float64)[None, :, None]
    c = np.arange(w, dtype=np.float64)[None, None, :]
    mr = (weights * r).sum(axis=(1, 2))
    mc = (weights * c).sum(axis=(1, 2))
    dr = r - mr[:, None, None]
    var_r = (weights * dr * dr).sum(axis=(1, 2))
    cov = (weights * dr * (c - mc[:, None, None])).sum(axis=(1, 2))
    slant = np.divide(-cov, var_r, out=np.zeros(n), where=var_r > 0)

    rows, cols = mask.any(axis=2), mask.any(axis=1)
    has_ink = rows.any(axis=1)
    top, bottom = rows.argmax(axis=1), h - 1 - rows[:, ::-1].argmax(axis=1)
    left, right = cols.argmax(axis=1), w - 1 - cols[:, ::-1].argmax(axis=1)
    size = np.where(has_ink, (bottom - top + 1) * (right - left + 1) / (h * w), 0.0)
    position = np.where(has_ink, ((top + bottom) / 2 - (h - 1) / 2) / h, 0.0)

    lit = x > 0
    ink = np.array([np.median(xi[li]) if li.any() else 0.0 for xi, li in zip(x, lit, strict=True)])
    return {"thickness": thickness, "slant": slant, "size": size, "position": position, "ink": ink}


def crofton_perimeter(mask: np.ndarray) -> np.ndarray:
    """Boundary length of each binary mask (N, H, W) by the Crofton formula over 0/45/90/135 degree lines.

    Counting 4-neighbour edges would make a diagonal stroke's staircase ~1.4x longer than it is (and the stroke
    look thinner); averaging the crossings of four line directions is within ~10% for any orientation.
    """
    p = np.pad(mask, ((0, 0), (1, 1), (1, 1)))
    straight = (p[:, 1:, :] != p[:, :-1, :]).sum(axis=(1, 2)) + (p[:, :, 1:] != p[:, :, :-1]).sum(axis=(1, 2))
    diagonal = (p[:, 1:, 1:] != p[:, :-1, :-1]).sum(axis=(1, 2)) + (p[:, 1:, :-1] != p[:, :-1, 1:]).sum(axis=(1, 2))
    return np.pi / 8 * (straight + diagonal / np.sqrt(2))


def fit_thresholds(properties: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """The tertiles (lo, hi) of each property over a (training) set, as plain floats for a JSON manifest."""
    return {name: [float(q) for q in np.quantile(properties[name], [1 / 3, 2 / 3])] for name in PROPERTIES}


def bin_properties(properties: dict[str, np.ndarray], thresholds: dict[str, Sequence[float]]) -> dict[str, np.ndarray]:
    """Word index 0/1/2 of each property: < lo -> 0, > hi -> 2, else 1."""
    missing = [name for name in PROPERTIES if name not in thresholds]
    if missing:
        raise CaptionError(f"caption thresholds lack {', '.join(missing)}")
    bins = {}
    for name in PROPERTIES:
        lo, hi = thresholds[name]
        v = properties[name]
        bins[name] = np.where(v < lo, 0, np.where(v > hi, 2, 1))
    return bins


def describe(images: np.ndarray, thresholds: dict[str, Sequence[float]]) -> list[dict[str, str]]:
    """The property words of each image, e.g. {"thickness": "bold", "slant": "upright", ...}."""
    bins = bin_properties(measure(images), thresholds)
    return [{name: WORDS[name][int(bins[name][i])] for name in PROPERTIES} for i in range(len(images))]


def make_captions(images: np.ndarray, labels: np.ndarray, thresholds: dict[str, Sequence[float]],
                  seed: int | Sequence[int] = 0) -> list[str]:
    """One caption per image: a template drawn with `seed` filled with the label word and the property words."""
    labels = np.asarray(labels)
    if len(labels) != len(images):
        raise CaptionError(f"{len(labels)} labels for {len(images)} images")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(DIGIT_WORDS)):
        raise CaptionError(f"captions name digits 0..9; labels range {int(labels.min())}..{int(labels.max())}")
    templates = np.random.default_rng(seed).integers(len(TEMPLATES), size=len(images))
    words = describe(images, thresholds)
    return [TEMPLATES[t].format(digit=DIGIT_WORDS[int(y)], **w)
            for t, y, w in zip(templates, labels, words, strict=True)]
