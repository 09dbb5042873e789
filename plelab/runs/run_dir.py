"""The run directory: one writer at a time (a lock), never someone else's folder, and a record of config changes.

A run directory holds config.json (the config in force), metrics.jsonl, checkpoints/, config_history.jsonl
(one line per resume that changed a setting) and whatever callbacks write. `.train.lock` is held (flock,
released by the OS even on kill -9; plelab.runs.lock) by the one process training into it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError
from plelab.runs.lock import RUN_LOCK, FolderLock
from plelab.util.fs import atomic_write_bytes

LOCK_FILE = RUN_LOCK
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
HISTORY_FILE = "config_history.jsonl"
RUN_FILES = (CONFIG_FILE, METRICS_FILE, HISTORY_FILE)
"""Files the trainer itself writes at the top of a run directory (plus checkpoints/)."""

RESUMABLE_FIELDS = (
    "max_steps", "log_every", "eval_every", "eval_tokens", "eval_sample", "ckpt_every", "keep_checkpoints",
    "max_bad_steps", "diagnostics_every", "tensorboard", "wandb", "device", "parallel", "activation_checkpointing",
    "compile", "pin_memory",
)
"""Settings `--resume` may change (each change is recorded in config_history.jsonl). Everything else (model
shape, data, batch, learning-rate schedule, seed, dtype, ...) defines what the checkpoint's state means, so
changing it is refused. Note that a new max_steps also stretches or shortens the cosine decay from here on."""


class RunDirError(PlelabError):
    """A run directory that is busy, belongs to another run, or cannot take the requested change."""


class RunLock(FolderLock):
    """The run folder's lock (plelab.runs.lock.RUN_LOCK), not waited for: a second holder gets a RunDirError."""

    def __init__(self, run_dir: Path):
        super().__init__(run_dir, RUN_LOCK, busy=lambda pid: RunDirError(
            f"{run_dir} is in use by another training process (pid {pid}); "
            "wait for it to finish or pick another --out"))


def is_run_config(config: Any) -> bool:
    """Whether a parsed config.json is a plelab run's (a Hugging Face model's config.json is not)."""
    return (isinstance(config, dict) and isinstance(config.get("model"), dict)
            and {"max_steps", "batch_size", "ckpt_every"} <= config.keys())


def holds_run(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds a plelab run: a run's config.json, or checkpoints the trainer wrote."""
    run_dir = Path(run_dir)
    return is_run_config(_read_config(run_dir)) or any((run_dir / "checkpoints").glob("step_*/manifest.json"))


class OpeningTraces:
    """What opening a run folder leaves (the folder, its lock file), noted before it is opened so that a run
    refused or failed before it started can take them back: a refused folder is left as it was found."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.made_folder = not self.run_dir.exists()
        self.made_lock = not (self.run_dir / LOCK_FILE).exists()

    def remove_unless_run(self) -> None:
        """Remove the lock file and folder this process made, unless the folder now holds a run."""
        if holds_run(self.run_dir):
            return
        if self.made_lock:
            (self.run_dir / LOCK_FILE).unlink(missing_ok=True)
        if self.made_folder:
            with contextlib.suppress(OSError):  # not empty: something else was written there, keep it
                self.run_dir.rmdir()


def _read_config(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def claim_fresh_run_dir(run_dir: Path, config: dict[str, Any], overwrite: bool) -> None:
    """Refuse to start a new run in a folder holding other data or another run, unless `overwrite`.

    Allowed without overwrite: a missing or empty folder (hidden files aside), and a folder holding this very
    config and no checkpoint (a run killed before its first checkpoint). With overwrite, the old run's files
    (config, metrics, history, checkpoints) are removed; other files are left alone. A folder that holds no run
    but a file a run writes (a model's config.json, say) is refused even with overwrite: it would be replaced.
    """
    run_dir = Path(run_dir)
    visible = [p for p in run_dir.iterdir() if not p.name.startswith(".")] if run_dir.is_dir() else []
    ckpts = run_dir / "checkpoints"
    has_ckpts = ckpts.is_dir() and any(ckpts.glob("step_*"))
    is_run = holds_run(run_dir)
    if not is_run:
        taken = next((run_dir / name for name in (*RUN_FILES, "checkpoints") if (run_dir / name).exists()), None)
        if taken is not None:
            raise RunDirError(f"{run_dir} holds {taken.name}, which is not a plelab run's and which a run would "
                              f"replace; --overwrite replaces only a plelab run, so pick a new --out")
    if not overwrite:
        if has_ckpts:
            raise RunDirError(
                f"{run_dir} already holds a run; use --resume to continue it, --overwrite to replace it, "
                "or pick a new --out"
            )
        if visible and _read_config(run_dir) != config:
            if is_run:
                raise RunDirError(f"{run_dir} already holds a different run; pass --overwrite to replace it or pick "
                                  "a new --out")
            raise RunDirError(f"{run_dir} already holds files that are not a plelab run; pass --overwrite to write "
                              "the run beside them (they are kept) or pick a new --out")
    if is_run:
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(ckpts, ignore_errors=True)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a nested config dict."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def resume_changes(saved: dict[str, Any], requested: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{field: {old, new}} between a checkpoint's config and the requested one; a RunDirError if any is fixed."""
    old, new = flatten(saved), flatten(requested)
    changes = {k: {"old": old[k], "new": new[k]} for k in sorted(old.keys() & new.keys()) if old[k] != new[k]}
    fixed = [k for k in changes if k not in RESUMABLE_FIELDS]
    if fixed:
        k = fixed[0]
        more = f" (and {len(fixed) - 1} more: {', '.join(fixed[1:])})" if len(fixed) > 1 else ""
        raise RunDirError(
            f"cannot change {k} on resume ({changes[k]['old']!r} -> {changes[k]['new']!r}){more}; "
            f"resumable settings: {', '.join(RESUMABLE_FIELDS)}; start a new run (another --out) for the rest"
        )
    return changes


def record_config(run_dir: Path, config: dict[str, Any], step: int, changes: dict[str, dict[str, Any]]) -> None:
    """Make config.json the config in force and append the changes (if any) to config_history.jsonl."""
    atomic_write_bytes(Path(run_dir) / CONFIG_FILE, json.dumps(config, indent=2).encode())
    if changes:
        entry = {"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "changes": changes}
        with open(Path(run_dir) / HISTORY_FILE, "a") as f:
            f.write(json.dumps(entry) + "\n")
