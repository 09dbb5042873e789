"""What a monitored run leaves in RUN_DIR/diagnostics/: its initial PLE table and the early / final verdicts.

Written by the trainer's PLE monitor (plelab.training.ple_monitor), read back by `plelab diagnose`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

INIT_TABLE_FILE = "table_init.npy"
"""Under RUN_DIR/diagnostics/: the PLE table as it was before the first step."""


def init_table_path(run_dir: str | Path) -> Path:
    """Where a run keeps its initial PLE table."""
    return Path(run_dir) / "diagnostics" / INIT_TABLE_FILE


def load_init_table(run_dir: str | Path) -> tuple[np.ndarray | None, str]:
    """(initial table memory-mapped, or None; a note saying where it came from or why it is missing)."""
    path = init_table_path(run_dir)
    if not path.is_file():
        return None, f"no initial table at {path} (the run was not monitored by PLEMonitor from step 0)"
    return np.load(path, mmap_mode="r"), f"initial table from {path}"


def monitor_summaries(run_dir: Path | None) -> dict:
    """The early and final verdicts PLEMonitor left in RUN_DIR/diagnostics (a damaged file says so)."""
    out = {}
    for name in ("early", "final"):
        f = run_dir / "diagnostics" / f"{name}.json" if run_dir else None
        if f is not None and f.is_file():
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):  # a damaged monitor file must not hide the diagnosis itself
                out[name] = {"verdict": f"unreadable ({f})"}
                continue
            out[name] = data.get("summary") or {"verdict": data.get("verdict")}
    return out
