"""Captions: measured properties land in the right words, the label word is right, the RNG is seeded."""

from __future__ import annotations

import re

import numpy as np
import pytest

from plelab.vision.captions import (
    DIGIT_WORDS,
    PROPERTIES,
    TEMPLATES,
    WORDS,
    CaptionError,
    describe,
    fit_thresholds,
    make_captions,
    measure,
)


def stroke(width: int = 3, shear: float = 0.0, top: int = 4, height: int = 20, ink: int = 255, side: int = 28):
    """A vertical stroke centred in a side x side image; shear > 0 moves its top to the right."""
    img = np.zeros((side, side), np.uint8)
    for r in range(top, top + height):
        centre = side / 2 + shear * ((top + height / 2) - r)
        left = int(round(centre - width / 2))
        img[r, max(left, 0):min(left + width, side)] = ink
    return img


def population() -> np.ndarray:
    """Strokes of every width, slant, height, position and ink: thresholds fitted on these are mid-range."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(300):
        height = int(rng.integers(8, 21))
        out.append(stroke(int(rng.integers(1, 7)), float(rng.uniform(-0.5, 0.5)),
                          int(rng.integers(0, 28 - height)), height, int(rng.integers(90, 256))))
    return np.stack(out)


THRESHOLDS = fit_thresholds(measure(population()))


@pytest.mark.parametrize(("image", "property", "word"), [
    (stroke(width=1), "thickness", "thin"),
    (stroke(width=6), "thickness", "bold"),
    (stroke(shear=0.45), "slant", "leaning right"),
    (stroke(shear=-0.45), "slant", "leaning left"),
    (stroke(shear=0.0), "slant", "upright"),
    (stroke(top=0, height=10), "position", "high"),
    (stroke(top=18, height=10), "position", "low"),
    (stroke(top=9, height=10), "position", "centred"),
    (stroke(width=1, height=8, top=10), "size", "small"),
    (stroke(width=6, height=20, shear=0.4), "size", "large"),
    (stroke(ink=95), "ink", "faint"),
    (stroke(ink=255), "ink", "black"),
])
def test_hand_made_strokes_get_the_right_words(image, property, word):
    assert describe(image[None], THRESHOLDS)[0][property] == word


def test_measures_are_in_pixels_and_signed():
    m = measure(np.stack([stroke(width=4, height=20), stroke(shear=0.3), stroke(shear=-0.3)]))
    assert m["thickness"][0] == pytest.approx(2 * 80 / 48, rel=0.1)  # 4x20 block: area 80, boundary 2*(4+20)
    thin_diagonal = measure(np.stack([stroke(width=1, shear=1.0), stroke(width=4)]))["thickness"]
    assert thin_diagonal[0] == pytest.approx(1 / np.sqrt(2), rel=0.25) and thin_diagonal[1] > 3
    assert m["slant"][1] > 0.2 and m["slant"][2] < -0.2


def test_blank_image_measures_zero_without_warnings():
    with np.errstate(all="raise"):
        m = measure(np.zeros((2, 8, 8), np.uint8))
    assert all(np.all(v == 0) for v in m.values())


def test_label_word_matches_label_and_captions_are_seeded():
    images = population()[:60]
    labels = np.arange(60) % 10
    a = make_captions(images, labels, THRESHOLDS, seed=3)
    assert a == make_captions(images, labels, THRESHOLDS, seed=3)
    assert a != make_captions(images, labels, THRESHOLDS, seed=4)
    words = describe(images, THRESHOLDS)
    for caption, label, props in zip(a, labels, words, strict=True):
        named = [w for w in re.findall(r"[a-z]+", caption) if w in DIGIT_WORDS]
        assert named == [DIGIT_WORDS[label]], caption
        for name, word in props.items():
            assert word in caption, (name, caption)
    assert len({c.split()[0] for c in a}) >= 4  # several templates drawn


def test_templates_name_the_digit_and_every_property():
    assert len(TEMPLATES) >= 4
    for template in TEMPLATES:
        fields = set(re.findall(r"{(\w+)}", template))
        assert fields == {"digit", *PROPERTIES}, template
    assert all(len(set(ws)) == 3 for ws in WORDS.values())


def test_thresholds_are_training_tertiles():
    values = {name: np.arange(9.0) for name in PROPERTIES}
    assert fit_thresholds(values)["slant"] == pytest.approx([8 / 3, 16 / 3])


def test_labels_outside_digits_are_refused():
    with pytest.raises(CaptionError, match="0..9"):
        make_captions(population()[:2], np.array([3, 12]), THRESHOLDS)
    with pytest.raises(CaptionError, match="labels for"):
        make_captions(population()[:2], np.array([3]), THRESHOLDS)
    with pytest.raises(CaptionError, match="lack"):
        describe(population()[:1], {"slant": [0, 1]})
    with pytest.raises(CaptionError, match=re.escape("(N, H, W)")):
        measure(np.zeros((8, 8), np.uint8))
