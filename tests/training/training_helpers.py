"""Small real datasets and configs for trainer tests (byte tokenizer, text written to tmp dirs)."""

from __future__ import annotations

from pathlib import Path

from plelab.data.prepare import prepare_dataset
from plelab.data.tokenizer import Tokenizer

TEXT = (
    "The quick brown fox jumps over the lazy dog. "
    "Per-layer embeddings give every layer its own small vector per token. "
    "A dead zone is where doubling the parameters changes nothing. "
)


def make_dataset(root: Path, docs: int = 60) -> Path:
    """Prepare a byte-tokenized dataset of `docs` short real-text documents under root/data."""
    src = root / "corpus.txt"
    src.write_text("\n<|endoftext|>\n".join(f"Document {i}. " + TEXT * (1 + i % 4) for i in range(docs)) + "\n")
    prepare_dataset([src], Tokenizer.byte_level(), root / "data", val_fraction=0.1, progress=False)
    valid = root / "valid"
    valid.mkdir(exist_ok=True)
    (valid / "prose.txt").write_text(TEXT * 3 + "\n<|endoftext|>\n" + TEXT[::-1] + "\n")
    (valid / "numbers.txt").write_text(" ".join(str(i) for i in range(200)) + "\n")
    return root / "data"


def write_config(root: Path, **fields) -> Path:
    """A TOML training config for the tiny preset on root/data, with fields overriding the defaults."""
    base = dict(
        data=str(root / "data"), eval_data=str(root / "valid"), batch_size=4, seq_len=32, max_steps=16,
        warmup_steps=3, log_every=4, ckpt_every=4, eval_tokens=256, lr=3e-3,
    )
    base.update(fields)
    lines = [f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {v}" for k, v in base.items()]
    lines += ["[model]", 'preset = "tiny"', "vocab_size = 258", "max_seq_len = 32"]
    path = root / "train.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
