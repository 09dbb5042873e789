"""The training memory planner against measured bytes of real CPU training steps, and its arithmetic.

Measured: every tensor autograd saves for backward (unique storages, the model's own weights left out),
the parameters, gradients and optimizer state after a real step of plelab's optimizer. The activation and
bf16-copy figures are exact for the reference model (the CUDA path); the stated error bound is 1 %.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from plelab.errors import PlelabError
from plelab.model.params import matmul_params
from plelab.model.transformer import LanguageModel
from plelab.training.config import load_train_config
from plelab.training.memory import (
    GB,
    GiB,
    MemoryRequest,
    ParamSplit,
    activation_bytes_per_token,
    rank_memory,
    training_memory,
)
from plelab.training.optim import Optimizer, model_config_for
from plelab.util.device import choose_precision

STATED_ERROR = 0.01  # docs/scaling.md quotes this bound


def small_train(dP: int = 32, ffn: dict | None = None, ple: dict | None = None, **fields):
    """A small config that none of the planner's coefficients were fitted on (odd head counts, H = 80)."""
    model = dict(vocab_size=1000, hidden_size=80, num_layers=3, num_heads=5, num_kv_heads=1, max_seq_len=64,
                 ffn=dict(intermediate_size=200, **(ffn or {})), ple=dict(dim=dP, **(ple or {})), kernels="off")
    return load_train_config({"model": model, "batch_size": 4, "seq_len": 64, **fields})


def saved_for_backward(model: LanguageModel, ids: torch.Tensor, targets: torch.Tensor, dtype: str) -> int:
    """Bytes of the distinct storages autograd keeps from forward to backward (weights excluded)."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with choose_precision(torch.device("cpu"), dtype).autocast(torch.device("cpu")):
            model(ids, targets, return_logits=False)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize(("dP", "batch", "seq"), [(0, 3, 64), (32, 2, 48), (32, 1, 16)])
def test_activation_estimate_matches_saved_tensors(dtype, dP, batch, seq):
    train = small_train(dP, dtype=dtype)
    torch.manual_seed(0)
    model = LanguageModel(model_config_for(train))
    ids = torch.randint(0, train.model.vocab_size, (batch, seq))
    measured = saved_for_backward(model, ids, torch.roll(ids, -1, 1), dtype)
    act_bytes = 2 if dtype == "bf16" else 4
    copies = 2 * matmul_params(train.model) if dtype == "bf16" else 0
    estimate = batch * seq * activation_bytes_per_token(train.model, act_bytes) + copies
    assert abs(measured - estimate) <= STATED_ERROR * measured, (measured, estimate)
    # The plan's own parts say the same.
    parts = rank_memory(MemoryRequest(train, gpus=1, strategy="ddp"), "ddp", batch, 1)
    if seq == train.context:
        assert abs(parts["activations"] + parts["bf16_weight_copies"] - measured) <= STATED_ERROR * measured


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("dP", [0, 32])
def test_checkpointing_estimate_matches_the_measured_peak(dtype, dP):
    """Per-layer non-reentrant checkpointing: the tensors saved outside the layers (each layer's input among
    them) stay for the whole backward, and backward recomputes one layer at a time: that sum is the peak."""
    train = small_train(dP, dtype=dtype)
    torch.manual_seed(0)
    model = LanguageModel(model_config_for(train))
    B, T = 2, 64
    ids = torch.randint(0, train.model.vocab_size, (B, T))
    copies = 2 * matmul_params(train.model) if dtype == "bf16" else 0
    full = saved_for_backward(model, ids, torch.roll(ids, -1, 1), dtype) - copies
    for layer in model.layers:
        layer.forward = functools.partial(
            lambda f, *a, **k: checkpoint(f, *a, use_reentrant=False, **k), layer.forward)
    kept = saved_for_backward(model, ids, torch.roll(ids, -1, 1), dtype)
    kept -= 2 * (train.model.vocab_size * train.model.hidden_size) if dtype == "bf16" else 0  # head copy
    L, H = train.model.num_layers, train.model.hidden_size
    one_layer = (full - kept + B * T * L * 4 * H) / L
    peak = kept + one_layer
    estimate = B * T * activation_bytes_per_token(train.model, 4 if dtype == "fp32" else 2, checkpointing=True)
    assert abs(estimate - peak) <= STATED_ERROR * peak, (peak, estimate)
    big = load_train_config({"model": {"preset": "seed-3b"}}).model
    assert activation_bytes_per_token(big, checkpointing=True) < 0.2 * activation_bytes_per_token(big)


# A pruned FFN trains at intermediate_size (its weights, gradients and Adam state) until export removes units.
# An n-gram table (4 heads of 1009 rows) reads 4 rows per token: 512 gradient rows for the step's 128 tokens.
@pytest.mark.parametrize("ffn, ple", [({}, {}), ({"kind": "pruned", "prune_to": 50}, {}),
                                      ({"kind": "mglu", "mask_count": 2}, {}),
                                      ({"kind": "moe", "num_experts": 4, "top_k": 2, "expert_size": 40}, {}),
                                      ({}, {"index": "ngram", "ngram": {"orders": [1, 2], "heads": 2}})],
                         ids=["swiglu", "pruned", "mglu", "moe", "ngram-table"])
def test_weights_gradients_and_optimizer_state_match_a_real_step(ffn, ple):
    train = small_train(32, ffn, ple)
    torch.manual_seed(0)
    model = LanguageModel(model_config_for(train))
    opt = Optimizer(model, train)
    B, T = 2, 64
    ids = torch.randint(0, train.model.vocab_size, (B, T))
    with choose_precision(torch.device("cpu"), "fp32").autocast(torch.device("cpu")):
        _, loss = model(ids, torch.roll(ids, -1, 1), return_logits=False)
    loss.backward()
    table = model.per_layer_inputs.embed_tokens_per_layer.weight
    dense_grads = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None and p is not table)
    g = table.grad
    sparse_grad = g._values().nbytes + g._indices().nbytes
    opt.step()
    state = sum(t.nbytes for o in opt.optimizers for s in o.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    weights = sum(p.nbytes for p in model.parameters())

    parts = rank_memory(MemoryRequest(train, gpus=1, strategy="ddp"), "ddp", B, 1)
    assert parts["weights"] + parts["ple_table"] == weights
    assert parts["gradients"] == dense_grads
    assert parts["optimizer"] + parts["ple_table_optimizer"] == state
    # B * T = 128 tokens (x 4 heads), fewer than the table's rows: one gradient row (and index) per row read.
    assert parts["ple_table_gradient"] == sparse_grad


def test_table_sharding_divides_the_table_and_its_state_by_the_ranks():
    train = load_train_config({"model": {"preset": "seed-3b", "ple": {"dim": 512}}, "batch_size": 4096,
                               "seq_len": 4096})
    s = ParamSplit.of(train.model)
    assert s.table == 100096 * 32 * 512
    plan = training_memory(MemoryRequest(train, gpus=8, gpu_memory=80 * GB, tokens=400e9))
    shard = plan["per_rank_bytes"]
    rows = -(-100096 // 8)
    assert shard["ple_table"] == 4 * rows * 32 * 512 and shard["ple_table_optimizer"] == 8 * rows * 32 * 512
    rep = plan["ple_table_replicated_bytes"]
    assert rep["ple_table"] == 4 * s.table and rep["ple_table_optimizer"] == 8 * s.table
    # The sharded lookup sends only the rows positions need: a send and a receive buffer of about one fp32 row
    # (32 layers x 512) per token of the micro-batch (plelab/parallel/table.py).
    tokens = plan["micro_batch"] * 4096
    assert shard["ple_exchange_transient"] == 2 * tokens * 4 * 32 * 512
    assert plan["ple_table_sharding_saves_bytes"] == pytest.approx(
        sum(rep.values()) - sum(shard[k] for k in rep) - shard["ple_exchange_transient"], rel=1e-12)
    one = training_memory(MemoryRequest(train, gpus=8, tokens=400e9, global_batch=8))
    assert one["per_rank_bytes"]["ple_exchange_transient"] > 0
    single = training_memory(MemoryRequest(train, gpus=1, global_batch=8))
    assert single["per_rank_bytes"]["ple_exchange_transient"] == 0


def test_fsdp_shards_the_dense_state_and_fits_more():
    train = load_train_config({"model": {"preset": "seed-3b"}, "batch_size": 4096, "seq_len": 4096})
    ddp = training_memory(MemoryRequest(train, gpus=8, strategy="ddp"))
    fsdp = training_memory(MemoryRequest(train, gpus=8, strategy="fsdp"))
    assert fsdp["per_rank_bytes"]["optimizer"] == pytest.approx(ddp["per_rank_bytes"]["optimizer"] / 8)
    assert fsdp["max_micro_batch"]["fsdp"] >= ddp["max_micro_batch"]["ddp"] >= 1
    assert fsdp["fits"] and ddp["fits"]


def test_the_micro_batch_chosen_is_the_largest_that_fits_and_divides():
    train = load_train_config({"model": {"preset": "seed-3b"}, "batch_size": 4096, "seq_len": 4096})
    req = MemoryRequest(train, gpus=8, strategy="fsdp", activation_checkpointing=True)
    plan = training_memory(req)
    mb = plan["micro_batch"]
    assert 512 % mb == 0 and plan["fits"]
    bigger = next(d for d in range(mb + 1, 513) if 512 % d == 0)
    assert rank_memory(req, "fsdp", bigger, 512 // bigger)["total"] > req.gpu_memory
    tight = training_memory(MemoryRequest(train, gpus=8, gpu_memory=8 * GB, strategy="ddp"))
    assert not tight["fits"] and tight["max_micro_batch"] == {"ddp": 0}


def test_throughput_and_gpu_hours_follow_the_stated_formula():
    train = load_train_config({"model": {"preset": "seed-3b"}, "batch_size": 4096, "seq_len": 4096})
    plan = training_memory(MemoryRequest(train, gpus=8, mfu=0.5, peak_flops=1e15, tokens=1e12))
    per_gpu = 0.5 * 1e15 / plan["train_flops_per_token"]
    assert plan["tokens_per_s_per_gpu"] == pytest.approx(per_gpu)
    assert plan["gpu_hours"] == pytest.approx(1e12 / per_gpu / 3600)
    assert plan["wall_hours"] == pytest.approx(plan["gpu_hours"] / 8)


def test_bad_requests_are_plelab_errors():
    train = small_train(batch_size=6)
    with pytest.raises(PlelabError, match="divide evenly over 4 GPUs"):
        training_memory(MemoryRequest(train, gpus=4))
    with pytest.raises(PlelabError, match="must divide the 3 sequences"):
        training_memory(MemoryRequest(train, gpus=2, micro_batch=2))
    with pytest.raises(PlelabError, match="strategy"):
        MemoryRequest(train, strategy="zero3")
    assert training_memory(MemoryRequest(train, gpus=2, overhead=0.0))["per_rank_bytes"]["overhead"] == 0
    assert GiB == 2**30


PROBE = '''
import json, sys
import torch
from torch.distributed.tensor import DTensor
from plelab.parallel.engine import from_environment
from plelab.training.config import load_train_config
from plelab.training.trainer import Trainer

def local(t):
    return t.to_local() if isinstance(t, DTensor) else t

cfg = load_train_config(sys.argv[1], sys.argv[3:])
t = Trainer(cfg, sys.argv[2], quiet=True, overwrite=True, distribution=from_environment(cfg))
try:
    t.train_step()
    table = t.distribution.table.weight if t.distribution.table is not None else None
    def state(own):
        return sum(local(v).nbytes for o in t.optimizer.optimizers for k, s in o.state.items() if (k is table) == own
                   for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    print("MEASURED " + json.dumps({
        "weights": sum(local(p).nbytes for p in t.model.parameters() if p is not table),
        "ple_table": local(table).nbytes, "optimizer": state(False), "ple_table_optimizer": state(True)}), flush=True)
finally:
    t.close()
'''


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_rank_state_matches_the_plan(tmp_path, strategy):
    """2 ranks under torchrun (gloo): each rank's weights, table shard and optimizer state, measured after a real
    step, equal the plan's (FSDP: the sharded fp32 part; the gathered bf16 buffers are transient)."""
    import json
    import os
    import subprocess
    import sys

    from plelab.data.prepare import prepare_dataset
    from plelab.data.tokenizer import Tokenizer

    src = tmp_path / "corpus.txt"
    src.write_text("\n<|endoftext|>\n".join(f"Doc {i}. per-layer embeddings " * 8 for i in range(40)))
    prepare_dataset([src], Tokenizer.byte_level(), tmp_path / "data", val_fraction=0.1, progress=False)
    cfg = tmp_path / "t.toml"
    cfg.write_text(f'data = "{tmp_path / "data"}"\nbatch_size = 4\nseq_len = 64\nmax_steps = 2\nwarmup_steps = 1\n'
                   '[model]\npreset = "tiny"\nvocab_size = 258\nmax_seq_len = 64\n')
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(probe), str(cfg),
         str(tmp_path / "run"), f"parallel={strategy}"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    measured = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("MEASURED")]
    assert proc.returncode == 0 and len(measured) == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    train = load_train_config(cfg)
    plan = rank_memory(MemoryRequest(train, gpus=2, strategy=strategy), strategy, 2, 1)
    split = ParamSplit.of(train.model)
    for m in measured:
        assert m["ple_table"] == plan["ple_table"] and m["ple_table_optimizer"] == plan["ple_table_optimizer"]
        assert m["optimizer"] == plan["optimizer"]
        assert m["weights"] == (plan["weights"] if strategy == "ddp" else 4 * split.dense / 2)
