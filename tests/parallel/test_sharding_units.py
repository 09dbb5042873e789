"""In-process pieces of the distributed path: table bounds, loader positions across world sizes, optimizer state."""

from __future__ import annotations

import json

import pytest
import torch
from dist_helpers import make_dataset

from plelab.data.loader import BatchLoader, TokenDataset
from plelab.errors import PlelabError
from plelab.model.presets import load_model_config
from plelab.model.transformer import LanguageModel
from plelab.parallel.engine import parallel_mode
from plelab.parallel.group import World, world_from_env
from plelab.parallel.table import shard_bounds
from plelab.training.config import TrainConfig
from plelab.training.optim import Optimizer, grad_norm_and_clip, model_config_for


@pytest.mark.parametrize("rows,size", [(258, 2), (259, 2), (10, 3), (7, 4), (3, 4)])
def test_shard_bounds_tile_the_table_like_torch_chunk(rows, size):
    bounds = [shard_bounds(rows, World(r, size)) for r in range(size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    chunks = [len(c) for c in torch.arange(rows).chunk(size)]
    assert [hi - lo for lo, hi in bounds if hi > lo] == chunks


def test_world_from_env_reads_torchrun_and_refuses_nonsense():
    assert world_from_env({}) == World(0, 1, 0)
    assert world_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == World(3, 4, 1)
    with pytest.raises(PlelabError, match="malformed"):
        world_from_env({"RANK": "4", "WORLD_SIZE": "4"})


def test_parallel_auto_is_ddp_on_several_ranks_and_one_process_otherwise():
    assert TrainConfig().parallel == "auto"
    assert parallel_mode("auto", World(0, 2)) == "ddp" and parallel_mode("auto", World(0, 1)) == "none"
    assert parallel_mode("fsdp", World(1, 2)) == "fsdp" and parallel_mode("ddp", World(0, 1)) == "none"
    with pytest.raises(PlelabError, match='2 ranks but parallel = "none"'):
        parallel_mode("none", World(0, 2))


def test_loader_position_resumes_on_another_world_size(tmp_path):
    ds = TokenDataset(make_dataset(tmp_path), "train")
    two = [BatchLoader(ds, batch_size=2, seq_len=16, seed=5, rank=r, world_size=2) for r in range(2)]
    for _ in range(3):
        for loader in two:
            loader.next_batch()
    state = json.loads(json.dumps(two[0].state_dict()))
    want = torch.cat([loader.next_batch()[0] for loader in two])  # the next global batch, rank by rank
    one = BatchLoader(ds, batch_size=4, seq_len=16, seed=5)
    one.load_state_dict(state)
    assert torch.equal(one.next_batch()[0], want)
    with pytest.raises(PlelabError, match="global_batch_size"):
        BatchLoader(ds, batch_size=3, seq_len=16, seed=5).load_state_dict(state)


def _config() -> TrainConfig:
    return TrainConfig(model=load_model_config("tiny", ["max_seq_len=8", "vocab_size=64"]), batch_size=2, max_steps=2)


def _trained_optimizer() -> tuple[LanguageModel, Optimizer]:
    cfg = _config()
    assert cfg.model.ple.dim > 0 and cfg.sparse_ple
    torch.manual_seed(0)
    model = LanguageModel(model_config_for(cfg))
    opt = Optimizer(model, cfg)
    x = torch.randint(0, model.config.vocab_size, (2, 8))
    for _ in range(2):
        model(x, x)[1].backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_named_optimizer_state_round_trips_both_ways():
    model, opt = _trained_optimizer()
    named = opt.named_state()
    assert named.keys() == {n for n, p in model.named_parameters() if p.requires_grad}
    assert opt.named_from_state_dict(opt.state_dict()).keys() == named.keys()
    fresh = Optimizer(model, _config())
    fresh.load_state_dict({"named": named})  # what a sharded checkpoint restores in one process
    a, b = opt.state_dict(), fresh.state_dict()
    for key in ("dense", "sparse"):
        for idx, st in a[key]["state"].items():
            for field, value in st.items():
                assert torch.equal(torch.as_tensor(b[key]["state"][idx][field]), torch.as_tensor(value)), field


def test_grad_norm_without_sharding_is_the_plain_norm():
    model, opt = _trained_optimizer()
    x = torch.randint(0, model.config.vocab_size, (2, 8))
    model(x, x)[1].backward()
    params = [p for p in model.parameters() if p.requires_grad]
    want = torch.sqrt(sum((p.grad.coalesce().values() if p.grad.is_sparse else p.grad).pow(2).sum() for p in params))
    assert grad_norm_and_clip(params, 0.0) == pytest.approx(float(want), rel=1e-6)
