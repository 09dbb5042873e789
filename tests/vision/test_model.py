"""VisionPLEModel: shapes, caption-only loss, where the visual table enters, the aux loss, bad configs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from vision_helpers import PATCH, VOCAB, K, P, planted_split

from plelab.model.config import ModelConfig
from plelab.util.dataclass_config import ConfigError
from plelab.vision.config import VisionConfig
from plelab.vision.model import (
    VisionBatch,
    VisionPLEModel,
    caption_targets,
    vision_param_counts,
    visual_model_config,
)

H = 32


def make_model(ple_dim: int = 8, aux_weight: float = 0.0, context: bool = True, seed: int = 0) -> VisionPLEModel:
    torch.manual_seed(seed)
    base = ModelConfig(vocab_size=VOCAB, hidden_size=H, num_layers=2, num_heads=2, max_seq_len=8, kernels="off")
    base.ple.context = context
    return VisionPLEModel(visual_model_config(base, ple_dim, K), P, PATCH * PATCH, K, aux_weight)


def batch(n: int = 4) -> tuple[VisionBatch, torch.Tensor]:
    s = planted_split(n, seed=3)
    inputs = VisionBatch(torch.from_numpy(s.pixels), torch.from_numpy(s.patch_ids), torch.from_numpy(s.captions))
    return inputs, caption_targets(inputs.captions, torch.from_numpy(s.caption_lengths), P)


def test_shapes_and_caption_targets():
    model = make_model()
    inputs, targets = batch()
    T = inputs.captions.shape[1]
    assert model.hidden_states(inputs).shape == (4, P + T, H)
    logits, loss = model(inputs, targets)
    assert logits.shape == (4, T, VOCAB) and loss.ndim == 0
    # -100 at patches 0..P-2; the last patch predicts caption token 0; padding (length 2 of 3) is -100.
    assert (targets[:, : P - 1] == -100).all()
    assert torch.equal(targets[:, P - 1 : P + 1], inputs.captions[:, :2])
    assert (targets[:, P + 1 :] == -100).all()


def test_a_leading_start_token_is_input_only():
    captions = torch.tensor([[7, 3, 4, 0], [7, 5, 0, 0], [2, 6, 0, 0]])
    targets = caption_targets(captions, torch.tensor([3, 2, 2]), patches=2, bos_id=7)
    assert targets.tolist() == [[-100, -100, 3, 4, -100, -100], [-100, -100, 5, -100, -100, -100],
                                [-100, 2, 6, -100, -100, -100]]


def test_only_caption_predictions_reach_the_loss():
    model = make_model()
    inputs, targets = batch()
    _, loss = model(inputs, targets)
    at_patch = targets.clone()
    at_patch[:, : P - 1] = 5  # a real token where a patch predicts a patch
    assert torch.equal(model(inputs, at_patch)[1], loss)
    first_caption = targets.clone()
    first_caption[:, P - 1] = (first_caption[:, P - 1] + 1) % VOCAB  # the last patch's prediction counts
    assert not torch.equal(model(inputs, first_caption)[1], loss)
    fused = model(inputs, targets, return_logits=False)[1]
    torch.testing.assert_close(fused, loss)


def test_visual_ple_off_has_no_visual_parameters():
    off = make_model(ple_dim=0)
    assert off.visual_ple is None and off.aux_head is None
    assert not [n for n, _ in off.named_parameters() if "ple" in n or "per_layer" in n]
    on = make_model(ple_dim=8)
    assert on.visual_ple.embed_tokens_per_layer.weight.shape == (K, 2 * 8)
    # Same seed, same trunk and patch embedding whatever dP is: runs with and without the table compare.
    for name, p in off.named_parameters():
        assert torch.equal(p, dict(on.named_parameters())[name]), name


@pytest.mark.parametrize("context", [True, False])
def test_visual_ple_enters_at_patch_positions_only(context):
    model = make_model(context=context)
    seen = []
    model.trunk.layers[0].ple.register_forward_hook(lambda m, args, out: seen.append(args[1]))
    inputs, _ = batch()
    model.hidden_states(inputs)
    ple_input = seen[0]
    assert ple_input.shape[1] == P + inputs.captions.shape[1]
    assert (ple_input[:, :P].abs().sum(-1) > 0).all()
    assert (ple_input[:, P:] == 0).all()


def test_aux_loss_is_training_only_and_reaches_the_table_through_the_injection():
    model = make_model(aux_weight=0.5)
    inputs, targets = batch()
    model.train()
    model(inputs, targets)
    aux = model.aux_losses["patch_id"]
    aux.backward()  # the aux loss alone
    table = model.visual_ple.embed_tokens_per_layer.weight
    assert table.grad is not None and table.grad.abs().sum() > 0
    model.eval()
    model(inputs, targets)
    assert model.aux_losses == {}
    assert make_model(aux_weight=0.0).aux_head is None


@pytest.mark.parametrize(("fields", "key"), [
    ({"corpus": "c", "ple_dim": -1}, "vision.ple_dim"),
    ({"corpus": "c", "aux_weight": -0.1}, "vision.aux_weight"),
    ({"corpus": "c", "codebook": 1}, "vision.codebook"),
    ({"corpus": "c", "patches": 0}, "vision.patches"),
    ({"ple_dim": 8}, "vision.corpus"),
])
def test_bad_vision_config_is_one_line(fields, key):
    with pytest.raises(ConfigError, match=key) as err:
        VisionConfig(**fields)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("ple_dim, aux_weight", [(0, 0.0), (8, 0.0), (8, 0.5)])
def test_analytic_parameter_counts_match_the_built_model(ple_dim, aux_weight):
    model = make_model(ple_dim, aux_weight)
    base = dataclasses.replace(model.config, ple=dataclasses.replace(model.config.ple, dim=0, vocab_size=None))
    counts = vision_param_counts(base, ple_dim, K, P, PATCH * PATCH, aux_weight > 0)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    visual = model.visual_ple
    table_and_injection = sum(p.numel() for n, p in model.named_parameters()
                              if ".ple." in n or n.startswith("trunk.per_layer_inputs."))
    assert counts["ple_added"] == (table_and_injection if visual is not None else 0)


def test_ids_only_model_sees_the_image_through_its_ids_alone():
    """pixels=False: no patch embedding; the pixels cannot change a logit, the patch ids do."""
    torch.manual_seed(0)
    base = ModelConfig(vocab_size=VOCAB, hidden_size=H, num_layers=2, num_heads=2, max_seq_len=8, kernels="off")
    model = VisionPLEModel(visual_model_config(base, 8, K), P, PATCH * PATCH, K, pixels=False).eval()
    assert model.patch_embed is None
    inputs, _ = batch()
    with torch.no_grad():
        ref = model.hidden_states(inputs)
        other_pixels = inputs._replace(pixels=torch.rand_like(inputs.pixels))
        assert torch.equal(model.hidden_states(other_pixels), ref)
        other_ids = inputs._replace(patch_ids=(inputs.patch_ids + 1) % K)
        assert not torch.allclose(model.hidden_states(other_ids), ref)
    counts = vision_param_counts(base, 8, K, P, PATCH * PATCH, False, pixels=False)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    with_pixels = vision_param_counts(base, 8, K, P, PATCH * PATCH, False)
    assert with_pixels["total"] - counts["total"] == PATCH * PATCH * H + H


def test_ids_only_needs_a_visual_table():
    with pytest.raises(ConfigError, match="vision.ple_dim"):
        VisionConfig(corpus="c", ple_dim=0, pixels=False)
