"""FFN variants: MGLU masks (straight-through, packed at 1 bit), one interface and exact counts for every kind,
clear errors for bad settings."""

from __future__ import annotations

import pytest
import torch

from plelab.cli.main import main
from plelab.model.config import FFN_KINDS, FFNConfig
from plelab.model.ffn import (
    MGLU,
    binary_mask,
    build_ffn,
    ffn_training_param_count,
    pack_mask,
    unpack_mask,
)
from plelab.util.dataclass_config import ConfigError

# The settings each kind needs beyond its name (a KeyError here means a new kind needs an entry).
KIND_SETTINGS = {
    "swiglu": {}, "mglu": {"mask_count": 2}, "lowrank": {"rank": 4},
    "moe": {"num_experts": 4, "top_k": 2, "expert_size": 8, "shared_expert": True}, "pruned": {"prune_to": 8},
}


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


@pytest.mark.parametrize("kind", FFN_KINDS)
def test_every_kind_maps_h_to_h_and_its_built_size_matches_the_analytic_count(kind):
    cfg = FFNConfig(kind=kind, intermediate_size=16, **KIND_SETTINGS[kind])
    x = torch.randn(2, 5, 12)
    assert build_ffn(12, cfg)(x).shape == x.shape
    with torch.device("meta"):
        skeleton = build_ffn(12, cfg)
    assert sum(p.numel() for p in skeleton.parameters()) == ffn_training_param_count(12, cfg)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(kind="dense"), "ffn.kind must be one of swiglu, mglu, lowrank, moe, pruned"),
        (dict(kind="moe", num_experts=4, top_k=5), "ffn.top_k must lie in 1..num_experts=4"),
        (dict(kind="pruned", prune_to=16), "ffn.prune_to must lie in 1..intermediate_size-1 = 15"),
        (dict(kind="pruned", prune_to=40), "ffn.prune_to"),
    ],
)
def test_bad_ffn_settings_are_config_errors(fields, message):
    with pytest.raises(ConfigError, match=message):
        FFNConfig(intermediate_size=16, **fields)


@pytest.mark.parametrize("setting", [["ffn.kind=dense"], ["ffn.kind=moe", "ffn.top_k=9"],
                                     ["ffn.kind=pruned", "ffn.prune_to=64"]])
def test_bad_ffn_settings_on_the_command_line_are_one_line_and_exit_2(setting, capsys):
    args = [a for s in setting for a in ("--set", s)]
    assert main(["params", "tiny", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ffn." in err
