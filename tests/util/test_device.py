"""Device choices: precision (bf16 autocast where the hardware has it), distributed backend, fused AdamW,
pinned copies; with the hardware probes injected, so every branch runs on this machine."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from plelab.errors import PlelabError
from plelab.model.norm import RMSNorm
from plelab.model.presets import load_model_config
from plelab.model.transformer import LanguageModel
from plelab.util import device as dev
from plelab.util.device import backend_for, choose_precision, cpu_bf16_features, fused_adamw, host_to_device

CPU, CUDA, MPS = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
NATIVE_BF16_CPU = bool(cpu_bf16_features())


@pytest.mark.parametrize(("flags", "want"), [
    ({"avx512f", "avx512_bf16"}, ["avx512_bf16"]),
    ({"amx_tile", "amx_bf16"}, ["amx_bf16"]),
    ({"avx512_bf16", "amx_bf16"}, ["avx512_bf16", "amx_bf16"]),
    ({"fp", "asimd", "bf16"}, ["bf16"]),  # aarch64 FEAT_BF16 (Graviton 3, Neoverse V1+)
    ({"avx2", "avx512f", "avx512bw"}, []),  # AVX-512 without BF16: oneDNN would emulate it
    (set(), []),
])
def test_cpu_bf16_features_from_flags(flags, want):
    assert cpu_bf16_features(flags) == want


@pytest.mark.parametrize(("device", "kw", "want"), [
    (CPU, dict(cpu_features={"avx512_bf16"}), "bf16"),
    (CPU, dict(cpu_features={"amx_bf16"}), "bf16"),
    (CPU, dict(cpu_features={"avx2"}), "fp32"),
    (CUDA, dict(cuda_bf16=True), "bf16"),
    (CUDA, dict(cuda_bf16=False), "fp32"),  # e.g. V100 / T4
    (MPS, {}, "fp32"),
])
def test_auto_picks_bf16_only_where_native(device, kw, want):
    p = choose_precision(device, "auto", **kw)
    assert p.name == want
    assert p.reason.startswith("dtype = auto")
    assert str(p).startswith("bf16 autocast" if want == "bf16" else "fp32")


def test_the_reason_names_what_was_found():
    assert "avx512_bf16, amx_bf16" in choose_precision(CPU, "auto", cpu_features={"amx_bf16", "avx512_bf16"}).reason
    assert "emulated" in choose_precision(CPU, "auto", cpu_features=set()).reason


def test_explicit_choices_win_and_emulated_bf16_is_flagged():
    assert choose_precision(CPU, "fp32", cpu_features={"avx512_bf16"}).name == "fp32"
    assert choose_precision(CUDA, "fp32", cuda_bf16=True).name == "fp32"
    slow = choose_precision(CPU, "bf16", cpu_features=set())
    assert slow.name == "bf16" and "slower than fp32" in slow.reason
    assert "note" not in choose_precision(CPU, "bf16", cpu_features={"amx_bf16"}).reason
    with pytest.raises(PlelabError, match="auto, bf16, bf16-head, fp32"):
        choose_precision(CPU, "fp16")


@pytest.mark.parametrize("features", [{"amx_bf16"}, set()])
def test_bf16_head_is_a_cpu_path_with_fp32_activations_and_autocast_elsewhere(features):
    p = choose_precision(CPU, "bf16-head", cpu_features=features)
    assert p.name == "bf16-head" and p.autocast_dtype is None and p.native_bf16 == bool(features)
    with p.autocast(CPU):  # no autocast: only the head kernel's GEMMs change (plelab.model.bf16_gemm)
        assert not torch.is_autocast_enabled("cpu")
    assert str(p).startswith("bf16-head") and ("bf16 units" if features else "emulated exactly") in str(p)
    on_cuda = choose_precision(CUDA, "bf16-head", cuda_bf16=True)
    assert on_cuda.name == "bf16" and "which on cuda is bf16 autocast" in on_cuda.reason


def test_this_machine_is_probed_from_cpuinfo():
    dev.cpu_flags.cache_clear()
    assert choose_precision(CPU).name == ("bf16" if NATIVE_BF16_CPU else "fp32")


def test_autocast_is_active_on_cpu_when_chosen():
    lin = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with choose_precision(CPU, "auto", cpu_features={"avx512_bf16"}).autocast(CPU):
        assert torch.is_autocast_enabled("cpu")
        assert lin(x).dtype == torch.bfloat16
    with choose_precision(CPU, "auto", cpu_features=set()).autocast(CPU):
        assert not torch.is_autocast_enabled("cpu")
        assert lin(x).dtype == torch.float32
    with dev.autocast_context(CPU, "bf16"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16


@pytest.mark.parametrize("kernels", ["on", "off"])
def test_model_trains_under_cpu_bf16_autocast(kernels):
    """Loss finite and near fp32; matmuls in bf16; every RMSNorm computed in fp32 (the residual stream's norms
    see and return fp32); every gradient fp32 and finite."""
    cfg = load_model_config("tiny", [f"kernels={kernels}"])
    torch.manual_seed(0)
    model = LanguageModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    targets = torch.roll(ids, -1, 1)
    with torch.no_grad():
        ref = float(model(ids, targets, return_logits=False)[1])
    norms: list[tuple[RMSNorm, torch.Tensor, torch.Tensor]] = []
    linear_out: set[torch.dtype] = set()
    hooks = [m.register_forward_hook(lambda m, i, o: norms.append((m, i[0].detach(), o.detach())))
             for m in model.modules() if isinstance(m, RMSNorm)]
    hooks += [m.register_forward_hook(lambda m, i, o: linear_out.add(o.dtype))
              for m in model.modules() if isinstance(m, nn.Linear)]
    with choose_precision(CPU, "bf16").autocast(CPU):
        _, loss = model(ids, targets, return_logits=False)
    loss.backward()
    for h in hooks:
        h.remove()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert abs(loss.item() - ref) < 0.02 * ref
    assert linear_out == {torch.bfloat16}
    for m in (model.norm, *(layer.input_layernorm for layer in model.layers)):
        assert any(n is m and i.dtype == o.dtype == torch.float32 for n, i, o in norms)
    for m, i, o in norms:
        xf = i.float()
        want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + m.eps) * m.weight.float()).to(i.dtype)
        assert o.dtype == i.dtype and torch.equal(o, want)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
               for p in model.parameters())


def test_backend_for_device():
    assert backend_for(CPU) == "gloo"
    assert backend_for("cuda:1", nccl_available=True) == "nccl"
    assert backend_for(CUDA, nccl_available=False) == "gloo"  # a torch build without NCCL
    assert backend_for("cpu", nccl_available=True) == "gloo"


def test_fused_adamw_only_on_cuda():
    assert fused_adamw(CUDA) and not fused_adamw(CPU) and not fused_adamw(MPS)


def test_host_to_device_keeps_cpu_batches_and_copies_elsewhere():
    t = torch.arange(6).view(2, 3)
    assert host_to_device(t, CPU) is t
    moved = host_to_device(t, torch.device("meta"))  # any non-CPU device takes the non_blocking copy path
    assert moved.device.type == "meta" and moved.shape == t.shape


def _tiny_run_config(root, **fields):
    from plelab.data.prepare import prepare_dataset
    from plelab.data.tokenizer import Tokenizer
    from plelab.training.config import load_train_config

    if not (root / "data").exists():
        src = root / "corpus.txt"
        src.write_text("\n<|endoftext|>\n".join(f"Doc {i}. per-layer embeddings " * 8 for i in range(20)))
        prepare_dataset([src], Tokenizer.byte_level(), root / "data", val_fraction=0.1, progress=False)
    return load_train_config({"data": str(root / "data"), "batch_size": 2, "seq_len": 16, "max_steps": 2,
                              "warmup_steps": 1, "ckpt_every": 2, **fields,
                              "model": {"preset": "tiny", "vocab_size": 258, "max_seq_len": 16}})


def test_trainer_says_and_records_its_precision(tmp_path, capsys):
    from plelab.training.trainer import Trainer

    for dtype in ("fp32", "bf16"):
        Trainer(_tiny_run_config(tmp_path, dtype=dtype), tmp_path / dtype).run()
        assert f"precision: {dtype}" in capsys.readouterr().out
        lines = [json.loads(x) for x in (tmp_path / dtype / "metrics.jsonl").read_text().splitlines()]
        assert {m["dtype"] for m in lines if "loss" in m} == {dtype}


def test_gpu_readiness_config_paths(tmp_path, monkeypatch):
    """compile = true compiles the model in place; on CUDA (injected) AdamW is fused and batches are pinned."""
    from plelab.model.transformer import LanguageModel as Model
    from plelab.training import data_access, trainer

    compiled, copies = [], []
    monkeypatch.setattr(Model, "compile", lambda self, *a, **k: compiled.append(self))
    monkeypatch.setattr(trainer, "fused_adamw", lambda device: True)
    monkeypatch.setattr(data_access, "host_to_device",
                        lambda t, device, pin: copies.append(pin) or t)
    t = trainer.Trainer(_tiny_run_config(tmp_path, compile=True, pin_memory=False), tmp_path / "run")
    try:
        assert compiled == [t.model]
        assert all(g["fused"] for g in t.optimizer.dense.param_groups)
        t.data.next_batch()
        assert copies == [False, False]
        assert list(t.model.state_dict()) == list(Model(t.model.config).state_dict())  # names unchanged
    finally:
        t.close()
    t = trainer.Trainer(_tiny_run_config(tmp_path), tmp_path / "run2")
    t.close()
    assert len(compiled) == 1  # off by default
