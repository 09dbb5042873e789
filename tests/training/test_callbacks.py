"""The trainer as a loop plus callbacks: config-requested callbacks built by the trainer, state restored by name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from training_helpers import make_dataset, write_config

from plelab.training.callbacks import Callback
from plelab.training.config import load_train_config
from plelab.training.trainer import Trainer


@pytest.fixture
def setup(tmp_path):
    make_dataset(tmp_path)
    return tmp_path


class Counter(Callback):
    """Counts its steps; the count is its checkpointed state."""

    def __init__(self, label: str):
        self.label, self.count = label, 0

    @property
    def name(self) -> str:
        return f"Counter-{self.label}"

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]


def test_callback_state_is_restored_by_name_after_reordering_and_adding(setup):
    cfg = load_train_config(write_config(setup, max_steps=4))
    a, b = Counter("a"), Counter("b")
    b.count = 100
    Trainer(cfg, setup / "run", callbacks=[a, b], quiet=True).run()
    assert (a.count, b.count) == (4, 104)
    more = load_train_config(write_config(setup, max_steps=6))
    new, a2, b2 = Counter("new"), Counter("a"), Counter("b")
    Trainer(more, setup / "run", callbacks=[new, b2, a2], resume=True, quiet=True).run()
    assert (a2.count, b2.count, new.count) == (6, 106, 2)


def test_trainer_builds_the_callbacks_its_config_asks_for(setup):
    cfg = load_train_config(write_config(setup, max_steps=2, diagnostics_every=1))
    trainer = Trainer(cfg, setup / "run", quiet=True)
    trainer.close()
    names = [cb.name for cb in trainer.callbacks]
    assert names[:4] == ["SpeedMonitor", "ProgressPrinter", "Evaluator", "Checkpointer"]
    assert "PLEMonitor" in names


def test_the_mfu_peak_is_measured_once_per_run_and_a_busy_start_divides_by_the_cpus_best(setup, monkeypatch,
                                                                                           tmp_path, capsys):
    import plelab.training.mfu as mfu_module

    monkeypatch.setenv("PLELAB_CACHE", str(tmp_path / "cache"))
    calls, peaks = [], iter([2e9, 1e9])  # the second run starts while the machine is busy: half the peak
    monkeypatch.setattr(mfu_module, "measure_matmul_peak", lambda **kw: calls.append(kw) or next(peaks))
    per_token_s = []  # MFU per token/s: FLOPs per token / the peak divided by
    for run in ("run", "busy"):
        cfg = load_train_config(write_config(setup, max_steps=12, log_every=2))
        Trainer(cfg, setup / run).run()
        first = json.loads((setup / run / "metrics.jsonl").read_text().splitlines()[0])
        per_token_s.append(first["mfu"] / first["tokens_per_s"])
    assert len(calls) == 2
    # the busy start divides by the CPU's best (2 GFLOP/s), not by its own 1: its MFU does not read double
    assert per_token_s[1] == pytest.approx(per_token_s[0], rel=1e-9)
    out = capsys.readouterr().out
    assert "GEMM peak of 2.0 GFLOP/s, the best of 2 measurement(s) on this CPU" in out
    assert "this start measured 1.0" in out


@pytest.mark.parametrize("dtype, want", [("fp32", "float32"), ("bf16", "bfloat16")])
def test_the_mfu_peak_is_measured_in_the_precision_the_run_computes_in(setup, monkeypatch, tmp_path, dtype, want):
    import plelab.training.mfu as mfu_module

    monkeypatch.setenv("PLELAB_CACHE", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(mfu_module, "measure_matmul_peak", lambda **kw: calls.append(kw) or 1e9)
    cfg = load_train_config(write_config(setup, max_steps=2, log_every=1, dtype=dtype))
    Trainer(cfg, setup / "run").run()
    assert str(calls[0]["dtype"]).endswith(want)


def test_a_registered_callback_joins_every_run_that_asks_for_it(setup, monkeypatch):
    """A new callback touches one place: its own registration, with the config deciding whether a run gets it."""
    from plelab.training import callbacks as C

    class Counter(Callback):
        def __init__(self):
            self.steps = 0

        def on_step_end(self, trainer, metrics):
            self.steps += 1

    monkeypatch.setattr(C, "_REGISTRY", dict(C._REGISTRY))
    C.register_callback("counter", lambda cfg, note: Counter() if cfg.log_every == 3 else None)
    with pytest.raises(ValueError, match="counter"):
        C.register_callback("counter", lambda cfg, note: None)
    trainer = Trainer(load_train_config(write_config(setup, max_steps=4, log_every=3)), setup / "run", quiet=True)
    counter = next(cb for cb in trainer.callbacks if type(cb).__name__ == "Counter")
    trainer.run()
    assert counter.steps == 4
    other = Trainer(load_train_config(write_config(setup, max_steps=4, log_every=2)), setup / "other", quiet=True)
    other.close()
    assert "Counter" not in [type(cb).__name__ for cb in other.callbacks]
