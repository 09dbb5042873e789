"""Fuzz the C runtime's .ple parser: `plelab c fuzz --cases 100000` prints the counts.

Builds `plefuzz` (plelab/edge/c/plefuzz.c) with AddressSanitizer + UBSan, exports a tiny int4 model as the
seed file (`--ngram`: one with an n-gram index and an id map, so the mutations reach version 3's fields), and runs
the in-process mutation loop. A crash, hang or sanitizer report is a non-zero exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from plelab.edge.c_engine import CEngineError, build

SANITIZER_ENV = {"ASAN_OPTIONS": "allocator_may_return_null=1:detect_leaks=1:abort_on_error=0",
                 "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


def seed_file(path: str | Path, ngram: bool = False) -> Path:
    """Write the small model the mutations start from (int4, PLE with context, tied head); `ngram`: its PLE table
    indexed by bigrams and trigrams, two hash heads each, ids compressed by an id map (pairs of ids merged)."""
    from plelab.edge.export import ExportOptions, export_model
    from plelab.model import LanguageModel, load_model_config
    from plelab.model.ngram import id_map_document

    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["max_seq_len=16", "vocab_size=64"]
        if ngram:  # the model keeps the map among its weights: the file is not needed after
            id_map = Path(tmp) / "idmap.json"
            id_map.write_text(json.dumps(id_map_document([i // 2 for i in range(64)])))
            overrides += ["ple.index=ngram", "ple.ngram.orders=[2,3]", "ple.ngram.heads=2",
                          f"ple.ngram.id_map={id_map}"]
        cfg = load_model_config("tiny", overrides)
        export_model(LanguageModel(cfg), path, ExportOptions(quant="int4", group=8))
    return Path(path)


def fuzz(cases: int, seed: int = 1, model: str | Path | None = None, timeout: float = 600,
         ngram: bool = False) -> dict[str, Any]:
    """Run `cases` mutations of `model` (default: `seed_file(ngram=ngram)`); the harness's counts, or CEngineError
    on a crash / sanitizer report / hang."""
    if cases < 1 or not timeout > 0:
        raise CEngineError(f"cases and timeout must be positive, got {cases} and {timeout}")
    if model and ngram:
        raise CEngineError("--ngram chooses the seed file: it does not apply with --model")
    binary = build(sanitize=True, program="plefuzz")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(model) if model else seed_file(Path(tmp) / "seed.ple", ngram)
        try:
            proc = subprocess.run([str(binary), str(path), "--cases", str(cases), "--seed", str(seed)],
                                  capture_output=True, text=True, timeout=timeout, env={**os.environ, **SANITIZER_ENV})
        except subprocess.TimeoutExpired as exc:
            raise CEngineError(f"plefuzz hung ({cases} cases not done in {timeout:.0f} s)") from exc
    if proc.returncode:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise CEngineError(f"plefuzz failed with exit status {proc.returncode}: {tail}")
    return json.loads(proc.stdout)

