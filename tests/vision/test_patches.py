"""patchify / unpatchify: row-major patch order, [0, 1] scaling, and one-line errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

from plelab.errors import PlelabError
from plelab.vision.patches import PatchError, patch_grid, patchify, unpatchify


def test_patches_are_row_major_and_scaled_to_unit_range():
    images = np.arange(2 * 28 * 28, dtype=np.int64).reshape(2, 28, 28) % 256
    images = images.astype(np.uint8)
    patches = patchify(images, 7)
    assert patches.shape == (2, 16, 49) and patches.dtype == np.float32
    np.testing.assert_array_equal(patches[1, 0], images[1, 0:7, 0:7].ravel() / np.float32(255))
    np.testing.assert_array_equal(patches[1, 1], images[1, 0:7, 7:14].ravel() / np.float32(255))
    np.testing.assert_array_equal(patches[1, 4], images[1, 7:14, 0:7].ravel() / np.float32(255))
    assert patches.min() >= 0.0 and patches.max() <= 1.0


def test_float_images_pass_through_and_unpatchify_inverts():
    rng = np.random.default_rng(0)
    images = rng.random((3, 12, 8)).astype(np.float64)
    patches = patchify(images, 4)
    assert patches.shape == (3, 6, 16)
    np.testing.assert_allclose(unpatchify(patches, (12, 8)), images.astype(np.float32))
    assert patch_grid((12, 8), 4) == (3, 2)


@pytest.mark.parametrize(("images", "patch_size", "match"), [
    (np.zeros((28, 28), np.uint8), 7, "shape"),
    (np.zeros((2, 28, 28, 3), np.uint8), 7, "shape"),
    (np.zeros((2, 28, 28), np.int32), 7, "dtype"),
    (np.full((2, 28, 28), 2.0), 7, r"\[0, 1\]"),
    (np.full((2, 28, 28), np.nan), 7, "finite"),
    (np.zeros((2, 28, 28), np.uint8), 5, "divide"),
    (np.zeros((2, 28, 28), np.uint8), 0, "positive"),
    (np.zeros((2, 28, 28), np.uint8), True, "positive"),
    ([[[0]]], 1, "numpy"),
])
def test_bad_images_or_patch_size_are_one_line_errors(images, patch_size, match):
    with pytest.raises(PatchError, match=match) as err:
        patchify(images, patch_size)
    assert isinstance(err.value, PlelabError) and "\n" not in str(err.value)


def test_unpatchify_refuses_patches_that_do_not_tile_the_image():
    with pytest.raises(PatchError, match="tile"):
        unpatchify(np.zeros((1, 15, 49), np.float32), (28, 28))
    with pytest.raises(PatchError, match="square"):
        unpatchify(np.zeros((1, 16, 48), np.float32), (28, 28))
