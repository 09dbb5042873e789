"""normal_rows_: a slice of a table drawn alone holds exactly the numbers the whole draw gives it."""

from __future__ import annotations

import pytest
import torch

from plelab.model import row_init
from plelab.model.row_init import normal_rows_, skip_normal_


def whole_and_next(total: int, dim: int, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole (total, dim) draw, and the next numbers the generator gives after it."""
    g = torch.Generator().manual_seed(seed)
    whole = torch.empty(total, dim).normal_(0.0, 0.02, generator=g)
    return whole, torch.empty(37).normal_(generator=g)


def rows_and_next(first: int, n: int, total: int, dim: int, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = normal_rows_(torch.empty(n, dim), 0.02, g, first, total)
    return rows, torch.empty(37).normal_(generator=g)


SHAPES = [(258, 16), (259, 24), (7, 3), (5, 3), (1, 17), (3, 5), (1000, 33), (64, 1)]


@pytest.mark.parametrize("total,dim", SHAPES)
@pytest.mark.parametrize("parts", [2, 3, 4])
def test_every_split_of_the_table_equals_the_whole_draw_bit_for_bit(total, dim, parts, monkeypatch):
    monkeypatch.setattr(row_init, "CHUNK", 64)  # many chunks per part, so chunk seams are tested too
    whole, after = whole_and_next(total, dim)
    per = -(-total // parts)
    pieces = []
    for r in range(parts):
        lo, hi = min(total, r * per), min(total, (r + 1) * per)
        rows, nxt = rows_and_next(lo, hi - lo, total, dim)
        assert torch.equal(nxt, after), "the generator must end where the whole draw leaves it"
        pieces.append(rows)
    assert torch.equal(torch.cat(pieces), whole)


def test_any_single_row_range_equals_the_whole_draw(monkeypatch):
    monkeypatch.setattr(row_init, "CHUNK", 32)
    total, dim = 41, 7  # 287 values: a partial last block
    whole, after = whole_and_next(total, dim)
    for first in range(total):
        for n in (0, 1, 2, 5, total - first):
            n = min(n, total - first)
            rows, nxt = rows_and_next(first, n, total, dim)
            assert torch.equal(rows, whole[first:first + n]), (first, n)
            assert torch.equal(nxt, after), (first, n)


def test_the_whole_table_is_plain_normal_and_a_bad_range_is_refused():
    whole, _ = whole_and_next(10, 4)
    assert torch.equal(rows_and_next(0, 10, 10, 4)[0], whole)
    with pytest.raises(ValueError, match="not inside"):
        normal_rows_(torch.empty(3, 4), 0.02, torch.Generator(), 9, 10)


@pytest.mark.parametrize("numel", [1, 15, 16, 17, 100, 4101, (1 << 20) + 3])
def test_skipping_a_draw_leaves_the_generator_where_the_draw_does(numel):
    drawn = torch.Generator().manual_seed(5)
    torch.empty(numel).normal_(0.0, 0.0, generator=drawn)
    skipped = torch.Generator().manual_seed(5)
    skip_normal_(skipped, numel)
    assert torch.equal(torch.rand(8, generator=drawn), torch.rand(8, generator=skipped))
