"""Hugging Face interop: load HF Gemma 3n / Gemma 4 PLE weights and Llama core weights into `LanguageModel`.

plelab's Gemma-form PLE modules carry the same names as the HF Gemma 3n / Gemma 4 text models, so the
mapping is a fixed 1:1 rename (our module path inserts `per_layer_inputs.` for the model-level parts and
`.ple` inside each layer); no tensor is transposed, rescaled or reshaped:

    plelab (LanguageModel)                               HF Gemma 3n / Gemma 4 text model
    per_layer_inputs.embed_tokens_per_layer.weight       embed_tokens_per_layer.weight        (V_ple, L*dP)
    per_layer_inputs.per_layer_model_projection.weight   per_layer_model_projection.weight    (L*dP, H)
    per_layer_inputs.per_layer_projection_norm.weight    per_layer_projection_norm.weight     (dP,)
    layers.{i}.ple.per_layer_input_gate.weight           layers.{i}.per_layer_input_gate.weight        (dP, H)
    layers.{i}.ple.per_layer_projection.weight           layers.{i}.per_layer_projection.weight        (H, dP)
    layers.{i}.ple.post_per_layer_input_norm.weight      layers.{i}.post_per_layer_input_norm.weight   (H,)

HF names are relative to the text model; checkpoints put a prefix in front (`model.language_model.` for the
multimodal Gemma3nForConditionalGeneration / Gemma4ForConditionalGeneration and the published checkpoints,
`model.` for *ForCausalLM); the loaders find it on their own. Gemma 3n / 4 RMSNorm weights are used as-is
(`x * w`, like ours), unlike Gemma 1-3 whose norms compute `x * (1 + w)`: do not feed those here.

The constants HF keeps as buffers are fixed numbers in plelab (sqrt(dP), H^-1/2, 2^-1/2), see
`GEMMA_PLE_CONSTANTS`. Gemma 4's per-layer `layer_scalar` (the whole residual is multiplied by it after
the PLE block) is not a PLE weight: the PLE loaders leave it alone.

Gemma 4 whole (`arch = "gemma4"`, plelab/model/gemma4.py): every name is HF's but for the PLE rename above
(`gemma4_hf_name`); `gemma4_config_from_hf` / `hf_gemma4_config` convert the configs, `load_hf_gemma4_weights`
and `hf_gemma4_state_dict` the weights, `gemma4_folder_config` checks a local folder for `train --init-from-hf`.

Llama: our core names (embed_tokens, q/k/v/o_proj, gate/up/down_proj, input_layernorm,
post_attention_layernorm, norm, lm_head) are Llama's, so a dP = 0 plelab model with the same dimensions
computes what `LlamaForCausalLM` computes (tests/hf/test_llama_parity.py checks it logit for logit).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from plelab.errors import PlelabError
from plelab.model.config import ModelConfig
from plelab.training.initial_weights import WeightSource, register_weight_source

if TYPE_CHECKING:
    from plelab.model.transformer import LanguageModel


class HFInteropError(PlelabError, ValueError):
    """HF weights that cannot be loaded into a plelab model (missing keys, shape or config mismatch)."""


@dataclass(frozen=True)
class NameMapping:
    """One row of a name mapping: our parameter name, the HF name (relative to the text model), shape, meaning."""

    ours: str
    hf: str
    shape: str
    note: str


GEMMA_PLE_MODEL_NAMES: tuple[NameMapping, ...] = (
    NameMapping(
        "per_layer_inputs.embed_tokens_per_layer.weight", "embed_tokens_per_layer.weight", "(V_ple, L*dP)",
        "token-identity table; both multiply the looked-up row by sqrt(dP)",
    ),
    NameMapping(
        "per_layer_inputs.per_layer_model_projection.weight", "per_layer_model_projection.weight", "(L*dP, H)",
        "context projection of the input embedding; both scale it by 1/sqrt(H)",
    ),
    NameMapping(
        "per_layer_inputs.per_layer_projection_norm.weight", "per_layer_projection_norm.weight", "(dP,)",
        "RMSNorm over dP of the context part",
    ),
)
GEMMA_PLE_LAYER_NAMES: tuple[NameMapping, ...] = (
    NameMapping(
        "layers.{i}.ple.per_layer_input_gate.weight", "layers.{i}.per_layer_input_gate.weight", "(dP, H)",
        "gate: GELU-tanh(W h)",
    ),
    NameMapping(
        "layers.{i}.ple.per_layer_projection.weight", "layers.{i}.per_layer_projection.weight", "(H, dP)",
        "projection dP -> H of gate * ple[i]",
    ),
    NameMapping(
        "layers.{i}.ple.post_per_layer_input_norm.weight", "layers.{i}.post_per_layer_input_norm.weight", "(H,)",
        "RMSNorm over H of the injection",
    ),
)
GEMMA_MAIN_EMBEDDING = NameMapping(
    "embed_tokens.weight", "embed_tokens.weight", "(V, H)",
    "main embedding (optional); Gemma scales it by sqrt(H): build with embed_scale=true",
)

GEMMA_PLE_CONSTANTS: tuple[tuple[str, str, str], ...] = (
    ("PerLayerInputs.embed_scale", "embed_tokens_per_layer.embed_scale", "sqrt(dP)"),
    ("PerLayerInputs.per_layer_model_projection_scale",
     "per_layer_projection_scale (3n) / per_layer_model_projection_scale (4)", "1/sqrt(H)"),
    ("PerLayerInputs.per_layer_input_scale", "per_layer_input_scale", "1/sqrt(2)"),
    ("(none: 1)", "layers.{i}.layer_scalar (Gemma 4 only)", "learned; multiplies the residual after PLE"),
)

LLAMA_MODEL_NAMES: tuple[NameMapping, ...] = (
    NameMapping("embed_tokens.weight", "embed_tokens.weight", "(V, H)", "input embedding"),
    NameMapping("norm.weight", "norm.weight", "(H,)", "final RMSNorm"),
)
LLAMA_LAYER_NAMES: tuple[NameMapping, ...] = tuple(
    NameMapping(f"layers.{{i}}.{name}.weight", f"layers.{{i}}.{name}.weight", shape, note)
    for name, shape, note in (
        ("input_layernorm", "(H,)", "pre-attention RMSNorm"),
        ("self_attn.q_proj", "(heads*D, H)", "query"),
        ("self_attn.k_proj", "(kv_heads*D, H)", "key"),
        ("self_attn.v_proj", "(kv_heads*D, H)", "value"),
        ("self_attn.o_proj", "(H, heads*D)", "attention output"),
        ("post_attention_layernorm", "(H,)", "pre-FFN RMSNorm"),
        ("mlp.gate_proj", "(F, H)", "SwiGLU gate"),
        ("mlp.up_proj", "(F, H)", "SwiGLU up"),
        ("mlp.down_proj", "(H, F)", "SwiGLU down"),
    )
)
LLAMA_HEAD = NameMapping("lm_head.weight", "lm_head.weight", "(V, H)", "output head (untied models only)")


def gemma_ple_mapping(num_layers: int | None = None, include_embedding: bool = False) -> list[NameMapping]:
    """The Gemma PLE name mapping; per-layer rows as `{i}` templates, or expanded for `num_layers` layers."""
    rows = [GEMMA_MAIN_EMBEDDING] if include_embedding else []
    rows += list(GEMMA_PLE_MODEL_NAMES)
    return rows + _expand(GEMMA_PLE_LAYER_NAMES, num_layers)


def llama_mapping(num_layers: int | None = None, tied: bool = True) -> list[NameMapping]:
    """The Llama core name mapping (our names on the left, LlamaModel names on the right)."""
    rows = list(LLAMA_MODEL_NAMES) + _expand(LLAMA_LAYER_NAMES, num_layers)
    return rows if tied else rows + [LLAMA_HEAD]


def mapping_table_markdown(rows: list[NameMapping]) -> str:
    """A Markdown table of a mapping (for docs/hf-mapping.md)."""
    lines = ["| plelab | Hugging Face | shape | meaning |", "|---|---|---|---|"]
    lines += [f"| `{r.ours}` | `{r.hf}` | {r.shape} | {r.note} |" for r in rows]
    return "\n".join(lines)


def _expand(rows: tuple[NameMapping, ...], num_layers: int | None) -> list[NameMapping]:
    if num_layers is None:
        return list(rows)
    return [
        NameMapping(r.ours.format(i=i), r.hf.format(i=i), r.shape, r.note) for i in range(num_layers) for r in rows
    ]


# ---------------------------------------------------------------------------------------------------------------
# Where HF tensors come from: a model object, a state dict, or safetensors files (read lazily, key by key).


class _TensorSource:
    """Uniform read access to HF tensors plus the HF text config when one is known."""

    def __init__(self, source: Any, hf_config: Any = None):
        self._tensors: Mapping[str, torch.Tensor] | None = None
        self._files: dict[str, Path] = {}
        self.config = _text_config_dict(hf_config)
        self.description = type(source).__name__
        if isinstance(source, nn.Module):
            self._tensors = source.state_dict()
            if self.config is None:
                self.config = _text_config_dict(getattr(source, "config", None))
        elif isinstance(source, Mapping):
            self._tensors = source
            self.description = "state dict"
        elif isinstance(source, (str, Path)):
            self._open_safetensors(Path(source))
        else:
            raise HFInteropError(
                f"cannot read HF weights from a {type(source).__name__}: pass an HF model, a state dict, "
                "a .safetensors file or a directory of them"
            )

    def _open_safetensors(self, path: Path) -> None:
        if path.is_dir():
            files = sorted(path.glob("*.safetensors"))
            config_file = path / "config.json"
        else:
            files = [path] if path.exists() else []
            config_file = path.parent / "config.json"
        if not files:
            raise HFInteropError(f"no .safetensors file found at {path}")
        index = path / "model.safetensors.index.json" if path.is_dir() else None
        if index is not None and index.is_file():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise HFInteropError(f"{index} is not a safetensors index: {e}") from e
            absent = sorted(name for name in shards if not (path / name).is_file())
            if absent:
                raise HFInteropError(f"{path} lacks {len(absent)} shard(s) its index lists: {', '.join(absent[:3])}")
        for f in files:
            with _open_checked(f) as handle:
                for key in handle.keys():
                    self._files[key] = f
        if self.config is None and config_file.exists():
            self.config = _text_config_dict(json.loads(config_file.read_text()))
        self.description = f"safetensors at {path}"

    def keys(self) -> list[str]:
        """All tensor names."""
        return list(self._tensors.keys()) if self._tensors is not None else list(self._files)

    def __contains__(self, key: str) -> bool:
        return key in (self._tensors if self._tensors is not None else self._files)

    def shape(self, key: str) -> tuple[int, ...]:
        """One tensor's shape, without reading its data from disk."""
        if self._tensors is not None:
            return tuple(self._tensors[key].shape)
        with _open_checked(self._files[key]) as handle:
            return tuple(handle.get_slice(key).get_shape())

    def get(self, key: str) -> torch.Tensor:
        """One tensor by name (from disk only now, so a large checkpoint is never read whole)."""
        if self._tensors is not None:
            return self._tensors[key]
        with _open_checked(self._files[key]) as handle:
            return handle.get_tensor(key)

    def copy_rows_into(self, key: str, first: int, target: torch.Tensor) -> None:
        """target <- rows [first, first + len(target)) of one tensor in target's dtype (a rank's part of a table):
        read from disk with pread in chunks, so neither the whole tensor nor a second copy of the rows is held."""
        n = target.shape[0]
        if self._tensors is not None:
            target.copy_(self._tensors[key][first : first + n])
            return
        from plelab.util.safetensors import READ_CHUNK, read_header, read_rows

        info = read_header(self._files[key])[key]
        step = max(1, READ_CHUNK // max(1, info.row_bytes))
        for a in range(0, n, step):
            b = min(n, a + step)
            target[a:b].copy_(read_rows(info, first + a, first + b))


@contextlib.contextmanager
def _open_checked(path: Path) -> Iterator[Any]:
    """safe_open(path), every failure to read it (a damaged header, a truncated file) one HFInteropError line."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            yield handle
    except (SafetensorError, OSError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise HFInteropError(f"{path} is not a readable safetensors file ({why})") from None


def _text_config_dict(config: Any) -> dict[str, Any] | None:
    """The text part of an HF config (object or dict) as a plain dict, or None."""
    if config is None:
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        return None
    if isinstance(config.get("text_config"), Mapping):
        return dict(config["text_config"])
    return dict(config)


def _find_prefix(source: _TensorSource, suffix: str, what: str) -> str:
    """The single prefix in front of `suffix` among the source's keys."""
    prefixes = sorted({k[: -len(suffix)] for k in source.keys() if k.endswith(suffix)})
    prefixes = [p for p in prefixes if p == "" or p.endswith(".")]
    if not prefixes:
        sample = ", ".join(sorted(source.keys())[:5])
        raise HFInteropError(
            f"no '{suffix}' in the {source.description}, so it holds no {what} (first keys: {sample})"
        )
    if len(prefixes) > 1:
        raise HFInteropError(f"several {what} found (prefixes {prefixes}); pass prefix= to choose one")
    return prefixes[0]


def _normalise_prefix(prefix: str) -> str:
    return prefix if prefix == "" or prefix.endswith(".") else prefix + "."


def _check_hf_config(cfg: ModelConfig, hf: dict[str, Any] | None, checks: list[tuple[str, Any, str]]) -> None:
    """Raise when an HF config field that changes the numerics differs from ours."""
    if hf is None:
        return
    problems = []
    for key, ours, fix in checks:
        if key not in hf or hf[key] is None:
            continue
        theirs = hf[key]
        same = math.isclose(theirs, ours, rel_tol=1e-12) if isinstance(ours, float) else theirs == ours
        if not same:
            problems.append(f"HF {key}={theirs!r} but ours is {ours!r} ({fix})")
    if problems:
        raise HFInteropError("HF config does not match the plelab model: " + "; ".join(problems))


def _copy_checked(plan: list[tuple[nn.Parameter, torch.Tensor, str, str]], hints: dict[str, str]) -> None:
    """Validate every (param, tensor) shape first, then copy all, so a failed load leaves the model untouched."""
    errors = []
    for param, tensor, ours, hf in plan:
        if tuple(tensor.shape) != tuple(param.shape):
            hint = hints.get(ours.split(".")[-2], "")
            message = f"{hf} has shape {tuple(tensor.shape)} but {ours} needs {tuple(param.shape)}"
            errors.append(message + (f" ({hint})" if hint else ""))
    if errors:
        raise HFInteropError("shape mismatch loading HF weights: " + "; ".join(errors))
    with torch.no_grad():
        for param, tensor, _, _ in plan:
            param.copy_(tensor.to(device=param.device, dtype=param.dtype))


def _get(source: _TensorSource, key: str, missing: list[str]) -> torch.Tensor | None:
    if key not in source:
        missing.append(key)
        return None
    return source.get(key)


def _raise_missing(missing: list[str], source: _TensorSource, prefix: str) -> None:
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise HFInteropError(f"the {source.description} lacks {shown} (looked under prefix {prefix!r})")


# ---------------------------------------------------------------------------------------------------------------
# Gemma PLE


def _require_gemma_form(cfg: ModelConfig) -> None:
    p = cfg.ple
    if p.dim == 0:
        raise HFInteropError("the plelab model has no PLE (ple.dim=0); build it with the HF model's ple.dim")
    if p.gate != "input" or not p.context or not p.output_norm:
        raise HFInteropError(
            "HF Gemma PLE weights need the Gemma form: ple.gate='input', ple.context=true, ple.output_norm=true "
            f"(got gate={p.gate!r}, context={p.context}, output_norm={p.output_norm})"
        )


def load_hf_ple_weights(
    model: LanguageModel,
    source: nn.Module | Mapping[str, torch.Tensor] | str | Path,
    prefix: str | None = None,
    include_embedding: bool = False,
    hf_config: Any = None,
) -> dict[str, str]:
    """Copy HF Gemma 3n / Gemma 4 PLE tensors into `model`; returns {our name: HF name} of what was loaded.

    `source` is an HF model (Gemma3nTextModel, Gemma4ForConditionalGeneration, ...), an HF-style state dict,
    or a local .safetensors file / directory of shards (only the PLE tensors are read). `prefix` is the part in
    front of the text-model names (found automatically). With PLE on a subset of layers, each of our slots
    takes the HF columns of its layer. Everything is validated before anything is copied.
    """
    cfg = model.config
    _require_gemma_form(cfg)
    src = _TensorSource(source, hf_config)
    prefix = _normalise_prefix(prefix) if prefix is not None else _find_prefix(
        src, "embed_tokens_per_layer.weight", "Gemma per-layer-embedding table"
    )
    L, dP, H, Vp = cfg.num_layers, cfg.ple.dim, cfg.hidden_size, cfg.ple_vocab_size
    _check_hf_config(cfg, src.config, [
        ("hidden_size_per_layer_input", dP, "set ple.dim"),
        ("vocab_size_per_layer_input", Vp, "set ple.vocab_size"),
        ("num_hidden_layers", L, "set num_layers"),
        ("hidden_size", H, "set hidden_size"),
        ("rms_norm_eps", cfg.norm_eps, "set norm_eps"),
        ("hidden_activation", "gelu_pytorch_tanh", "plelab's PLE gate is GELU-tanh"),
    ])
    params = dict(model.named_parameters())
    missing: list[str] = []
    plan: list[tuple[nn.Parameter, torch.Tensor, str, str]] = []
    hints = {
        "embed_tokens_per_layer": f"rows = ple.vocab_size, columns = num_layers * ple.dim = {L} x {dP}",
        "per_layer_model_projection": f"rows = num_layers * ple.dim = {L} x {dP}, columns = hidden_size",
        "per_layer_projection_norm": "its length is the HF ple.dim (hidden_size_per_layer_input)",
        "per_layer_input_gate": "(ple.dim, hidden_size)",
        "per_layer_projection": "(hidden_size, ple.dim)",
        "post_per_layer_input_norm": "its length is hidden_size",
        "embed_tokens": "(vocab_size, hidden_size)",
    }
    rows = gemma_ple_mapping(include_embedding=include_embedding)
    model_rows = [r for r in rows if "{i}" not in r.ours]
    layer_rows = [r for r in rows if "{i}" in r.ours]
    slots = cfg.ple_layers
    for r in model_rows:
        t = _get(src, prefix + r.hf, missing)
        if t is None:
            continue
        if slots != list(range(L)) and r.hf in ("embed_tokens_per_layer.weight", "per_layer_model_projection.weight"):
            t = _select_layer_blocks(t, slots, L, dP, r.hf, axis=1 if r.hf.startswith("embed") else 0)
        plan.append((params[r.ours], t, r.ours, prefix + r.hf))
    for i in slots:
        for r in layer_rows:
            t = _get(src, prefix + r.hf.format(i=i), missing)
            if t is not None:
                plan.append((params[r.ours.format(i=i)], t, r.ours.format(i=i), prefix + r.hf.format(i=i)))
    _raise_missing(missing, src, prefix)
    _copy_checked(plan, hints)
    return {ours: hf for _, _, ours, hf in plan}


def _select_layer_blocks(t: torch.Tensor, layers: list[int], L: int, dP: int, name: str, axis: int) -> torch.Tensor:
    """Keep the dP-wide blocks of `layers` along `axis` of a packed (.., L*dP, ..) tensor."""
    if t.shape[axis] != L * dP:
        raise HFInteropError(f"{name} has {t.shape[axis]} packed entries, expected num_layers * ple.dim = {L * dP}")
    idx = torch.cat([torch.arange(i * dP, (i + 1) * dP) for i in layers])
    return t.index_select(axis, idx.to(t.device))


def hf_ple_state_dict(
    model: LanguageModel, prefix: str = "", include_embedding: bool = False
) -> dict[str, torch.Tensor]:
    """Our PLE weights under HF Gemma names (for `hf_model.load_state_dict(..., strict=False)`)."""
    cfg = model.config
    _require_gemma_form(cfg)
    if cfg.ple_layers != list(range(cfg.num_layers)):
        raise HFInteropError("HF Gemma puts PLE on every layer; this model has ple.layers set to a subset")
    params = dict(model.named_parameters())
    return {prefix + r.hf: params[r.ours].detach() for r in gemma_ple_mapping(cfg.num_layers, include_embedding)}


def ple_config_from_hf(hf_config: Any) -> dict[str, Any]:
    """ModelConfig overrides (a dict for `load_model_config`) reproducing an HF Gemma config's PLE shape."""
    c = _text_config_dict(hf_config)
    if not c or not c.get("hidden_size_per_layer_input"):
        raise HFInteropError("the HF config has no per-layer embeddings (hidden_size_per_layer_input is 0 or absent)")
    return {
        "vocab_size": c["vocab_size"], "hidden_size": c["hidden_size"], "num_layers": c["num_hidden_layers"],
        "norm_eps": c["rms_norm_eps"], "embed_scale": True, "tie_embeddings": bool(c.get("tie_word_embeddings", True)),
        "ple": {
            "dim": c["hidden_size_per_layer_input"], "vocab_size": c["vocab_size_per_layer_input"],
            "context": True, "gate": "input", "output_norm": True,
        },
    }


# ---------------------------------------------------------------------------------------------------------------
# Llama core


def _require_llama_core(cfg: ModelConfig) -> None:
    if cfg.ffn.kind != "swiglu":
        raise HFInteropError(f"Llama weights need ffn.kind='swiglu', the model has {cfg.ffn.kind!r}")
    if cfg.embed_scale:
        raise HFInteropError("Llama does not scale its embedding; build with embed_scale=false")


def hf_llama_config(cfg: ModelConfig, **overrides: Any) -> Any:
    """A transformers LlamaConfig with the dimensions and numerics of our (dP = 0 part of the) model."""
    _require_llama_core(cfg)
    try:
        from transformers import LlamaConfig
    except ImportError as e:
        raise HFInteropError("transformers is not installed (pip install 'plelab[hf]')") from e
    kwargs = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_size, max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu", attention_bias=False, mlp_bias=False,
    )
    kwargs.update(overrides)
    try:
        return LlamaConfig(**kwargs)
    except (ValueError, TypeError) as e:
        raise HFInteropError(f"transformers rejects this model as a Llama config: {e}") from e


def load_hf_llama_weights(
    model: LanguageModel,
    source: nn.Module | Mapping[str, torch.Tensor] | str | Path,
    prefix: str | None = None,
    hf_config: Any = None,
) -> dict[str, str]:
    """Copy HF Llama core weights (embedding, attention, SwiGLU, norms, head) into `model`; PLE is left as is."""
    cfg = model.config
    _require_llama_core(cfg)
    src = _TensorSource(source, hf_config)
    prefix = _normalise_prefix(prefix) if prefix is not None else _find_prefix(
        src, "layers.0.self_attn.q_proj.weight", "Llama-style decoder"
    )
    hf = src.config
    if hf is not None:
        rope = hf.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise HFInteropError(f"rope_type {rope.get('rope_type')!r} is not plain RoPE; plelab has no rope scaling")
        hf = dict(hf, rope_theta=rope.get("rope_theta", hf.get("rope_theta")))
    _check_hf_config(cfg, hf, [
        ("num_hidden_layers", cfg.num_layers, "set num_layers"),
        ("num_attention_heads", cfg.num_heads, "set num_heads"),
        ("num_key_value_heads", cfg.kv_heads, "set num_kv_heads"),
        ("head_dim", cfg.head_size, "set head_dim"),
        ("rms_norm_eps", cfg.norm_eps, "set norm_eps"),
        ("rope_theta", float(cfg.rope_theta), "set rope_theta"),
        ("hidden_act", "silu", "plelab's FFN is SwiGLU"),
        ("attention_bias", False, "plelab's projections have no bias"),
        ("mlp_bias", False, "plelab's projections have no bias"),
    ])
    params = dict(model.named_parameters())
    missing: list[str] = []
    plan: list[tuple[nn.Parameter, torch.Tensor, str, str]] = []
    for r in llama_mapping(cfg.num_layers):
        t = _get(src, prefix + r.hf, missing)
        if t is not None:
            plan.append((params[r.ours], t, r.ours, prefix + r.hf))
    head_keys = [k for k in src.keys() if k.endswith("lm_head.weight")]
    embed = src.get(prefix + "embed_tokens.weight") if prefix + "embed_tokens.weight" in src else None
    if cfg.tie_embeddings:
        if head_keys and embed is not None:
            head = src.get(head_keys[0])
            if head.shape != embed.shape or not torch.equal(head, embed):
                raise HFInteropError("the HF lm_head is not tied to its embedding; build with tie_embeddings=false")
    else:
        # A tied HF checkpoint may store only the embedding; an untied plelab model then starts from a copy.
        head = src.get(head_keys[0]) if head_keys else embed
        if head is not None:
            head_name = head_keys[0] if head_keys else prefix + "embed_tokens.weight"
            plan.append((params["lm_head.weight"], head, "lm_head.weight", head_name))
    _raise_missing(missing, src, prefix)
    hints = {"embed_tokens": "(vocab_size, hidden_size)", "lm_head": "(vocab_size, hidden_size)"}
    _copy_checked(plan, hints)
    return {ours: hf for _, _, ours, hf in plan}


# ---------------------------------------------------------------------------------------------------------------
# Gemma 4: the whole text model (arch = "gemma4")

GEMMA4_TEXT_TYPES = ("gemma4_text", "gemma4")


def gemma4_hf_name(ours: str) -> str:
    """The HF Gemma4TextModel name of one of our `arch = "gemma4"` state-dict entries (`lm_head` is top level)."""
    if ours.startswith("per_layer_inputs."):
        ours = ours[len("per_layer_inputs."):]
    return ours.replace(".ple.", ".")


def gemma4_config_from_hf(hf_config: Any) -> ModelConfig:
    """The plelab ModelConfig (arch = "gemma4") of an HF Gemma 4 text config (object, dict or config.json dict).

    Raises HFInteropError, in one line, for a config that is not Gemma 4 or uses what plelab does not build
    (MoE blocks, bidirectional attention, attention biases, RoPE scaling, another activation, per-layer
    overrides other than the full-attention layers' head width and key/value heads).
    """
    from plelab.util.dataclass_config import ConfigError, from_dict

    c = _text_config_dict(hf_config)
    if not c or c.get("model_type") not in GEMMA4_TEXT_TYPES:
        found = (c or {}).get("model_type")
        raise HFInteropError(f"not a Gemma 4 config (model_type={found!r}, expected gemma4 / gemma4_text)")
    unsupported = [
        ("enable_moe_block", "MoE blocks"), ("use_bidirectional_attention", "bidirectional attention"),
        ("attention_bias", "attention biases"),
    ]
    for key, what in unsupported:
        if c.get(key):
            raise HFInteropError(f"this Gemma 4 config uses {what} ({key}={c[key]!r}); plelab does not build them")
    if c.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise HFInteropError(f"hidden_activation={c['hidden_activation']!r}; plelab's Gemma 4 FFN is GELU-tanh")
    L = c["num_hidden_layers"]
    layer_types = c.get("layer_types") or ModelConfig(arch="gemma4", num_layers=L).layer_types
    full_head_dim, full_kv = _gemma4_full_layer_overrides(c, layer_types)
    rope = c.get("rope_parameters") or {}
    sliding_rope = _gemma4_rope(rope.get("sliding_attention", {"rope_theta": 10_000.0}), "sliding_attention")
    full_rope = _gemma4_rope(
        rope.get("full_attention", {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}),
        "full_attention",
    )
    dP = c.get("hidden_size_per_layer_input") or 0
    model = {
        "arch": "gemma4", "vocab_size": c["vocab_size"], "hidden_size": c["hidden_size"], "num_layers": L,
        "num_heads": c["num_attention_heads"], "num_kv_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
        "max_seq_len": c.get("max_position_embeddings", 131_072), "rope_theta": sliding_rope[0],
        "norm_eps": c["rms_norm_eps"], "tie_embeddings": bool(c.get("tie_word_embeddings", True)),
        "embed_scale": True, "ffn": {"kind": "swiglu", "intermediate_size": c["intermediate_size"]},
        "ple": {"dim": dP, "vocab_size": c.get("vocab_size_per_layer_input") if dP else None},
        "gemma4": {
            "layer_types": list(layer_types), "sliding_window": c.get("sliding_window", 512),
            "full_head_dim": full_head_dim, "full_kv_heads": full_kv,
            "full_rope_theta": full_rope[0], "full_rotary_fraction": full_rope[1],
            "attention_k_eq_v": bool(c.get("attention_k_eq_v", False)),
            "num_kv_shared_layers": c.get("num_kv_shared_layers", 0),
            "double_wide_mlp": bool(c.get("use_double_wide_mlp", False)),
            "final_logit_softcap": c.get("final_logit_softcapping"),
        },
    }
    try:
        return from_dict(ModelConfig, model)
    except (ConfigError, TypeError, ValueError) as e:
        raise HFInteropError(f"this Gemma 4 config has no plelab equivalent: {e}") from e


def _gemma4_rope(params: Mapping[str, Any], kind: str) -> tuple[float, float]:
    """(theta, rotated fraction) of one attention kind's HF rope_parameters."""
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "proportional") or params.get("factor", 1.0) != 1.0:
        raise HFInteropError(f"{kind} uses rope_type={rope_type!r} factor={params.get('factor', 1.0)}; "
                             "plelab builds plain and proportional RoPE without scaling")
    fraction = params.get("partial_rotary_factor", 1.0) if rope_type == "proportional" else 1.0
    return float(params.get("rope_theta", 10_000.0)), float(fraction)


def _gemma4_full_layer_overrides(c: Mapping[str, Any], layer_types: list[str]) -> tuple[int | None, int | None]:
    """(head width, kv heads) of the full-attention layers, from per_layer_config or the global_* fields."""
    per_layer = c.get("per_layer_config")
    if per_layer is None:
        # What Gemma4TextConfig does when the file predates per_layer_config.
        kv = c.get("num_global_key_value_heads") if c.get("attention_k_eq_v") else None
        return c.get("global_head_dim", 512), kv
    overrides = {int(k): dict(v) for k, v in per_layer.items()}
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    # An explicitly serialised config (serialize_explicit_per_layer_config) lists every layer; the sliding ones
    # then repeat the global values, which is no override.
    glob = {"head_dim": c.get("head_dim"), "num_key_value_heads": c.get("num_key_value_heads")}
    overrides = {i: o for i, o in overrides.items() if i in full or any(o.get(k, glob[k]) != glob[k] for k in o)}
    wrong = sorted(set(overrides) - set(full)) + [i for i in full if overrides.get(i) != overrides.get(full[0])]
    extra = {k for v in overrides.values() for k in v} - {"head_dim", "num_key_value_heads"}
    if wrong or extra:
        raise HFInteropError(
            "per_layer_config must give every full-attention layer the same head_dim / num_key_value_heads and "
            f"nothing else (layers {wrong}, other fields {sorted(extra)})"
        )
    first = overrides.get(full[0], {}) if full else {}
    return first.get("head_dim"), first.get("num_key_value_heads")


def full_attention_overrides(cfg: ModelConfig) -> dict[int, dict[str, int]]:
    """{layer: {"head_dim", "num_key_value_heads"}} of every full-attention layer (HF `per_layer_config`)."""
    out = {}
    for i, kind in enumerate(cfg.layer_types):
        if kind == "full_attention":
            kv, head_dim = cfg.attention_shape(i)
            out[i] = {"head_dim": head_dim, "num_key_value_heads": kv}
    return out


def hf_gemma4_config(cfg: ModelConfig, **overrides: Any) -> Any:
    """A transformers Gemma4TextConfig computing what our `arch = "gemma4"` model computes."""
    if cfg.arch != "gemma4":
        raise HFInteropError(f"only arch=gemma4 models export as Gemma 4 (this one is arch={cfg.arch!r})")
    if cfg.ple.dim:
        _require_gemma_form(cfg)
        if cfg.ple_layers != list(range(cfg.num_layers)):
            raise HFInteropError("HF Gemma 4 puts PLE on every layer; this model has ple.layers set to a subset")
    try:
        from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
    except ImportError as e:
        raise HFInteropError("transformers with Gemma 4 is not installed (pip install 'plelab[hf]')") from e
    g = cfg.gemma4
    full_rope = {"rope_type": "proportional", "partial_rotary_factor": g.full_rotary_fraction,
                 "rope_theta": g.full_rope_theta}
    kwargs = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_size, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                         "full_attention": full_rope},
        sliding_window=g.sliding_window, layer_types=cfg.layer_types, final_logit_softcapping=g.final_logit_softcap,
        hidden_size_per_layer_input=cfg.ple.dim, vocab_size_per_layer_input=cfg.ple_vocab_size,
        attention_k_eq_v=g.attention_k_eq_v, num_kv_shared_layers=g.num_kv_shared_layers,
        use_double_wide_mlp=g.double_wide_mlp, attention_bias=False, enable_moe_block=False,
        per_layer_config=full_attention_overrides(cfg),
    )
    kwargs.update(overrides)
    try:
        return Gemma4TextConfig(**kwargs)
    except (ValueError, TypeError) as e:
        raise HFInteropError(f"transformers rejects this model as a Gemma 4 config: {e}") from e


def hf_gemma4_state_dict(model: LanguageModel) -> dict[str, torch.Tensor]:
    """Our weights (and layer scalars) under Gemma4ForCausalLM names: `model.` + text-model name, `lm_head.weight`."""
    hf_gemma4_config(model.config)  # refuses what Gemma 4 cannot express
    out = {}
    for name, tensor in model.state_dict().items():
        out[name if name == "lm_head.weight" else "model." + gemma4_hf_name(name)] = tensor.detach()
    return out


def load_hf_gemma4_weights(
    model: LanguageModel,
    source: nn.Module | Mapping[str, torch.Tensor] | str | Path,
    prefix: str | None = None,
) -> dict[str, str]:
    """Copy a whole HF Gemma 4 text model into our `arch = "gemma4"` model; returns {our name: HF name}.

    Every one of our weights must be found with its shape, and every text-model tensor of the source must have
    a place here; all names and shapes are checked (from file headers) before anything is read or copied, then
    tensors are read and copied one at a time, so loading never holds a second copy of the model. A PLE table
    holding only some rows (one rank's part, `plelab.model.ple.table_rows`) is checked against the whole table's
    shape and only its rows are read. Vision / audio towers of a multimodal checkpoint are ignored. A model on
    the meta device is only checked.
    """
    cfg = model.config
    if cfg.arch != "gemma4":
        raise HFInteropError(f"Gemma 4 weights need an arch=gemma4 model (this one is arch={cfg.arch!r})")
    src = _TensorSource(source)
    prefix = _normalise_prefix(prefix) if prefix is not None else _find_prefix(
        src, "embed_tokens.weight", "Gemma 4 text model"
    )
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    # A PLE table split across processes holds rows [first, first + held) of `total`: read only those.
    parts: dict[str, tuple[int, int]] = {}
    if model.per_layer_inputs is not None:
        from plelab.model.ple import table_rows

        first, held, total = table_rows(model.per_layer_inputs.embed_tokens_per_layer)
        if held != total:
            parts["per_layer_inputs.embed_tokens_per_layer.weight"] = (first, total)

    def whole_shape(ours: str) -> tuple[int, ...]:
        shape = tuple(targets[ours].shape)
        return (parts[ours][1], *shape[1:]) if ours in parts else shape

    plan = {ours: prefix + gemma4_hf_name(ours) for ours in model.state_dict() if ours != "lm_head.weight"}
    head_key = next((k for k in src.keys() if k.endswith("lm_head.weight")), None)
    if not cfg.tie_embeddings:
        plan["lm_head.weight"] = head_key or "lm_head.weight"
    missing = [hf for hf in plan.values() if hf not in src]
    _raise_missing(missing, src, prefix)
    unknown = sorted(k for k in src.keys() if k.startswith(prefix) and k not in set(plan.values()) and k != head_key)
    if unknown:
        raise HFInteropError(f"the {src.description} has text-model tensors this config does not build: "
                             f"{', '.join(unknown[:4])}{' ...' if len(unknown) > 4 else ''} (config/weights mismatch)")
    wrong = [f"{hf} is {src.shape(hf)}, {ours} needs {whole_shape(ours)}"
             for ours, hf in plan.items() if src.shape(hf) != whole_shape(ours)]
    if wrong:
        raise HFInteropError(f"shape mismatch loading HF weights ({len(wrong)}): " + "; ".join(wrong[:3]))
    if cfg.tie_embeddings and head_key is not None:
        if not torch.equal(src.get(head_key), src.get(prefix + "embed_tokens.weight")):
            raise HFInteropError("the HF lm_head is not tied to its embedding; build with tie_embeddings=false")
    if targets["embed_tokens.weight"].device.type != "meta":
        with torch.no_grad():
            for ours, hf in plan.items():
                target = targets[ours]
                if ours in parts:
                    src.copy_rows_into(hf, parts[ours][0], target)
                else:
                    target.copy_(src.get(hf).to(device=target.device, dtype=target.dtype))
    return plan


def gemma4_folder_config(path: str | Path, like: ModelConfig | None = None) -> ModelConfig:
    """The ModelConfig of a local HF Gemma 4 folder, its weights checked (names, shapes, shards) but not read.

    `like` contributes the settings that are not architecture (kernels). Every problem is one HFInteropError line.
    """
    import dataclasses

    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise HFInteropError(f"{folder} is not a Hugging Face model folder (no config.json)")
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFInteropError(f"{config_file} is not valid JSON: {e}") from e
    cfg = gemma4_config_from_hf(raw)
    if like is not None:
        cfg = dataclasses.replace(cfg, kernels=like.kernels)
    from plelab.model.transformer import LanguageModel

    with torch.device("meta"):
        skeleton = LanguageModel(cfg)
    load_hf_gemma4_weights(skeleton, folder)
    return cfg


register_weight_source("hf", WeightSource(gemma4_folder_config, load_hf_gemma4_weights))
