"""Tiny trained plelab arch = "gemma4" runs for the GGUF / llama.cpp tests (real text, real tokenizers).

Widths are multiples of 256 so every GGUF type (k-quants' blocks are 256 values) can hold every matrix:
H 256, 4 heads of 64 (2 kv heads), FFN 512, dP 256, 2 layers (sliding then full attention, window 16).
The model's vocabulary is the tokenizer's plus 2, so exports must pad the tokenizer (`<unusedN>`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from training_helpers import TEXT  # noqa: E402

from plelab.data.prepare import prepare_dataset  # noqa: E402
from plelab.data.tokenizer import Tokenizer  # noqa: E402
from plelab.training.config import load_train_config  # noqa: E402
from plelab.training.trainer import Trainer  # noqa: E402

STORY = (
    "Once upon a time a little fox lived near the river. Every morning the fox ran to the water and looked at "
    "the fish. The fish said: good morning, fox! And the fox said: good morning, fish! Then the sun came up "
    "over the hills and the birds began to sing.\n"
)
CODE = "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i * 2))\n"
WINDOW = 16


def corpus(root: Path) -> Path:
    """A few KB of real text: prose, code, numbers, some non-ASCII."""
    src = root / "corpus.txt"
    docs = [f"Document {i}. " + (STORY if i % 3 else TEXT) * (1 + i % 3) + (CODE if i % 4 == 0 else "")
            for i in range(80)]
    docs.append("Café, naïve, 日本語のテキスト, emoji 🦊.\n" * 5)
    src.write_text("\n<|endoftext|>\n".join(docs) + "\n", encoding="utf-8")
    return src


def held_out(root: Path) -> Path:
    """Two held-out domains (text the model never trained on)."""
    valid = root / "valid"
    valid.mkdir(exist_ok=True)
    (valid / "story.txt").write_text(STORY.replace("fox", "cat").replace("fish", "frog") * 6, encoding="utf-8")
    (valid / "code.txt").write_text(CODE.replace("add", "mul").replace("+", "*") * 8, encoding="utf-8")
    return valid


def train_run(root: Path, name: str, tokenizer: Tokenizer, steps: int = 40, extra_model: str = "",
              seed: int = 0, ffn: int = 512, gemma4: str = "", layers: int = 2) -> Path:
    """Prepare root/name-data with `tokenizer` and train a tiny gemma4 model into root/name."""
    data = root / f"{name}-data"
    if not data.exists():
        prepare_dataset([corpus(root)], tokenizer, data, val_fraction=0.1, progress=False)
    config = root / f"{name}.toml"
    config.write_text(
        f'data = "{data}"\neval_data = "{held_out(root)}"\nbatch_size = 8\nseq_len = 64\nmax_steps = {steps}\n'
        f"warmup_steps = 4\nlog_every = 20\nckpt_every = {steps}\neval_tokens = 256\nlr = 3e-3\nseed = {seed}\n"
        "[model]\n"
        f'arch = "gemma4"\nvocab_size = {tokenizer.vocab_size + 2}\nhidden_size = 256\nnum_layers = {layers}\n'
        "num_heads = 4\nnum_kv_heads = 2\nhead_dim = 64\nmax_seq_len = 128\n"
        f"ffn = {{ intermediate_size = {ffn} }}\nple = {{ dim = 256 }}\n" + extra_model +
        f"[model.gemma4]\nsliding_window = {WINDOW}\nfinal_logit_softcap = 30.0\n{gemma4}"
    )
    torch.manual_seed(seed)
    Trainer(load_train_config(config), root / name, quiet=True).run()
    return root / name


def gemma_tokenizer(root: Path) -> Tokenizer:
    """A Gemma-style BPE trained on the corpus."""
    return Tokenizer.train_gemma([corpus(root).read_text(encoding="utf-8")], 420, min_frequency=2)


def byte_level_tokenizer(root: Path) -> Tokenizer:
    """A byte-level BPE (plelab's default kind) trained on the corpus."""
    return Tokenizer.train_bpe([corpus(root).read_text(encoding="utf-8")], 400, min_frequency=2)


def plelab_logits(run: Path, ids: list[int]) -> np.ndarray:
    """(T, V) float32 logits of plelab's own model for one sequence."""
    from plelab.inference.load import load_model

    model, _ = load_model(run)
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0].float().numpy()


def sample_ids(tokenizer: Tokenizer, n: int = 60) -> list[int]:
    """`n` token ids of held-out text (past the sliding window), starting with the end-of-text id as BOS."""
    ids = [tokenizer.eot_id] + tokenizer.encode(STORY.replace("fox", "dog") * 4 + CODE)
    assert len(ids) >= n
    return ids[:n]
