"""The key/value cache of incremental decoding: every layer's keys and values for the tokens seen so far.

Its own module because both blocks read and write it (the Llama-style attention in transformer.py and the Gemma 4
block in gemma4.py), and the transformer builds on the Gemma 4 block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from plelab.model.config import ModelConfig

Tensor = torch.Tensor


@dataclass
class KVCache:
    """Preallocated keys/values for every layer; `pos` tokens are filled. An n-gram PLE table also keeps the ids
    (`ple_ids`, (B, length)) and a PLE short convolution its normed inputs (`ple_conv`, per layer (B, length, H)):
    a position's rows and convolution reach back over earlier calls."""

    keys: list[Tensor]
    values: list[Tensor]
    pos: int = 0
    ple_ids: Tensor | None = None
    ple_conv: dict[int, Tensor] = field(default_factory=dict)

    @classmethod
    def empty(cls, cfg: ModelConfig, batch: int, length: int, device=None, dtype=torch.float32) -> KVCache:
        """Allocate a cache for `batch` sequences of up to `length` tokens (nothing for KV-shared layers)."""

        def shape(layer: int) -> tuple[int, ...]:
            if cfg.kv_source(layer) != layer:
                return (0,)  # a Gemma 4 KV-shared layer reads its source layer's entries
            kv_heads, head_dim = cfg.attention_shape(layer)
            return (batch, kv_heads, length, head_dim)

        shapes = [shape(i) for i in range(cfg.num_layers)]
        ple_ids = (torch.zeros(batch, length, dtype=torch.long, device=device)
                   if cfg.ple_layers and cfg.ple_layout is not None else None)
        conv = {i: torch.zeros(batch, length, cfg.hidden_size, device=device, dtype=dtype)
                for i in (cfg.ple_layers if cfg.ple.conv_kernel else [])}
        return cls(
            [torch.zeros(shape, device=device, dtype=dtype) for shape in shapes],
            [torch.zeros(shape, device=device, dtype=dtype) for shape in shapes],
            ple_ids=ple_ids, ple_conv=conv,
        )

    @property
    def capacity(self) -> int:
        """Longest sequence the cache holds."""
        return self.keys[0].shape[2]
