"""FFN variants: MGLU masks (straight-through, packed at 1 bit), low-rank shapes, one interface."""

from __future__ import annotations

import torch

from plelab.model.config import FFNConfig
from plelab.model.ffn import MGLU, binary_mask, build_ffn, pack_mask, unpack_mask


def test_binary_mask_is_hard_forward_and_identity_backward():
    logits = torch.tensor([-0.5, 0.0, 0.3, 2.0], requires_grad=True)
    m = binary_mask(logits)
    assert m.tolist() == [0.0, 0.0, 1.0, 1.0]
    (m * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert logits.grad.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_mglu_with_one_mask_splits_the_shared_matrix():
    torch.manual_seed(0)
    ffn = MGLU(8, FFNConfig(kind="mglu", intermediate_size=16, mask_count=1))
    torch.nn.init.normal_(ffn.weight)
    torch.nn.init.normal_(ffn.mask_logits)
    x = torch.randn(3, 8)
    m = (ffn.mask_logits[0] > 0).float()
    ref = ffn.down_proj(torch.nn.functional.silu(x @ (ffn.weight * m).T) * (x @ (ffn.weight * (1 - m)).T))
    assert torch.allclose(ffn(x), ref, atol=1e-6)


def test_packed_mask_round_trips_at_one_bit_per_element():
    ffn = MGLU(8, FFNConfig(kind="mglu", intermediate_size=16, mask_count=2))
    torch.nn.init.normal_(ffn.mask_logits)
    bits = ffn.packed_masks()
    assert bits.nbytes == 2 * 16 * 8 // 8
    assert torch.equal(unpack_mask(bits, (2, 16, 8)), ffn.mask_logits.detach() > 0)
    assert torch.equal(unpack_mask(pack_mask(torch.tensor([True, False, True])), (3,)), torch.tensor([1, 0, 1]).bool())


def test_all_variants_share_the_interface():
    x = torch.randn(2, 5, 12)
    for cfg in (FFNConfig(), FFNConfig(kind="mglu"), FFNConfig(kind="lowrank", rank=4)):
        assert build_ffn(12, cfg)(x).shape == x.shape
