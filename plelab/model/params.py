"""Analytic parameter accounting: exact counts by part, without allocating a single weight."""

from __future__ import annotations

import dataclasses
import math

from plelab.model.config import FFNConfig, ModelConfig
from plelab.model.ffn import ffn_param_count
from plelab.model.ple import gate_shape, ple_param_count

PLE_PARTS = ("ple_table", "ple_model_projection", "ple_per_layer")


def count_params(cfg: ModelConfig) -> dict[str, int]:
    """Exact parameter count by part, plus `base_total` (dP = 0), `ple_added`, `total` and `rest`.

    `rest` is everything but the PLE table and the main embedding: the dense core of an edge model.
    """
    H, L, V = cfg.hidden_size, cfg.num_layers, cfg.vocab_size
    parts = {"embedding": V * H, "attention": 0, "ffn": 0, "ffn_mask": 0, "norms": H,
             "output_head": 0 if cfg.tie_embeddings else V * H}
    for layer in range(L):
        for part, n in layer_param_count(cfg, layer).items():
            parts[part] += n
    parts.update(ple_param_count(cfg))
    parts["ple_added"] = sum(parts[k] for k in PLE_PARTS)
    parts["total"] = sum(v for k, v in parts.items() if k != "ple_added")
    parts["base_total"] = parts["total"] - parts["ple_added"]
    parts["rest"] = parts["total"] - parts["ple_table"] - parts["embedding"]
    return parts


def layer_param_count(cfg: ModelConfig, layer: int) -> dict[str, int]:
    """Attention, FFN and norm parameters of one decoder layer (PLE apart)."""
    H, heads = cfg.hidden_size, cfg.num_heads
    kv_heads, D = cfg.attention_shape(layer)
    ffn = ffn_param_count(H, layer_ffn_config(cfg, layer))
    if cfg.arch != "gemma4":
        return {"attention": 2 * H * heads * D + 2 * H * kv_heads * D, "ffn": ffn["ffn"],
                "ffn_mask": ffn["ffn_mask"], "norms": 2 * H}
    g = cfg.gemma4
    owns_kv = cfg.kv_source(layer) == layer
    # Values are the keys on full layers with attention_k_eq_v; KV-shared layers have neither (nor k_norm).
    kv_mats = (0 if not owns_kv else 1 if g.attention_k_eq_v and cfg.layer_types[layer] == "full_attention" else 2)
    return {"attention": 2 * H * heads * D + kv_mats * H * kv_heads * D, "ffn": ffn["ffn"],
            "ffn_mask": ffn["ffn_mask"], "norms": 4 * H + D * (2 if owns_kv else 1)}


def layer_ffn_config(cfg: ModelConfig, layer: int) -> FFNConfig:
    """The FFN config of one layer: cfg.ffn, twice as wide on Gemma 4's KV-shared layers with double_wide_mlp."""
    if cfg.arch == "gemma4" and cfg.gemma4.double_wide_mlp and cfg.kv_source(layer) != layer:
        return dataclasses.replace(cfg.ffn, intermediate_size=2 * cfg.ffn.intermediate_size)
    return cfg.ffn


def with_ple_dim(cfg: ModelConfig, dim: int) -> ModelConfig:
    """A copy of `cfg` with PLE width dP = `dim`."""
    return dataclasses.replace(cfg, ple=dataclasses.replace(cfg.ple, dim=dim))


def sweep_ple(cfg: ModelConfig, dims: list[int]) -> list[dict[str, int | float]]:
    """Rows of the seed's table: dP, added parameters and % of the dP = 0 base, per part."""
    rows = []
    for d in dims:
        c = count_params(with_ple_dim(cfg, d))
        rows.append(
            {
                "ple_dim": d,
                **{k: c[k] for k in PLE_PARTS},
                "ple_added": c["ple_added"],
                "base_total": c["base_total"],
                "total": c["total"],
                "pct_of_base": 100.0 * c["ple_added"] / c["base_total"],
                "table_share_of_added": (c["ple_table"] / c["ple_added"]) if c["ple_added"] else 0.0,
            }
        )
    return rows


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters that take part in a matmul per token (for MFU): everything but lookup tables and norms.

    The output head counts (it is a V x H matmul even when tied); embedding and PLE-table lookups do not.
    """
    c = count_params(cfg)
    head = cfg.vocab_size * cfg.hidden_size
    n_ple, dP, H = len(cfg.ple_layers), cfg.ple.dim, cfg.hidden_size
    ple_norms = (dP if cfg.ple.context and n_ple else 0) + (n_ple * H if cfg.ple.output_norm else 0)
    # A learned scalar/vector gate is an elementwise product; the input gate is a matmul and stays in.
    ple_gates = n_ple * math.prod(gate_shape(cfg)) if cfg.ple.gate != "input" else 0
    return c["attention"] + c["ffn"] + head + c["ple_model_projection"] + c["ple_per_layer"] - ple_norms - ple_gates
