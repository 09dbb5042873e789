"""Sharded checkpoints: torch.distributed.checkpoint (DCP) files, with the guarantees of `runs/checkpoint.py`.

Every rank writes its own shards (the PLE table rows it owns and their Adam moments; FSDP's parameter and
optimizer shards) into one temp dir; rank 0 adds config.json, tokenizer.json and state.pt (step, loader, RNG,
callbacks) and seals it with `commit_checkpoint` (fsync, manifest last, rename). Tensors are stored as global
tensors (`Shard(0)` DTensors for the sharded ones), so DCP reshards on load: a checkpoint resumes on another
world size, and `runs/checkpoint.read_weights` reads it into one process. A single-process checkpoint
resumes on N ranks too (each rank keeps only its part of the table after reading it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from plelab.parallel.group import World, broadcast, on_main
from plelab.parallel.table import ShardedEmbedding, shard_bounds
from plelab.runs.checkpoint import (
    SHARDED_MODEL_PREFIX,
    SHARDED_OPTIM_PREFIX,
    CheckpointError,
    commit_checkpoint,
    is_sharded,
    load_training_state,
    new_checkpoint_tmp,
    sha256_file,
    unpack_mask_weights,
)
from plelab.training.optim import Optimizer
from plelab.util.dataclass_config import to_dict
from plelab.util.safetensors import read_header, read_rows_into

TABLE_WEIGHT = "per_layer_inputs.embed_tokens_per_layer.weight"
"""The PLE table's parameter name (the one tensor sharded by vocabulary)."""


class ShardLayout:
    """Which tensors of a model hold only this rank's part, and how that part looks as the whole tensor."""

    def __init__(self, world: World, table: ShardedEmbedding | None, device_type: str = "cpu"):
        self.world, self.table = world, table
        self._mesh = None
        self.device_type = device_type

    @property
    def mesh(self):  # noqa: ANN201 - DeviceMesh (imported lazily with the rest of torch.distributed)
        """A 1-D device mesh over all ranks."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.device_type, (self.world.size,))
        return self._mesh

    def as_global(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """`local` as DCP should see it: the table's rows as a Shard(0) DTensor of the full table."""
        if self.table is None or name != TABLE_WEIGHT or isinstance(local, DTensor):
            return local
        rows, dim = self.table.num_rows, local.shape[1]
        return DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False, shape=(rows, dim), stride=(dim, 1))

    def part_of(self, name: str, full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """This rank's part of a full (single-process) tensor, shaped like the local tensor `like` (the table's
        rows are a view: the caller copies them)."""
        if isinstance(like, DTensor):
            lo, hi = shard_bounds(full.shape[0], self.world)
            return DTensor.from_local(full[lo:hi].clone(), like.device_mesh, like.placements, run_check=False,
                                      shape=full.shape, stride=full.stride())
        if self.table is not None and name == TABLE_WEIGHT:
            lo, hi = shard_bounds(full.shape[0], self.world)
            return full[lo:hi]
        return full


def flat_state(model: nn.Module, optimizer: Optimizer, layout: ShardLayout) -> dict[str, torch.Tensor]:
    """Weights and optimizer state as DCP sees them: `model/<name>`, `optim/<name>.<field>`, sharded ones global."""
    out = {SHARDED_MODEL_PREFIX + k: layout.as_global(k, v) for k, v in model.state_dict().items()}
    for name, state in optimizer.named_state().items():
        for field, t in state.items():
            out[f"{SHARDED_OPTIM_PREFIX}{name}.{field}"] = t if field == "step" else layout.as_global(name, t)
    return out


def save_sharded(ckpt_dir: Path, model: nn.Module, optimizer: Optimizer, layout: ShardLayout,
                 train_config: dict[str, Any], state: dict[str, Any] | None, tokenizer: Path | None,
                 device: str | None = None) -> Path:
    """Write a sharded checkpoint of all ranks into `ckpt_dir` atomically (a collective: every rank calls it).

    state: the trainer's state without the optimizer (only rank 0's is written); device: rank 0's resolved
    training device, recorded in config.json."""
    world = layout.world
    tmp = Path(broadcast(world, str(new_checkpoint_tmp(ckpt_dir)) if world.is_main else None))
    try:
        dcp.save(flat_state(model, optimizer, layout), checkpoint_id=str(tmp))

        def seal() -> None:
            files = sorted(p.name for p in tmp.iterdir())
            tok_hash = None
            if tokenizer is not None:
                shutil.copyfile(tokenizer, tmp / "tokenizer.json")
                tok_hash = sha256_file(tmp / "tokenizer.json")
                files.append("tokenizer.json")
            config = {"model": to_dict(model.config), "train": train_config, "tokenizer": tok_hash,
                      "world_size": world.size, **({"device": device} if device is not None else {})}
            (tmp / "config.json").write_text(json.dumps(config, indent=2))
            torch.save({**(state or {}), "optimizer": None}, tmp / "state.pt")
            commit_checkpoint(tmp, ckpt_dir, [*files, "config.json", "state.pt"])

        on_main(world, seal)
    except BaseException:
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ckpt_dir


def _copy_into(target: torch.Tensor, source: torch.Tensor) -> None:
    dst = target.to_local() if isinstance(target, DTensor) else target
    dst.copy_(source.to_local() if isinstance(source, DTensor) else source)


def load_sharded(ckpt: Path, model: nn.Module, optimizer: Optimizer, layout: ShardLayout) -> dict[str, Any]:
    """Load weights and optimizer state from any checkpoint (sharded or not, any world size) into this rank's
    parts (a collective); returns the trainer state (step, loader, RNG, callbacks) to restore."""
    if not is_sharded(ckpt):
        return _load_single(ckpt, model, optimizer, layout)
    meta = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    model_state = model.state_dict()
    targets = {SHARDED_MODEL_PREFIX + k: layout.as_global(k, v) for k, v in model_state.items()}
    missing = [k for k in targets if k not in meta]
    if missing:
        names = [k.removeprefix(SHARDED_MODEL_PREFIX) for k in missing]
        raise CheckpointError(f"{ckpt}: weights missing for {names[:5]}")
    local: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in optimizer.named_params().items():
        if f"{SHARDED_OPTIM_PREFIX}{name}.step" not in meta:
            continue
        fields = {"exp_avg": torch.zeros_like(p.detach()), "exp_avg_sq": torch.zeros_like(p.detach()),
                  "step": torch.zeros((), dtype=torch.float32)}
        local[name] = fields
        for field, t in fields.items():
            targets[f"{SHARDED_OPTIM_PREFIX}{name}.{field}"] = t if field == "step" else layout.as_global(name, t)
    try:
        dcp.load(targets, checkpoint_id=str(ckpt))
    except (RuntimeError, ValueError, KeyError) as exc:
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{ckpt}: cannot load this sharded checkpoint ({why})") from exc
    for k, v in model_state.items():
        _copy_into(v, targets[SHARDED_MODEL_PREFIX + k])  # a no-op where DCP wrote in place
    optimizer.load_named_state(local)
    state = load_training_state_only(ckpt)
    return state


def load_training_state_only(ckpt: Path) -> dict[str, Any]:
    """state.pt of a sharded checkpoint (its optimizer entry is empty: the optimizer lives in the DCP files)."""
    f = Path(ckpt) / "state.pt"
    if not f.is_file():
        raise CheckpointError(f"{ckpt} has no training state (a weights-only checkpoint cannot be resumed)")
    return torch.load(f, map_location="cpu", weights_only=False)


def _load_single(ckpt: Path, model: nn.Module, optimizer: Optimizer, layout: ShardLayout) -> dict[str, Any]:
    """A single-process checkpoint into this rank's parts: each rank reads its rows of the PLE table (and of its
    Adam moments) and the other tensors one at a time, never the whole table."""
    from safetensors import safe_open

    model_state = model.state_dict()
    with safe_open(str(Path(ckpt) / "model.safetensors"), framework="pt") as f:
        missing = sorted(set(model_state) - {k.removesuffix("mask_bits") + "mask_logits" if k.endswith("mask_bits")
                                             else k for k in f.keys()})
        if missing:
            raise CheckpointError(f"{ckpt}: weights missing for {missing[:5]}")
        for key in f.keys():
            if layout.table is not None and key == TABLE_WEIGHT:
                shape = tuple(f.get_slice(key).get_shape())
                if shape != (layout.table.num_rows, layout.table.embedding_dim):
                    raise CheckpointError(f"{ckpt}: {key} has shape {shape} but the model needs "
                                          f"{(layout.table.num_rows, layout.table.embedding_dim)} (was the model "
                                          "shape changed?)")
                # pread straight into this rank's rows: safe_open's memory map would leave the pages in RSS.
                info = read_header(Path(ckpt) / "model.safetensors")[key]
                read_rows_into(info, shard_bounds(shape[0], layout.world)[0], model_state[key])
                continue
            (name, value), = unpack_mask_weights({key: f.get_tensor(key)}, model).items()
            target = model_state[name]
            whole = tuple(target.shape) if not isinstance(target, DTensor) else tuple(target.size())
            if tuple(value.shape) != whole:
                raise CheckpointError(f"{ckpt}: {name} has shape {tuple(value.shape)} but the model needs {whole} "
                                      "(was the model shape changed?)")
            _copy_into(target, layout.part_of(name, value, target))
    # mmap: only this rank's rows of the table's Adam moments are read from disk (and their pages let go).
    state = load_training_state(ckpt, mmap=True)
    params = optimizer.named_params()
    named = optimizer.named_from_state_dict(state.pop("optimizer"))
    local = {}
    for name, fields in named.items():
        local[name] = {}
        for field, t in fields.items():
            if field != "step" and layout.table is not None and name == TABLE_WEIGHT:
                local[name][field] = _mapped_rows(t, *shard_bounds(t.shape[0], layout.world))
            elif field == "step":
                local[name][field] = t
            else:  # copied out of the file mapping (so no copy is made again below)
                part = layout.part_of(name, t, params[name])
                local[name][field] = part if isinstance(part, DTensor) else part.clone()
    optimizer.load_named_state(local, copy=False)
    return state


def _mapped_rows(full: torch.Tensor, lo: int, hi: int, chunk_bytes: int = 64 << 20) -> torch.Tensor:
    """Rows [lo, hi) of a tensor `torch.load(mmap=True)` mapped from a file, copied out chunk by chunk, each
    chunk's pages handed back to the kernel once copied: the file's pages never pile up in this process's RSS.

    Safe because the mapping is private and never written: a page dropped (MADV_DONTNEED) is read again from
    the file if touched later (and `full` is not read again here anyway)."""
    out = torch.empty((hi - lo, *full.shape[1:]), dtype=full.dtype)
    step = max(1, chunk_bytes // max(1, full[0].numel() * full.element_size())) if full.shape[0] else 1
    for a in range(lo, hi, step):
        b = min(hi, a + step)
        out[a - lo : b - lo] = full[a:b]
        _drop_pages(full[a:b])
    return out


def _drop_pages(t: torch.Tensor) -> None:
    """madvise(MADV_DONTNEED) the whole pages inside t's bytes (Linux; elsewhere nothing happens)."""
    import ctypes
    import mmap
    import sys

    if not sys.platform.startswith("linux") or not t.numel():
        return
    page = mmap.PAGESIZE
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    first, last = -(-start // page) * page, end // page * page  # only pages wholly inside t
    if last > first:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4)  # 4 = MADV_DONTNEED
