"""Per-token cost of a model (active parameters, weight bytes read, FLOPs) and FFN widths matched to a budget.

What one decoded token reads, from the shipped model's parameters (built on the meta device, so exact for every
architecture and FFN kind without allocating a weight):

    dense tensors          read whole: attention, FFN, norms, PLE gates and projections, an untied head
    MoE experts            the router, top_k of the num_experts routed experts, and the shared expert
    MGLU masks             n_m x F x H mask elements at 1 bit each (not weights: `active_params_per_token` and
                           the `ffn_params` budget leave them out, `inference_bytes` counts their bits)
    lookup tables          one row each: the main embedding (H values) and the PLE table (L_ple x dP); an n-gram
                           PLE table S rows of L_ple x dP / S, one per hash head, each with its own scales, and
                           with an id map the token's compressed id (4 bytes, no parameter)
    tied output head       the whole V x H embedding matrix (a matmul for every token)

A `pruned` FFN ships as the plain SwiGLU of width prune_to (`shipped_config`, as the export writes it), so
that is what is counted. Bytes follow the edge export (plelab/edge/export.py) to the byte: matrices and table rows at
the export encoding (quant) plus one fp16 scale per `group` values for int8/int4, vectors at fp32 in an fp32 export and
fp16 otherwise, masks packed 8 per byte; a tied head is the embedding table, read whole, each row carrying its
own scales; each MoE expert is a tensor of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from plelab.edge.export import EMBED, ID_MAP_BUFFER, PLE_TABLE, ExportOptions, shipped_config
from plelab.edge.quant import EXPORT_QUANTS, Encoding
from plelab.errors import PlelabError
from plelab.model.config import FFNConfig, ModelConfig
from plelab.model.ffn import MGLU, build_ffn
from plelab.model.moe import MoE
from plelab.model.params import count_params, layer_ffn_config
from plelab.model.transformer import LanguageModel
from plelab.util.dataclass_config import from_dict, to_dict

BUDGETS = ("ffn_params", "inference_bytes", "active_flops")
# The width match_ffn solves for, per FFN kind (FFNConfig field).
FREE_WIDTH = {"swiglu": "intermediate_size", "mglu": "intermediate_size", "lowrank": "rank",
              "moe": "expert_size", "pruned": "prune_to"}
MAX_WIDTH = 1 << 40  # a bound for the width search that no budget value reaches first
MATCH_TOLERANCE = 0.10
"""match_ffn refuses a width whose budget value falls more than this share below the reference's."""


class BudgetError(PlelabError):
    """A budget that cannot be computed or met (unknown budget or quant, no width within tolerance)."""


ReadKind = Literal["matrix", "vector", "mask", "row", "id"]


@dataclass(frozen=True)
class Read:
    """Something one decoded token reads: `times` copies of a tensor (or table row) of `numel` values."""

    name: str
    kind: ReadKind
    """matrix (quantised like a matrix), vector (norms, scalar gates), mask (1 bit per value), row (a table
    record: codes and the row's own scales) or id (a uint32 of the n-gram id map: not a parameter)."""
    numel: int
    times: int = 1
    macs: int = 0
    """Multiply-adds per value read (1 for a matmul weight; MGLU's shared matrix: n_m + 1, see `_module_reads`)."""
    params: int | None = None
    """Distinct parameters this read adds (None = numel x times; masks are not parameters here)."""

    @property
    def param_count(self) -> int:
        """Parameters counted towards `active_params_per_token`."""
        if self.params is not None:
            return self.params
        return 0 if self.kind in ("mask", "id") else self.numel * self.times


def _module_reads(model: nn.Module, skip: str | None = None) -> list[Read]:
    """Reads of every parameter of `model` (lookup tables and modules named `skip` apart)."""
    reads = []
    for prefix, module in model.named_modules():
        if skip in prefix.split("."):
            continue
        for name, p in module.named_parameters(prefix=prefix, recurse=False):
            short = name.rsplit(".", 1)[-1]
            if name in (EMBED, PLE_TABLE):
                continue  # one row each, see token_reads
            if isinstance(module, MoE) and p.ndim == 3:  # stacked (E, ., .) expert weights
                reads.append(Read(name, "matrix", p[0].numel(), times=module.top_k, macs=1))
            elif isinstance(module, MGLU) and short == "mask_logits":
                reads.append(Read(name, "mask", p.numel()))
            elif isinstance(module, MGLU) and short == "weight":
                # The runtime's one pass per mask plus one for W x: gate_k = (W*m_k) x, up_k = W x - gate_k.
                reads.append(Read(name, "matrix", p.numel(), macs=module.mask_logits.shape[0] + 1))
            else:
                reads.append(Read(name, "vector" if p.ndim == 1 else "matrix", p.numel(), macs=int(p.ndim > 1)))
    return reads


@functools.lru_cache(maxsize=32)
def _core_reads(key: str) -> tuple[Read, ...]:
    """Reads of everything but the FFNs and the tables of the model `key` (its config as JSON)."""
    with torch.device("meta"):
        model = LanguageModel(from_dict(ModelConfig, json.loads(key)))
    return tuple(_module_reads(model, skip="mlp"))


@functools.lru_cache(maxsize=256)
def _ffn_reads(hidden: int, key: str) -> tuple[Read, ...]:
    """Reads of one FFN block (config `key` as JSON), names relative to the block."""
    with torch.device("meta"):
        module = build_ffn(hidden, from_dict(FFNConfig, json.loads(key)))
    return tuple(_module_reads(module))


def _key(cfg: ModelConfig | FFNConfig) -> str:
    return json.dumps(to_dict(cfg), sort_keys=True)


def token_reads(cfg: ModelConfig) -> list[Read]:
    """Every tensor (share) and table row one decoded token reads from the shipped model (see module doc).

    The FFNs are counted apart from the rest (built one block at a time), so that sizing an FFN rebuilds
    neither the rest of the model nor an identical block twice.
    """
    cfg = shipped_config(cfg)
    H, V = cfg.hidden_size, cfg.vocab_size
    reads = list(_core_reads(_key(dataclasses.replace(cfg, ffn=FFNConfig()))))
    for layer in range(cfg.num_layers):
        block = _ffn_reads(H, _key(layer_ffn_config(cfg, layer)))
        reads += [dataclasses.replace(r, name=f"layers.{layer}.mlp.{r.name}") for r in block]
    if cfg.ple_layers:
        reads.append(Read(PLE_TABLE, "row", cfg.ple_row_width, times=cfg.ple_heads))
        if cfg.ple_layout is not None and cfg.ple.ngram.id_map is not None:
            reads.append(Read(ID_MAP_BUFFER, "id", 1))
    # Tied: the input row is one of the head's rows, so it is read again but adds no parameter.
    reads.append(Read(EMBED, "row", H, params=0 if cfg.tie_embeddings else H))
    if cfg.tie_embeddings:
        reads.append(Read(EMBED + " (tied head)", "row", H, times=V, macs=1))
    return reads


def active_params_per_token(cfg: ModelConfig) -> int:
    """Parameters one token's forward touches: every dense weight it multiplies or scales by (attention, FFN
    with only the router, top_k experts and shared expert of an MoE, norms, PLE gates and projections, the
    output head even when tied) plus the table rows it looks up (one embedding row; one PLE row, or the S rows of
    an n-gram table); not the other rows, not the unrouted experts, not MGLU's 1-bit masks. A tied embedding row
    counts once (it is a row of the head)."""
    return sum(r.param_count for r in token_reads(cfg))


def active_flops(cfg: ModelConfig) -> int:
    """Matmul FLOPs per decoded token: 2 x the multiply-adds of every matmul weight it reads (MGLU's shared
    matrix n_m + 1 times, as the edge runtime computes it); attention over the context, norms and activations
    are left out (they do not depend on the FFN width)."""
    return 2 * sum(r.numel * r.times * r.macs for r in token_reads(cfg))


def _export_options(quant: str) -> ExportOptions:
    if quant not in EXPORT_QUANTS:
        raise BudgetError(f"export quant must be one of {', '.join(EXPORT_QUANTS)}, got {quant!r}")
    return ExportOptions(quant=quant)


def read_bytes(read: Read, opts: ExportOptions) -> int:
    """Bytes of one read as `opts` stores it (codes plus fp16 scales; an id is a uint32)."""
    if read.kind == "id":
        return read.times * 4 * read.numel
    enc = {"vector": opts.vector_enc, "mask": Encoding("u1")}.get(read.kind, opts.matrix_enc)
    return read.times * (enc.code_bytes(read.numel) + enc.scale_bytes(read.numel))


def inference_bytes(cfg: ModelConfig, quant: str = "fp16") -> int:
    """Weight bytes read per decoded token from the model exported at `quant` (fp32, fp16, int8, int4): the
    reads of `token_reads` encoded as plelab/edge/export.py stores them (the KV cache is not counted)."""
    opts = _export_options(quant)
    return sum(read_bytes(r, opts) for r in token_reads(cfg))


def budget_value(cfg: ModelConfig, budget: str, quant: str = "fp16") -> int:
    """The model's value on one budget of BUDGETS.

    ffn_params: the shipped FFN weights over all layers (count_params' "ffn": MoE with every expert and the
    router, pruned at prune_to, MGLU without its 1-bit masks, as the published "halves gate/up" counts);
    inference_bytes: `inference_bytes(cfg, quant)`; active_flops: `active_flops(cfg)`.
    """
    if budget == "ffn_params":
        return count_params(cfg)["ffn"]
    if budget == "inference_bytes":
        return inference_bytes(cfg, quant)
    if budget == "active_flops":
        return active_flops(cfg)
    raise BudgetError(f"unknown budget {budget!r}; use one of {', '.join(BUDGETS)}")


def with_width(cfg: ModelConfig, width: int) -> ModelConfig:
    """`cfg` with its FFN kind's free width (FREE_WIDTH) set to `width`."""
    ffn = dataclasses.replace(cfg.ffn, **{FREE_WIDTH[cfg.ffn.kind]: width})
    return dataclasses.replace(cfg, ffn=ffn)


def _largest_at_most(value: Callable[[int], int], target: int, start: int, cap: int) -> int | None:
    """Largest w in 1..cap with value(w) <= target (None if there is none), for an increasing `value`.

    Every budget is affine in the free width up to the rounding of quantisation scales, so the bracket is found
    by extrapolating along a secant and narrowed by interpolation (a bisection step whenever an interpolation
    step fails to halve it): a handful of evaluations, each a meta-device model build.
    """
    if value(1) > target:
        return None
    lo, hi = 1, min(max(2, start), cap)
    while value(hi) <= target:
        if hi == cap:
            return cap
        slope = (value(hi) - value(lo)) / (hi - lo)
        ahead = hi + int((target - value(hi)) / slope) + 1 if slope > 0 else 2 * hi
        lo, hi = hi, min(max(ahead, hi + 1), cap)
    halve = False
    while hi - lo > 1:  # value(lo) <= target < value(hi)
        span = hi - lo
        if halve:
            mid = (lo + hi) // 2
        else:
            mid = lo + (target - value(lo)) * span // (value(hi) - value(lo))
            mid = min(max(mid, lo + 1), hi - 1)
        lo, hi = (mid, hi) if value(mid) <= target else (lo, mid)
        halve = 2 * (hi - lo) > span
    return lo


def match_ffn(cfg: ModelConfig, reference: ModelConfig, budget: str, quant: str = "fp16",
              tolerance: float = MATCH_TOLERANCE) -> ModelConfig:
    """`cfg` with its FFN's free width (FREE_WIDTH: intermediate_size, rank, expert_size or prune_to) set to
    the largest value whose `budget_value` does not exceed the reference's.

    BudgetError when no width reaches `(1 - tolerance)` x the reference's value without exceeding it (even
    width 1 is over, or the widths allowed, e.g. prune_to < intermediate_size, stop short).
    """
    if budget not in BUDGETS:
        raise BudgetError(f"unknown budget {budget!r}; use one of {', '.join(BUDGETS)}")
    _export_options(quant)
    kind, field = cfg.ffn.kind, FREE_WIDTH[cfg.ffn.kind]
    target = budget_value(reference, budget, quant)
    cache: dict[int, int] = {}

    def value(width: int) -> int:
        if width not in cache:
            cache[width] = budget_value(with_width(cfg, width), budget, quant)
        return cache[width]

    cap = cfg.ffn.intermediate_size - 1 if kind == "pruned" else MAX_WIDTH
    start = getattr(cfg.ffn, field) or cfg.ffn.intermediate_size
    width = _largest_at_most(value, target, start, cap)
    if width is None:
        raise BudgetError(f"no {kind} width keeps {budget} at or below the reference's {target:,}: the smallest, "
                          f"ffn.{field}=1, gives {value(1):,}")
    if value(width) < (1 - tolerance) * target:
        limit = f" (prune_to must stay below intermediate_size={cfg.ffn.intermediate_size})" if width == cap else ""
        raise BudgetError(f"no {kind} width comes within {100 * tolerance:g} % of the reference's {budget} of "
                          f"{target:,}: the closest is {value(width):,} at ffn.{field}={width}{limit}")
    return with_width(cfg, width)
