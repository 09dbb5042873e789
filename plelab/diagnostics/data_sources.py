"""Token data for diagnosing a checkpoint: a prepared dataset, a folder of domain .txt files, or a .npy array.

Evaluation batches come from held-out text (the prepared dataset's validation split, or the domain files);
token frequencies for table health come from the training split when there is one, else from the same
held-out tokens, and the returned descriptions say which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plelab.errors import PlelabError

EVAL_MAX_TOKENS = 4_000_000
"""Held-out tokens read at most (batches are random windows inside them)."""
FREQ_MAX_TOKENS = 20_000_000
"""Training tokens counted at most for token frequencies (from the start of the split)."""
VALIDATION_SPLITS = ("val", "valid", "validation")


class DiagnosticDataError(PlelabError):
    """Data that cannot feed a diagnosis."""


@dataclass
class DiagnosticData:
    """Held-out tokens for evaluation batches, tokens for frequencies, and where each came from."""

    eval_tokens: np.ndarray
    freq_tokens: np.ndarray
    eval_source: str
    freq_source: str


def _checkpoint_tokenizer_sha256(checkpoint_dir: Path) -> str | None:
    """sha256 of the tokenizer saved with the checkpoint (None when it has none: only the vocabulary is checked)."""
    from plelab.data.tokenizer import Tokenizer

    return Tokenizer.load(checkpoint_dir).sha256 if (checkpoint_dir / "tokenizer.json").is_file() else None


def _prepared(path: Path, vocab_size: int, tokenizer_sha256: str | None) -> DiagnosticData:
    from plelab.data.loader import TokenDataset, read_manifest

    splits = read_manifest(path)["splits"]
    val = next((s for s in VALIDATION_SPLITS if s in splits), None)
    if val is None:
        raise DiagnosticDataError(f"{path}: no validation split (have: {', '.join(splits)})")
    # As `plelab train` does: tokens of another tokenizer would give a confident verdict on meaningless input.
    held = TokenDataset(path, val, vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256)
    eval_tokens = held.get(0, min(len(held), EVAL_MAX_TOKENS))
    eval_source = f"split {val!r} of {path} ({len(eval_tokens):,} tokens)"
    if "train" not in splits:
        return DiagnosticData(eval_tokens, eval_tokens, eval_source, eval_source)
    train = TokenDataset(path, "train", vocab_size=vocab_size)
    freq = train.get(0, min(len(train), FREQ_MAX_TOKENS))
    return DiagnosticData(eval_tokens, freq, eval_source, f"the first {len(freq):,} tokens of split 'train' of {path}")


def _domain_text(path: Path, checkpoint_dir: Path) -> DiagnosticData:
    from plelab.data.prepare import load_eval_domains
    from plelab.data.tokenizer import Tokenizer

    if not (checkpoint_dir / "tokenizer.json").is_file():
        raise DiagnosticDataError(f"{checkpoint_dir} has no tokenizer.json to tokenize {path} with; pass a prepared "
                                  "dataset folder or a .npy token array instead")
    domains = load_eval_domains(path, Tokenizer.load(checkpoint_dir))
    tokens = np.concatenate([d.tokens.astype(np.int64) for d in domains.values()])[:EVAL_MAX_TOKENS]
    source = f"{len(domains)} domain file(s) in {path} ({len(tokens):,} tokens)"
    return DiagnosticData(tokens, tokens, source, source)


def load_diagnostic_data(path: str | Path, checkpoint_dir: str | Path, vocab_size: int) -> DiagnosticData:
    """Tokens from a prepared dataset folder, a folder (or file) of domain .txt files, or a 1-D .npy array."""
    p = Path(path)
    if not p.exists():
        raise DiagnosticDataError(f"{path}: no such file or directory")
    if p.suffix == ".npy":
        try:
            tokens = np.load(p, mmap_mode="r").reshape(-1)
        except (ValueError, OSError) as exc:
            raise DiagnosticDataError(f"{p}: not a readable .npy token array ({exc})") from None
        if not np.issubdtype(tokens.dtype, np.integer):
            raise DiagnosticDataError(f"{p} holds {tokens.dtype} values, not integer token ids")
        if len(tokens) and int(tokens.max()) >= vocab_size:
            raise DiagnosticDataError(f"{p} holds token id {int(tokens.max())}, the model's vocabulary is {vocab_size}")
        return DiagnosticData(tokens, tokens, f"{p} ({len(tokens):,} tokens)", f"{p}")
    if (p / "manifest.json").is_file():
        return _prepared(p, vocab_size, _checkpoint_tokenizer_sha256(Path(checkpoint_dir)))
    return _domain_text(p, Path(checkpoint_dir))
