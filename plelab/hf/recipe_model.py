"""A model the quantization recipe measures: a plelab run, or an HF Gemma 3n / Gemma 4 folder (PLE table on disk).

What the recipe needs of either:
    matrices       {HF name: Matrix} of every quantizable weight, each tagged with its group
                   (plelab/hf/tensor_groups.py); the PLE table of an HF folder is never in memory
    quantized(...) a context in which one group's weights are replaced by their values stored in a format and
                   read back (the table of an HF folder: the rows of each batch, converted as they are read)
    log_probs(x)   (positions, vocab) float32 log-probabilities, a chunk of positions at a time
    tokenizer      the model's tokenizer (None for an HF folder without tokenizer.json)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from plelab.errors import PlelabError
from plelab.hf.quant_formats import Format
from plelab.hf.tensor_groups import group_of

LOGIT_CHUNK = 256
"""Positions whose logits exist at once (a 262k vocabulary makes a full batch's logits GBs)."""


class RecipeModelError(PlelabError):
    """A model the recipe cannot measure."""


@dataclass
class Matrix:
    """One quantizable weight: its tensor (None for the streamed table), shape, group, whether it is a row table."""

    name: str
    tensor: torch.Tensor | None
    shape: tuple[int, ...]
    group: str
    table: bool


@dataclass
class RecipeModel:
    """A loaded model and how to run and modify it (see the module docstring)."""

    kind: str
    """'plelab' (a run) or 'hf' (a Hugging Face folder)."""
    family: str
    """'llama' / 'gemma4' (plelab arch), or 'gemma3n' / 'gemma4' (HF)."""
    source: str
    module: torch.nn.Module
    matrices: dict[str, Matrix]
    tokenizer: Any
    vocab_size: int
    description: dict[str, Any] = field(default_factory=dict)
    context: int | None = None
    """Longest sequence the model was made for (None: not stated)."""
    _streamed: Any = None
    _hidden: Any = None
    _head: Any = None

    def groups(self) -> dict[str, list[Matrix]]:
        """Matrices by group (report order: tensor_groups.GROUPS first)."""
        out: dict[str, list[Matrix]] = {}
        for m in self.matrices.values():
            out.setdefault(m.group, []).append(m)
        return out

    def group_bytes(self, group: str, fmt: Format) -> int | None:
        """Stored bytes of `group` in `fmt` (None when a matrix cannot be held)."""
        total = 0
        for m in self.groups().get(group, []):
            n = fmt.nbytes(m.shape, m.table)
            if n is None:
                return None
            total += n
        return total

    @contextmanager
    def quantized(self, assignment: dict[str, Format]) -> Iterator[None]:
        """Within the block, every group in `assignment` computes with its weights stored in that format."""
        saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        try:
            with torch.no_grad():
                for group, fmt in assignment.items():
                    for m in self.groups().get(group, []):
                        if m.tensor is None:  # the streamed HF table: converted row by row as rows are read
                            self._streamed.row_transform = lambda rows, fmt=fmt: fmt.round_trip(rows, True)
                            continue
                        saved.append((m.tensor, m.tensor.detach().clone()))
                        flat = m.tensor.detach().float().cpu().reshape(-1, m.shape[-1]).numpy()
                        value = torch.from_numpy(fmt.round_trip(flat, m.table)).reshape(m.tensor.shape)
                        m.tensor.copy_(value.to(m.tensor.dtype))
            yield
        finally:
            with torch.no_grad():
                for tensor, original in saved:
                    tensor.copy_(original)
            if self._streamed is not None:
                self._streamed.row_transform = None

    @torch.no_grad()
    def log_probs(self, x: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
        """(positions of the flattened batch, float32 log-probabilities) a chunk of positions at a time."""
        h = self._hidden(x)
        h = h.reshape(-1, h.shape[-1])
        for a in range(0, h.shape[0], LOGIT_CHUNK):
            logits = self._head(h[a : a + LOGIT_CHUNK]).float()
            yield slice(a, a + logits.shape[0]), F.log_softmax(logits, dim=-1)


def _matrix_table(name: str) -> bool:
    return group_of(name) in ("ple_table", "embedding")


def plelab_model(run: str | Path, device: torch.device | None = None) -> RecipeModel:
    """A plelab run (its newest intact checkpoint) in float32."""
    from plelab.hf.interop import gemma4_hf_name
    from plelab.inference.load import checkpoint_tokenizer, load_model
    from plelab.runs.checkpoint import reading_checkpoint

    with reading_checkpoint(run) as ckpt:  # a run still training cannot prune it while it is read
        model, _ = load_model(ckpt, device=device or "cpu")
        tokenizer = checkpoint_tokenizer(ckpt, model.config.vocab_size)
    model = model.float().eval()
    cfg = model.config
    matrices = {}
    for name, param in model.named_parameters():
        hf = gemma4_hf_name(name)
        group = group_of(hf, param.ndim)
        if group in ("norms",):
            continue
        matrices[hf] = Matrix(hf, param, tuple(param.shape), group, _matrix_table(hf))
    if cfg.tie_embeddings:
        matrices.pop("lm_head.weight", None)
    return RecipeModel("plelab", cfg.arch, str(run), model, matrices, tokenizer, cfg.vocab_size,
                       {"run": str(run), "checkpoint": str(model.checkpoint_dir)}, context=cfg.max_seq_len,
                       _hidden=model.hidden_states, _head=model.logits)


def hf_model(path: str | Path, device: torch.device | None = None) -> RecipeModel:
    """An HF Gemma 3n / Gemma 4 folder: its text model in float32 with the PLE table streamed from disk."""
    from plelab.data.tokenizer import Tokenizer
    from plelab.hf.checkpoint import HFCheckpoint
    from plelab.hf.model import load_text_model

    ckpt = HFCheckpoint.open(path)
    hf = load_text_model(ckpt, torch.float32)
    lm = hf.lm
    if device is not None:
        lm.to(device)
    matrices = {}
    for name, param in lm.named_parameters():
        short = name.removeprefix("model.")
        group = group_of(short, param.ndim)
        if group == "norms":
            continue
        matrices[short] = Matrix(short, param, tuple(param.shape), group, _matrix_table(short))
    table = ckpt.table
    matrices["embed_tokens_per_layer.weight"] = Matrix("embed_tokens_per_layer.weight", None, table.shape,
                                                       "ple_table", True)
    tok = Tokenizer.load(ckpt.tokenizer_json) if ckpt.tokenizer_json is not None else None
    cap = getattr(lm.config, "final_logit_softcapping", None)

    def head(h: torch.Tensor) -> torch.Tensor:
        logits = lm.lm_head(h)
        return torch.tanh(logits / cap) * cap if cap else logits

    return RecipeModel("hf", ckpt.family, str(path), lm, matrices, tok, ckpt.text_config["vocab_size"],
                       {"hf": str(path), "architecture": ckpt.family},
                       context=ckpt.text_config.get("max_position_embeddings"), _streamed=hf.table,
                       _hidden=lambda x: hf.text(input_ids=x, use_cache=False).last_hidden_state, _head=head)


def open_model(source: str | Path, hf: bool = False, device: torch.device | None = None) -> RecipeModel:
    """`plelab_model` or (hf) `hf_model`."""
    return hf_model(source, device) if hf else plelab_model(source, device)
