"""Checkpoints: safetensors weights + JSON config + training state, written atomically, verified on load.

Layout of one checkpoint directory (`RUN_DIR/checkpoints/step_00000100/`):
    model.safetensors   weights (names as in `LanguageModel.state_dict()`)
    config.json         {"model": ModelConfig fields, "train": training config or null, "tokenizer": sha256 or null,
                         "device": the device the weights were trained on ("cpu", "cuda:0"; absent when unknown)}
    tokenizer.json      the tokenizer the model was trained with (when known)
    state.pt            optimizer, scheduler, loader, RNG and step (absent in weights-only exports)
    ple_table_rows.safetensors   only for a PLE table trained on disk: its touched rows (plelab.runs.table_rows);
                        model.safetensors then holds everything but the table
    manifest.json       sha256 + size of every file above; written last, so its presence marks completion
`RUN_DIR/checkpoints/LATEST` names the newest complete checkpoint.

A checkpoint written by several ranks (`plelab.parallel.checkpoint`) holds `.metadata` + `__R_0.distcp`
(torch.distributed.checkpoint: weights and optimizer state, each rank its own shards) instead of
model.safetensors, and state.pt without the optimizer; the manifest covers every file the same way.
`read_weights` and `load_training_state` read both kinds into one process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from plelab.errors import PlelabError
from plelab.model.ffn import pack_mask, unpack_mask
from plelab.model.transformer import LanguageModel
from plelab.runs.table_rows import TABLE_ROWS_FILE, TABLE_WEIGHT, dense_table
from plelab.util.dataclass_config import to_dict
from plelab.util.fs import atomic_write_bytes, fsync_dir, sha256_file

__all__ = ["atomic_write_bytes", "sha256_file"]  # re-exported: other modules import them from here

SHARDED_METADATA = ".metadata"
"""torch.distributed.checkpoint's index file: its presence marks a sharded checkpoint (`__R_0.distcp` per rank)."""
SHARDED_MODEL_PREFIX = "model/"
SHARDED_OPTIM_PREFIX = "optim/"
"""Keys in a sharded checkpoint: `model/<parameter>` and `optim/<parameter>.<exp_avg|exp_avg_sq|step>`."""

DELETING_SUFFIX = ".deleting"
"""A pruned checkpoint is renamed to `.step_N.deleting` before its files are removed."""


class CheckpointError(PlelabError):
    """A checkpoint that is missing, incomplete or corrupt."""


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def save_checkpoint(
    ckpt_dir: Path,
    model: LanguageModel,
    train_config: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    tokenizer: str | Path | None = None,
    device: str | None = None,
    extra: Callable[[Path], list[str]] | None = None,
) -> Path:
    """Write a complete checkpoint into `ckpt_dir` atomically (built in a temp dir, then renamed).

    device: the resolved training device, recorded because "auto" in the config does not say which one ran
    (a model rebuilt from the run's seed matches only on the same kind of device). extra: writes more files into
    the directory being built and returns their names (a PLE table kept on disk: `table_rows`), which the
    manifest then covers."""
    ckpt_dir = Path(ckpt_dir)
    tmp = new_checkpoint_tmp(ckpt_dir)
    try:
        weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        if state is None:
            weights = pack_mask_weights(weights)
        with _write_errors_as_oserror(tmp / "model.safetensors"):
            save_file(weights, str(tmp / "model.safetensors"))
        files = ["model.safetensors", "config.json"]
        tok_hash = None
        if tokenizer is not None:
            shutil.copyfile(tokenizer, tmp / "tokenizer.json")
            tok_hash = sha256_file(tmp / "tokenizer.json")
            files.append("tokenizer.json")
        config = {"model": to_dict(model.config), "train": train_config, "tokenizer": tok_hash}
        if device is not None:
            config["device"] = device
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        if state is not None:
            with _write_errors_as_oserror(tmp / "state.pt"):
                torch.save(state, tmp / "state.pt")
            files.append("state.pt")
        if extra is not None:
            files += extra(tmp)
        commit_checkpoint(tmp, ckpt_dir, files)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ckpt_dir


def new_checkpoint_tmp(ckpt_dir: Path) -> Path:
    """A fresh temp dir beside `ckpt_dir` to build it in (removed by `remove_leftovers` if the writer dies)."""
    ckpt_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=ckpt_dir.parent, prefix=f".{ckpt_dir.name}.tmp"))


def commit_checkpoint(tmp: Path, ckpt_dir: Path, files: list[str]) -> None:
    """Seal a checkpoint built in `tmp`: fsync `files`, write the manifest last, rename it into `ckpt_dir`."""
    for name in files:
        _fsync_file(tmp / name)
    manifest = {name: {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size} for name in files}
    atomic_write_bytes(tmp / "manifest.json", json.dumps(manifest, indent=2).encode())
    fsync_dir(tmp)
    if ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    os.replace(tmp, ckpt_dir)
    fsync_dir(ckpt_dir.parent)


_WRITE_FAILURE = ("PytorchStreamWriter", "inline_container", "file write failed", "I/O error")
"""Markers of torch.save's zip writer (RuntimeError) and safetensors (SafetensorError) failing to write."""


@contextlib.contextmanager
def _write_errors_as_oserror(path: Path):
    """Turn the writers' own exception types for a failed write (disk full, I/O error) into OSError."""
    try:
        yield
    except (RuntimeError, SafetensorError) as exc:
        text = str(exc).strip()
        if not any(marker in text for marker in _WRITE_FAILURE):
            raise
        code = re.search(r"os error (\d+)", text)  # safetensors names the errno; torch does not
        raise OSError(int(code.group(1)) if code else None,
                      f"could not write {path.name}: {text.splitlines()[-1]}") from exc


def pack_mask_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace MGLU mask logits by their binarised masks at 1 bit per element (weights-only checkpoints)."""
    out = {}
    for k, v in weights.items():
        if k.endswith("mask_logits"):
            out[k.removesuffix("mask_logits") + "mask_bits"] = torch.from_numpy(pack_mask(v > 0))
        else:
            out[k] = v
    return out


def unpack_mask_weights(weights: dict[str, torch.Tensor], model: LanguageModel) -> dict[str, torch.Tensor]:
    """Inverse of `pack_mask_weights`: packed masks become logits of +1 / -1 (same binarised mask)."""
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    out = {}
    for k, v in weights.items():
        if k.endswith("mask_bits"):
            name = k.removesuffix("mask_bits") + "mask_logits"
            mask = unpack_mask(v.cpu().numpy(), tuple(shapes[name]))
            out[name] = (mask.float() * 2 - 1).to(v.device)
        else:
            out[k] = v
    return out


def verify_checkpoint(ckpt_dir: Path) -> dict[str, Any]:
    """Check every file against the manifest; return the manifest or raise CheckpointError."""
    ckpt_dir = Path(ckpt_dir)
    mpath = ckpt_dir / "manifest.json"
    if not mpath.is_file():
        raise CheckpointError(f"{ckpt_dir} is not a complete checkpoint (no manifest.json)")
    manifest = read_checkpoint_json(mpath)
    for name, meta in manifest.items():
        f = ckpt_dir / name
        if not f.is_file():
            raise CheckpointError(f"{ckpt_dir}: {name} is missing")
        if not isinstance(meta, dict) or f.stat().st_size != meta.get("bytes") or sha256_file(f) != meta.get("sha256"):
            raise CheckpointError(f"{ckpt_dir}: {name} fails its checksum (corrupt or truncated)")
    return manifest


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint dir, or a run dir's newest complete checkpoint."""
    path = Path(path)
    if (path / "manifest.json").is_file():
        return path
    ckpts = path / "checkpoints"
    latest = ckpts / "LATEST"
    if latest.is_file():
        cand = ckpts / latest.read_text().strip()
        if (cand / "manifest.json").is_file():
            return cand
    found = sorted(p for p in ckpts.glob("step_*") if (p / "manifest.json").is_file()) if ckpts.is_dir() else []
    if found:
        return found[-1]
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    raise CheckpointError(f"{path} holds no complete checkpoint")


def read_checkpoint_config(path: str | Path) -> dict[str, Any]:
    """The config.json of a checkpoint (or of a run dir's newest checkpoint)."""
    return read_checkpoint_json(resolve_checkpoint(path) / "config.json")


def read_checkpoint_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file (config or manifest); unreadable or non-UTF-8 content is a CheckpointError."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is corrupt: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is corrupt: not a JSON object")
    return data


def newest_verified_checkpoint(run_dir: str | Path) -> tuple[Path, list[str]]:
    """The newest checkpoint of a run that passes its checksums, and one note per newer one skipped (and why)."""
    ckpts = Path(run_dir) / "checkpoints"
    found = sorted((p for p in ckpts.glob("step_*") if (p / "manifest.json").is_file()), reverse=True)
    skipped = []
    for ckpt in found:
        try:
            verify_checkpoint(ckpt)
        except CheckpointError as exc:
            skipped.append(f"skipping {ckpt.name}: {exc}")
            continue
        return ckpt, skipped
    if skipped:
        raise CheckpointError(f"no intact checkpoint in {ckpts}: " + "; ".join(skipped))
    raise CheckpointError(f"{run_dir} holds no complete checkpoint")


def is_sharded(ckpt: Path) -> bool:
    """Whether a checkpoint was written by several ranks (torch.distributed.checkpoint files, no safetensors)."""
    return (Path(ckpt) / SHARDED_METADATA).is_file()


def read_sharded(ckpt: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The full (unsharded) tensors under `prefix` of a sharded checkpoint, in this one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        meta = dcp.FileSystemReader(str(ckpt)).read_metadata()
        want = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()
                if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(want, checkpoint_id=str(ckpt), no_dist=True)
    except (OSError, RuntimeError, ValueError, KeyError, EOFError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            raise
        raise CheckpointError(f"{ckpt}: unreadable sharded checkpoint ({str(exc).splitlines()[0][:200]})") from exc
    return {k.removeprefix(prefix): v for k, v in want.items()}


def read_weights(ckpt: Path, model: LanguageModel, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A checkpoint's weights as a state dict for `model` (packed masks unpacked, completeness checked)."""
    if is_sharded(ckpt):
        weights = {k: v.to(device) for k, v in read_sharded(ckpt, SHARDED_MODEL_PREFIX).items()}
    else:
        weights = load_file(str(Path(ckpt) / "model.safetensors"), device=str(device))
    weights = unpack_mask_weights(weights, model)
    rows_file = Path(ckpt) / TABLE_ROWS_FILE
    if rows_file.is_file() and TABLE_WEIGHT in model.state_dict():  # a table kept on disk, into memory
        weights[TABLE_WEIGHT] = dense_table(rows_file).to(device)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = [k for k, v in weights.items() if k in shapes and tuple(v.shape) != shapes[k]]
    if wrong:
        k = wrong[0]
        raise CheckpointError(f"{ckpt}: {k} has shape {tuple(weights[k].shape)} but the model needs {shapes[k]} "
                              "(was the model shape changed?)")
    missing = set(model.state_dict()) - set(weights)
    if missing:
        raise CheckpointError(f"{ckpt}: weights missing for {sorted(missing)[:5]}")
    return weights


def load_training_state(ckpt: Path, mmap: bool = False) -> dict[str, Any]:
    """The optimizer/loader/RNG state saved with a checkpoint.

    mmap: map state.pt instead of reading it, so only the parts used are read (one rank's rows of the table's
    Adam moments); the tensors are then backed by the file (copy-on-write): clone what is kept."""
    f = Path(ckpt) / "state.pt"
    if not f.is_file():
        raise CheckpointError(f"{ckpt} has no training state (a weights-only checkpoint cannot be resumed)")
    state = torch.load(f, map_location="cpu", weights_only=False, mmap=mmap)
    if is_sharded(ckpt):
        flat = read_sharded(ckpt, SHARDED_OPTIM_PREFIX)
        named: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in flat.items():
            name, _, field = key.rpartition(".")
            named.setdefault(name, {})[field] = value
        state["optimizer"] = {"named": named}
    return state


def prune_checkpoints(ckpts_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (and any stale temp dirs); one that a reader holds
    (`reading_checkpoint`) is left for the next prune."""
    ckpts_dir = Path(ckpts_dir)
    done = sorted(p for p in ckpts_dir.glob("step_*") if (p / "manifest.json").is_file())
    for old in done[: max(0, len(done) - keep)]:
        fd = os.open(old, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # an export is reading it
            # Renamed first, so that a kill during the delete leaves a marked leftover, never a half checkpoint.
            doomed = old.with_name(f".{old.name}{DELETING_SUFFIX}")
            os.replace(old, doomed)
        finally:
            os.close(fd)
        shutil.rmtree(doomed, ignore_errors=True)
    remove_leftovers(ckpts_dir)


@contextlib.contextmanager
def reading_checkpoint(path: str | Path, attempts: int = 10) -> Iterator[Path]:
    """The checkpoint `path` names (a run's newest), held for reading until the block ends: the pruning of a run
    still training skips it, so a reader (an export of a run with keep_checkpoints = 1) never sees it vanish."""
    for _ in range(attempts):
        ckpt = resolve_checkpoint(path)
        try:
            fd = os.open(ckpt, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue  # pruned between being found and opened: the newest is another one now
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a pruner holds it, which then renames it away
            try:
                held = os.path.samestat(os.fstat(fd), os.stat(ckpt))
            except FileNotFoundError:
                held = False
            if held:
                yield ckpt
                return
        finally:
            os.close(fd)
    raise CheckpointError(f"{path}: its newest checkpoint was replaced {attempts} times while being opened; "
                          "try again")


def remove_leftovers(ckpts_dir: Path) -> list[Path]:
    """Remove what killed writers and pruners leave behind; call only while holding the run's lock.

    Provably incomplete: temp dirs of `save_checkpoint`, dirs renamed for deletion, temp files of
    `atomic_write_bytes`, and `step_*` dirs without manifest.json (a checkpoint is renamed into place only
    after its manifest is written, so such a dir can only be one whose deletion was cut short).
    """
    ckpts_dir = Path(ckpts_dir)
    if not ckpts_dir.is_dir():
        return []
    stale = [*ckpts_dir.glob(".step_*.tmp*"), *ckpts_dir.glob(f".step_*{DELETING_SUFFIX}"),
             *ckpts_dir.glob(".LATEST.*.tmp"),
             *(p for p in ckpts_dir.glob("step_*") if p.is_dir() and not (p / "manifest.json").exists())]
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale
