"""The PLE table split by vocabulary: each rank holds rows [lo, hi) and their optimizer state, nothing more.

Lookup (`ShardedEmbedding.forward`): all ranks gather every rank's ids, each looks up the ids it owns (a sparse
lookup, so the gradient names only those rows), and a variable-size all-to-all sends each row to the rank whose
position needs it (only owned rows travel: B x T x L x dP floats in all per step, not N times that). Backward
sends each position's gradient back to the row's owner the same way: the lazy sparse Adam then updates only the
rows that were seen, on their owner. Rows follow `torch.chunk` boundaries, which is what a `Shard(0)` DTensor of the
full table means, so torch.distributed.checkpoint can reshard the table to another world size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plelab.parallel.group import World


def shard_bounds(rows: int, world: World) -> tuple[int, int]:
    """Rows [lo, hi) of a `rows`-row table held by this rank (torch.chunk / DTensor Shard(0) boundaries)."""
    per = -(-rows // world.size)
    lo = min(rows, world.rank * per)
    return lo, min(rows, lo + per)


# torch >= 2.13 names it all_gather_single (all_gather_into_tensor is deprecated there).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _RouteRows(torch.autograd.Function):
    """Send rows to the ranks that need them (counts per rank both ways); backward sends the gradients back."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:  # noqa: ANN001
        ctx.send, ctx.recv = send, recv
        out = rows.new_empty(sum(recv), rows.shape[1])
        dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv, input_split_sizes=send)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001
        # Divided by N like DDP / FSDP average the dense gradients over ranks.
        back = grad.new_empty(sum(ctx.send), grad.shape[1])
        dist.all_to_all_single(back, (grad / dist.get_world_size()).contiguous(),
                               output_split_sizes=ctx.send, input_split_sizes=ctx.recv)
        return back, None, None


class ShardedEmbedding(nn.Embedding):
    """Rows [lo, hi) of a `num_rows` x D embedding; forward takes global ids and is a collective (all ranks call it)."""

    def __init__(self, shard: torch.Tensor, lo: int, num_rows: int, sparse: bool = True):
        super().__init__(shard.shape[0], shard.shape[1], sparse=sparse, _weight=shard, device=shard.device)
        self.lo, self.num_rows = lo, num_rows

    def extra_repr(self) -> str:
        return f"rows [{self.lo}, {self.lo + self.num_embeddings}) of {self.num_rows}, dim {self.embedding_dim}"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n, rank = dist.get_world_size(), dist.get_rank()
        per = -(-self.num_rows // n)  # rows per rank (shard_bounds)
        flat = ids.reshape(-1)
        m = flat.numel()
        gathered = torch.empty(n * m, dtype=flat.dtype, device=flat.device)
        _all_gather(gathered, flat.contiguous())
        # Rows this rank owns, in (destination rank, position) order: every rank's ids are gathered in rank order.
        mine = (gathered // per == rank).nonzero().squeeze(1)
        rows = F.embedding(gathered[mine] - self.lo, self.weight, sparse=self.sparse)
        send = torch.bincount(mine // m, minlength=n)
        # This rank's positions grouped by owner (stable: position order within each owner, as the owner sends).
        owner = flat // per
        order = torch.argsort(owner, stable=True)
        recv = torch.bincount(owner, minlength=n)
        received = _RouteRows.apply(rows, send.tolist(), recv.tolist())
        out = received.index_select(0, torch.argsort(order))
        return out.view(*ids.shape, self.embedding_dim)


def ple_table_module(model: nn.Module) -> nn.Embedding | None:
    """The model's PLE table (None for a model without PLE)."""
    inputs = getattr(model, "per_layer_inputs", None)
    return None if inputs is None else inputs.embed_tokens_per_layer


def shard_ple_table(model: nn.Module, world: World) -> ShardedEmbedding | None:
    """Replace the model's PLE table by this rank's rows of it (in place); returns the new module.

    On a meta-device model nothing is allocated: `LanguageModel.materialize` then draws only these rows, with the
    numbers the whole table would give them (a table already sharded is returned as it is)."""
    table = ple_table_module(model)
    if table is None or isinstance(table, ShardedEmbedding):
        return table
    lo, hi = shard_bounds(table.num_embeddings, world)
    sharded = ShardedEmbedding(table.weight.detach()[lo:hi].clone(), lo, table.num_embeddings, table.sparse)
    model.per_layer_inputs.embed_tokens_per_layer = sharded
    return sharded
