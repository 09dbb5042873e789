"""Analytic parameter accounting: exact counts by part, without allocating a single weight."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from plelab.model.config import FFNConfig, ModelConfig
from plelab.model.ffn import ffn_param_count, ffn_training_param_count
from plelab.model.moe import MoE
from plelab.model.ple import ple_layer_parts, ple_param_count

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


def ple_table_reads(cfg: ModelConfig) -> dict[str, object]:
    """The PLE table's shape and what one token reads from it ({} without PLE): a token table gives each token one
    row of L_ple x dP values; an n-gram table one row of L_ple x dP / S values from each of its S hash heads."""
    if not cfg.ple_layers:
        return {}
    layout, S, width = cfg.ple_layout, cfg.ple_heads, cfg.ple_row_width
    out: dict[str, object] = {"index": cfg.ple.index, "table_rows": cfg.ple_table_rows, "row_values": width}
    if layout is not None:
        out.update(orders=list(layout.orders), heads_per_order=layout.heads, heads=S,
                   rows_per_head=list(layout.rows), id_map=cfg.ple.ngram.id_map)
    out.update(rows_read_per_token=S, table_params_per_token=S * width, table_bytes_per_token_fp32=4 * S * width)
    return out


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


def _non_ffn_matmul_params(cfg: ModelConfig) -> int:
    """Matmul weights outside the FFNs: attention, the output head (even when tied), PLE projections and the
    input / Engram gates' matrices (learned scalar / vector gates, norms and convolution taps are elementwise)."""
    c = count_params(cfg)
    head = cfg.vocab_size * cfg.hidden_size
    n_ple, dP = len(cfg.ple_layers), cfg.ple.dim
    context = c["ple_model_projection"] - (dP if cfg.ple.context and n_ple else 0)
    return c["attention"] + head + context + (n_ple * ple_layer_parts(cfg)["matmul"] if n_ple else 0)


def _sum_over_ffns(cfg: ModelConfig, count: Callable[[int, FFNConfig], int]) -> int:
    return sum(count(cfg.hidden_size, layer_ffn_config(cfg, layer)) for layer in range(cfg.num_layers))


def ffn_train_macs_per_token(hidden: int, cfg: FFNConfig) -> int:
    """Weight multiply-adds per token of one FFN's training forward, as plelab/model/ffn.py runs it.

    MoE: the router, top_k routed experts and the shared expert (dropless; a capacity factor drops some
    assignments and runs fewer). MGLU: gate (W*m_i) x and up (W*(1-m_i)) x for each of the n_m masks, then down
    (forming W*m_i is once per step, not per token). Pruned: every one of intermediate_size units runs until
    export removes the dead ones. The others: each weight once.
    """
    if cfg.kind == "moe":
        return MoE.active_param_count(hidden, cfg)
    if cfg.kind == "mglu":
        return (2 * cfg.mask_count + 1) * hidden * cfg.intermediate_size
    return ffn_training_param_count(hidden, cfg)


def training_ffn_params(cfg: ModelConfig) -> int:
    """FFN parameters over all layers as built for training (MGLU masks in; a pruned FFN at intermediate_size)."""
    return _sum_over_ffns(cfg, ffn_training_param_count)


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters that take part in a matmul, as the model is built for training: all but lookup tables, norms,
    elementwise gates and MGLU's mask logits; every MoE expert; a pruned FFN at intermediate_size.

    The output head counts (it is a V x H matmul even when tied); embedding and PLE-table lookups do not.
    """
    def ffn(hidden: int, ffn_cfg: FFNConfig) -> int:
        return ffn_training_param_count(hidden, ffn_cfg) - ffn_param_count(hidden, ffn_cfg)["ffn_mask"]

    return _non_ffn_matmul_params(cfg) + _sum_over_ffns(cfg, ffn)


def train_matmul_macs_per_token(cfg: ModelConfig) -> int:
    """Weight multiply-adds per token of a training forward (the N of MFU's 6N): `matmul_params`, with each FFN
    counted as `ffn_train_macs_per_token` runs it (MoE: routed experts only; MGLU: its shared matrix 2 n_m times)."""
    return _non_ffn_matmul_params(cfg) + _sum_over_ffns(cfg, ffn_train_macs_per_token)
