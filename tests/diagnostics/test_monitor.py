"""PLEMonitor driven the way the trainer drives callbacks: metrics, early/final verdicts, resume, dP = 0."""

from __future__ import annotations

import json

import numpy as np
import torch

from plelab.training.ple_monitor import PLEMonitor


class FakeTrainer:
    """The attributes a callback may read (as plelab.training.trainer.Trainer exposes them)."""

    def __init__(self, model, run_dir, total_steps):
        self.model, self.run_dir, self.total_steps, self.step = model, run_dir, total_steps, 0


def drive(trainer, monitor, chain, until, end=True):
    """The trainer's call order: backward, on_after_backward, optimizer step, step += 1, on_step_end."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    monitor.on_train_start(trainer)
    logged = []
    trainer.model.train()
    while trainer.step < until:
        x, y = chain(1000 + trainer.step)
        _, loss = trainer.model(x, y)
        loss.backward()
        metrics = {"step": trainer.step + 1, "loss": loss.item()}
        monitor.on_after_backward(trainer, metrics)
        opt.step()
        opt.zero_grad()
        trainer.step += 1
        monitor.on_step_end(trainer, metrics)
        logged.append(json.loads(json.dumps(metrics, allow_nan=False)))  # stays valid JSON
    if end:
        monitor.on_train_end(trainer)
    return logged


def test_monitor_logs_warns_early_and_compares_with_final(tmp_path, make_model, chain, eval_batches):
    model = make_model()
    init = model.per_layer_inputs.embed_tokens_per_layer.weight.detach().clone().numpy()
    monitor = PLEMonitor(every=20, eval_batches=eval_batches)
    logged = drive(FakeTrainer(model, tmp_path, 120), monitor, chain, 120)
    assert monitor.early_step == 12  # 10 % of trainer.total_steps
    with_ple = [m for m in logged if "ple/injection_ratio/layer0" in m]
    assert [m["step"] for m in with_ple] == [20, 40, 60, 80, 100, 120]
    for key in ("ple/gate_abs/layer1", "ple/gate_zero_frac/layer0", "ple/grad_ratio_gate/layer0",
                "ple/grad_ratio_proj/layer1", "ple/grad_ratio_table/layer1", "ple/grad_ratio_table",
                "ple/injection_ratio/mean"):
        assert all(m[key] is not None for m in with_ple), key
    diag = tmp_path / "diagnostics"
    np.testing.assert_array_equal(np.load(diag / "table_init.npy"), init)
    early = json.loads((diag / "early.json").read_text())
    assert early["step"] == 12 and early["summary"]["verdict"] in ("used", "unused", "not resolved", "harmful")
    final = json.loads((diag / "final.json").read_text())
    assert final["summary"]["verdict"] == "used"
    assert final["report"]["table_health"]["views"]["delta"]["available"]
    match = final["early_matches_final"]
    assert match["verdict"] == (early["summary"]["verdict"] == "used")
    assert set(match["layers"]) == {"0", "1"}


def test_resumed_monitor_keeps_init_table_and_early_verdict(tmp_path, make_model, chain):
    model = make_model(gate="scalar", output_norm=False)
    for layer in model.layers:
        layer.ple.gate.data.zero_()
        layer.ple.gate.requires_grad_(False)
    trainer = FakeTrainer(model, tmp_path, 40)
    first = PLEMonitor(every=10)  # no eval batches: ablation on captured training batches
    drive(trainer, first, chain, 20, end=False)
    assert first.early["verdict"] == "unused" and first.early["step"] == 4
    saved = np.load(tmp_path / "diagnostics" / "table_init.npy")
    resumed = PLEMonitor(every=10)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # checkpoint state round trip
    with torch.no_grad():
        model.per_layer_inputs.embed_tokens_per_layer.weight.add_(1.0)
    drive(trainer, resumed, chain, 40)
    np.testing.assert_array_equal(np.load(tmp_path / "diagnostics" / "table_init.npy"), saved)
    final = json.loads((tmp_path / "diagnostics" / "final.json").read_text())
    assert final["summary"]["verdict"] == "unused"
    assert final["early"]["step"] == 4
    assert final["early_matches_final"]["verdict"] is True
    assert any("captured training batches" in n for n in final["report"]["notes"])


def test_resume_without_snapshot_says_delta_view_is_unavailable(tmp_path, make_model, chain):
    trainer = FakeTrainer(make_model(), tmp_path, 10)
    trainer.step = 8
    monitor = PLEMonitor(every=5, early_step=9)
    drive(trainer, monitor, chain, 10)
    final = json.loads((tmp_path / "diagnostics" / "final.json").read_text())
    assert any("without" in n and "delta" in n for n in final["notes"])
    assert not final["report"]["table_health"]["views"]["delta"]["available"]


def test_monitor_leaves_global_rngs_alone(tmp_path, make_model, chain, eval_batches):
    # Exact resume compares runs step by step: diagnostics must not draw from the global generators.
    trainer = FakeTrainer(make_model(), tmp_path, 6)  # make_model seeds torch itself
    torch.manual_seed(5)
    np.random.seed(5)
    before = torch.get_rng_state(), np.random.get_state()[1].copy()
    drive(trainer, PLEMonitor(every=2, early_step=3), chain, 6)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1])


def test_dp0_model_is_a_noop_with_a_note(tmp_path, make_model, chain):
    model = make_model(dim=0)
    logged = drive(FakeTrainer(model, tmp_path, 10), PLEMonitor(every=2), chain, 10)
    assert not any(k.startswith("ple/") for m in logged for k in m)
    final = json.loads((tmp_path / "diagnostics" / "final.json").read_text())
    assert final["verdict"] == "n/a" and "dP = 0" in final["notes"][0]
