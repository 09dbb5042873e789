"""Optimizers: AdamW for the dense part, a lazy row-wise Adam for sparse PLE tables, one schedule.

Why lazy: dense AdamW over a V x L x dP table touches every row every step (moments decay, stale momentum
keeps moving unseen rows), so a step costs time and memory in proportion to V. With sparse gradients
only the rows in the batch have gradient; `torch.optim.SparseAdam` updates exactly those rows' moments
and values. Differences from dense AdamW, by design: (1) a row's moments only decay on steps that see it,
(2) unseen rows do not move at all (dense Adam keeps moving them with leftover momentum), (3) no weight
decay (tables are excluded from decay anyway), (4) bias correction uses the global step count.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from plelab.errors import PlelabError
from plelab.model.config import ModelConfig
from plelab.training.config import TrainConfig


class OptimizerGroupsError(PlelabError):
    """The optimizer's parameter groups do not cover the model's trainable parameters exactly once."""


def model_config_for(cfg: TrainConfig) -> ModelConfig:
    """The model a run builds: `cfg.model` with sparse PLE-table gradients iff `cfg.sparse_ple`."""
    return dataclasses.replace(cfg.model, ple=dataclasses.replace(cfg.model.ple, sparse_grad=cfg.sparse_ple))


def sparse_params(model: nn.Module) -> list[nn.Parameter]:
    """Weights of the embeddings that produce sparse gradients (the model config decides which)."""
    return [m.weight for m in model.modules() if isinstance(m, nn.Embedding) and m.sparse and m.weight.requires_grad]


def no_decay(name: str, p: torch.Tensor) -> bool:
    """Norms, embeddings, PLE tables, gates and vectors get no weight decay."""
    return p.ndim < 2 or "embed" in name or "norm" in name or name.endswith(".gate")


def check_coverage(model: nn.Module, groups: list[list[torch.Tensor]]) -> None:
    """Raise OptimizerGroupsError unless `groups` hold every trainable parameter of `model` exactly once."""
    trainable = {id(p): name for name, p in model.named_parameters() if p.requires_grad}
    counts = Counter(id(p) for group in groups for p in group)
    missing = [name for i, name in trainable.items() if counts[i] == 0]
    duplicated = [trainable[i] for i, c in counts.items() if c > 1 and i in trainable]
    foreign = sum(1 for i in counts if i not in trainable)
    problems = [f"missing {missing}" if missing else "", f"duplicated {duplicated}" if duplicated else "",
                f"{foreign} tensor(s) that are not trainable parameters of the model" if foreign else ""]
    if any(problems):
        raise OptimizerGroupsError(
            "optimizer groups must hold every trainable parameter exactly once: " + "; ".join(filter(None, problems))
        )


class Optimizer:
    """AdamW (dense params) + SparseAdam (embeddings with sparse gradients) behind one step/zero_grad/state API.

    Which parameters are sparse is the model's choice (`ple.sparse_grad`, set from the training config by
    `model_config_for`); the optimizer only reads it, and refuses a model that disagrees with `cfg.sparse_ple`.
    """

    def __init__(self, model: nn.Module, cfg: TrainConfig, fused: bool = False):
        sparse = sparse_params(model)
        if cfg.model.ple.dim > 0 and bool(sparse) != cfg.sparse_ple:
            raise ValueError(
                f"sparse_ple = {cfg.sparse_ple} but the model's PLE table has "
                f"{'sparse' if sparse else 'dense'} gradients; build it from model_config_for(train_config)"
            )
        sparse_ids = {id(p) for p in sparse}
        decay, plain = [], []
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in sparse_ids:
                (plain if no_decay(name, p) else decay).append(p)
        check_coverage(model, [decay, plain, sparse])
        betas = (cfg.beta1, cfg.beta2)
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": plain, "weight_decay": 0.0}]
        kwargs = {"fused": True} if fused else {"foreach": True}
        self.dense = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=betas, **kwargs)
        self.sparse = torch.optim.SparseAdam(sparse, lr=cfg.lr, betas=betas) if sparse else None
        self.optimizers = [o for o in (self.dense, self.sparse) if o is not None]
        self.names = {id(p): name for name, p in model.named_parameters()}
        # Tables that keep their Adam moments themselves (a table on disk: plelab.training.disk_table): the lazy
        # Adam starts from their moments, and the moments stay out of state_dict (their checkpoint holds them).
        self.external = {id(m.weight): m for m in model.modules() if hasattr(m, "adam_state") and id(m.weight) in
                         sparse_ids}
        for table in self.external.values():
            self.sparse.state[table.weight] = {"step": 0, **table.adam_state()}

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of every group."""
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr

    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self) -> None:
        """Drop all gradients."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        """Both optimizers' states (of a table that keeps its own moments, only the step)."""
        sparse = self.sparse.state_dict() if self.sparse else None
        for i, p in enumerate(p for g in (self.sparse.param_groups if self.sparse else []) for p in g["params"]):
            if id(p) in self.external and i in sparse["state"]:
                sparse["state"][i] = {"step": sparse["state"][i]["step"]}
        return {"dense": self.dense.state_dict(), "sparse": sparse}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        if "named" in state:  # written by a sharded (multi-rank) checkpoint
            self.load_named_state(state["named"])
            return
        self.dense.load_state_dict(state["dense"])
        if self.sparse is not None and state.get("sparse") is not None:
            self.sparse.load_state_dict(state["sparse"])
        for table in self.external.values():  # the moments the table itself restored, at the saved step
            step = self.sparse.state.get(table.weight, {}).get("step", 0)
            self.sparse.state[table.weight] = {"step": step, **table.adam_state()}

    def named_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Per-parameter state by parameter name: {name: {exp_avg, exp_avg_sq, step (0-dim tensor)}}.

        The form sharded checkpoints store (independent of group layout and world size)."""
        out = {}
        for opt in self.optimizers:
            for p, st in opt.state.items():
                if st:
                    step = st["step"]
                    out[self.names[id(p)]] = {"exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"],
                                              "step": step if torch.is_tensor(step) else torch.tensor(float(step))}
        return out

    def named_params(self) -> dict[str, torch.Tensor]:
        """Every parameter this optimizer updates, by name."""
        return {self.names[id(p)]: p for opt in self.optimizers for g in opt.param_groups for p in g["params"]}

    def load_named_state(self, named: dict[str, dict[str, torch.Tensor]], copy: bool = True) -> None:
        """Restore what `named_state` returned (tensors already shaped like this optimizer's parameters).

        copy=False: the moments are taken as they are (the caller made them for this optimizer alone; on the
        parameter's device no second copy of a large table's moments is made)."""
        for opt in self.optimizers:
            sparse = opt is self.sparse
            for group in opt.param_groups:
                for p in group["params"]:
                    st = named.get(self.names[id(p)])
                    if st is None:
                        continue
                    step = st["step"].detach().clone().float()
                    moments = {k: st[k].detach().to(p.device) for k in ("exp_avg", "exp_avg_sq")}
                    if copy:
                        moments = {k: v.clone() for k, v in moments.items()}
                    opt.state[p] = {"step": int(step.item()) if sparse else step, **moments}

    def named_from_state_dict(self, state: dict[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
        """A `state_dict()` of a single-process Optimizer over the same parameter names, in `named_state` form."""
        if "named" in state:
            return state["named"]
        out = {}
        for key, opt in (("dense", self.dense), ("sparse", self.sparse)):
            saved = state.get(key)
            if opt is None or saved is None:
                continue
            order = [p for g in opt.param_groups for p in g["params"]]
            saved_order = [i for g in saved["param_groups"] for i in g["params"]]
            for p, idx in zip(order, saved_order, strict=True):
                st = saved["state"].get(idx)
                if st:
                    step = st["step"]
                    out[self.names[id(p)]] = {"exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"],
                                              "step": step if torch.is_tensor(step) else torch.tensor(float(step))}
        return out


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr, then cosine decay to cfg.lr * cfg.min_lr_ratio at cfg.max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def _sq_sum(grads: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squares of (local parts of) dense and sparse gradients, on the device."""
    def local(g: torch.Tensor) -> torch.Tensor:
        g = g.to_local() if hasattr(g, "to_local") else g  # a DTensor's own shard
        return (g.coalesce().values() if g.is_sparse else g).detach().float()
    return torch.stack([local(g).pow(2).sum() for g in grads]).sum()


def grad_norm_and_clip(
    params: list[torch.Tensor], max_norm: float, sharded: Callable[[torch.Tensor], bool] | None = None
) -> float:
    """Global L2 norm over dense and sparse gradients; scale them down to max_norm when above it.

    sharded: on several ranks, tells which parameters hold only this rank's part (sharded table, FSDP); their
    squares are summed over ranks, the others (replicated, already averaged) count once."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads and sharded is None:
        return 0.0
    if sharded is None:
        # Sum on the device and synchronise once (one .item() per step, not one per tensor).
        sq = torch.stack([(g.coalesce().values() if g.is_sparse else g).detach().float().pow(2).sum() for g in grads])
        norm = float(sq.sum().sqrt())
    else:
        import torch.distributed as dist

        own = [p.grad for p in params if p.grad is not None and sharded(p)]
        rep = [p.grad for p in params if p.grad is not None and not sharded(p)]
        part = _sq_sum(own) if own else torch.zeros((), device=grads[0].device if grads else "cpu")
        dist.all_reduce(part)  # every rank calls it, also with no gradient of its own
        norm = float((part + (_sq_sum(rep) if rep else 0.0)).sqrt())
    if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads:
            g.mul_(scale)
    return norm
