"""llama.cpp from Python: its converter (from the llama-cpp-python source package) and its runtime (llama-cpp-python).

    converter_dir()      the vendored llama.cpp tree holding convert_hf_to_gguf.py, conversion/ and gguf-py/,
                         which `bash scripts/setup.sh --test` unpacks from the llama-cpp-python sdist into
                         ~/.cache/plelab (or $PLELAB_LLAMA_CPP_SRC points at one)
    convert_hf(...)      runs that converter on a Hugging Face folder, as a user would
    LlamaCpp(path)       a GGUF loaded by llama.cpp: logits of a token sequence, greedy generation, tokenizer

Both are optional: `available()` / `converter_dir()` say whether they are installed here.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from plelab.errors import PlelabError

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The llama-cpp-python release whose llama.cpp (with src/models/gemma4.cpp) the tests and setup.sh use."""


class LlamaCppError(PlelabError):
    """llama.cpp (its converter or llama-cpp-python) missing or failing."""


def cache_root() -> Path:
    """Where setup.sh keeps downloaded third-party sources (~/.cache/plelab, or $XDG_CACHE_HOME/plelab)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "plelab"


def converter_dir() -> Path | None:
    """The llama.cpp source tree whose convert_hf_to_gguf.py to run, or None when setup.sh has not unpacked it."""
    env = os.environ.get("PLELAB_LLAMA_CPP_SRC")
    candidates = [Path(env)] if env else []
    candidates.append(cache_root() / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp")
    for c in candidates:
        if (c / "convert_hf_to_gguf.py").is_file() and (c / "gguf-py").is_dir():
            return c
    return None


def convert_hf(folder: str | Path, out: str | Path, outtype: str = "f32", timeout: float = 600) -> Path:
    """Run llama.cpp's convert_hf_to_gguf.py on an HF folder (as `python convert_hf_to_gguf.py FOLDER --outtype
    T --outfile OUT`); its last lines of output are the error when it fails."""
    src = converter_dir()
    if src is None:
        raise LlamaCppError("llama.cpp's converter is not unpacked here (bash scripts/setup.sh --test does it, or "
                            "set PLELAB_LLAMA_CPP_SRC to a llama.cpp checkout)")
    cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(folder), "--outtype", outtype, "--outfile", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.pop("NO_LOCAL_GGUF", None)  # the converter's own gguf-py, which knows its own architectures
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise LlamaCppError(f"llama.cpp's converter failed on {folder}: {' | '.join(tail)}")
    return Path(out)


def available() -> bool:
    """Whether llama-cpp-python is importable."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


@contextlib.contextmanager
def _no_extra_buffers(llama_module) -> Iterator[None]:
    """Load with llama.cpp's `use_extra_bufts` off (llama-cli's `--no-repack`): weights stay in the plain CPU buffer.

    On a CPU with AMX (Xeon Sapphire Rapids and newer), a llama.cpp built with -march=native puts q4_0 and q4_k
    matrices in its AMX buffer, and ggml_backend_amx_mul_mat then crashes the process (SIGSEGV) on any batch of
    more than one token (llama.cpp issue #20824, open; seen here with llama-cpp-python 0.3.36 on a 256 x 128
    q4_0 matrix). llama-cpp-python's `Llama` takes no argument for the flag, so the default parameters it starts
    from are patched while it loads.
    """
    native = llama_module.llama_cpp
    default_params = native.llama_model_default_params

    def without_extra_buffers():
        params = default_params()
        params.use_extra_bufts = False
        return params

    native.llama_model_default_params = without_extra_buffers
    try:
        yield
    finally:
        native.llama_model_default_params = default_params


class LlamaCpp:
    """A GGUF loaded in llama.cpp (CPU), with every position's logits kept."""

    def __init__(self, path: str | Path, n_ctx: int = 512, threads: int = 1, f32_cache: bool = True,
                 repack: bool = False):
        """`f32_cache`: keys and values cached in f32 (llama.cpp's default f16 cache rounds them, ~1e-3 off).
        `repack`: let llama.cpp move weights into its repacked CPU layouts (AMX, interleaved q4_0/q4_k), as
        llama-cli does by default; off by default (its `--no-repack`), see `_no_extra_buffers`."""
        try:
            import llama_cpp.llama as llama_module
            from llama_cpp import Llama
        except ImportError as exc:
            raise LlamaCppError(f"llama-cpp-python is not installed (pip install 'plelab[test]'): {exc}") from None
        self.path = Path(path)
        try:
            cache = {"type_k": 0, "type_v": 0} if f32_cache else {}  # GGML_TYPE_F32
            with contextlib.nullcontext() if repack else _no_extra_buffers(llama_module):
                self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                                 n_threads=threads, n_threads_batch=threads, verbose=False, seed=0, **cache)
        except (ValueError, RuntimeError) as exc:
            raise LlamaCppError(f"llama.cpp cannot load {path}: {exc}") from None

    @property
    def n_vocab(self) -> int:
        """Vocabulary size llama.cpp reads from the file."""
        return self.llm.n_vocab()

    def logits(self, ids: list[int]) -> np.ndarray:
        """(len(ids), vocab) float32 logits of every position, from a fresh context."""
        self.llm.reset()
        self.llm.eval([int(i) for i in ids])
        return np.array(self.llm.scores[: len(ids)], dtype=np.float32)

    def greedy(self, ids: list[int], n: int, stop: int | None = None) -> list[int]:
        """`n` tokens after `ids` by argmax of llama.cpp's logits (stopping after `stop` when it comes)."""
        self.llm.reset()
        self.llm.eval([int(i) for i in ids])
        out: list[int] = []
        for _ in range(n):
            nxt = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
            out.append(nxt)
            if nxt == stop:
                break
            self.llm.eval([nxt])
        return out

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """llama.cpp's tokens of `text` (BOS first when asked)."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)

    def detokenize(self, ids: list[int]) -> str:
        """llama.cpp's text of `ids`."""
        return self.llm.detokenize([int(i) for i in ids]).decode("utf-8", errors="replace")

    def close(self) -> None:
        """Free the model and context."""
        self.llm.close()

    def __enter__(self) -> LlamaCpp:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
