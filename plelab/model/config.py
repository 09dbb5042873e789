"""Model configuration: typed dataclasses with one docstring per field, validated on creation."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from plelab.errors import PlelabError
from plelab.util.dataclass_config import LATER, ConfigError

if TYPE_CHECKING:
    from plelab.model.ngram import NgramLayout

# The one list of each kind of variant: config validation, the module registries (ffn.py, ple.py),
# parameter accounting and the edge runtime all take their names from here.
FFNKind = Literal["swiglu", "mglu", "lowrank", "moe", "pruned"]
FFN_KINDS: tuple[str, ...] = get_args(FFNKind)
PruneImportance = Literal["magnitude", "taylor"]
PRUNE_IMPORTANCES: tuple[str, ...] = get_args(PruneImportance)
PLEGate = Literal["input", "scalar", "vector", "engram"]
PLE_GATES: tuple[str, ...] = get_args(PLEGate)
PLEIndex = Literal["token", "ngram"]
PLE_INDEXES: tuple[str, ...] = get_args(PLEIndex)
KernelsSetting = Literal["auto", "on", "off"]
KERNEL_SETTINGS: tuple[str, ...] = get_args(KernelsSetting)
Arch = Literal["llama", "gemma4"]
ARCHS: tuple[str, ...] = get_args(Arch)
LayerType = Literal["sliding_attention", "full_attention"]
LAYER_TYPES: tuple[str, ...] = get_args(LayerType)


@dataclass
class FFNConfig:
    """The feed-forward block; all variants share one interface (see plelab/model/ffn.py)."""

    kind: FFNKind = "swiglu"
    """swiglu: separate gate/up; mglu: one shared matrix split by learned 1-bit masks;
    lowrank: gate and up each factorised; moe: top-k routed SwiGLU experts (plelab/model/moe.py);
    pruned: a SwiGLU whose units are removed during training down to prune_to (plelab/model/pruning.py)."""
    intermediate_size: int = 128
    """FFN width (the gate/up output size); for pruned, the width training starts at."""
    mask_count: int = 1
    """MGLU only: number n_m of binary masks summed (the seed's negative result is n_m = 1)."""
    rank: int = 0
    """lowrank only: rank r of each of the gate and up factorisations (H x r then r x F)."""
    num_experts: int = 8
    """moe only: routed experts E."""
    top_k: int = 2
    """moe only: experts each token is sent to (1 <= top_k <= num_experts)."""
    expert_size: int = 0
    """moe only: SwiGLU width of each expert (and of the shared expert); 0 = intermediate_size."""
    shared_expert: bool = False
    """moe only: add one always-on SwiGLU expert of expert_size that every token passes through."""
    router_aux_weight: float = 0.01
    """moe only: weight of the load-balancing loss E * sum_i f_i * P_i (Switch / OLMoE; 1 for a uniform router)."""
    router_z_weight: float = 0.001
    """moe only: weight of the router z-loss mean(logsumexp(router logits)^2)."""
    capacity_factor: float = 0.0
    """moe only: 0 = dropless; c > 0 = each expert takes at most ceil(c * T * top_k / E) of a batch's T tokens,
    first come (batch order) first served, and the assignments beyond that are dropped (they add nothing)."""
    prune_to: int = 0
    """pruned only: final width, 0 < prune_to < intermediate_size; what ships and what the counts report."""
    prune_start: float = 0.25
    """pruned only: fraction of max_steps at which unit removal starts."""
    prune_end: float = 0.75
    """pruned only: fraction of max_steps by which exactly prune_to units are left (removal is linear between)."""
    prune_importance: PruneImportance = "magnitude"
    """pruned only: unit score. magnitude: |gate row| * |up row| * |down column| (L2 norms); taylor: first-order
    estimate of the loss change on removing the unit, |sum over tokens of h_j * dL/dh_j| per micro-batch,
    accumulated with a decay of 0.9 per step (h_j: the unit's silu(gate) * up)."""

    def __post_init__(self) -> None:
        if self.kind not in FFN_KINDS:
            raise ConfigError(f"ffn.kind must be one of {', '.join(FFN_KINDS)}, got {self.kind!r}")
        if self.intermediate_size <= 0:
            raise ConfigError(f"ffn.intermediate_size must be > 0, got {self.intermediate_size}")
        if self.kind == "mglu" and self.mask_count < 1:
            raise ConfigError(f"ffn.mask_count must be >= 1 for mglu, got {self.mask_count}")
        if self.kind == "lowrank" and self.rank <= 0:
            raise ConfigError("ffn.rank must be > 0 for the lowrank FFN (e.g. --set ffn.rank=64)")
        self._check_moe()
        self._check_pruning()

    def _check_moe(self) -> None:
        if self.num_experts < 1:
            raise ConfigError(f"ffn.num_experts must be >= 1, got {self.num_experts}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ConfigError(f"ffn.top_k must lie in 1..num_experts={self.num_experts}, got {self.top_k}")
        if self.expert_size < 0:
            raise ConfigError(f"ffn.expert_size must be >= 0 (0 = intermediate_size), got {self.expert_size}")
        for name in ("router_aux_weight", "router_z_weight", "capacity_factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"ffn.{name} must be a finite number >= 0, got {value}")

    def _check_pruning(self) -> None:
        if self.kind == "pruned" and not 0 < self.prune_to < self.intermediate_size:
            raise ConfigError(f"ffn.prune_to must lie in 1..intermediate_size-1 = {self.intermediate_size - 1} "
                              f"for the pruned FFN, got {self.prune_to}")
        if not 0 <= self.prune_start < self.prune_end <= 1:
            raise ConfigError(f"ffn.prune_start < ffn.prune_end must both lie in [0, 1], "
                              f"got {self.prune_start} and {self.prune_end}")
        if self.prune_importance not in PRUNE_IMPORTANCES:
            raise ConfigError(f"ffn.prune_importance must be one of {', '.join(PRUNE_IMPORTANCES)}, "
                              f"got {self.prune_importance!r}")

    @property
    def expert_width(self) -> int:
        """Width of each MoE expert (expert_size, or intermediate_size when 0)."""
        return self.expert_size or self.intermediate_size


@dataclass
class NgramConfig:
    """The n-gram index of a PLE table (`ple.index = "ngram"`; the hash and layout: docs/ngram-ple.md). Written in
    full with every n-gram model, so a checkpoint records its hash exactly."""

    orders: list[int] = field(default_factory=lambda: [2, 3])
    """The n-gram lengths hashed, ascending (1 = the token alone, 2 = it and the one before, ...; at most 8)."""
    heads: int = 4
    """Hash heads per order; each of the orders x heads heads gives every PLE layer dP / (orders x heads) channels."""
    rows: list[int] | None = None
    """Rows of each head, one entry per order (or one entry for all); each prime and not a multiple of the
    vocabulary size (plelab.model.ngram.rows_problem says why). None = the smallest prime above the vocabulary
    size (written in when the model config is made), so the table holds about a token table's parameters."""
    seed: int = 0
    """Seed of the hash multipliers, a uint32 (plelab.model.ngram.multiplier)."""
    id_map: str | None = None
    """A token-id compression file (`plelab data id-map`): ids go through it before they are hashed, so case and
    whitespace variants of one word make the same n-grams. None = the ids as they are."""
    id_map_sha256: str | None = None
    """Not a setting but a record: the sha256 of the id_map file, filled in from the file when the config is made
    (a changed file is then refused rather than silently hashed). The model keeps the map itself among its
    weights, so a checkpoint needs the file no more."""

    def __post_init__(self) -> None:
        from plelab.model.ngram import MAX_HEADS, MAX_ORDER, file_sha256

        orders = self.orders
        if not orders or len(set(orders)) != len(orders) or not all(1 <= n <= MAX_ORDER for n in orders):
            raise ConfigError(f"ple.ngram.orders must be distinct lengths in 1..{MAX_ORDER}, got {orders}")
        if sorted(orders) != list(orders):
            raise ConfigError(f"ple.ngram.orders must be ascending (the table's heads follow them), got {orders}")
        if not 1 <= self.heads <= MAX_HEADS:
            raise ConfigError(f"ple.ngram.heads must lie in 1..{MAX_HEADS}, got {self.heads}")
        if self.rows is not None and len(self.rows) not in (1, len(orders)):
            raise ConfigError(f"ple.ngram.rows needs one entry per order {orders} (or one for all), got {self.rows}")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            raise ConfigError(f"ple.ngram.seed must be a uint32 (0..4294967295), got {self.seed}")
        if self.id_map is not None and self.id_map_sha256 is None:
            try:
                self.id_map_sha256 = file_sha256(self.id_map)
            except PlelabError as exc:
                raise ConfigError(str(exc)) from None


@dataclass
class PLEConfig:
    """Per-layer embeddings. dim = 0 disables them and gives exactly the baseline model."""

    dim: int = 0
    """dP, width of each layer's per-token vector; 0 = no PLE."""
    index: PLEIndex = field(default="token", metadata=LATER)
    """Which table rows a position reads. token: the row of its token id (Gemma 3n / Gemma 4). ngram: one row per
    hash head, chosen by hashing the suffix n-grams that end at it (Engram, LongCat; settings in `ngram`); each
    layer's vector is the heads' slices of that layer side by side."""
    vocab_size: int | None = None
    """token index only: rows in the PLE table (V_ple); None = the model's vocabulary. Larger ids map to row 0."""
    ngram: NgramConfig | None = field(default=None, metadata=LATER)
    """The n-gram index's settings (ngram index only; its defaults when absent)."""
    layers: list[int] | None = None
    """Layers that receive PLE (0-based); None = all layers."""
    context: bool = True
    """Gemma form: add a projection of the input embedding (H -> L*dP, RMSNorm over dP), fused x 1/sqrt(2)."""
    gate: PLEGate = "input"
    """input: GELU-tanh(Linear(h)) H -> dP (Gemma); scalar / vector: a learned gate (simple form;
    vector is per dP channel); engram: Engram's context-aware scalar per token,
    sigmoid(signed-sqrt(<RMSNorm(W_key e), RMSNorm(h)> / sqrt(H))) with e the layer's PLE vector."""
    gate_init: float = 1.0
    """Initial value of a scalar/vector gate."""
    output_norm: bool = True
    """RMSNorm over H after the dP -> H projection (Gemma's post_per_layer_input_norm)."""
    output_norm_init: float = 1.0
    """Initial weight of that norm; 0 makes PLE start silent (the edge reference's choice)."""
    conv_kernel: int = field(default=0, metadata=LATER)
    """Taps of a short depthwise causal convolution over each PLE layer's output y (Engram: 4), added as
    y + SiLU(conv(RMSNorm(y))); its dilation is the longest n-gram order (1 for the token index). 0 = none."""
    table_init_std: float | None = None
    """Std of the table initialisation; None = the model's init_std."""
    sparse_grad: bool = False
    """Not a setting but a record: whether the table was built with sparse gradients (only the batch's rows).
    The trainer sets it from the training config's sparse_ple on the model it builds, so checkpoints and
    exports record it; a training config may not set it (plelab.training.config refuses true)."""

    def __post_init__(self) -> None:
        if self.dim < 0:
            raise ConfigError(f"ple.dim (dP) must be >= 0, got {self.dim}")
        if self.vocab_size is not None and self.vocab_size <= 0:
            raise ConfigError(f"ple.vocab_size must be > 0, got {self.vocab_size}")
        if self.gate not in PLE_GATES:
            raise ConfigError(f"ple.gate must be one of {', '.join(PLE_GATES)}, got {self.gate!r}")
        if self.layers is not None and len(set(self.layers)) != len(self.layers):
            raise ConfigError(f"ple.layers has duplicates: {self.layers}")
        if self.table_init_std is not None and self.table_init_std < 0:
            raise ConfigError(f"ple.table_init_std must be >= 0, got {self.table_init_std}")
        if self.conv_kernel < 0:
            raise ConfigError(f"ple.conv_kernel must be >= 0 (0 = no convolution), got {self.conv_kernel}")
        if self.index not in PLE_INDEXES:
            raise ConfigError(f"ple.index must be one of {', '.join(PLE_INDEXES)}, got {self.index!r}")
        if self.index == "token" and self.ngram is not None:
            raise ConfigError("ple.ngram holds the settings of the n-gram index: set ple.index = \"ngram\" (or "
                              "remove them)")
        if self.index == "ngram":
            if self.vocab_size is not None:
                raise ConfigError("ple.vocab_size sets the rows of a token table; an n-gram table's are "
                                  "ple.ngram.rows")
            if self.ngram is None:
                self.ngram = NgramConfig()


@dataclass
class Gemma4Config:
    """The Gemma 4 decoder's own settings (used only with `arch = "gemma4"`; names follow transformers'
    Gemma4TextConfig, see docs/hf-mapping.md). Sliding layers use the model's head_dim, num_kv_heads and
    rope_theta; full-attention layers may override them here."""

    layer_types: list[LayerType] | None = None
    """Attention kind of each layer; None = transformers' default (every 6th layer full, the last one full)."""
    sliding_window: int = 512
    """Sliding layers see the last `sliding_window` positions, their own included."""
    full_head_dim: int | None = None
    """Head width of the full-attention layers (HF global_head_dim); None = head_dim."""
    full_kv_heads: int | None = None
    """Key/value heads of the full-attention layers (HF num_global_key_value_heads); None = num_kv_heads."""
    full_rope_theta: float = 1_000_000.0
    """RoPE base of the full-attention layers."""
    full_rotary_fraction: float = 0.25
    """Share of the full layers' head width that is rotated (HF "proportional" RoPE partial_rotary_factor);
    the rest keeps frequency 0. 1.0 = plain RoPE."""
    attention_k_eq_v: bool = False
    """Full-attention layers have no v_proj: the values are the keys before their norm and RoPE."""
    num_kv_shared_layers: int = 0
    """The last this-many layers compute no keys/values of their own: each reuses those of the last earlier
    layer of its attention kind."""
    double_wide_mlp: bool = False
    """KV-shared layers have an FFN of twice ffn.intermediate_size."""
    final_logit_softcap: float | None = None
    """logits = c * tanh(logits / c) when set."""

    def __post_init__(self) -> None:
        if self.sliding_window <= 0:
            raise ConfigError(f"gemma4.sliding_window must be > 0, got {self.sliding_window}")
        for name in ("full_head_dim", "full_kv_heads", "final_logit_softcap"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"gemma4.{name} must be > 0 (or unset), got {value}")
        if not 0 < self.full_rotary_fraction <= 1:
            raise ConfigError(f"gemma4.full_rotary_fraction must lie in (0, 1], got {self.full_rotary_fraction}")
        if self.num_kv_shared_layers < 0:
            raise ConfigError(f"gemma4.num_kv_shared_layers must be >= 0, got {self.num_kv_shared_layers}")
        bad = [t for t in self.layer_types or [] if t not in LAYER_TYPES]
        if bad:
            raise ConfigError(f"gemma4.layer_types entries must be one of {', '.join(LAYER_TYPES)}, got {bad}")


@dataclass
class ModelConfig:
    """A decoder-only transformer LM with optional per-layer embeddings."""

    arch: Arch = "llama"
    """Decoder block. llama: pre-norm attention + FFN (SwiGLU or a variant), one RoPE, causal attention.
    gemma4: transformers' Gemma 4 text block (plelab/model/gemma4.py): pre- and post-norms around attention
    and FFN, QK-norm and a weightless V-norm with attention scale 1, GELU-tanh GLU, a per-layer scalar,
    sliding/full attention layers (settings in `gemma4`), embedding scaled by sqrt(H) whatever embed_scale
    says. PLE sits where both put it: after the FFN (before Gemma 4's layer scalar)."""
    vocab_size: int = 256
    """Vocabulary size V of the main embedding and output head."""
    hidden_size: int = 64
    """Residual width H."""
    num_layers: int = 2
    """Number of decoder layers L."""
    num_heads: int = 4
    """Query heads."""
    num_kv_heads: int | None = None
    """Key/value heads for grouped-query attention; None = num_heads (plain multi-head)."""
    head_dim: int | None = None
    """Per-head width; None = hidden_size / num_heads."""
    max_seq_len: int = 256
    """Longest sequence (context length) the model is used with."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    tie_embeddings: bool = True
    """Share the input embedding with the output head."""
    embed_scale: bool = False
    """Multiply input embeddings by sqrt(H) as Gemma does (always on for arch = "gemma4")."""
    init_std: float = 0.02
    """Std of the normal initialisation of linear and embedding weights."""
    ffn: FFNConfig = field(default_factory=FFNConfig)
    """Feed-forward block."""
    ple: PLEConfig = field(default_factory=PLEConfig)
    """Per-layer embeddings."""
    gemma4: Gemma4Config = field(default_factory=Gemma4Config)
    """Settings of the Gemma 4 block (ignored unless arch = "gemma4")."""
    kernels: KernelsSetting = "auto"
    """Compute paths (the fused ops, plelab/model/fused_ops.py): "off" = the reference formulas, "on" = the hand-written
    RMSNorm/RoPE backward and the fused chunked head + cross-entropy (same math, to rounding), "auto" = on
    when the model is built for the CPU, the only device where they were measured faster."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ConfigError(
                f"num_heads={self.num_heads} does not divide hidden_size={self.hidden_size}; "
                "change one or set head_dim explicitly"
            )
        if self.head_dim is not None and self.head_dim <= 0:
            raise ConfigError(f"head_dim must be > 0, got {self.head_dim}")
        if self.kv_heads <= 0 or self.num_heads % self.kv_heads:
            raise ConfigError(
                f"num_kv_heads={self.num_kv_heads} must be > 0 and divide num_heads={self.num_heads}"
            )
        if self.head_size % 2:
            raise ConfigError(f"head dim must be even for RoPE, got {self.head_size}")
        if self.norm_eps <= 0 or not math.isfinite(self.norm_eps):
            raise ConfigError(f"norm_eps must be a positive number, got {self.norm_eps}")
        if not self.rope_theta > 1:  # RoPE frequencies are theta ** (-2i / d): theta <= 1 stops rotating
            raise ConfigError(f"rope_theta must be > 1, got {self.rope_theta}")
        if not self.init_std > 0:
            raise ConfigError(f"init_std must be > 0, got {self.init_std}")
        if self.kernels not in KERNEL_SETTINGS:
            raise ConfigError(f"kernels must be one of {', '.join(KERNEL_SETTINGS)}, got {self.kernels!r}")
        if self.ple.layers is not None:
            bad = [i for i in self.ple.layers if not 0 <= i < self.num_layers]
            if bad:
                raise ConfigError(f"ple.layers {bad} outside 0..{self.num_layers - 1}")
        if self.arch not in ARCHS:
            raise ConfigError(f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        if self.arch == "gemma4":
            self._check_gemma4()
        if self.ple.index == "ngram":
            self._check_ngram()

    def _check_ngram(self) -> None:
        from plelab.model.ngram import default_rows, rows_problem

        if self.ple.ngram.rows is None:  # written in (new objects: a config sharing this one keeps its own)
            ngram = dataclasses.replace(self.ple.ngram, rows=[default_rows(self.vocab_size)])
            self.ple = dataclasses.replace(self.ple, ngram=ngram)
        layout = self.ple_layout
        for n, rows in zip(layout.orders, layout.rows, strict=True):
            problem = rows_problem(rows, self.vocab_size)
            if problem:
                raise ConfigError(f"ple.ngram.rows: {rows:,} rows per head (order {n}) {problem}")
        if self.ple.dim % layout.num_heads:
            raise ConfigError(f"ple.dim = {self.ple.dim} must be a multiple of the {layout.num_heads} hash heads "
                              f"({len(layout.orders)} orders x {layout.heads} heads): each head gives every layer "
                              "dP / heads channels")

    def _check_gemma4(self) -> None:
        g = self.gemma4
        if self.ffn.kind != "swiglu":
            raise ConfigError(f"arch=gemma4 has a plain gated FFN: set ffn.kind=swiglu (got {self.ffn.kind!r})")
        if g.layer_types is not None and len(g.layer_types) != self.num_layers:
            raise ConfigError(f"gemma4.layer_types has {len(g.layer_types)} entries for {self.num_layers} layers")
        if self.layer_types[-1] != "full_attention":
            raise ConfigError("gemma4.layer_types must end with full_attention (transformers forces the last layer)")
        if g.full_head_dim is not None and g.full_head_dim % 2:
            raise ConfigError(f"gemma4.full_head_dim must be even for RoPE, got {g.full_head_dim}")
        if g.full_kv_heads is not None and self.num_heads % g.full_kv_heads:
            raise ConfigError(f"gemma4.full_kv_heads={g.full_kv_heads} must divide num_heads={self.num_heads}")
        first_shared = self.num_layers - g.num_kv_shared_layers
        if g.num_kv_shared_layers and set(self.layer_types[first_shared:]) - set(self.layer_types[:first_shared]):
            raise ConfigError(
                f"gemma4.num_kv_shared_layers={g.num_kv_shared_layers}: every attention kind among the shared "
                "layers needs an earlier layer of the same kind that computes keys/values"
            )

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads actually used."""
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads

    @property
    def head_size(self) -> int:
        """Per-head width actually used (of every layer for llama, of the sliding layers for gemma4)."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def layer_types(self) -> list[str]:
        """Attention kind of each layer ("full_attention" everywhere for llama)."""
        if self.arch != "gemma4":
            return ["full_attention"] * self.num_layers
        if self.gemma4.layer_types is not None:
            return list(self.gemma4.layer_types)
        # transformers' default: five sliding layers to one full one, and the last layer full.
        kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(self.num_layers)]
        return kinds[:-1] + ["full_attention"]

    @property
    def scales_embedding(self) -> bool:
        """Whether the input embedding is multiplied by sqrt(H)."""
        return self.embed_scale or self.arch == "gemma4"

    @property
    def logit_softcap(self) -> float | None:
        """c of logits = c * tanh(logits / c), or None (no soft-capping)."""
        return self.gemma4.final_logit_softcap if self.arch == "gemma4" else None

    def attention_shape(self, layer: int) -> tuple[int, int]:
        """(key/value heads, head width) of one layer's attention."""
        g = self.gemma4
        if self.arch == "gemma4" and self.layer_types[layer] == "full_attention":
            kv = g.full_kv_heads if g.full_kv_heads is not None else self.kv_heads
            return kv, g.full_head_dim if g.full_head_dim is not None else self.head_size
        return self.kv_heads, self.head_size

    def kv_source(self, layer: int) -> int:
        """The layer whose keys/values `layer` attends to: itself, or for a Gemma 4 KV-shared layer the last
        earlier layer of its attention kind that computes its own."""
        first_shared = self.num_layers - (self.gemma4.num_kv_shared_layers if self.arch == "gemma4" else 0)
        if layer < first_shared:
            return layer
        kind = self.layer_types[layer]
        return max(i for i in range(first_shared) if self.layer_types[i] == kind)

    @property
    def ple_layers(self) -> list[int]:
        """Layers that receive PLE, in order (empty when dP = 0)."""
        if self.ple.dim == 0:
            return []
        return sorted(self.ple.layers) if self.ple.layers is not None else list(range(self.num_layers))

    @property
    def ple_vocab_size(self) -> int:
        """Rows of a token-indexed PLE table (the ids it has rows for)."""
        return self.ple.vocab_size if self.ple.vocab_size is not None else self.vocab_size

    @property
    def ple_layout(self) -> NgramLayout | None:
        """Orders, heads, rows and hash of an n-gram table (None for the token index)."""
        if self.ple.index != "ngram":
            return None
        from plelab.model.ngram import NgramLayout

        g = self.ple.ngram
        rows = g.rows * len(g.orders) if len(g.rows) == 1 else g.rows  # rows: written in by _check_ngram
        return NgramLayout(tuple(g.orders), g.heads, tuple(rows), g.seed)

    @property
    def ple_table_rows(self) -> int:
        """Rows of the PLE table: V_ple for the token index, every hash head's rows for the n-gram index."""
        layout = self.ple_layout
        return layout.total_rows if layout is not None else self.ple_vocab_size

    @property
    def ple_heads(self) -> int:
        """Table rows one position reads (S): 1 for the token index, orders x heads for the n-gram index."""
        layout = self.ple_layout
        return layout.num_heads if layout is not None else 1

    @property
    def ple_row_width(self) -> int:
        """Values in one table row: every PLE layer's slice of one head (L_ple x dP / S)."""
        return len(self.ple_layers) * self.ple.dim // self.ple_heads
