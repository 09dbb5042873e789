"""The fine-tuning config: `plelab train`'s TrainConfig (same fields, same --set) plus a `[finetune]` table.

What differs from a training run: the model comes from a Hugging Face Gemma 3n / Gemma 4 folder
(`finetune.hf`), so `model` and `tokenizer` are filled in from it, never set by hand; defaults suit LoRA
(a lower learning rate, no weight decay, beta2 = 0.999, 512-token sequences). `sparse_ple` follows
`finetune.table`: the table's touched rows train with plelab's lazy sparse Adam only when it is "sparse".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plelab.hf.checkpoint import HFCheckpoint
from plelab.model.config import ModelConfig
from plelab.model.presets import load_model_config
from plelab.training.config import TrainConfig
from plelab.util.dataclass_config import ConfigError, apply_overrides, from_dict, read_file, to_dict

TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
    "ple": ("per_layer_input_gate", "per_layer_projection"),
}
"""Names `finetune.targets` may use for groups of a decoder layer's linear layers."""
TABLE_MODES = ("frozen", "sparse")
BASE_DTYPES = ("auto", "float32", "bfloat16")
ATTENTION = ("sdpa", "eager")


@dataclass
class FinetuneSettings:
    """What is fine-tuned, and how the frozen checkpoint is held."""

    hf: str = ""
    """The Hugging Face Gemma 3n / Gemma 4 folder (config.json, safetensors, tokenizer.json); `--hf` sets it."""
    rank: int = 8
    """LoRA rank r of every adapted linear layer."""
    alpha: float = 16.0
    """LoRA alpha: the adapter's output is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input (peft's lora_dropout), in [0, 1)."""
    targets: list[str] = field(default_factory=lambda: ["attention", "mlp"])
    """Linear layers of every decoder layer that get an adapter: the groups attention (q/k/v/o_proj), mlp
    (gate/up/down_proj), ple (per_layer_input_gate, per_layer_projection), or a module's name (e.g. o_proj,
    laurel.linear_left). An unknown name is refused with the list of names the checkpoint has."""
    table: str = "frozen"
    """The PLE table: "frozen" (read from disk, never trained) or "sparse" (the rows the training data
    touches train with the lazy sparse Adam; their change is kept in a sparse delta beside the adapter)."""
    table_in_memory: bool = False
    """Load the whole PLE table onto the training device, as transformers does, instead of reading each batch's
    rows from the shards: faster per step where the device has room for it; the baseline of
    benchmarks/bench_finetune_memory.py."""
    base_dtype: str = "auto"
    """dtype of the frozen weights in memory: float32, bfloat16, or auto = bfloat16 when the run computes in
    bf16 (dtype / autocast), else float32. Adapters, the table delta and optimizer state are float32."""
    attention: str = "sdpa"
    """transformers attention implementation: sdpa (no T x T matrix kept for backward) or eager."""

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ConfigError(f"finetune.rank must be > 0 (a LoRA rank), got {self.rank}")
        if not self.alpha > 0:
            raise ConfigError(f"finetune.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"finetune.dropout must lie in [0, 1), got {self.dropout}")
        if not self.targets:
            raise ConfigError("finetune.targets is empty: name the layers to adapt (e.g. attention,mlp)")
        for name, value, allowed in (("table", self.table, TABLE_MODES), ("base_dtype", self.base_dtype, BASE_DTYPES),
                                     ("attention", self.attention, ATTENTION)):
            if value not in allowed:
                raise ConfigError(f"finetune.{name} must be one of {', '.join(allowed)}, got {value!r}")


DEFAULT_SEQ_LEN = 512
"""Tokens per sequence when none is set, cut to the checkpoint's context when that is shorter."""


@dataclass
class FinetuneConfig(TrainConfig):
    """A LoRA fine-tuning run: every TrainConfig field, LoRA-suited defaults, and `finetune`."""

    lr: float = 2e-4
    """Peak learning rate (AdamW for the adapters, lazy sparse Adam for the table rows)."""
    weight_decay: float = 0.0
    """AdamW decay on the adapter matrices."""
    beta2: float = 0.999
    """Adam beta2."""
    warmup_steps: int = 20
    """Linear warmup steps."""
    max_steps: int = 500
    """Optimizer steps to train."""
    batch_size: int = 8
    """Sequences per micro-batch."""
    seq_len: int = DEFAULT_SEQ_LEN
    """Tokens per sequence (at most the checkpoint's max_position_embeddings; when not set, the smaller of the
    two)."""
    sparse_ple: bool = False
    """Set from finetune.table (true iff "sparse"); not set by hand."""
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)
    """The checkpoint, the adapters and the table (the `[finetune]` table of a config file)."""

    def __post_init__(self) -> None:
        self.sparse_ple = self.finetune.table == "sparse"
        if self.dtype == "bf16-head":
            raise ConfigError("dtype = bf16-head speeds up plelab's own fused output head + loss, which a Hugging Face "
                              "model does not run (its losses would be fp32's): choose fp32 or bf16")
        super().__post_init__()
        if self.diagnostics_every:
            raise ConfigError("diagnostics_every watches plelab models; for a fine-tune run `plelab diagnose --hf` "
                              "on the merged folder (plelab finetune --merge) instead")
        if self.parallel == "fsdp":
            raise ConfigError("parallel = fsdp: fine-tuning replicates the adapters with ddp (the frozen model is "
                              "not sharded); use parallel = ddp")

    def input_paths(self) -> tuple[str, ...]:
        """The run's inputs and the checkpoint it fine-tunes."""
        return (*super().input_paths(), *([self.finetune.hf] if self.finetune.hf else []))


def model_config_of(ckpt: HFCheckpoint) -> ModelConfig:
    """plelab's description of a checkpoint's text model (vocabulary, width, depth, heads, context, PLE shape):
    what the run-folder tools read. The rest of a Gemma layer (AltUp, LAuReL, norms) has no field here.
    `ckpt` may be anything with `.path` and `.text_config` (a config.json alone, for planning)."""
    t = ckpt.text_config
    ffn = t.get("intermediate_size", 128)
    data: dict[str, Any] = {
        "vocab_size": t["vocab_size"], "hidden_size": t["hidden_size"], "num_layers": t["num_hidden_layers"],
        "num_heads": t.get("num_attention_heads", 1), "num_kv_heads": t.get("num_key_value_heads"),
        "head_dim": t.get("head_dim"), "max_seq_len": t.get("max_position_embeddings") or 8192,
        "norm_eps": t.get("rms_norm_eps", 1e-6), "tie_embeddings": bool(t.get("tie_word_embeddings", True)),
        "embed_scale": True, "ffn": {"intermediate_size": max(ffn) if isinstance(ffn, list) else ffn},
        "ple": {"dim": t["hidden_size_per_layer_input"], "vocab_size": t["vocab_size_per_layer_input"],
                "context": True, "gate": "input", "output_norm": True},
    }
    try:
        return load_model_config(data)
    except ConfigError as exc:
        raise ConfigError(f"{ckpt.path}: cannot describe this checkpoint's shape ({exc})") from None


def load_finetune_config(source: str | Path | dict[str, Any] | None, overrides: list[str] | None = None,
                         fields: dict[str, Any] | None = None) -> tuple[FinetuneConfig, HFCheckpoint]:
    """(config, its opened checkpoint) from a file or dict (None = defaults), `key=value` overrides, then
    `fields` ({dotted key: value}, e.g. {"finetune.hf": PATH}; None values skipped). `model` and `tokenizer`
    are taken from the checkpoint: a run's recorded ones are replaced (resume then refuses a checkpoint
    whose shape changed), and setting them by hand is refused."""
    data = {} if source is None else dict(source) if isinstance(source, dict) else read_file(source)
    data.pop("model", None)
    data.pop("tokenizer", None)
    data = apply_overrides(data, overrides or [])
    for key, value in (fields or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    if "model" in data or "tokenizer" in data:
        raise ConfigError("model and tokenizer come from the checkpoint (finetune.hf); do not set them")
    section = data.get("finetune")
    hf = section.get("hf") if isinstance(section, dict) else None
    if not hf:
        raise ConfigError("no checkpoint: give --hf PATH (a Hugging Face Gemma 3n / Gemma 4 folder)")
    ckpt = HFCheckpoint.open(hf)
    if ckpt.tokenizer_json is None:
        raise ConfigError(f"{ckpt.path} has no tokenizer.json: fine-tuning needs the checkpoint's tokenizer "
                          "(to check and evaluate the data); copy it from the model's release")
    data["model"] = to_dict(model_config_of(ckpt))
    data["tokenizer"] = str(ckpt.tokenizer_json)
    return from_dict(FinetuneConfig, fit_seq_len(data)), ckpt


def fit_seq_len(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (with its "model") whose seq_len, when not given, is DEFAULT_SEQ_LEN or the model's context when that
    is shorter: a default the checkpoint cannot take would only be refused."""
    if "seq_len" not in data:
        data = {**data, "seq_len": min(DEFAULT_SEQ_LEN, data["model"]["max_seq_len"])}
    return data


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {part!r} is not a table")
    node[last] = value
