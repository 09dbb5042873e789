"""Training memory and time (`plelab train-memory`): per-rank bytes of a DDP or FSDP run, the micro-batch that fits,
GPU-hours.

Every figure is bytes on one rank (GPU). P = trainable parameters without the PLE table, as the model is
built for training (a pruned FFN at intermediate_size, not the prune_to it ships at), P_mm = the ones in
matmuls (`plelab.model.params.matmul_params`), P_layer = one decoder layer's, P_root = the rest of P
(embedding/head, PLE front end, final norm), N = ranks, R = ceil(V_ple / N) PLE-table rows per rank,
W = L_ple * dP the table's row width, a = bytes per activation element (2 under bf16 autocast, 4 in fp32).

- weights: fp32 master copy. DDP: 4 P. FSDP2 (`fully_shard` per decoder layer and the root, parameters
  gathered in the compute precision, a bytes): 4 P / N, plus the gathered root, a P_root, and two gathered
  layers (the one running and the one prefetched), 2 a P_layer.
- bf16 weight copies: under DDP, autocast casts each matmul weight to bf16 once per forward and keeps the
  copy until backward: 2 P_mm. (FSDP's mixed-precision gather replaces them.)
- gradients: DDP 4 P (buckets as views of the gradients, `gradient_as_bucket_view=True`); FSDP 4 P / N
  plus one layer's and the root's unsharded fp32 gradients before their reduce-scatter, 4 (P_layer + P_root).
- optimizer: AdamW's two fp32 moments, 8 P (DDP) or 8 P / N (FSDP).
- PLE table, vocabulary-sharded: 4 R W weights, and 8 R W optimizer state (the lazy sparse Adam keeps
  full-size moments for the rows it owns; dense AdamW the same). Gradient: sparse, one fp32 row plus an
  int64 index per row read (S per token: 1 for a token table, one per hash head for an n-gram table) the rank
  trains between optimizer steps, at most R rows once coalesced: min(tokens * S * grad_accum, R) * (4 W + 8)
  (uncoalesced accumulation would grow with grad_accum); dense: 4 R W. The replicated figure (every rank
  holding the whole table, R = its rows) is reported beside it. (R W is the same for both indexes at equal
  parameters; W = L_ple x dP / S.)
  The sharded lookup (plelab.parallel.table) sends each row only to the rank whose position needs it
  (variable-size all-to-all): a rank's send buffer holds the rows it owns for all ranks' positions (about
  `tokens` rows when ids spread evenly over the vocabulary) and its receive buffer one row per own position,
  and backward the same: a transient of 2 * tokens * S * 4 W (0 when N = 1; a batch whose ids all fall in one
  rank's rows makes that rank send N * tokens rows).
- activations: bytes autograd keeps for backward per token of the reference model (`kernels = "off"`,
  what runs on CUDA) with a fused attention kernel (flash / memory-efficient SDPA: no T x T matrix):

      act = tokens * sum_k c_k(a) * term_k        (`ACTIVATION_COEFFICIENTS`, `activation_terms`)

  terms L*H, L*F, L*q, L*kv, L*heads, L (each decoder layer: q = heads * head_dim, kv = kv_heads *
  head_dim), Lp*H, Lp*dP, Lp (PLE front end and injections), H, V, 1 (embedding, final norm, the fp32
  log-softmax of the loss: 4 V per token). The coefficients were counted tensor by tensor on this code
  (exact on CPU: tests/training/test_training_memory.py re-measures unseen configs) for the SwiGLU FFN and the
  Gemma-form PLE (input gate, context projection, output norm); other variants are approximated by them.
  With activation checkpointing of every decoder layer (non-reentrant), a layer keeps only its fp32 input,
  4 H per token, and backward recomputes one layer (with its PLE injection) at a time; the PLE front end
  (12 dP + 4 bytes per PLE layer, `FRONT_END_COEFFICIENTS`) and the model terms stay:

      act_ckpt = tokens * (L * 4 H + one layer's terms + the front-end and model terms)

  Plus a transient at the output head that saved tensors do not show: the bf16 logits and their fp32
  gradient, tokens * V * (a + 4).
- overhead: CUDA context, NCCL buffers and allocator fragmentation, a fixed `overhead` (default 3 GiB).

Throughput: tokens/s per GPU = MFU * peak FLOP/s / (6 M + 12 L T d_attn), M the weight multiply-adds per
token (P_mm, with a MoE's routed experts only and MGLU's shared matrix 2 n_m times; plelab.training.mfu), and
GPU-hours = tokens / (tokens/s per GPU) / 3600. The MFU counts model FLOPs: activation checkpointing
recomputes the forward, which shows up as a lower achievable MFU, not as more FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

from plelab.errors import PlelabError
from plelab.model.config import ModelConfig
from plelab.model.params import count_params, matmul_params, training_ffn_params
from plelab.training.config import TrainConfig
from plelab.training.mfu import train_flops_per_token

GiB = 1024**3
GB = 1000**3

# Dense bf16 tensor-core peaks from the vendors' data sheets (no sparsity): what --gpu names.
GPU_PEAKS = {"h100": 989e12, "a100": 312e12, "h200": 989e12, "b200": 2250e12}
DEFAULT_GPU = "h100"

# Bytes saved for backward per token, by term, for activation element size a = 2 (bf16) and 4 (fp32).
# Counted on the reference model's autograd graph (fit exactly, integer coefficients, over 60 random small
# configs; the test re-measures unseen ones). Why they are what they are, per decoder layer: the three
# fp32 RMSNorm inputs and normalised outputs (the residual stream stays fp32 under autocast) and the a-byte
# casts of the normed inputs to q/k/v, o, gate and up (H terms); gate, up, silu(gate) and their product
# (F terms); q, k, v and the attention output (head-width terms); the attention kernel's fp32 logsumexp
# (one per head); the norms' 1/rms per token (constant terms).
ACTIVATION_COEFFICIENTS: dict[int, dict[str, int]] = {
    2: {"L*H": 26, "L*F": 8, "L*q": 4, "L*kv": 4, "L*heads": 4, "L": 8,
        "Lp*H": 10, "Lp*dP": 18, "Lp": 8, "H": 10, "V": 4, "1": 20, "ple*H": 2, "ple": 8},
    4: {"L*H": 24, "L*F": 16, "L*q": 8, "L*kv": 8, "L*heads": 4, "L": 8,
        "Lp*H": 12, "Lp*dP": 24, "Lp": 8, "H": 12, "V": 4, "1": 20, "ple*H": 0, "ple": 8},
}


def activation_terms(cfg: ModelConfig) -> dict[str, int]:
    """The values the ACTIVATION_COEFFICIENTS multiply, for `cfg`."""
    L, Lp, H = cfg.num_layers, len(cfg.ple_layers), cfg.hidden_size
    has_ple = int(Lp > 0)
    return {"L*H": L * H, "L*F": L * cfg.ffn.intermediate_size, "L*q": L * cfg.num_heads * cfg.head_size,
            "L*kv": L * cfg.kv_heads * cfg.head_size, "L*heads": L * cfg.num_heads, "L": L,
            "Lp*H": Lp * H, "Lp*dP": Lp * cfg.ple.dim, "Lp": Lp, "H": H, "V": cfg.vocab_size, "1": 1,
            "ple*H": has_ple * H, "ple": has_ple}


# The share of the Lp terms that belongs to the PLE front end (the table rows and the context projection,
# computed once before the layers), the same at both element sizes; the rest is the per-layer injection.
FRONT_END_COEFFICIENTS = {"Lp*dP": 12, "Lp": 4}


def activation_bytes_per_token(cfg: ModelConfig, act_bytes: int = 2, checkpointing: bool = False) -> int:
    """Bytes kept for backward per trained token (reference model, fused attention); see the module doc."""
    if act_bytes not in ACTIVATION_COEFFICIENTS:
        raise ValueError(f"act_bytes must be 2 (bf16) or 4 (fp32), got {act_bytes}")
    coef, terms = ACTIVATION_COEFFICIENTS[act_bytes], activation_terms(cfg)
    total = sum(coef[k] * terms[k] for k in coef)
    if not checkpointing:
        return total
    L, Lp = cfg.num_layers, len(cfg.ple_layers)
    layers = sum(coef[k] * terms[k] for k in coef if k.startswith("L*") or k == "L")
    injections = sum((coef[k] - FRONT_END_COEFFICIENTS.get(k, 0)) * terms[k] for k in coef if k.startswith("Lp"))
    # Kept: each layer's fp32 input; recomputed in backward, one layer (and its injection) at a time.
    return total - layers - injections + L * 4 * cfg.hidden_size + layers // L + (injections // Lp if Lp else 0)


@dataclass(frozen=True)
class ParamSplit:
    """Parameter counts the memory figures are built from."""

    dense: int
    matmul: int
    layer: int
    root: int
    table: int
    table_rows: int
    table_width: int
    table_reads: int = 1
    """Rows each token reads (S: one per hash head of an n-gram table)."""

    @classmethod
    def of(cls, cfg: ModelConfig) -> ParamSplit:
        """Split `cfg`'s parameters into dense (all but the PLE table), per layer and root."""
        c = count_params(cfg)
        Lp = len(cfg.ple_layers)
        per_layer_ple = c["ple_per_layer"] // Lp if Lp else 0
        # count_params reports a pruned FFN as shipped (prune_to); training holds intermediate_size until export.
        ffn = training_ffn_params(cfg)
        # The largest layer: attention, FFN, two norms and, where there is PLE, its injection.
        layer = (c["attention"] + ffn) // cfg.num_layers + 2 * cfg.hidden_size + per_layer_ple
        dense = c["total"] - c["ffn"] - c["ffn_mask"] + ffn - c["ple_table"]
        root = c["embedding"] + c["output_head"] + c["ple_model_projection"] + cfg.hidden_size
        return cls(dense, matmul_params(cfg), layer, root, c["ple_table"], cfg.ple_table_rows,
                   cfg.ple_row_width, cfg.ple_heads)


Strategy = Literal["auto", "ddp", "fsdp"]


@dataclass(frozen=True)
class MemoryRequest:
    """What to estimate: the run's config, the cluster, the strategy and the assumptions."""

    train: TrainConfig
    gpus: int = 8
    gpu_memory: float = 80 * GB
    strategy: Strategy = "auto"
    micro_batch: int | None = None
    activation_checkpointing: bool = False
    mfu: float = 0.4
    peak_flops: float = GPU_PEAKS[DEFAULT_GPU]
    tokens: float | None = None
    global_batch: int | None = None
    overhead: float = 3 * GiB

    def __post_init__(self) -> None:
        if self.strategy not in get_args(Strategy):
            raise PlelabError(f"strategy must be one of {', '.join(get_args(Strategy))}, got {self.strategy!r}")
        if self.gpus < 1 or self.gpu_memory <= 0 or not 0 < self.mfu <= 1 or self.peak_flops <= 0:
            raise PlelabError("gpus >= 1, gpu_memory > 0, 0 < mfu <= 1 and peak_flops > 0 are required")


def sequences(req: MemoryRequest) -> int:
    """Sequences per optimizer step over all ranks: --global-batch, else batch_size * grad_accum of the config."""
    return req.global_batch if req.global_batch is not None else req.train.batch_size * req.train.grad_accum


def rank_memory(req: MemoryRequest, strategy: str, micro_batch: int, grad_accum: int,
                replicated_table: bool = False) -> dict[str, float]:
    """Per-rank bytes by part for `strategy` at `micro_batch` sequences per micro-step."""
    cfg, N = req.train.model, req.gpus
    s = ParamSplit.of(cfg)
    act_bytes = 4 if req.train.dtype == "fp32" else 2
    T = req.train.context
    tokens = micro_batch * T
    rows = s.table_rows if replicated_table else math.ceil(s.table_rows / N)
    table = rows * s.table_width
    if strategy == "ddp":
        weights = 4 * s.dense
        copies = 2 * s.matmul if act_bytes == 2 else 0
        grads, optim = 4 * s.dense, 8 * s.dense
    else:
        # Gathered in the compute precision: the root for the whole step, two layers at a time.
        weights = 4 * s.dense / N + act_bytes * (s.root + 2 * s.layer)
        copies = 0
        grads, optim = 4 * s.dense / N + 4 * (s.layer + s.root), 8 * s.dense / N
    if req.train.sparse_ple:
        table_grad = min(tokens * s.table_reads * grad_accum, rows) * (4 * s.table_width + 8) if s.table_width else 0
    else:
        table_grad = 4 * table
    act = tokens * activation_bytes_per_token(cfg, act_bytes, req.activation_checkpointing)
    parts = {
        "weights": weights, "bf16_weight_copies": copies, "gradients": grads, "optimizer": optim,
        "ple_table": 4 * table, "ple_table_optimizer": 8 * table, "ple_table_gradient": table_grad,
        "activations": act, "head_transient": tokens * cfg.vocab_size * (act_bytes + 4),
        "ple_exchange_transient": 0 if replicated_table or N == 1 else 2 * tokens * s.table_reads * 4 * s.table_width,
        "overhead": req.overhead,
    }
    parts["total"] = sum(parts.values())
    return parts


def max_micro_batch(req: MemoryRequest, strategy: str, per_rank: int) -> int:
    """Largest micro-batch (sequences) dividing `per_rank` whose total fits in gpu_memory; 0 if none."""
    for mb in sorted((d for d in range(1, per_rank + 1) if per_rank % d == 0), reverse=True):
        if rank_memory(req, strategy, mb, per_rank // mb)["total"] <= req.gpu_memory:
            return mb
    return 0


def training_memory(req: MemoryRequest) -> dict[str, Any]:
    """The whole estimate as a JSON-friendly dict (see the module docstring for every formula)."""
    cfg, N = req.train.model, req.gpus
    seqs = sequences(req)
    if seqs % N:
        raise PlelabError(f"the global batch ({seqs} sequences) must divide evenly over {N} GPUs; "
                          "set --global-batch or the config's batch_size / grad_accum")
    per_rank = seqs // N
    if req.micro_batch is not None and per_rank % req.micro_batch:
        raise PlelabError(f"--micro-batch {req.micro_batch} must divide the {per_rank} sequences per rank per step")
    candidates = ["ddp", "fsdp"] if req.strategy == "auto" else [req.strategy]
    fits = {st: max_micro_batch(req, st, per_rank) for st in candidates}
    strategy = next((st for st in candidates if fits[st]), candidates[-1])
    mb = req.micro_batch or fits[strategy] or 1
    accum = per_rank // mb
    mem = rank_memory(req, strategy, mb, accum)
    replicated = rank_memory(req, strategy, mb, accum, replicated_table=True)
    T = req.train.context
    flops = train_flops_per_token(cfg, T)
    tok_s_gpu = req.mfu * req.peak_flops / flops
    s = ParamSplit.of(cfg)
    table_parts = ("ple_table", "ple_table_optimizer", "ple_table_gradient")
    result: dict[str, Any] = {
        "model": {"params_total": s.dense + s.table, "params_dense": s.dense, "ple_table": s.table,
                  "matmul_params": s.matmul, "ple_dim": cfg.ple.dim, "seq_len": T},
        "cluster": {"gpus": N, "gpu_memory_bytes": req.gpu_memory, "peak_flops_per_gpu": req.peak_flops,
                    "mfu": req.mfu},
        "strategy": strategy,
        "strategy_choice": "given" if req.strategy != "auto" else "ddp when it fits, else fsdp",
        "precision": "fp32" if req.train.dtype == "fp32" else "bf16 autocast",
        "activation_checkpointing": req.activation_checkpointing,
        "global_batch_sequences": seqs, "sequences_per_rank_per_step": per_rank,
        "micro_batch": mb, "grad_accum": accum, "max_micro_batch": fits,
        "fits": mem["total"] <= req.gpu_memory,
        "per_rank_bytes": mem,
        "ple_table_replicated_bytes": {k: replicated[k] for k in table_parts},
        "ple_table_sharding_saves_bytes": replicated["total"] - mem["total"],
        "activation_bytes_per_token": activation_bytes_per_token(
            cfg, 4 if req.train.dtype == "fp32" else 2, req.activation_checkpointing),
        "train_flops_per_token": flops,
        "tokens_per_s_per_gpu": tok_s_gpu,
        "tokens_per_s": tok_s_gpu * N,
    }
    if req.tokens:
        result["tokens"] = req.tokens
        result["gpu_hours"] = req.tokens / tok_s_gpu / 3600
        result["wall_hours"] = result["gpu_hours"] / N
    if cfg.ffn.kind != "swiglu" or (cfg.ple_layers and (cfg.ple.gate != "input" or not cfg.ple.context)):
        result["note"] = ("activation coefficients are exact for the SwiGLU FFN and the Gemma-form PLE; "
                          "this model's are approximated by them")
    return result
