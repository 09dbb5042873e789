"""Initialise some rows of a table with exactly the numbers a draw of the whole table gives them.

A table split across processes (the PLE table under torchrun) must start as the one-process table does, bit for
bit, without any process drawing, or holding, the whole table. `normal_rows_` reproduces what
`torch.Tensor.normal_(0, std, generator)` writes into rows [first, first + n) of a (total, D) float32 table on
the CPU, drawing in chunks of `CHUNK` values, and leaves the generator where the whole draw leaves it (so what is
drawn next, e.g. the rest of the PLE parts, is unchanged too).

Why it can: on the CPU, `normal_` of a float32 tensor of N >= 16 contiguous values draws N uniforms from the
generator (one 32-bit draw each, as `uniform_` does), turns each aligned block of 16 into normals by Box-Muller
(value j pairs with j + 8), and when N is not a multiple of 16 redraws the last 16 values from 16 further
uniforms. So aligned blocks can be drawn apart: skip the uniforms before a block, draw the block with `normal_`,
and draw the last, partial, block together with the 16 before it. tests/model/test_row_init.py checks it against
the whole draw for many shapes, and tests/parallel checks the 2-rank table against the 1-process one.
"""

from __future__ import annotations

import torch

BLOCK = 16
"""Values per Box-Muller block of torch's CPU normal_."""

CHUNK = 1 << 20
"""Values drawn at a time (a multiple of BLOCK): the scratch memory is 4 MiB whatever the table's size."""


def _skip(generator: torch.Generator, count: int, scratch: torch.Tensor) -> None:
    """Advance `generator` by `count` 32-bit draws (uniform_ of a float32 takes one per value)."""
    while count > 0:
        m = min(count, scratch.numel())
        scratch[:m].uniform_(generator=generator)
        count -= m


def normal_rows_(rows: torch.Tensor, std: float, generator: torch.Generator, first: int, total: int) -> torch.Tensor:
    """Fill `rows` ((n, D)) with rows [first, first + n) of what `normal_(0, std, generator)` draws for a (total, D)
    table, leaving `generator` where that whole draw would; returns `rows`.

    Exact (bit for bit) for float32 tables of 16 values or more drawn on the CPU; anything else (a tiny table,
    another dtype) is drawn whole and sliced, which is still exact."""
    n, dim = rows.shape
    if not 0 <= first <= first + n <= total:
        raise ValueError(f"rows [{first}, {first + n}) are not inside a table of {total} rows")
    if first == 0 and n == total:
        return rows.normal_(0.0, std, generator=generator)
    N, a, b = total * dim, first * dim, (first + n) * dim
    if N < BLOCK or rows.dtype != torch.float32 or generator.device.type != "cpu":
        whole = torch.empty(total, dim, dtype=rows.dtype).normal_(0.0, std, generator=generator)
        return rows.copy_(whole[first : first + n])
    if not rows.is_contiguous() or rows.device.type != "cpu":
        return rows.copy_(normal_rows_(torch.empty(n, dim), std, generator, first, total))
    tail = N % BLOCK
    last_start = N - tail - BLOCK if tail else N  # the block drawn together with the partial one after it
    out = rows.view(-1)
    scratch = torch.empty(min(CHUNK + 2 * BLOCK, N))
    pos = min(a - a % BLOCK, last_start)
    _skip(generator, pos, scratch)
    drawn = pos
    while pos < b:
        end = min(pos + CHUNK, N)
        if tail and end > last_start:
            end = N  # this chunk ends the table: torch redraws its last 16 values from 16 further uniforms
        values = scratch[: end - pos].normal_(0.0, std, generator=generator)
        drawn = end + (BLOCK if end == N and tail else 0)
        lo, hi = max(a, pos), min(b, end)
        out[lo - a : hi - a].copy_(values[lo - pos : hi - pos])
        pos = end
    _skip(generator, N + (BLOCK if tail else 0) - drawn, scratch)
    return rows


def skip_normal_(generator: torch.Generator, numel: int) -> None:
    """Advance `generator` exactly as `normal_` of `numel` float32 values on the CPU would, keeping nothing (a
    table that starts at zero without being drawn, e.g. one on disk, leaves the generator where a drawn one does)."""
    if numel < BLOCK:  # below one block torch draws another way: draw it (a few values)
        torch.empty(numel).normal_(generator=generator)
        return
    _skip(generator, numel + (BLOCK if numel % BLOCK else 0), torch.empty(min(CHUNK, numel)))
