"""Cut grayscale images into non-overlapping square patches, row-major, as the visual tokenizers see them."""

from __future__ import annotations

import numpy as np

from plelab.errors import PlelabError


class PatchError(PlelabError):
    """Images or a patch size that cannot be patchified (wrong shape, dtype, range, or a size not divisible)."""


def patch_grid(image_shape: tuple[int, int], patch_size: int) -> tuple[int, int]:
    """(rows, columns) of the patch grid of (H, W) images; PatchError unless both divide by `patch_size`."""
    if isinstance(patch_size, bool) or not isinstance(patch_size, (int, np.integer)) or patch_size < 1:
        raise PatchError(f"patch size must be a positive integer, got {patch_size!r}")
    h, w = (int(s) for s in image_shape)
    if h % patch_size or w % patch_size:
        raise PatchError(f"images of {h}x{w} pixels do not divide into {patch_size}x{patch_size} patches")
    return h // patch_size, w // patch_size


def check_images(images: np.ndarray) -> np.ndarray:
    """`images` as given if they are (N, H, W) uint8, or float in [0, 1]; PatchError (one line) otherwise."""
    if not isinstance(images, np.ndarray):
        raise PatchError(f"images must be a numpy array (N, H, W), got {type(images).__name__}")
    if images.ndim != 3:
        raise PatchError(f"images must have shape (N, H, W) (grayscale), got shape {images.shape}")
    if images.dtype == np.uint8:
        return images
    if not np.issubdtype(images.dtype, np.floating):
        raise PatchError(f"images must be uint8 or float in [0, 1], got dtype {images.dtype}")
    if images.size and not (np.isfinite(images).all() and images.min() >= 0.0 and images.max() <= 1.0):
        raise PatchError("float images must be finite and in [0, 1] (uint8 images are scaled by 1/255)")
    return images


def to_unit_float(images: np.ndarray) -> np.ndarray:
    """Checked images as float32 in [0, 1] (uint8 divided by 255)."""
    images = check_images(images)
    if images.dtype == np.uint8:
        return images.astype(np.float32) / np.float32(255.0)
    return images.astype(np.float32, copy=False)


def patchify(images: np.ndarray, patch_size: int = 7) -> np.ndarray:
    """(N, H, W) images -> (N, P, patch_size**2) float32 in [0, 1], patches in row-major grid order."""
    x = to_unit_float(images)
    gh, gw = patch_grid(x.shape[1:], patch_size)
    n, p = x.shape[0], patch_size
    x = x.reshape(n, gh, p, gw, p).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(x.reshape(n, gh * gw, p * p))


def unpatchify(patches: np.ndarray, image_shape: tuple[int, int]) -> np.ndarray:
    """Inverse of `patchify`: (N, P, p*p) patches -> (N, H, W) float32 images of `image_shape`."""
    if patches.ndim != 3:
        raise PatchError(f"patches must have shape (N, P, p*p), got shape {patches.shape}")
    p = int(round(patches.shape[2] ** 0.5))
    if p * p != patches.shape[2]:
        raise PatchError(f"patch length {patches.shape[2]} is not a square number of pixels")
    gh, gw = patch_grid(image_shape, p)
    if gh * gw != patches.shape[1]:
        raise PatchError(f"{patches.shape[1]} patches do not tile {image_shape[0]}x{image_shape[1]} images")
    n = patches.shape[0]
    x = patches.astype(np.float32, copy=False).reshape(n, gh, gw, p, p).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(x.reshape(n, gh * p, gw * p))
