"""The multimodal PLE model: an image's P patches, then its caption, through one decoder.

    x[:P]  = Linear(p*p -> H)(pixels) + pos[:P]            continuous patch embedding (vision.pixels; without
                                                            it x[:P] = pos[:P]: the image enters by its ids only)
    x[P:]  = embed(caption)                                 the trunk's token embedding
    ple[:P] = PerLayerInputs(patch_ids, x[:P])              visual PLE (only when vision.ple_dim > 0)
    ple[P:] = 0
    h = trunk layers(x, ple)                                the trunk's decoder, PLE injection unchanged
    loss = CE(head(h[P-1 : P+T-1]), caption)                caption tokens only
    aux  = lambda * CE(aux_head(h[:P-1]), patch_ids[1:])    patch p predicts patch p+1's id (aux_weight > 0)

The visual table *is* the trunk's PLE: the trunk is a `LanguageModel` built from the run's model config with
ple.dim = vision.ple_dim and ple.vocab_size = K, so its `per_layer_inputs` is the K-row table and every
layer's `ple` is that layer's injection, in the form (gate, context, output_norm) `[model.ple]` names. The
existing PLE diagnostics therefore read it unchanged (`model.trunk.per_layer_inputs`, `model.trunk.layers`).

Why the visual PLE input is zero at caption positions: a caption token has no patch id, and feeding row 0
(what an out-of-vocabulary id gets in text PLE) would give every caption position the same learned bias, a
capacity the no-visual-PLE model lacks. With the context path on (Gemma form) the whole vector is zeroed
there too, context included: the context part is a projection of the token embedding, a text feature, and
keeping it would again hand caption positions capacity that has nothing to do with the image. So turning
visual PLE on changes the computation at patch positions only.

Why the auxiliary loss closes the loop: the published visual-PLE runs use patch ids only as inputs. The
caption loss reaches a table row only if the caption depends on that row, through attention from caption
positions; that gradient is weak and noisy, and the rows stay random-like. With `aux_weight` > 0 the ids are
also prediction targets, as text token ids are: the hidden state at patch p must name patch p+1's id, so
ids that predict different neighbours need different representations. The aux head reads hidden states
only, so the table receives this gradient solely through the injection (table row -> PerLayerInjection ->
residual stream at patch p -> aux head); nothing else connects them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import nn

from plelab.model.config import ModelConfig
from plelab.model.transformer import LanguageModel, cross_entropy

Tensor = torch.Tensor


class VisionBatch(NamedTuple):
    """One batch of images with their captions: pixels (B, P, p*p) float, patch_ids (B, P) and captions (B, T)
    int64 (captions right-padded)."""

    pixels: Tensor
    patch_ids: Tensor
    captions: Tensor

    def to(self, device: torch.device | str) -> VisionBatch:
        """The batch on `device`."""
        return VisionBatch(*(t.to(device) for t in self))


def visual_model_config(model: ModelConfig, ple_dim: int, codebook: int) -> ModelConfig:
    """The trunk's config: `model` with a PLE table of `codebook` rows of width `ple_dim` (0 = no visual PLE)."""
    return dataclasses.replace(model, ple=dataclasses.replace(model.ple, dim=ple_dim, vocab_size=codebook))


class VisionPLEModel(nn.Module):
    """Patches then caption through one decoder; `forward(batch, targets)` returns (logits, caption loss).

    trunk_config: the trunk's ModelConfig (from `visual_model_config`: its PLE is the visual table);
    patches (P), patch_pixels (p*p) and codebook (K) describe the corpus; aux_weight is lambda of the
    patch-id loss (0 = no aux head); pixels=False drops the linear patch path (ids-only: the image reaches the
    model through the visual PLE table alone).
    """

    def __init__(self, trunk_config: ModelConfig, patches: int, patch_pixels: int, codebook: int,
                 aux_weight: float = 0.0, device: torch.device | str | None = None, pixels: bool = True):
        super().__init__()
        self.config = trunk_config  # what checkpoints record as the model
        self.patches, self.codebook, self.aux_weight, self.patch_pixels = patches, codebook, aux_weight, patch_pixels
        H = trunk_config.hidden_size
        # The trunk first, so its weights are those of a text model under the same seed.
        self.trunk = LanguageModel(trunk_config, device=device)
        self.patch_embed = nn.Linear(patch_pixels, H) if pixels else None
        self.patch_pos = nn.Parameter(torch.empty(patches, H))
        self.aux_head = nn.Linear(H, codebook, bias=False) if aux_weight > 0 else None
        self.aux_losses: dict[str, Tensor] = {}
        self.reset_parameters()
        if device is not None:
            self.to(device)

    def reset_parameters(self) -> None:
        """The vision parts ~ N(0, init_std) (bias zero), from the global RNG (the trunk initialises itself)."""
        std = self.config.init_std
        if self.patch_embed is not None:
            nn.init.normal_(self.patch_embed.weight, std=std)
            nn.init.zeros_(self.patch_embed.bias)
        nn.init.normal_(self.patch_pos, std=std)
        if self.aux_head is not None:
            nn.init.normal_(self.aux_head.weight, std=std)

    @property
    def visual_ple(self) -> nn.Module | None:
        """The visual PLE table's front end (PerLayerInputs), or None without visual PLE."""
        return self.trunk.per_layer_inputs

    def visual_table(self) -> Tensor | None:
        """The visual table's rows as (K, L_ple, dP), the layout the table diagnostics read (None without it)."""
        if self.visual_ple is None:
            return None
        table = self.visual_ple.embed_tokens_per_layer.weight
        return table.view(self.codebook, self.visual_ple.num_layers, self.visual_ple.dim)

    def hidden_states(self, batch: VisionBatch) -> Tensor:
        """Final normed hidden states (B, P + T, H) of the patches followed by the caption."""
        pos = self.patch_pos.expand(batch.patch_ids.shape[0], -1, -1)
        patches = self.patch_embed(batch.pixels) + pos if self.patch_embed is not None else pos
        x = torch.cat([patches, self.trunk.embed(batch.captions)], dim=1)
        ple = None
        if self.visual_ple is not None:
            visual = self.visual_ple(batch.patch_ids, patches)
            caption_part = visual.new_zeros(visual.shape[0], batch.captions.shape[1], *visual.shape[2:])
            ple = torch.cat([visual, caption_part], dim=1)
        return self.trunk.run_layers(x, ple)

    def forward(self, batch: VisionBatch, targets: Tensor | None = None,
                return_logits: bool = True) -> tuple[Tensor | None, Tensor | None]:
        """(logits over the caption predictions (B, T, V), loss); `targets` (B, P + T) are next-token targets
        aligned with the sequence, of which only positions P-1 .. P+T-2 (the caption predictions) are read."""
        h = self.hidden_states(batch)
        P = self.patches
        self.aux_losses = {}
        if self.training and self.aux_head is not None:
            aux = cross_entropy(self.aux_head(h[:, : P - 1]), batch.patch_ids[:, 1:])
            self.aux_losses = {"patch_id": self.aux_weight * aux}
        # Slicing (not masking) the patch positions: no target there can reach the loss, whatever it says.
        h = h[:, P - 1 : -1]
        if targets is None:
            return self.trunk.logits(h), None
        targets = targets[:, P - 1 : -1]
        if not return_logits and self.config.logit_softcap is None:
            return None, self.trunk.ops.head_loss(h, self.trunk.output_weight(), targets)
        logits = self.trunk.logits(h)
        return (logits if return_logits else None), cross_entropy(logits, targets)


def vision_param_counts(model: ModelConfig, ple_dim: int, codebook: int, patches: int, patch_pixels: int,
                        aux: bool, pixels: bool = True) -> dict[str, int]:
    """Exact parameter counts of a VisionPLEModel without building it: `count_params` of the trunk with its
    visual table (whose PLE parts are the visual PLE: `ple_added`), plus the patch embedding, the patch
    positions and the aux head, which are in `total` and `base_total` alike (no patch embedding when ids-only)."""
    from plelab.model.params import count_params

    counts = count_params(visual_model_config(model, ple_dim, codebook))
    H = model.hidden_size
    vision_parts = (patch_pixels * H + H if pixels else 0) + patches * H + (H * codebook if aux else 0)
    counts["vision_inputs"] = vision_parts
    counts["total"] += vision_parts
    counts["base_total"] += vision_parts
    return counts


def caption_targets(captions: Tensor, lengths: Tensor, patches: int, bos_id: int | None = None) -> Tensor:
    """Next-token targets (B, P + T) for patches + captions: -100 at patches 0..P-2, the last patch predicts
    caption token 0, caption token t predicts t + 1; positions past a caption's length are -100. A leading
    `bos_id` is input only: predicting a constant start token would add a free, image-blind term to the loss."""
    B, T = captions.shape
    targets = torch.full((B, patches + T), -100, dtype=torch.long, device=captions.device)
    inside = torch.arange(T, device=captions.device) < lengths[:, None]
    if bos_id is not None:
        inside[:, 0] &= captions[:, 0] != bos_id
    targets[:, patches - 1 : patches - 1 + T] = torch.where(inside, captions, -100)
    return targets
