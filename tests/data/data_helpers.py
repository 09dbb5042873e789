"""Small corpora for the data tests (tiny, multilingual, with awkward whitespace)."""

from __future__ import annotations

from pathlib import Path

DOCS = [
    "The cat sat on the mat.\nIt was a sunny day, and the cat was happy.",
    "  Indented first line\n\n\nthen blank lines\n  and spaces   \ttabs\t",
    "日本語と中文混合。第一回 宴桃园豪杰三结义，斩黄巾英雄首立功。\n滚滚长江东逝水，浪花淘尽英雄。",
    "Numbers 12345 and 3.14159, emoji 🐍🚀, accents café naïve.",
    "def f(x):\n    return x * 2  # code\n\nprint(f(21))\n",
    "Once upon a time there was a little rabbit named Peter. " * 20,
]


def write_docs(path: Path, docs: list[str], sep: str = "<|endoftext|>") -> Path:
    """Write documents in the shared/data format: doc1 + '\\n<sep>\\n' + doc2 + ... + '\\n'."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"\n{sep}\n".join(docs) + "\n", encoding="utf-8")
    return path


def corpus_text(n: int = 40) -> str:
    """A few KB of varied text for training a tiny BPE."""
    return "\n".join(DOCS * n)
