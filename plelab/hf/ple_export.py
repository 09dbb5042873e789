"""A Hugging Face Gemma 3n / Gemma 4 folder's PLE table (and main embedding) as a table-only .ple file.

The real table, streamed a chunk of rows at a time from the safetensors shards; the decoder core is only
described (its shapes, for the planner), since the .ple runtimes execute the Llama-style block alone.
"""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from plelab import __version__
from plelab.edge.export import (
    EMBED,
    PLE_TABLE,
    ExportError,
    ExportOptions,
    checked_tokenizer_text,
    layout_for_config,
    table_records,
)
from plelab.edge.format import Layout, write_ple
from plelab.model.config import ModelConfig
from plelab.model.presets import load_model_config

HF_CORE_NOTE = ("table-only export: the {family} decoder (not the Llama-style core the .ple runtimes execute) is "
                "not in this file; `model` describes its shapes for the planner only, and runtimes must refuse it")


def _hf_stand_in_config(text: dict[str, Any], where: str) -> ModelConfig:
    """A plelab ModelConfig with the checkpoint's shapes (what the layout and the planner read)."""
    from plelab.hf.interop import ple_config_from_hf
    from plelab.util.dataclass_config import ConfigError

    ffn = text.get("intermediate_size") or 4 * text["hidden_size"]
    rope = text.get("rope_theta") or (text.get("rope_parameters") or {}).get("full_attention", {}).get("rope_theta")
    heads = text.get("num_attention_heads") or 1
    try:
        return load_model_config(dict(
            ple_config_from_hf(text), num_heads=heads, num_kv_heads=text.get("num_key_value_heads") or heads,
            head_dim=text.get("head_dim"), max_seq_len=text.get("max_position_embeddings") or 8192,
            rope_theta=float(rope or 10000.0), ffn={"intermediate_size": ffn[0] if isinstance(ffn, list) else ffn},
        ))
    except (ConfigError, ValueError, TypeError) as exc:
        raise ExportError(f"{where}: cannot describe this checkpoint's shapes ({exc})") from None


def hf_layout(path: str | Path, opts: ExportOptions, tokenizer: dict[str, Any] | None = None) -> Layout:
    """The table-only layout of a Gemma 3n / Gemma 4 folder, from its config.json alone (no weights read)."""
    from plelab.hf.checkpoint import read_config, text_config_of

    family, text = text_config_of(read_config(path), path)
    cfg = _hf_stand_in_config(text, str(path))
    shapes = {PLE_TABLE: (cfg.ple_vocab_size, cfg.num_layers * cfg.ple.dim), EMBED: (cfg.vocab_size, cfg.hidden_size)}
    source = {"plelab": __version__, "hf": str(path), "architecture": family, "table_only": True,
              "core": HF_CORE_NOTE.format(family=family)}
    return layout_for_config(cfg, opts, tokenizer, source, shapes)


def export_hf(path: str | Path, out: str | Path, opts: ExportOptions, with_tokenizer: bool = True) -> Layout:
    """Write the PLE table (and the main embedding) of a Gemma folder to `out`, a chunk of rows at a time."""
    from plelab.hf.checkpoint import HFCheckpoint
    from plelab.util.safetensors import read_rows

    ckpt = HFCheckpoint.open(path)
    embed = ckpt.tensors.get(EMBED)
    want = (ckpt.text_config["vocab_size"], ckpt.text_config["hidden_size"])
    if embed is None or embed.shape != want:
        got = "is missing" if embed is None else f"has shape {embed.shape}"
        raise ExportError(f"{path}: config/weights mismatch: {ckpt.prefix}{EMBED} {got}, config.json implies {want}")
    tok_blob, tok = b"", None
    if with_tokenizer and ckpt.tokenizer_json is not None:
        text = checked_tokenizer_text(ckpt.tokenizer_json)
        tok_blob = zlib.compress(text.encode("utf-8"), 9)
        tok = {"encoding": "zlib", "bytes": len(tok_blob), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
    layout = hf_layout(path, opts, tok)
    infos = {"ple": ckpt.table, "embed": embed}

    def rows(part: str, a: int, b: int) -> np.ndarray:
        return read_rows(infos[part], a, b).float().numpy()

    sections: dict[str, Any] = {"tensors": iter(())}
    for tab in layout.tables:
        sections[tab.name] = tab.chunks(table_records(tab, rows, opts.scale_search))
    if tok_blob:
        sections["tokenizer"] = [tok_blob]
    return write_ple(out, layout, sections)


def hf_export_inputs(path: str | Path) -> tuple[Path, ...]:
    """Files an export of a Hugging Face folder reads (its output must be none of them)."""
    root = Path(path)
    return (root, *sorted(p for p in root.iterdir() if p.is_file())) if root.is_dir() else (root,)
