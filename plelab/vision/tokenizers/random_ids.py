"""The random control: ids drawn from a seeded generator, independent of the pixels."""

from __future__ import annotations

import numpy as np

from plelab.vision.tokenizers.base import VisualTokenizer


class RandomTokenizer(VisualTokenizer):
    """Ids uniform in [0, K) from `numpy.random.default_rng(seed)`; they depend on (seed, N, P) only.

    Encoding the same number of images twice gives the same ids whatever the images are, so any effect
    a model shows with these ids is the floor that a real tokenizer has to beat.
    """

    kind = "random"

    def _fit(self, images: np.ndarray) -> None:
        pass  # nothing to learn; fit only records the image size

    def _encode(self, images: np.ndarray) -> np.ndarray:
        return np.random.default_rng(self.seed).integers(0, self.codebook, size=(len(images), self.num_patches))
