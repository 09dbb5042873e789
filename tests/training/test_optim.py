"""The optimizer covers every trainable parameter exactly once and leaves the model as it was built."""

from __future__ import annotations

import pytest
import torch

from plelab.model import LanguageModel
from plelab.training.config import load_train_config
from plelab.training.optim import (
    Optimizer,
    OptimizerGroupsError,
    check_coverage,
    model_config_for,
    sparse_params,
)


def train_config(sparse: bool, *overrides: str):
    return load_train_config({"model": {"preset": "tiny"}, "sparse_ple": sparse}, list(overrides))


def groups(opt: Optimizer) -> list[list[torch.Tensor]]:
    return [g["params"] for o in opt.optimizers for g in o.param_groups]


@pytest.mark.parametrize(
    "overrides",
    [[], ["model.tie_embeddings=false", "model.ffn.kind=mglu"], ["model.ple.dim=0"], ["model.ple.gate=vector"]],
)
@pytest.mark.parametrize("sparse", [True, False])
def test_groups_hold_every_parameter_exactly_once(sparse: bool, overrides: list[str]):
    cfg = train_config(sparse, *overrides)
    model = LanguageModel(model_config_for(cfg))
    opt = Optimizer(model, cfg)
    held = [id(p) for g in groups(opt) for p in g]
    assert sorted(held) == sorted(id(p) for p in model.parameters())
    table = model.per_layer_inputs.embed_tokens_per_layer.weight if model.per_layer_inputs else None
    assert (opt.sparse is not None) == (sparse and table is not None)
    if opt.sparse is not None:
        assert opt.sparse.param_groups[0]["params"] == [table]


def test_the_training_config_sets_sparse_gradients_in_the_model_config():
    assert model_config_for(train_config(True)).ple.sparse_grad
    assert not model_config_for(train_config(False)).ple.sparse_grad
    model = LanguageModel(model_config_for(train_config(True)))
    assert sparse_params(model) == [model.per_layer_inputs.embed_tokens_per_layer.weight]


def test_optimizer_does_not_change_the_model():
    cfg = train_config(True)
    model = LanguageModel(cfg.model)  # built without model_config_for: a dense table
    table = model.per_layer_inputs.embed_tokens_per_layer
    with pytest.raises(ValueError, match="model_config_for"):
        Optimizer(model, cfg)
    assert table.sparse is False  # the old optimizer switched it to sparse behind the model's back
    dense = LanguageModel(model_config_for(train_config(False)))
    Optimizer(dense, train_config(False))
    assert dense.per_layer_inputs.embed_tokens_per_layer.sparse is False


def test_coverage_errors_name_the_parameter():
    model = LanguageModel(train_config(False).model)
    named = dict(model.named_parameters())
    rest = [p for n, p in named.items() if n != "norm.weight"]
    with pytest.raises(OptimizerGroupsError, match=r"missing \['norm.weight'\]"):
        check_coverage(model, [rest])
    with pytest.raises(OptimizerGroupsError, match=r"duplicated \['layers.0.mlp.up_proj.weight'\]"):
        check_coverage(model, [list(named.values()), [named["layers.0.mlp.up_proj.weight"]]])
    with pytest.raises(OptimizerGroupsError, match="1 tensor"):
        check_coverage(model, [list(named.values()), [torch.zeros(3)]])
    named["norm.weight"].requires_grad_(False)  # frozen parameters need no group ...
    check_coverage(model, [rest])
    with pytest.raises(OptimizerGroupsError, match="not trainable"):  # ... and must not be in one
        check_coverage(model, [list(named.values())])


def test_sparse_step_moves_only_the_rows_in_the_batch():
    cfg = train_config(True, "model.ple.dim=8")
    torch.manual_seed(0)
    model = LanguageModel(model_config_for(cfg))
    opt = Optimizer(model, cfg)
    table = model.per_layer_inputs.embed_tokens_per_layer.weight
    before = table.detach().clone()
    ids = torch.tensor([[3, 5, 7, 5]])
    model(ids, ids)[1].backward()
    assert table.grad.is_sparse
    opt.step()
    moved = (table.detach() != before).any(dim=1).nonzero().flatten().tolist()
    assert moved == [3, 5, 7]


def test_sparse_grad_is_decided_by_sparse_ple_alone():
    """model.ple.sparse_grad is a record the trainer writes, not a setting that sparse_ple silently overrides:
    old configs (which record false) load, a config setting it true is refused in one line."""
    from plelab.util.dataclass_config import ConfigError

    assert load_train_config({"model": {"ple": {"sparse_grad": False}}, "sparse_ple": True}).sparse_ple
    with pytest.raises(ConfigError, match="sparse_ple") as err:
        load_train_config({"model": {"ple": {"sparse_grad": True}}, "sparse_ple": False})
    assert "\n" not in str(err.value)
