"""How a training run spreads over processes: the interface the Trainer calls, and its one-process form.

The Trainer never imports plelab.parallel. It calls a `Distribution`: `SingleProcess` (below) by default, or
`plelab.parallel.engine.Parallel`, which implements the same methods for the ranks torchrun started (the PLE
table split by vocabulary, DDP / FSDP2 over the rest, sharded checkpoints) and is handed to the Trainer by
whoever starts the run (`plelab train` does, through `plelab.parallel.engine.from_environment`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from plelab.errors import PlelabError
from plelab.runs.checkpoint import load_training_state, read_weights, save_checkpoint
from plelab.training.disk_table import disk_table

T = TypeVar("T")


class PeerLost(PlelabError):
    """A collective failed because another rank died or hung: every surviving rank says so (one line each)."""


@dataclass(frozen=True)
class World:
    """This process's place among the ranks: rank, world size, rank on this node."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one rank that writes logs, metrics, progress and run-dir files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one rank."""
        return self.size > 1


def world_from_env(env: dict[str, str] | None = None) -> World:
    """The World torchrun describes in RANK / WORLD_SIZE / LOCAL_RANK (one rank when they are absent)."""
    env = os.environ if env is None else env
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as exc:
        raise PlelabError(f"malformed torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {exc}") from None
    if size < 1 or not 0 <= rank < size:
        raise PlelabError(f"malformed torchrun environment: RANK={rank} WORLD_SIZE={size}")
    return World(rank, size, local)


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them (names unchanged)."""
    for layer in model.layers:
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)


class Distribution(Protocol):
    """What the Trainer asks of the processes it runs on (see the module docstring)."""

    world: World
    device: torch.device
    mode: str
    """What the run does across processes: "none" (one process), "ddp" or "fsdp"."""

    def materialize(self, skeleton: nn.Module) -> nn.Module:
        """Real weights for a meta-device model on this rank's device (only this rank's rows of a split table)."""

    def wrap(self, model: nn.Module, bf16: bool = False) -> nn.Module:
        """Prepare the model for training here (activation checkpointing, sharding, DDP / FSDP); the module to call."""

    def grad_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Around one micro-batch's forward + backward: synchronise gradients only on the last one."""

    def mean(self, value: float) -> float:
        """The mean of a per-rank float (the loss) over all ranks."""

    def any_rank(self, flag: bool) -> bool:
        """Whether flag is true on any rank (the same answer everywhere)."""

    def on_main(self, fn: Callable[[], T]) -> T | None:
        """fn on rank 0 only, its failure raised on every rank."""

    def broadcast(self, value: Any) -> Any:
        """Rank 0's value on every rank."""

    def sharded(self, p: torch.Tensor) -> bool:
        """Whether p holds only this rank's part (its squared gradient is summed over ranks in the norm)."""

    def save(self, ckpt_dir: Path, model: nn.Module, optimizer: Any, train_config: dict[str, Any],
             state: dict[str, Any], tokenizer: Path | None) -> Path:
        """Write a complete checkpoint of every rank's state (every rank calls it)."""

    def load(self, ckpt: Path, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        """Load any checkpoint into this rank's model and optimizer; returns the trainer state to restore."""

    def peer_failure(self, exc: BaseException) -> str | None:
        """The gist of exc when it is a collective failing because another rank died or hung, else None."""

    def close(self) -> None:
        """Leave the other ranks (after the caller dropped the model and optimizer)."""


class SingleProcess:
    """The Distribution of a run in one process: no collectives, plain checkpoints."""

    def __init__(self, cfg: Any, device: torch.device):
        self.world = world_from_env()
        if self.world.distributed:
            raise PlelabError(f"started on {self.world.size} ranks (torchrun), but this Trainer was given no "
                              "distribution for them: pass distribution=plelab.parallel.engine.from_environment(cfg) "
                              "(as `plelab train` does)")
        self.device = device
        self.mode = "none"
        self.activation_checkpointing = cfg.activation_checkpointing

    def materialize(self, skeleton: nn.Module) -> nn.Module:
        return skeleton.materialize(self.device)

    def wrap(self, model: nn.Module, bf16: bool = False) -> nn.Module:  # noqa: ARG002 - one process: no sharding
        if self.activation_checkpointing:
            checkpoint_activations(model)
        return model

    @contextlib.contextmanager
    def grad_sync(self, last: bool) -> Iterator[None]:  # noqa: ARG002 - nothing to synchronise
        yield

    def mean(self, value: float) -> float:
        return value

    def any_rank(self, flag: bool) -> bool:
        return flag

    def on_main(self, fn: Callable[[], T]) -> T | None:
        return fn()

    def broadcast(self, value: Any) -> Any:
        return value

    def sharded(self, p: torch.Tensor) -> bool:  # noqa: ARG002 - nothing is sharded in one process
        return False

    def save(self, ckpt_dir: Path, model: nn.Module, optimizer: Any, train_config: dict[str, Any],  # noqa: ARG002
             state: dict[str, Any], tokenizer: Path | None) -> Path:
        table = disk_table(model)  # a table on disk writes its touched rows beside the other weights
        return save_checkpoint(ckpt_dir, model, train_config, state, tokenizer, device=str(self.device),
                               extra=table.save_rows if table is not None else None)

    def load(self, ckpt: Path, model: nn.Module, optimizer: Any) -> dict[str, Any]:  # noqa: ARG002
        state = load_training_state(ckpt)  # the optimizer's state is in it: the trainer restores it
        model.load_state_dict(read_weights(ckpt, model, self.device))
        table = disk_table(model)
        if table is not None:
            table.restore(ckpt)
        return state

    def peer_failure(self, exc: BaseException) -> str | None:  # noqa: ARG002 - there are no peers
        return None

    def close(self) -> None:
        pass
