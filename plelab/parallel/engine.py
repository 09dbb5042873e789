"""`Parallel`: how one training run spreads over the ranks torchrun started; in one process it does nothing.

The trainer asks it to wrap the model (shard the PLE table by vocabulary, then DDP or FSDP2 over the rest),
to hold back gradient synchronisation between micro-batches, to average the loss, to tell the gradient-norm
clipper which gradients are partial, and to save and load sharded checkpoints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from plelab.errors import PlelabError
from plelab.parallel import group
from plelab.parallel.checkpoint import TABLE_WEIGHT, ShardLayout, load_sharded, save_sharded
from plelab.parallel.table import ShardedEmbedding, shard_ple_table
from plelab.runs.checkpoint import load_training_state, read_weights, save_checkpoint
from plelab.training.distribution import Distribution, SingleProcess, checkpoint_activations, world_from_env
from plelab.training.optim import Optimizer
from plelab.util.device import pick_device

T = TypeVar("T")


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's keyword for 'do not broadcast buffers every forward' (renamed in torch 2.13)."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    new = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    return {"forward_sync_buffers": False} if new else {"broadcast_buffers": False}


def parallel_mode(requested: str, world: group.World) -> str:
    """What a run does on `world`: "none" in one process; on several ranks "ddp" for auto, else what was asked
    ("none" there is refused: the ranks would each train alone)."""
    if not world.distributed:
        return "none"
    if requested == "none":
        raise PlelabError(f"started on {world.size} ranks but parallel = \"none\"; set parallel = \"auto\", "
                          "\"ddp\" or \"fsdp\" (e.g. --set parallel=ddp)")
    return "ddp" if requested == "auto" else requested


class Parallel:
    """The ranks of this run and what the trainer does differently on them (see the module docstring)."""

    def __init__(self, cfg: Any, device: torch.device):
        self.world = group.world_from_env()
        if self.world.distributed and device.type == "cuda" and device.index is None:
            device = torch.device("cuda", self.world.local_rank)  # one GPU per rank on each node
            torch.cuda.set_device(device)
        self.device = device
        self.mode = parallel_mode(cfg.parallel, self.world)
        self.activation_checkpointing = cfg.activation_checkpointing
        n = self.world.size
        if cfg.batch_size % n:
            raise PlelabError(f"batch_size {cfg.batch_size} is the global batch and must be divisible by the "
                              f"world size {n}; pick a multiple of {n}")
        if self.world.distributed and cfg.diagnostics_every:
            raise PlelabError("diagnostics_every needs the whole PLE table in one process, but on several ranks it "
                              "is split by vocabulary; set diagnostics_every = 0 and run `plelab diagnose` on "
                              "a checkpoint instead")
        self.table: ShardedEmbedding | None = None
        self.layout: ShardLayout | None = None
        self.wrapped: nn.Module | None = None
        group.init_group(self.world, device)

    @property
    def distributed(self) -> bool:
        """More than one rank."""
        return self.world.distributed

    def materialize(self, skeleton: nn.Module) -> nn.Module:
        """Real weights for a meta-device model (`LanguageModel.materialize`) on this rank's device; on several
        ranks the PLE table is cut to this rank's rows first, so no rank ever holds the whole table."""
        if self.distributed:
            self.table = shard_ple_table(skeleton, self.world)
        return skeleton.materialize(self.device)

    def wrap(self, model: nn.Module, bf16: bool = False) -> nn.Module:
        """Shard the PLE table (unless `materialize` did) and apply DDP / FSDP2 (in place where possible); returns
        the module to call."""
        if self.activation_checkpointing:
            checkpoint_activations(model)
        if not self.distributed:
            return model
        self.table = shard_ple_table(model, self.world)
        self.layout = ShardLayout(self.world, self.table, self.device.type)
        if self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            # The table is sharded, not replicated: DDP must neither broadcast nor all-reduce it.
            DDP._set_params_and_buffers_to_ignore_for_model(model, [TABLE_WEIGHT] if self.table else [])
            ids = [self.device.index or 0] if self.device.type == "cuda" else None
            # RoPE tables are the only buffers: constants, never synchronised after the start.
            self.wrapped = DDP(model, device_ids=ids, **_no_buffer_sync())
            return self.wrapped
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
            MixedPrecisionPolicy()
        for layer in model.layers:
            fully_shard(layer, mesh=self.layout.mesh, mp_policy=mp)
        ignored = {self.table.weight} if self.table is not None else None
        fully_shard(model, mesh=self.layout.mesh, mp_policy=mp, ignored_params=ignored)
        self.wrapped = model
        return model

    @contextlib.contextmanager
    def grad_sync(self, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward + backward: synchronise gradients only on the last one."""
        if self.mode == "ddp" and not last:
            with self.wrapped.no_sync():
                yield
            return
        if self.mode == "fsdp":
            self.wrapped.set_requires_gradient_sync(last)
        yield

    def mean(self, value: float) -> float:
        """The mean of a per-rank float (the loss) over all ranks."""
        return group.mean(self.world, value)

    def any_rank(self, flag: bool) -> bool:
        """Whether flag is true on any rank (the same answer everywhere)."""
        return group.any_rank(self.world, flag)

    def on_main(self, fn: Callable[[], T]) -> T | None:
        """fn on rank 0 only, its failure raised on every rank (see `group.on_main`)."""
        return group.on_main(self.world, fn)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's value on every rank."""
        return group.broadcast(self.world, value)

    def sharded(self, p: torch.Tensor) -> bool:
        """Whether p holds only this rank's part (its squared gradient is summed over ranks in the norm)."""
        return isinstance(p, DTensor) or (self.table is not None and p is self.table.weight)

    def save(self, ckpt_dir: Path, model: nn.Module, optimizer: Optimizer, train_config: dict[str, Any],
             state: dict[str, Any], tokenizer: Path | None) -> Path:
        """Write a sharded checkpoint (every rank calls it); in one process a plain one."""
        if not self.distributed:
            return save_checkpoint(ckpt_dir, model, train_config, state, tokenizer, device=str(self.device))
        state = {k: v for k, v in state.items() if k != "optimizer"}
        return save_sharded(ckpt_dir, model, optimizer, self.layout, train_config, state, tokenizer,
                            device=str(self.device))

    def load(self, ckpt: Path, model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
        """Load any checkpoint into this rank's parts (every rank calls it); returns the trainer state."""
        if not self.distributed:
            state = load_training_state(ckpt)
            model.load_state_dict(read_weights(ckpt, model, self.device))
            return state
        return load_sharded(ckpt, model, optimizer, self.layout)

    def peer_failure(self, exc: BaseException) -> str | None:
        """The gist of a collective's failure when another rank died or hung (None for any other error)."""
        return group.peer_failure_text(exc) if self.distributed and group.is_peer_failure(exc) else None

    def close(self) -> None:
        """Tear the process group down (after the caller dropped the model and optimizer)."""
        self.wrapped = None
        self.table = None
        self.layout = None
        group.destroy_group()


def from_environment(cfg: Any, device: torch.device | None = None) -> Distribution:
    """The Distribution of a run started here: `Parallel` on the ranks torchrun started, else one process."""
    device = pick_device(cfg.device) if device is None else device
    return Parallel(cfg, device) if world_from_env().distributed else SingleProcess(cfg, device)
