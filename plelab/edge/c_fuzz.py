"""Fuzz the C runtime's .ple parser: `plelab c fuzz --cases 100000` prints the counts.

Builds `plefuzz` (plelab/edge/c/plefuzz.c) with AddressSanitizer + UBSan, exports a tiny int4 model as the
seed file, and runs the in-process mutation loop. A crash, hang or sanitizer report is a non-zero exit.
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


def seed_file(path: str | Path) -> Path:
    """Write the small model the mutations start from (int4, PLE with context, tied head)."""
    from plelab.edge.export import ExportOptions, export_model
    from plelab.model import LanguageModel, load_model_config

    cfg = load_model_config("tiny", ["max_seq_len=16", "vocab_size=64"])
    export_model(LanguageModel(cfg), path, ExportOptions(quant="int4", group=8))
    return Path(path)


def fuzz(cases: int, seed: int = 1, model: str | Path | None = None, timeout: float = 600) -> dict[str, Any]:
    """Run `cases` mutations; the harness's counts, or CEngineError on a crash / sanitizer report / hang."""
    if cases < 1 or not timeout > 0:
        raise CEngineError(f"cases and timeout must be positive, got {cases} and {timeout}")
    binary = build(sanitize=True, program="plefuzz")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(model) if model else seed_file(Path(tmp) / "seed.ple")
        try:
            proc = subprocess.run([str(binary), str(path), "--cases", str(cases), "--seed", str(seed)],
                                  capture_output=True, text=True, timeout=timeout, env={**os.environ, **SANITIZER_ENV})
        except subprocess.TimeoutExpired as exc:
            raise CEngineError(f"plefuzz hung ({cases} cases not done in {timeout:.0f} s)") from exc
    if proc.returncode:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise CEngineError(f"plefuzz failed with exit status {proc.returncode}: {tail}")
    return json.loads(proc.stdout)

