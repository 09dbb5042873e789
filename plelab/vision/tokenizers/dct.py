"""DCT + k-means: each patch's low-frequency 2-D DCT coefficients, clustered; decodable by the inverse DCT."""

from __future__ import annotations

from typing import Any

import numpy as np

from plelab.vision.patches import patchify
from plelab.vision.tokenizers.base import vision_import
from plelab.vision.tokenizers.kmeans import KMeansTokenizer


class DCTKMeansTokenizer(KMeansTokenizer):
    """`scipy.fft.dctn` (orthonormal) of each patch; the top-left b x b block, b = ceil(p / 2), is clustered.

    For 7x7 patches that keeps 4x4 = 16 of 49 coefficients (the low frequencies hold nearly all of a
    digit stroke's energy); a centroid decodes to a patch by zero-filling the rest and inverting.
    """

    kind = "dct-kmeans"

    @property
    def block(self) -> int:
        """Side b of the kept low-frequency coefficient block."""
        return (self.patch_size + 1) // 2

    def settings(self) -> dict[str, Any]:
        """k-means settings plus the kept DCT block."""
        return {**super().settings(), "dct_block": self.block, "dct_norm": "ortho"}

    def _descriptors(self, images: np.ndarray) -> np.ndarray:
        dctn = vision_import("scipy.fft").dctn
        p, b = self.patch_size, self.block
        patches = patchify(images, p)
        coeffs = dctn(patches.reshape(*patches.shape[:2], p, p), axes=(-2, -1), norm="ortho")
        return np.ascontiguousarray(coeffs[..., :b, :b]).reshape(*patches.shape[:2], b * b).astype(np.float32)

    def _reconstruct(self, images: np.ndarray) -> np.ndarray:
        idctn = vision_import("scipy.fft").idctn
        p, b = self.patch_size, self.block
        ids = self._encode(images)
        full = np.zeros((self.codebook, p, p), dtype=np.float64)
        full[:, :b, :b] = self.centroids.reshape(-1, b, b)
        decoded = np.clip(idctn(full, axes=(-2, -1), norm="ortho"), 0.0, 1.0).astype(np.float32)
        return decoded.reshape(self.codebook, p * p)[ids]
