"""Write a Gemma 4 model (a plelab arch = "gemma4" run, or a Hugging Face Gemma 4 folder) as a GGUF file for llama.cpp.

The file is what llama.cpp's own convert_hf_to_gguf.py writes for the same model (tests/hf/test_llama_cpp.py
compares the two key by key and tensor by tensor), without going through a Hugging Face folder:

    metadata   general.*, gemma4.* (block count, widths, per-layer kv heads, sliding pattern, RoPE bases, head
               widths of the sliding and the full layers, PLE width, soft-cap), tokenizer.ggml.*
    tensors    llama.cpp's names (gguf's TensorNameMap for MODEL_ARCH.GEMMA4): token_embd, per_layer_token_embd,
               per_layer_model_proj, per_layer_proj_norm, blk.N.{attn_q, attn_k, attn_v, attn_output, ffn_gate,
               ffn_up, ffn_down, inp_gate, proj, the norms, layer_output_scale}, output_norm, output (untied), and
               rope_freqs: the full layers' proportional RoPE as frequency factors (1e30 = not rotated)

Types: every 1-D tensor (norms, layer scalars, rope_freqs) stays f32 as in the converter; each matrix gets
`default` unless an override names its group (plelab.hf.tensor_groups) or matches its GGUF name. A type whose
block does not divide a matrix's row length is refused before anything is written. An HF checkpoint is read
and written a chunk of rows at a time (bounded memory, like `diagnose --hf`); the output is written to a
temp file and renamed into place.

Tokenizers: a Gemma-style tokenizer.json becomes llama.cpp's "gemma4" tokenizer (what the converter does via
gguf's LlamaHfVocab); a plelab byte-level BPE becomes its "gpt2" tokenizer with the "llama-bpe" pre-tokenizer
(plelab's split regex is Llama 3's); anything else is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plelab.errors import PlelabError
from plelab.hf.gguf_types import GGUFType, check_fits, fitting_type, gguf_type, quantize
from plelab.hf.tensor_groups import GROUPS, group_of

ARCH = "gemma4"
CHUNK_BYTES = 8 << 20
"""float32 bytes of a source tensor read, quantized and written at a time."""
# Gemma 4's chat markers that the converter types USER_DEFINED so they are always rendered.
_VISIBLE = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
            '<|"|>'}
_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
               "q5_0": "MOSTLY_Q5_0", "q5_1": "MOSTLY_Q5_1", "q4_0": "MOSTLY_Q4_0", "q4_1": "MOSTLY_Q4_1",
               "q6_k": "MOSTLY_Q6_K", "q5_k": "MOSTLY_Q5_K_S", "q4_k": "MOSTLY_Q4_K_S", "q3_k": "MOSTLY_Q3_K_S",
               "q2_k": "MOSTLY_Q2_K", "iq4_nl": "MOSTLY_IQ4_NL", "iq4_xs": "MOSTLY_IQ4_XS"}


class GGUFExportError(PlelabError):
    """A model, tokenizer or type choice that cannot be written as a Gemma 4 GGUF."""


Rows = Callable[[int, int], np.ndarray]
"""rows(a, b): float32 rows a..b-1 of a tensor (along its first dimension)."""


@dataclass
class SourceTensor:
    """One text-model tensor: its HF name (relative to the text model, or 'lm_head.weight'), shape, reader."""

    name: str
    shape: tuple[int, ...]
    rows: Rows


@dataclass
class Gemma4Source:
    """What a GGUF is made from: the model's plelab config, its tensors, its tokenizer.json, a name."""

    config: Any  # plelab ModelConfig, arch = "gemma4"
    tensors: list[SourceTensor]
    tokenizer_json: str
    name: str
    description: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    """An HF folder (its tokenizer_config.json names the special tokens), or None for a run."""


def run_source(run: str | Path) -> Gemma4Source:
    """A plelab arch = "gemma4" run (its newest intact checkpoint) as a GGUF source; the model is in memory."""
    from plelab.hf.interop import hf_gemma4_state_dict
    from plelab.inference.load import checkpoint_tokenizer, load_model
    from plelab.runs.checkpoint import reading_checkpoint

    with reading_checkpoint(run) as ckpt:  # a run still training cannot prune it while it is read
        model, _ = load_model(ckpt)
        cfg = model.config
        if cfg.arch != "gemma4":
            raise GGUFExportError(f"{run} is an arch={cfg.arch!r} model; llama.cpp's Gemma 4 graph needs a model "
                                  "trained with model.arch=gemma4 (the .ple runtimes run the llama-style one: plelab "
                                  "export)")
        tok = checkpoint_tokenizer(ckpt, cfg.vocab_size)
    tensors = []
    for name, value in hf_gemma4_state_dict(model).items():
        t = value.detach().float().cpu()
        t = t.reshape(t.shape[0], -1) if t.ndim > 1 else t.reshape(1, -1)
        tensors.append(SourceTensor(name.removeprefix("model."), tuple(value.shape),
                                    lambda a, b, t=t, one=value.ndim <= 1: (t if one else t[a:b]).numpy()))
    return Gemma4Source(cfg, tensors, tok.to_json(), Path(run).resolve().name,
                        {"run": str(run), "checkpoint": str(model.checkpoint_dir)})


def hf_source(path: str | Path) -> Gemma4Source:
    """A Hugging Face Gemma 4 folder as a GGUF source; tensors are read from the shards a chunk of rows at a time."""
    from plelab.hf.checkpoint import HFCheckpoint
    from plelab.hf.interop import gemma4_config_from_hf
    from plelab.util.safetensors import read_rows, read_tensor

    ckpt = HFCheckpoint.open(path)
    if ckpt.family != "gemma4":
        raise GGUFExportError(f"{path} is a Gemma 3n checkpoint; export-gguf writes llama.cpp's Gemma 4 "
                              "architecture (for Gemma 3n use llama.cpp's convert_hf_to_gguf.py)")
    if ckpt.tokenizer_json is None:
        raise GGUFExportError(f"{path} has no tokenizer.json; a GGUF carries its tokenizer (copy the model's "
                              "tokenizer.json into the folder)")
    try:
        tok_text = ckpt.tokenizer_json.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GGUFExportError(f"{ckpt.tokenizer_json}: cannot read ({exc})") from None
    cfg = gemma4_config_from_hf(ckpt.text_config)

    def reader(info):
        if not info.shape or len(info.shape) == 1:
            return lambda a, b: read_tensor(info).float().reshape(1, -1).numpy()
        return lambda a, b: read_rows(info, a, b).float().reshape(b - a, -1).numpy()

    tensors = [SourceTensor(name, info.shape, reader(info)) for name, info in ckpt.tensors.items()]
    if ckpt.lm_head is not None and not cfg.tie_embeddings:
        tensors.append(SourceTensor("lm_head.weight", ckpt.lm_head.shape, reader(ckpt.lm_head)))
    return Gemma4Source(cfg, tensors, tok_text, Path(path).resolve().name, {"hf": str(path)}, Path(path))


# ---------------------------------------------------------------------------------------------------------------
# names and types


def gguf_name(hf_name: str, num_layers: int) -> str:
    """llama.cpp's name of an HF Gemma 4 text tensor ('layers.3.mlp.up_proj.weight' -> 'blk.3.ffn_up.weight')."""
    full = hf_name if hf_name == "lm_head.weight" else "model." + hf_name
    if full.endswith("layer_scalar"):  # a buffer without '.weight', named like a weight by the converter
        full += ".weight"
    name = _name_map(num_layers).get_name(full, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise GGUFExportError(f"no llama.cpp Gemma 4 tensor corresponds to {hf_name}")
    return name


_MAPS: dict[int, Any] = {}


def _name_map(num_layers: int):
    import gguf

    if num_layers not in _MAPS:
        _MAPS[num_layers] = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, num_layers)
    return _MAPS[num_layers]


@dataclass(frozen=True)
class TypePlan:
    """The GGUF type of every matrix: a default, then overrides (group name or regex on the GGUF name) in order."""

    default: str = "f16"
    overrides: tuple[tuple[str, str], ...] = ()

    def type_for(self, gguf_tensor: str, hf_tensor: str) -> GGUFType:
        """The type of one matrix (the last matching override wins)."""
        chosen = self.default
        for pattern, type_name in self.overrides:
            if self.matches(pattern, gguf_tensor, hf_tensor):
                chosen = type_name
        return gguf_type(chosen)

    @staticmethod
    def matches(pattern: str, gguf_tensor: str, hf_tensor: str) -> bool:
        """Whether an override's PATTERN (a group name or a regex on the GGUF name) selects this matrix."""
        return (pattern == group_of(hf_tensor) or re.fullmatch(pattern, gguf_tensor) is not None
                or re.fullmatch(pattern, gguf_tensor.removesuffix(".weight")) is not None)

    def check_all_match(self, matrices: list[tuple[str, str]]) -> None:
        """Refuse an override that selects none of `matrices` ((GGUF name, HF name) pairs): a mistyped group
        would otherwise leave its tensors at the default type without a word."""
        for pattern, type_name in self.overrides:
            if not any(self.matches(pattern, g, h) for g, h in matrices):
                raise GGUFExportError(f"--tensor-type {pattern}={type_name} matches no matrix of this model; give a "
                                      f"group ({', '.join(GROUPS)}) or a regular expression on llama.cpp's names "
                                      f"(e.g. {matrices[0][0] if matrices else 'blk.0.ffn_down.weight'})")

    @classmethod
    def parse(cls, default: str, overrides: list[str] | None) -> TypePlan:
        """From `--type` and `--tensor-type PATTERN=TYPE` strings (types checked here)."""
        gguf_type(default)
        pairs = []
        for item in overrides or []:
            pattern, sep, type_name = item.partition("=")
            if not sep or not pattern or not type_name:
                raise GGUFExportError(f"--tensor-type wants PATTERN=TYPE (e.g. ple_table=q8_0), got {item!r}")
            gguf_type(type_name)
            try:
                re.compile(pattern)
            except re.error as exc:
                raise GGUFExportError(f"--tensor-type {pattern!r} is not a regular expression ({exc})") from None
            pairs.append((pattern, type_name.lower()))
        return cls(default.lower(), tuple(pairs))


@dataclass
class PlannedTensor:
    """A tensor as it will be written."""

    gguf: str
    source: SourceTensor | None
    type: GGUFType
    values: np.ndarray | None = None
    """For generated tensors (rope_freqs): the float32 values."""
    wanted: str | None = None
    """The type asked for, when it could not hold the rows and `type` is its fallback (see fitting_type)."""

    @property
    def row(self) -> int:
        """Values per row (ne0)."""
        shape = self.source.shape if self.source is not None else self.values.shape
        return shape[-1] if shape else 1

    @property
    def nrows(self) -> int:
        """Rows (the product of the other dimensions)."""
        shape = self.source.shape if self.source is not None else self.values.shape
        return int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1

    @property
    def nbytes(self) -> int:
        """Stored bytes."""
        return self.nrows * self.type.row_bytes(self.row)

    @property
    def gguf_shape(self) -> tuple[int, ...]:
        """Shape as GGUF lists it (ne0 first)."""
        shape = self.source.shape if self.source is not None else self.values.shape
        return tuple(reversed(shape)) if shape else (1,)


def rope_freqs(cfg) -> np.ndarray:
    """The full layers' frequency factors: 1 for the rotated pairs, 1e30 (no rotation) for the rest."""
    _, head_dim = cfg.attention_shape(cfg.layer_types.index("full_attention"))
    rotated = int(head_dim * cfg.gemma4.full_rotary_fraction / 2)
    return np.array([1.0] * rotated + [1e30] * (head_dim // 2 - rotated), np.float32)


def check_llama_cpp_layout(cfg) -> None:
    """Refuse layer layouts llama.cpp's Gemma 4 cannot run or would compute differently from transformers.

    llama.cpp keeps a sliding-window and a full KV cache and asserts that some layer slides. KV sharing:
    transformers has a shared layer reuse the keys/values of the last earlier non-shared layer of its own attention
    kind; llama.cpp (llama-model.cpp, Gemma 3n / 4) has a shared full layer reuse layer first_shared - 1 and a
    shared sliding layer layer first_shared - 2, the layout of Gemma's own checkpoints.
    """
    if "sliding_attention" not in cfg.layer_types:
        raise GGUFExportError("llama.cpp's Gemma 4 needs at least one sliding-attention layer (it asserts one in "
                              "its KV cache); this model's layer_types are all full_attention")
    n = cfg.gemma4.num_kv_shared_layers
    if not n:
        return
    kinds, first = cfg.layer_types, cfg.num_layers - n
    shared = set(kinds[first:])
    ok = first >= 2 and ("full_attention" not in shared or kinds[first - 1] == "full_attention") and (
        "sliding_attention" not in shared or (kinds[first - 2] == "sliding_attention"
                                              and kinds[first - 1] != "sliding_attention"))
    if not ok:
        raise GGUFExportError(
            f"llama.cpp's Gemma 4 has the {n} KV-shared layer(s) reuse layer {first - 1} (full attention) and "
            f"{first - 2} (sliding), which needs layer_types[{first - 2}:{first}] = sliding, full; this model's are "
            f"{kinds[max(0, first - 2):first]}")


def plan_tensors(source: Gemma4Source, plan: TypePlan, strict: bool = False) -> list[PlannedTensor]:
    """Every tensor with its GGUF name and type. A type that cannot hold a tensor's rows falls back as llama.cpp's
    quantizer does (`fitting_type`, noted in the tensor's `wanted`), or with `strict` is one error."""
    cfg = source.config
    check_llama_cpp_layout(cfg)
    out = []
    if "full_attention" in cfg.layer_types:
        out.append(PlannedTensor("rope_freqs.weight", None, gguf_type("f32"), rope_freqs(cfg)))
    matrices = [(gguf_name(t.name, cfg.num_layers), t.name) for t in source.tensors if len(t.shape) > 1]
    plan.check_all_match(matrices)
    for t in source.tensors:
        name = gguf_name(t.name, cfg.num_layers)
        if len(t.shape) <= 1:
            out.append(PlannedTensor(name, t, gguf_type("f32")))
            continue
        kind = plan.type_for(name, t.name)
        if strict:
            check_fits(kind, name, t.shape)
        used = fitting_type(kind, t.shape[-1])
        out.append(PlannedTensor(name, t, used, wanted=kind.name if used != kind else None))
    return out


# ---------------------------------------------------------------------------------------------------------------
# metadata


def _add_model_keys(w, cfg, name: str, file_type: str) -> None:
    import gguf

    g = cfg.gemma4
    kinds = cfg.layer_types
    swa = [k == "sliding_attention" for k in kinds]
    full = kinds.index("full_attention") if "full_attention" in kinds else None
    full_kv, full_head = cfg.attention_shape(full) if full is not None else (cfg.kv_heads, cfg.head_size)
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.hidden_size)
    F = cfg.ffn.intermediate_size
    if g.double_wide_mlp:
        first_shared = cfg.num_layers - g.num_kv_shared_layers
        w.add_feed_forward_length([F if i < first_shared else 2 * F for i in range(cfg.num_layers)])
    else:
        w.add_feed_forward_length(F)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv([cfg.kv_heads if s else full_kv for s in swa])
    w.add_rope_freq_base(g.full_rope_theta)
    w.add_key_value(gguf.Keys.Rope.FREQ_BASE_SWA.format(arch=ARCH), float(cfg.rope_theta), gguf.GGUFValueType.FLOAT32)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_key_length(full_head)
    w.add_value_length(full_head)
    w.add_file_type(gguf.LlamaFileType[_FILE_TYPES[file_type]])
    if g.final_logit_softcap:
        w.add_final_logit_softcapping(g.final_logit_softcap)
    w.add_sliding_window(g.sliding_window)
    w.add_shared_kv_layers(g.num_kv_shared_layers)
    w.add_embedding_length_per_layer_input(cfg.ple.dim)
    w.add_sliding_window_pattern(swa)
    w.add_key_length_swa(cfg.head_size)
    w.add_value_length_swa(cfg.head_size)
    w.add_rope_dimension_count(full_head)
    w.add_rope_dimension_count_swa(cfg.head_size)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


@dataclass
class Vocab:
    """A tokenizer as GGUF stores it."""

    model: str
    pre: str | None
    tokens: list[str]
    types: list[int]
    merges: list[str]
    special: dict[str, int]
    add_bos: bool


def vocab_from_tokenizer(json_text: str, rows: int, folder: Path | None = None) -> Vocab:
    """The GGUF vocabulary of a tokenizer.json for a model with `rows` embedding rows (padded with <unusedN>).

    Token types follow the converter (gguf's LlamaHfVocab): byte tokens BYTE, transformers' special tokens
    CONTROL, other added tokens USER_DEFINED; `folder` (an HF folder) supplies its tokenizer_config.json.
    """
    from gguf import TokenType

    from plelab.data.tokenizer import Tokenizer, tokenizer_kind

    kind = tokenizer_kind(json_text)
    if kind == "other":
        raise GGUFExportError("the tokenizer is neither Gemma-style nor plelab's byte-level BPE; llama.cpp's Gemma 4 "
                              "tokenizer needs BPE with byte fallback (plelab data tokenizer --kind gemma)")
    tok = Tokenizer.from_json(json_text)
    if tok.vocab_size > rows:
        raise GGUFExportError(f"the tokenizer has {tok.vocab_size} ids but the model only {rows} embedding rows")
    tok = tok.padded_to(rows)
    special_ids = _special_ids(tok, folder)
    d = json.loads(tok.to_json())
    base: dict[str, int] = dict(d["model"]["vocab"])
    added = {a["content"]: a["id"] for a in d.get("added_tokens", []) if a["content"] not in base}
    by_id = {i: t for t, i in (base | added).items()}
    missing = [i for i in range(rows) if i not in by_id]
    if missing:
        raise GGUFExportError(f"the tokenizer has no token for id(s) {missing[:5]}; llama.cpp needs one per row")
    tokens = [by_id[i] for i in range(rows)]
    types = []
    for i, t in enumerate(tokens):
        if t in _VISIBLE:
            types.append(TokenType.USER_DEFINED)
        elif kind == "gemma" and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
            types.append(TokenType.BYTE)
        elif i in special_ids:
            types.append(TokenType.CONTROL)
        elif t in added:
            types.append(TokenType.USER_DEFINED)
        else:
            types.append(TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"].get("merges", [])]
    special = {"bos": tok.eot_id, "eos": tok.eot_id}
    if tok.pad_id is not None:
        special["pad"] = tok.pad_id
    unk = tok.token_to_id("<unk>")
    if unk is not None:
        special["unk"] = unk
    if kind == "gemma":
        return Vocab("gemma4", None, tokens, [int(t) for t in types], merges, special, add_bos=True)
    return Vocab("gpt2", "llama-bpe", tokens, [int(t) for t in types], merges, special, add_bos=True)


def _special_ids(tok, folder: Path | None) -> set[int]:
    """Ids transformers calls special (what the converter types CONTROL: the folder's view, or export-hf's), and
    always the end-of-text, pad and unknown tokens (a folder without tokenizer_config.json names none)."""
    named = {i for i in (tok.eot_id, tok.pad_id, tok.token_to_id("<unk>")) if i is not None}
    try:
        if folder is not None:
            return named | folder_special_ids(folder)
        return named | set(tok.to_hf().all_special_ids)
    except ImportError:
        return named


def folder_special_ids(folder: Path) -> set[int]:
    """The ids transformers calls special in a Hugging Face folder (from its tokenizer files); a folder whose
    tokenizer transformers cannot read (a corrupt tokenizer_config.json, say) is one GGUFExportError."""
    from transformers import AutoTokenizer

    try:
        return set(AutoTokenizer.from_pretrained(folder, local_files_only=True).all_special_ids)
    except Exception as exc:  # json, OSError, ValueError, ...: transformers raises many kinds for a bad file
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise GGUFExportError(f"{folder}: transformers cannot read its tokenizer ({type(exc).__name__}: {why}); check "
                              "tokenizer_config.json and tokenizer.json") from None


def _add_vocab_keys(w, v: Vocab) -> None:
    w.add_tokenizer_model(v.model)
    if v.pre is not None:
        w.add_tokenizer_pre(v.pre)
    w.add_token_list(v.tokens)
    w.add_token_scores([-1000.0] * len(v.tokens))
    w.add_token_types(v.types)
    if v.merges:
        w.add_token_merges(v.merges)
    setters = {"bos": w.add_bos_token_id, "eos": w.add_eos_token_id, "unk": w.add_unk_token_id,
               "pad": w.add_pad_token_id}
    for kind, token_id in v.special.items():
        setters[kind](token_id)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(v.add_bos)


# ---------------------------------------------------------------------------------------------------------------
# writing


@dataclass
class GGUFResult:
    """What was written: path, bytes, tensor count, type counts and the bytes of each group."""

    path: Path
    file_bytes: int
    tensors: int
    types: dict[str, int]
    group_bytes: dict[str, int]
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    """Tensors written in another type than asked, because its blocks do not divide their rows."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {"path": str(self.path), "file_bytes": self.file_bytes, "tensors": self.tensors, "types": self.types,
                "group_bytes": self.group_bytes, "fallbacks": self.fallbacks}


def _chunks(t: PlannedTensor) -> Iterator[np.ndarray]:
    if t.source is None:
        yield quantize(t.values.reshape(1, -1), t.type)
        return
    step = max(1, CHUNK_BYTES // (4 * t.row))
    for a in range(0, t.nrows, step):
        b = min(t.nrows, a + step)
        yield quantize(t.source.rows(a, b).reshape(b - a, t.row), t.type)


def write_gguf(source: Gemma4Source, out: str | Path, plan: TypePlan, tensors: list[PlannedTensor] | None = None,
               progress: Callable[[str], None] | None = None) -> GGUFResult:
    """Write `source` as a GGUF at `out` (atomically) with the types of `plan`; returns what was written."""
    import gguf
    from gguf.gguf_writer import WriterState

    from plelab.util.fs import atomic_writer

    cfg = source.config
    if cfg.ple.dim and cfg.ple_vocab_size != cfg.vocab_size:
        raise GGUFExportError(f"ple.vocab_size={cfg.ple_vocab_size} differs from vocab_size={cfg.vocab_size}: "
                              "llama.cpp's Gemma 4 reads one PLE row per token")
    tensors = tensors if tensors is not None else plan_tensors(source, plan)
    vocab = vocab_from_tokenizer(source.tokenizer_json, cfg.vocab_size, source.folder)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(out) as f:
        w = gguf.GGUFWriter(None, ARCH)
        _add_model_keys(w, cfg, source.name, plan.default)
        _add_vocab_keys(w, vocab)
        for t in tensors:
            raw = None if t.type.name in ("f32", "f16") else gguf.GGMLQuantizationType(t.type.ggml)
            dtype = {"f32": np.float32, "f16": np.float16}.get(t.type.name, np.uint8)
            shape = tuple(reversed(t.gguf_shape))  # the writer takes NumPy order and reverses it itself
            if raw is not None:
                shape = (*shape[:-1], t.type.row_bytes(t.row))  # byte shape: the writer turns it into values
            w.add_tensor_info(t.gguf, shape, np.dtype(dtype), t.nbytes, raw_dtype=raw)
        w.fout, w.path, w.state = [f], out, WriterState.EMPTY
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in tensors:
            if progress is not None:
                progress(t.gguf)
            w.write_padding(f, f.tell())
            written = 0
            for chunk in _chunks(t):
                f.write(np.ascontiguousarray(chunk).data)  # not tofile: its OSError on a full disk has no errno
                written += chunk.nbytes
            if written != t.nbytes:
                raise GGUFExportError(f"{t.gguf}: wrote {written} bytes, expected {t.nbytes}")
            w.write_padding(f, written)
        size = f.tell()
    types: dict[str, int] = {}
    groups: dict[str, int] = {}
    for t in tensors:
        types[t.type.name] = types.get(t.type.name, 0) + 1
        g = group_of(t.source.name) if t.source is not None else "other"
        groups[g] = groups.get(g, 0) + t.nbytes
    fallbacks = [{"tensor": t.gguf, "wanted": t.wanted, "used": t.type.name, "row": t.row} for t in tensors if t.wanted]
    return GGUFResult(out, size, len(tensors), types, groups, fallbacks)


def export_gguf(source_path: str | Path, out: str | Path, type_name: str = "f16",
                overrides: list[str] | None = None, hf: bool = False, overwrite: bool = False,
                progress: Callable[[str], None] | None = None, strict: bool = False) -> GGUFResult:
    """`plelab export-gguf`: a run (or, with `hf`, an HF Gemma 4 folder) to a GGUF at `out`; checks come first.
    strict: refuse a type that cannot hold a tensor's rows instead of falling back (see plan_tensors)."""
    from plelab.edge.export import export_inputs
    from plelab.hf.ple_export import hf_export_inputs
    from plelab.util.fs import check_output_path

    plan = TypePlan.parse(type_name, overrides)
    inputs = hf_export_inputs(source_path) if hf else export_inputs(source_path)
    out = check_output_path(out, overwrite=overwrite, inputs=inputs)
    source = hf_source(source_path) if hf else run_source(source_path)
    tensors = plan_tensors(source, plan, strict)
    vocab_from_tokenizer(source.tokenizer_json, source.config.vocab_size, source.folder)  # refused before writing
    return write_gguf(source, out, plan, tensors, progress)
