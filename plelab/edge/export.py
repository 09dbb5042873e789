"""Export a PyTorch PLE model (a checkpoint, or a preset with random weights) to a .ple file.

What is stored how:
    PLE table                    row table `ple`: one record per table row = its L_ple x dP / S values + their
                                 scales; a token table has a row (all L*dP values) per token id, plus the
                                 main-embedding row when `embed_in_record`; an n-gram table a row per hash bucket
                                 (S of them read per position, docs/ngram-ple.md)
    n-gram id map                section `idmap`: the compressed id of every token id, uint32
    main embedding               row table `embed`: one record per id (also the output head when tied);
                                 absent when it is untied and already inside the `ple` records
    matrices (2-D weights)       the chosen encoding, grouped over the flattened matrix
    vectors (norms, gates)       fp32 for an fp32 export, else fp16 (tiny, and quantising them hurts)
    MGLU mask logits             their binarised masks (logit > 0) at 1 bit each
    MoE experts                  the stacked (E, ...) gate/up/down split into one tensor per expert
                                 (`mlp.experts.{e}.gate_proj` ...), so a token reads only its routed experts
    pruned FFN                   exported as the plain SwiGLU of width prune_to (plelab.model.pruning)
The layout depends only on the config and the options, so `layout_for_config` sizes a model (for
`plelab place`) without any weights. A model the runtimes cannot run as the file would describe it (a gate or a
convolution they do not implement) is refused in one line naming the field: never written wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plelab import __version__
from plelab.edge.format import GATE_CODES, ID_MAP, Layout, Part, Table, TensorEntry, write_ple
from plelab.edge.quant import EXPORT_QUANTS, Encoding, ExportQuant, quantize
from plelab.errors import PlelabError
from plelab.model.config import FFNConfig, ModelConfig
from plelab.model.presets import PRESETS, load_model_config
from plelab.model.transformer import LanguageModel
from plelab.util.dataclass_config import to_dict

PLE_TABLE = "per_layer_inputs.embed_tokens_per_layer.weight"
EMBED = "embed_tokens.weight"
ID_MAP_BUFFER = "per_layer_inputs.index.id_map"  # the n-gram index's token-id compression (section `idmap`)
_CHUNK_VALUES = 1 << 22  # values per streamed table chunk (16 MB of float32)
_EXPERT_STACK = re.compile(r"(.*\.mlp\.)(gate_proj|up_proj|down_proj)")  # MoE's (E, ...) stacks: no `.weight`


class ExportError(PlelabError):
    """A model or option combination that cannot be exported."""


@dataclass
class ExportOptions:
    """How to encode and lay out the file."""

    quant: ExportQuant = "int4"
    """Encoding of matrices and tables: fp32, fp16, int8 or int4."""
    group: int = 128
    """Values per fp16 scale for int8 / int4."""
    embed_in_record: bool = False
    """Put each token's main-embedding row inside its PLE record (one read per token; a tied head then
    stores the embedding twice)."""
    align: int = 1
    """PLE record stride is a multiple of this many bytes (1 = packed)."""
    page: int = 0
    """Flash page size: no PLE record straddles a page boundary (0 = no constraint)."""
    scale_search: bool = True
    """Per-group search for the least-squared-error scale (int8 / int4)."""
    encodings: dict[str, Encoding] = dataclasses.field(default_factory=dict)
    """Per-tensor encodings overriding `quant`/`group`: a file tensor name, or the row-table parts "ple" and
    "embed" (a quantization recipe, plelab quant-recipe). Recorded in the file's quant metadata."""

    def __post_init__(self) -> None:
        if self.quant not in EXPORT_QUANTS:
            raise ExportError(f"--quant must be {', '.join(EXPORT_QUANTS[:-1])} or {EXPORT_QUANTS[-1]}, "
                              f"got {self.quant!r}")
        bad = [k for k, e in self.encodings.items() if not isinstance(e, Encoding) or e.dtype not in EXPORT_QUANTS]
        if bad:
            raise ExportError(f"per-tensor encodings must be {', '.join(EXPORT_QUANTS)} Encodings ({', '.join(bad)})")
        for name, low in (("group", 1), ("align", 1), ("page", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ExportError(f"--{name} must be an integer >= {low}, got {value!r}")

    @property
    def matrix_enc(self) -> Encoding:
        """Encoding of matrices and tables."""
        return Encoding(self.quant, self.group if self.quant.startswith("int") else 0)

    @property
    def vector_enc(self) -> Encoding:
        """Encoding of 1-D parameters."""
        return Encoding("fp32" if self.quant == "fp32" else "fp16")


def derived(cfg: ModelConfig) -> dict[str, Any]:
    """Values the runtime needs that the config only implies (so the runtime needs no plelab.model): with an n-gram
    index, its orders, heads per order, rows per head of each order, hash seed and whether ids are compressed."""
    out = {"head_dim": cfg.head_size, "kv_heads": cfg.kv_heads, "ple_layers": cfg.ple_layers,
           "ple_vocab_size": cfg.ple_table_rows if cfg.ple.dim else 0}
    layout = cfg.ple_layout
    if layout is not None and cfg.ple_layers:
        out["ple_ngram"] = {"orders": list(layout.orders), "heads": layout.heads, "rows": list(layout.rows),
                            "seed": layout.seed, "id_map": cfg.ple.ngram.id_map is not None}
    return out


def unsupported(cfg: ModelConfig) -> str | None:
    """Why the .ple runtimes cannot run `cfg` as its file would describe it (one line naming the field), or None."""
    if cfg.arch != "llama":
        return (f"arch={cfg.arch}: the .ple runtimes execute the llama-style block only (for transformers: "
                "plelab export-hf)")
    if not cfg.ple_layers:
        return None
    if cfg.ple.gate not in GATE_CODES:
        return (f"ple.gate={cfg.ple.gate}: the .ple runtimes implement the gates {', '.join(GATE_CODES)} (train "
                "with one of them to export)")
    if cfg.ple.conv_kernel:
        return (f"ple.conv_kernel={cfg.ple.conv_kernel}: the .ple runtimes do not implement the short "
                "convolution (train with ple.conv_kernel=0 to export)")
    return None


def shipped_config(cfg: ModelConfig) -> ModelConfig:
    """The config a .ple file describes: a pruned FFN ships as the plain SwiGLU of width prune_to."""
    if cfg.ffn.kind != "pruned":
        return cfg
    return dataclasses.replace(cfg, ffn=FFNConfig(kind="swiglu", intermediate_size=cfg.ffn.prune_to))


def file_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict as the file stores it: each MoE expert stack (E, ...) split into E per-expert tensors."""
    out = {}
    for name, value in state.items():
        hit = _EXPERT_STACK.fullmatch(name)
        if hit and value.ndim == 3:
            out.update((f"{hit[1]}experts.{e}.{hit[2]}", value[e]) for e in range(value.shape[0]))
        else:
            out[name] = value
    return out


def parameter_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of the file, from a model built on the meta device (no memory)."""
    with torch.device("meta"):
        model = LanguageModel(shipped_config(cfg))
    return {k: tuple(v.shape) for k, v in file_tensors(model.state_dict()).items()}


def ship_model(model: LanguageModel) -> tuple[LanguageModel, dict[str, Any]]:
    """(the model as exported, provenance to record): a pruned model becomes its dense prune_to SwiGLU."""
    cfg = model.config
    if cfg.ffn.kind != "pruned":
        return model, {}
    from plelab.model.pruning import PruningError, export_pruned

    try:
        dense_cfg, state = export_pruned(model, cfg)
    except PruningError as exc:
        raise ExportError(str(exc)) from exc
    with torch.device("meta"):
        dense = LanguageModel(dense_cfg)
    dense.load_state_dict(state, assign=True)
    dense.rope_cos, dense.rope_sin = LanguageModel.rope_buffers(dense_cfg, "cpu")
    origin = {"kind": "pruned", "intermediate_size": cfg.ffn.intermediate_size, "prune_to": cfg.ffn.prune_to,
              "prune_importance": cfg.ffn.prune_importance}
    return dense.eval(), {"ffn_origin": origin}


def layout_for_config(cfg: ModelConfig, opts: ExportOptions, tokenizer: dict[str, Any] | None = None,
                      source: dict[str, Any] | None = None,
                      shapes: dict[str, tuple[int, ...]] | None = None) -> Layout:
    """The file layout (every offset and size) of `cfg` exported with `opts`, without weights.

    `tokenizer` describes an embedded tokenizer section ({"encoding": "zlib", "bytes": n, "sha256": ...});
    `shapes` (parameter name -> shape) saves building a meta model when a real one is at hand.
    """
    cfg = shipped_config(cfg)
    problem = unsupported(cfg)
    if problem:
        raise ExportError(f"cannot export this model: {problem}")
    shapes = dict(shapes) if shapes is not None else parameter_shapes(cfg)
    if cfg.ple_layers:  # from the config: a model from `random_model` holds a small stand-in table
        shapes[PLE_TABLE] = (cfg.ple_table_rows, cfg.ple_row_width)
    H = cfg.hidden_size
    embed_enc = opts.encodings.get("embed", opts.matrix_enc)
    embed_part = Part("embed", embed_enc, H)
    tables = []
    if PLE_TABLE in shapes:
        if opts.embed_in_record and cfg.ple_layout is not None:
            raise ExportError("--embed-in-record puts each token id's embedding row in its PLE record; the rows of "
                              "an n-gram table are hash buckets, not token ids (export without it)")
        if opts.embed_in_record and cfg.ple_vocab_size != cfg.vocab_size:
            raise ExportError(f"--embed-in-record needs ple.vocab_size == vocab_size "
                              f"({cfg.ple_vocab_size} != {cfg.vocab_size})")
        rows, width = shapes[PLE_TABLE]
        parts = [Part("ple", opts.encodings.get("ple", opts.matrix_enc), width)] + (
            [embed_part] if opts.embed_in_record else [])
        tables.append(Table("ple", rows, parts, opts.align, opts.page))
    elif opts.embed_in_record:
        raise ExportError("--embed-in-record needs a model with PLE (ple.dim > 0)")
    in_record = bool(tables) and opts.embed_in_record
    if cfg.tie_embeddings or not in_record:
        tables.append(Table("embed", cfg.vocab_size, [Part("embed", embed_enc, H)]))
    tensors = []
    for name, shape in shapes.items():
        if name in (PLE_TABLE, EMBED, ID_MAP_BUFFER):
            continue
        numel = math.prod(shape)
        if name.endswith("mask_logits"):
            enc = Encoding("u1")
        else:
            enc = opts.vector_enc if len(shape) == 1 else opts.encodings.get(name, opts.matrix_enc)
        tensors.append(TensorEntry(name, shape, enc, numel))
    quant = {"dtype": opts.quant, "group": opts.group, "scale_search": opts.scale_search,
             "embed_in_record": in_record, "align": opts.align, "page": opts.page}
    if opts.encodings:  # only then: files without a recipe keep their exact bytes
        quant["encodings"] = {k: e.to_json() for k, e in sorted(opts.encodings.items())}
    return Layout(to_dict(cfg), derived(cfg), quant, tensors, tables, tokenizer, source or {})


def layout_for_model(model: LanguageModel, opts: ExportOptions, tokenizer: dict[str, Any] | None = None,
                     source: dict[str, Any] | None = None) -> Layout:
    """`layout_for_config` for a model at hand (its parameter shapes, no meta model needed)."""
    shapes = {k: tuple(v.shape) for k, v in file_tensors(model.state_dict()).items()}
    return layout_for_config(model.config, opts, tokenizer, source, shapes)


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


def export_model(
    model: LanguageModel,
    out: str | Path,
    opts: ExportOptions,
    tokenizer_json: str | None = None,
    source: dict[str, Any] | None = None,
    ple_rows: Callable[[int, int], np.ndarray] | None = None,
) -> Layout:
    """Write `model` to `out`; `ple_rows(start, stop)` may supply the PLE table instead of the model."""
    tok_blob, tok = b"", None
    if tokenizer_json:
        tok_blob = zlib.compress(tokenizer_json.encode("utf-8"), 9)
        tok = {"encoding": "zlib", "bytes": len(tok_blob),
               "sha256": hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest()}
    model, origin = ship_model(model)
    layout = layout_for_model(model, opts, tok, {"plelab": __version__, **origin, **(source or {})})
    sections = model_sections(model, layout, opts.scale_search, ple_rows)
    if tok_blob:
        sections["tokenizer"] = [tok_blob]
    return write_ple(out, layout, sections)


def model_sections(model: LanguageModel, layout: Layout, search: bool = True,
                   ple_rows: Callable[[int, int], np.ndarray] | None = None) -> dict[str, Iterator]:
    """Lazily encoded bytes of the `tensors` section and of every row table, for `write_ple`."""
    params = file_tensors(model.state_dict())
    if ple_rows is None and PLE_TABLE in params:
        table = params[PLE_TABLE]
        ple_rows = lambda a, b: _as_numpy(table[a:b])  # noqa: E731
    embed = params[EMBED]

    def source_rows(part: str, a: int, b: int) -> np.ndarray:
        return ple_rows(a, b) if part == "ple" else _as_numpy(embed[a:b])

    def encode_tensor(t: TensorEntry) -> tuple[np.ndarray, np.ndarray]:
        value = params[t.name]
        flat = _as_numpy(value > 0 if t.enc.dtype == "u1" else value).reshape(t.vectors, t.vector)
        return quantize(flat, t.enc, search=search)

    sections: dict[str, Iterator] = {"tensors": layout.tensor_chunks(encode_tensor)}
    if layout.id_map:
        sections[ID_MAP] = iter([params[ID_MAP_BUFFER].cpu().numpy().astype("<u4").tobytes()])
    for tab in layout.tables:
        sections[tab.name] = tab.chunks(table_records(tab, source_rows, search))
    return sections


def table_records(tab: Table, rows: Callable[[str, int, int], np.ndarray], search: bool) -> Iterator[np.ndarray]:
    """Assembled record batches of a table, encoded chunk by chunk (the table is never whole in memory)."""
    step = max(1, _CHUNK_VALUES // sum(p.length for p in tab.parts))
    for a in range(0, tab.rows, step):
        b = min(tab.rows, a + step)
        yield tab.assemble({p.name: quantize(rows(p.name, a, b), p.enc, search) for p in tab.parts})


def random_model(cfg: ModelConfig, seed: int) -> tuple[LanguageModel, Callable[[int, int], np.ndarray] | None]:
    """A randomly initialised model for export, plus a streaming row generator for its PLE table.

    The model is built with a stand-in PLE table of a row or a few (so a 1 GB table is never allocated) and then
    carries the real `cfg`: it is for export only, its own forward pass would be wrong.
    """
    torch.manual_seed(seed)
    model = LanguageModel(_small_table(cfg))
    model.config = cfg
    if not cfg.ple_layers:
        return model, None
    std = cfg.ple.table_init_std if cfg.ple.table_init_std is not None else cfg.init_std

    def rows(a: int, b: int) -> np.ndarray:
        # Seeded by (seed, chunk start): reproducible for the exporter's fixed chunking, no table held.
        rng = np.random.default_rng([seed, a])
        return rng.standard_normal((b - a, cfg.ple_row_width), dtype=np.float32) * np.float32(std)

    return model, rows


def _small_table(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with the smallest PLE table its index allows: one row, or an n-gram head of the smallest prime rows the
    hash accepts (everything else, the id map included, as configured)."""
    if not cfg.ple_layers:
        return cfg
    if cfg.ple_layout is None:
        return dataclasses.replace(cfg, ple=dataclasses.replace(cfg.ple, vocab_size=1))
    from plelab.model.ngram import next_prime, rows_problem

    rows = 2
    while rows_problem(rows, cfg.vocab_size):
        rows = next_prime(rows + 1)
    return dataclasses.replace(cfg, ple=dataclasses.replace(cfg.ple, ngram=dataclasses.replace(cfg.ple.ngram,
                                                                                               rows=[rows])))


def checkpoint_config(path: str | Path) -> ModelConfig:
    """The model config of a checkpoint or run dir (no weights read); a bad config.json is one clear error."""
    from plelab.runs.checkpoint import CheckpointError, read_checkpoint_config
    from plelab.util.dataclass_config import ConfigError, from_dict

    meta = read_checkpoint_config(path)
    try:
        return from_dict(ModelConfig, meta["model"])
    except (ConfigError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: the checkpoint's config.json has no valid model config ({exc})") from exc


def export_inputs(src: str | Path) -> tuple[Path, ...]:
    """Files an export of `src` reads (a config file, or every file of the checkpoint): never its output."""
    path = Path(src)
    if not path.is_dir():
        return (path,) if path.exists() else ()
    from plelab.runs.checkpoint import CheckpointError, resolve_checkpoint

    try:
        ckpt = resolve_checkpoint(path)
    except CheckpointError:
        return (path,)
    return (path, *sorted(p for p in ckpt.iterdir() if p.is_file()))


def checked_tokenizer_text(path: Path) -> str:
    """The text of a tokenizer.json to embed, refused (by name) unless it loads as a tokenizer: a broken one would
    otherwise fail only later, when a runtime reads the file, without saying which file it came from."""
    from plelab.data.tokenizer import Tokenizer, TokenizerError

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ExportError(f"{path} is not UTF-8 text (corrupt?); pass --no-tokenizer to export without it") from exc
    try:
        Tokenizer.load(path)
    except TokenizerError as exc:
        raise ExportError(f"{exc}; fix it or pass --no-tokenizer to export without it") from None
    return text


def export_source(src: str, out: str | Path, opts: ExportOptions, overrides: list[str] | None = None,
                  seed: int = 0, with_tokenizer: bool = True) -> Layout:
    """Export a checkpoint/run dir (trained weights) or a preset/config file (random weights)."""
    path = Path(src)
    if path.is_dir():
        from plelab.inference.load import load_model
        from plelab.runs.checkpoint import resolve_checkpoint

        if overrides:
            raise ExportError("--set only applies to presets and config files, not to a checkpoint")
        model, _ = load_model(path)
        tok = resolve_checkpoint(path) / "tokenizer.json"
        text = checked_tokenizer_text(tok) if with_tokenizer and tok.is_file() else None
        return export_model(model, out, opts, text, {"checkpoint": str(model.checkpoint_dir)})
    cfg = shipped_config(load_model_config(src, overrides))  # random weights: no pruning to replay
    model, rows = random_model(cfg, seed)
    kind = "preset" if src in PRESETS else "config"
    return export_model(model, out, opts, None, {kind: src, "weights": f"random (seed {seed})"}, rows)
