"""Learned quantizers on patches: VQ-VAE, LFQ and BSQ, each a small conv autoencoder around a library quantizer.

One autoencoder shape for all three (encoder: 3x3 conv, stride-2 3x3 conv, linear to the latent; decoder:
linear to a 16-channel patch-size map, 3x3 conv, sigmoid), trained on the MSE of the patch reconstruction
plus the quantizer's own loss.
Quantizers come from `vector-quantize-pytorch`:
- vqvae: `VectorQuantize(dim=32, codebook_size=K)`, EMA codebook (decay 0.95), k-means init, dead codes
  (EMA count < 2) restarted, commitment weight 0.25 (van den Oord et al. 2017);
- lfq: `LFQ(codebook_size=K)`, latent = log2(K) signs (K must be a power of two), commitment weight 0.25
  (MAGVIT-v2), entropy penalty 1.0: at the library's 0.1 only 32 of 256 codes were in use on MNIST, at 1.0
  220, with the same reconstruction error;
- bsq: the same with `spherical=True` (latent on the unit sphere before the signs; Zhao et al. 2024) and
  entropy penalty 0.1, which already uses 254 of 256 codes.
Training: 600 Adam steps (lr 2e-3) on batches of 512 patches drawn with a seeded generator; on 9,000 MNIST
images (144,000 patches) that is about two passes, 12-18 s of CPU (fit and encode run on one torch thread,
see `deterministic_torch`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plelab.vision.patches import patchify
from plelab.vision.tokenizers.base import TokenizerError, VisualTokenizer, deterministic_torch, vision_import

ENCODE_BATCH = 16384  # patches per forward pass when encoding (memory only; ids do not depend on it)


class PatchAutoencoder(nn.Module):
    """Patch (B, p*p) -> latent -> quantizer -> reconstruction; one id per patch."""

    def __init__(self, patch_size: int, latent_dim: int, quantizer: nn.Module, width: int = 16) -> None:
        super().__init__()
        p, half = patch_size, (patch_size + 1) // 2
        self.patch_size = p
        self.encoder = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(2 * width * half * half, latent_dim))
        self.quantizer = quantizer
        # A light decoder (linear to a full-size map, one conv): a transposed conv would double the fit time.
        self.decoder = nn.Sequential(
            nn.Linear(latent_dim, width * p * p), nn.ReLU(), nn.Unflatten(1, (width, p, p)),
            nn.Conv2d(width, 1, 3, padding=1), nn.Sigmoid())

    def forward(self, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, p*p) patches -> (reconstruction (B, p*p), ids (B,), quantizer loss)."""
        z = self.encoder(patches.view(-1, 1, self.patch_size, self.patch_size))
        quantized, ids, aux = self.quantizer(z.unsqueeze(1))  # the library wants (batch, sequence, dim)
        recon = self.decoder(quantized.squeeze(1)).flatten(1)
        return recon, ids.squeeze(1), aux.sum()


class AutoencoderTokenizer(VisualTokenizer):
    """Shared fit/encode/save of the autoencoder kinds; subclasses build the quantizer and name the latent size."""

    option_defaults = {"steps": 600, "batch_size": 512, "lr": 2e-3}

    def __init__(self, codebook: int, patch_size: int = 7, seed: int = 0, **options: int | float) -> None:
        super().__init__(codebook, patch_size, seed, **options)
        self.model: PatchAutoencoder | None = None

    def latent_dim(self) -> int:
        """Size of the encoder output the quantizer sees."""
        raise NotImplementedError

    def make_quantizer(self) -> nn.Module:
        """The library quantizer for this kind."""
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        """Training schedule and latent size."""
        return {**super().settings(), "latent_dim": self.latent_dim()}

    def _build(self) -> PatchAutoencoder:
        with deterministic_torch(self.seed):  # construction draws initial weights
            return PatchAutoencoder(self.patch_size, self.latent_dim(), self.make_quantizer())

    def _fit(self, images: np.ndarray) -> None:
        patches = torch.from_numpy(patchify(images, self.patch_size)).flatten(0, 1)
        model = self._build().train()
        opt = torch.optim.Adam(model.parameters(), lr=self.options["lr"])
        gen = torch.Generator().manual_seed(self.seed)
        with deterministic_torch(self.seed):
            for _ in range(self.options["steps"]):
                batch = patches[torch.randint(len(patches), (self.options["batch_size"],), generator=gen)]
                recon, _, aux = model(batch)
                loss = F.mse_loss(recon, batch) + aux
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        self.model = model.eval().requires_grad_(False)

    @torch.inference_mode()
    def _run(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids (N, P), reconstructions (N, P, p*p)) of checked images."""
        patches = torch.from_numpy(patchify(images, self.patch_size))
        n, p, d = patches.shape
        flat = patches.reshape(n * p, d)
        ids, recon = [], []
        with deterministic_torch():
            for chunk in flat.split(ENCODE_BATCH):
                r, i, _ = self.model(chunk)
                ids.append(i)
                recon.append(r)
        ids_t = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64)
        recon_t = torch.cat(recon) if recon else torch.zeros(0, d)
        return ids_t.reshape(n, p).numpy().astype(np.int64), recon_t.reshape(n, p, d).numpy()

    def _encode(self, images: np.ndarray) -> np.ndarray:
        return self._run(images)[0]

    def _reconstruct(self, images: np.ndarray) -> np.ndarray:
        return self._run(images)[1]

    def _state(self) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy() for k, v in self.model.state_dict().items()}

    def _restore(self, tensors: dict[str, np.ndarray]) -> None:
        model = self._build()
        try:
            model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
        except RuntimeError as e:
            raise TokenizerError(f"{self.kind}: saved weights do not fit the model: "
                                 f"{str(e).splitlines()[0]}") from None
        self.model = model.eval().requires_grad_(False)


class VQVAETokenizer(AutoencoderTokenizer):
    """VQ-VAE: nearest of K learned code vectors (EMA updates, commitment 0.25)."""

    kind = "vqvae"
    latent = 32
    commitment_weight = 0.25
    decay = 0.95
    dead_code_threshold = 2

    def latent_dim(self) -> int:
        """32-dimensional code vectors."""
        return self.latent

    def settings(self) -> dict[str, Any]:
        """Schedule plus the codebook's EMA/commitment settings."""
        return {**super().settings(), "commitment_weight": self.commitment_weight, "ema_decay": self.decay,
                "kmeans_init": True, "dead_code_threshold": self.dead_code_threshold}

    def make_quantizer(self) -> nn.Module:
        """`VectorQuantize` with an EMA codebook."""
        vq = vision_import("vector_quantize_pytorch")
        return vq.VectorQuantize(dim=self.latent, codebook_size=self.codebook, decay=self.decay,
                                 commitment_weight=self.commitment_weight, kmeans_init=True,
                                 threshold_ema_dead_code=self.dead_code_threshold)


class LFQTokenizer(AutoencoderTokenizer):
    """Lookup-free quantization: the id is the sign pattern of a log2(K)-dimensional latent."""

    kind = "lfq"
    spherical = False
    entropy_weight = 1.0
    commitment_weight = 0.25

    def __init__(self, codebook: int, patch_size: int = 7, seed: int = 0, **options: int | float) -> None:
        super().__init__(codebook, patch_size, seed, **options)
        if codebook & (codebook - 1):
            raise TokenizerError(f"{self.kind} needs a codebook size that is a power of two (one bit per latent "
                                 f"dimension), got {codebook}; try {2 ** math.ceil(math.log2(codebook))}")

    def latent_dim(self) -> int:
        """log2(K) sign bits."""
        return self.codebook.bit_length() - 1

    def settings(self) -> dict[str, Any]:
        """Schedule plus the entropy and commitment weights."""
        return {**super().settings(), "entropy_weight": self.entropy_weight,
                "commitment_weight": self.commitment_weight, "spherical": self.spherical}

    def make_quantizer(self) -> nn.Module:
        """`LFQ` (spherical for BSQ)."""
        vq = vision_import("vector_quantize_pytorch")
        return vq.LFQ(codebook_size=self.codebook, dim=self.latent_dim(), entropy_loss_weight=self.entropy_weight,
                      commitment_loss_weight=self.commitment_weight, spherical=self.spherical)


class BSQTokenizer(LFQTokenizer):
    """Binary spherical quantization: LFQ on the unit-normalised latent."""

    kind = "bsq"
    spherical = True
    entropy_weight = 0.1
