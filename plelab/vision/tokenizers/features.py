"""Pretrained-feature k-means: EfficientNet-Lite0 (ImageNet) features of the whole image, pooled per patch.

Each image is upsampled (bilinear) so that every patch covers one 16x16 cell of the stride-16 feature map
after block 7 (80 channels; 28x28 MNIST with 7x7 patches -> 64x64 input, 4x4 map), replicated to RGB and
normalised as the TF Lite models were trained; the map is average-pooled to the patch grid (one cell per
patch here) and the 80-dimensional vectors are clustered. The backbone is frozen and not saved: the
tokenizer records the sha256 of the packaged weights and refuses to load against different ones.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from plelab.util.fs import sha256_file
from plelab.vision.patches import patch_grid, to_unit_float
from plelab.vision.tokenizers.base import deterministic_torch
from plelab.vision.tokenizers.kmeans import KMeansTokenizer

if TYPE_CHECKING:  # torch is imported only when features are computed
    from plelab.vision.tokenizers.efficientnet import EfficientNetLite0

FEATURE_BLOCK = 7  # last block of stage 4: stride 16, 80 channels (mid-level parts rather than ImageNet classes)
CELLS_PER_PATCH = 1  # feature cells per patch side; 2 would quadruple the cost for little gain on 7x7 patches
BATCH = 256


@functools.lru_cache(maxsize=1)
def backbone_sha256() -> str:
    """sha256 of the installed package's weights file."""
    from plelab.vision.tokenizers.efficientnet import weights_path

    return sha256_file(weights_path())


@functools.lru_cache(maxsize=1)
def _backbone() -> EfficientNetLite0:
    """The frozen pretrained network, built once per process."""
    from plelab.vision.tokenizers.efficientnet import EfficientNetLite0

    return EfficientNetLite0.pretrained()


class FeaturesKMeansTokenizer(KMeansTokenizer):
    """MiniBatchKMeans on per-patch EfficientNet-Lite0 features (see the module doc)."""

    kind = "features-kmeans"

    def settings(self) -> dict[str, Any]:
        """k-means settings plus the backbone and its layer."""
        return {**super().settings(), "backbone": "efficientnet-lite0", "backbone_sha256": backbone_sha256(),
                "feature_block": FEATURE_BLOCK, "cells_per_patch": CELLS_PER_PATCH}

    def _descriptors(self, images: np.ndarray) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        from plelab.vision.tokenizers.efficientnet import INPUT_MEAN, INPUT_STD

        model = _backbone()
        stride = model.block_strides[FEATURE_BLOCK]
        gh, gw = patch_grid(images.shape[1:], self.patch_size)
        size = (gh * stride * CELLS_PER_PATCH, gw * stride * CELLS_PER_PATCH)
        x_all = torch.from_numpy(to_unit_float(images))
        out = []
        with torch.inference_mode(), deterministic_torch():
            for x in x_all.split(BATCH):
                x = F.interpolate(x[:, None], size=size, mode="bilinear", align_corners=False)
                x = ((x - INPUT_MEAN) / INPUT_STD).expand(-1, 3, -1, -1).contiguous(
                    memory_format=torch.channels_last)
                f = F.avg_pool2d(model.features(x, FEATURE_BLOCK), CELLS_PER_PATCH)
                out.append(f.flatten(2).transpose(1, 2).float())
        d = model.block_channels(FEATURE_BLOCK)
        return torch.cat(out).numpy() if out else np.zeros((0, gh * gw, d), dtype=np.float32)
