"""`PLEMonitor`: the trainer callback that watches PLE while it trains and warns early if the model is not using it.

Every `every` steps it adds per-layer injection ratio, gate statistics and gradient-norm ratios to the
step's metrics (so they land in RUN_DIR/metrics.jsonl), with the table's movement from its initialisation and
an all-layers zero ablation on a few evaluation batches: the early predictor's candidate signals
(plelab.diagnostics.early). At `early_step` (default 10 % of training) it runs
the full diagnosis and stores RUN_DIR/diagnostics/early.json; at the end it runs it again and writes
RUN_DIR/diagnostics/final.json, including whether the early verdicts matched the final ones.
The table at initialisation goes to RUN_DIR/diagnostics/table_init.npy once (not into checkpoint state),
so the 'delta' table-health view survives a resume and stays available to `plelab diagnose`.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plelab.diagnostics import verdict as V
from plelab.diagnostics.ablation import batch_losses, ple_ablated
from plelab.diagnostics.batches import batches_from_tokens, random_batches
from plelab.diagnostics.data_sources import FREQ_MAX_TOKENS
from plelab.diagnostics.diagnose import diagnose_model
from plelab.diagnostics.grads import grad_norm_ratios
from plelab.diagnostics.injection import probe_layers
from plelab.diagnostics.model_parts import as_batches, model_device, ple_layers, ple_table, unwrap
from plelab.diagnostics.run_files import INIT_TABLE_FILE, load_init_table
from plelab.diagnostics.table_health import DEFAULT_TOP_K
from plelab.runs.checkpoint import atomic_write_bytes
from plelab.training.callbacks import Callback, register_callback
from plelab.util.json_values import jsonable

EARLY_FRACTION = 0.1
"""Default early-warning point, as a fraction of trainer.total_steps."""
MOVEMENT_CHUNK_ROWS = 65536
"""Table rows compared at a time for the logged table movement."""


def summarize(report: dict, step: int) -> dict:
    """The used verdicts of a diagnosis (dependence, not benefit: training has no twin to pay against): overall
    (`verdict`), per layer, and what the proxies alone would have said."""
    layers = report.get("layers", [])
    proxies = V.overall_verdict([r["proxy_verdict"] for r in layers], None)["verdict"] if layers else "n/a"
    used = report["used"]
    return {
        "step": step, "verdict": used["verdict"], "basis": used["basis"],
        "proxy_verdict": proxies, "ablation_delta_loss": used.get("ablation_delta_loss"),
        "layers": {str(r["layer"]): r["verdict"] for r in layers},
        "layer_proxy_verdicts": {str(r["layer"]): r["proxy_verdict"] for r in layers},
    }


def compare_early_final(early: dict, final: dict) -> dict:
    """Did the early warning predict the final verdict (with ablation, and from proxies alone)?"""
    return {
        "verdict": early["verdict"] == final["verdict"],
        "proxy_verdict": early["proxy_verdict"] == final["verdict"],
        "layers": {k: early["layers"].get(k) == v for k, v in final["layers"].items()},
    }


class PLEMonitor(Callback):
    """Logs PLE diagnostics every `every` steps, an early-warning verdict at `early_step`, a final one at the end.

    eval_batches: (x, y) batches (or a zero-argument callable returning them) for ablation and probing; at most
    `max_eval_batches` are used. Without them the monitor cuts random windows from the trainer's evaluation
    domains (`trainer.data.eval_domains`) when it has some, else keeps `capture_batches` training batches (seen
    by the model, so that ablation is on training data), and says which in its notes. token_ids: ids whose
    frequencies pick the table rows for table health (default: the start of `trainer.data.dataset`, the training
    split, else the evaluation batches' inputs).
    """

    def __init__(
        self,
        every: int = 50,
        early_step: int | None = None,
        eval_batches: Iterable | Callable[[], Iterable] | None = None,
        early_fraction: float = EARLY_FRACTION,
        max_eval_batches: int = 8,
        eval_batch_size: int = 8,
        capture_batches: int = 4,
        probe_rows: int = 8,
        token_ids: np.ndarray | None = None,
        top_k: int = DEFAULT_TOP_K,
        cadence_ablation_batches: int = 2,
    ):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self.early_step = early_step
        self.early_fraction = early_fraction
        self._eval_source = eval_batches
        self._eval: list | None = None
        self.max_eval_batches = max_eval_batches
        self.eval_batch_size = eval_batch_size
        self.capture_batches = capture_batches
        self.probe_rows = probe_rows
        self.token_ids = token_ids
        self.top_k = top_k
        self.cadence_ablation_batches = cadence_ablation_batches
        self._init_table: np.ndarray | None = None
        self.freq_source = "the given token ids"
        self.early: dict | None = None
        self.notes: list[str] = []
        self.disabled = False
        self._captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._handles: list = []
        self._grads: dict | None = None

    # --- trainer hooks -------------------------------------------------------------------------------

    def on_train_start(self, trainer: Any) -> None:
        model = unwrap(trainer.model)
        self.diag_dir = Path(trainer.run_dir) / "diagnostics"
        if not ple_layers(model):
            self.disabled = True
            self.notes.append("the model has no PLE (dP = 0): PLEMonitor does nothing")
            return
        self.diag_dir.mkdir(parents=True, exist_ok=True)
        step = int(getattr(trainer, "step", 0) or 0)
        if self.early_step is None:
            total = getattr(trainer, "total_steps", None)
            self.early_step = max(1, round(self.early_fraction * total)) if total else None
            if self.early_step is None:
                self.notes.append("trainer.total_steps unknown and no early_step given: no early warning")
        self._snapshot_init_table(model, step)
        if self.token_ids is None:
            self._use_training_frequencies(trainer)
        if self._eval_source is None:
            self._eval_source = self._trainer_heldout(trainer, model)
        if self._eval_source is None:
            self.notes.append(f"ablation on up to {self.capture_batches} captured training batches "
                              "(no eval_batches given and the trainer has no evaluation domains)")
            self._handles.append(model.register_forward_pre_hook(self._capture, with_kwargs=True))

    def on_after_backward(self, trainer: Any, metrics: dict[str, Any]) -> None:
        # metrics["step"] is the step being computed (trainer.step counts the completed ones).
        step = int(metrics.get("step", getattr(trainer, "step", 0) + 1))
        if not self.disabled and step % self.every == 0:
            self._grads = grad_norm_ratios(trainer.model)

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        if self.disabled:
            return
        step = int(metrics.get("step", getattr(trainer, "step", 0)))
        model = unwrap(trainer.model)
        if step % self.every == 0:
            self._log(model, metrics)
        self._grads = None
        if self.early is None and self.early_step is not None and step >= self.early_step:
            report = self._diagnose(model)
            self.early = summarize(report, step)
            self._write("early.json", {"step": step, "summary": self.early, "report": report})

    def on_train_end(self, trainer: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        step = int(getattr(trainer, "step", 0) or 0)
        if self.disabled:
            self.diag_dir.mkdir(parents=True, exist_ok=True)
            self._write("final.json", {"step": step, "verdict": "n/a", "notes": self.notes})
            return
        report = self._diagnose(unwrap(trainer.model))
        final = summarize(report, step)
        out = {"step": step, "summary": final, "early": self.early, "notes": self.notes, "report": report}
        out["early_matches_final"] = compare_early_final(self.early, final) if self.early else None
        if self.early is None:
            out["notes"] = [*self.notes, "no early verdict was taken (training ended before early_step?)"]
        self._write("final.json", out)

    def state_dict(self) -> dict[str, Any]:
        # Notes are not state: on_train_start (which runs after a resume's load) writes them afresh.
        return {"early": self.early, "early_step": self.early_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.early = state.get("early")
        self.early_step = state.get("early_step", self.early_step)

    # --- internals ---------------------------------------------------------------------------------

    def _snapshot_init_table(self, model: torch.nn.Module, step: int) -> None:
        path = self.diag_dir / INIT_TABLE_FILE
        if step == 0:
            table = ple_table(model).detach().float().cpu().numpy()
            tmp = path.with_name(f".{path.name}.tmp.npy")
            np.save(tmp, table)
            tmp.replace(path)
        elif not path.is_file():
            self.notes.append(f"resumed at step {step} without {path}: the table-health 'delta' view is unavailable")

    def _use_training_frequencies(self, trainer: Any) -> None:
        """Token frequencies from the start of the trainer's training split, when it exposes one."""
        dataset = getattr(getattr(trainer, "data", None), "dataset", None)
        if dataset is None or not hasattr(dataset, "get"):
            return
        n = min(len(dataset), FREQ_MAX_TOKENS)
        self.token_ids = dataset.get(0, n)
        self.freq_source = f"the first {n:,} tokens of the training split"

    def _trainer_heldout(self, trainer: Any, model: torch.nn.Module) -> list | None:
        """Random windows of the trainer's evaluation domains (held-out text), or None when it has none."""
        domains = getattr(getattr(trainer, "data", None), "eval_domains", None) or {}
        tokens = [np.asarray(d.tokens) for d in domains.values() if len(getattr(d, "tokens", ())) > 1]
        stream = np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int64)
        if len(stream) < 3:
            return None
        seq = min(getattr(getattr(trainer, "config", None), "context", 0) or model.config.max_seq_len,
                  len(stream) - 2)
        self.notes.append(f"evaluation batches: {self.max_eval_batches} x {self.eval_batch_size} random windows of "
                          f"{seq} tokens from the trainer's evaluation domains ({', '.join(domains)})")
        return batches_from_tokens(stream, self.eval_batch_size, seq, self.max_eval_batches)

    def _capture(self, module, args, kwargs) -> None:
        # Keep a few training batches for ablation when no evaluation batches were given.
        if not module.training or len(self._captured) >= self.capture_batches:
            return
        x = args[0] if args else kwargs.get("input_ids")
        y = args[1] if len(args) > 1 else kwargs.get("targets")
        if x is not None and y is not None:
            self._captured.append((x.detach().cpu().clone(), y.detach().cpu().clone()))

    def _eval_batches(self) -> list:
        if self._eval is None and self._eval_source is not None:
            source = self._eval_source() if callable(self._eval_source) else self._eval_source
            self._eval = list(itertools.islice(source, self.max_eval_batches))
        return self._eval if self._eval is not None else self._captured

    def _probe_batch(self, model: torch.nn.Module) -> list:
        """The same few sequences every time, so the logged series are comparable across steps."""
        batches = self._eval_batches()
        if batches:
            x = batches[0][0] if isinstance(batches[0], (tuple, list)) else batches[0]
            return [(torch.as_tensor(x)[: self.probe_rows], None)]
        cfg = model.config
        return random_batches(cfg.vocab_size, self.probe_rows, min(64, cfg.max_seq_len), 1)

    def _log(self, model: torch.nn.Module, metrics: dict[str, Any]) -> None:
        found: dict[str, float | None] = {}
        probe = probe_layers(model, self._probe_batch(model))
        for i, stats in probe.items():
            found[f"ple/injection_ratio/layer{i}"] = stats["injection_ratio"]
            found[f"ple/gate_abs/layer{i}"] = stats["gate_mean_abs"]
            found[f"ple/gate_zero_frac/layer{i}"] = stats["gate_near_zero_frac"]
        if probe:
            found["ple/injection_ratio/mean"] = float(np.mean([s["injection_ratio"] for s in probe.values()]))
        found["ple/table_movement"] = self._table_movement(model)
        found["ple/ablation_delta"] = self._cadence_ablation(model)
        if self._grads is not None:
            found["ple/grad_ratio_table"] = self._grads.get("table")
            for i, parts in self._grads["layers"].items():
                for part, ratio in parts.items():
                    found[f"ple/grad_ratio_{part}/layer{i}"] = ratio
        # metrics.jsonl must stay valid JSON: NaN/inf (e.g. a zero trunk gradient) become null.
        metrics.update(jsonable(found))

    def _table_movement(self, model: torch.nn.Module) -> float | None:
        """|table - table at init| / |table at init| (Frobenius); None without the initial table.

        The initial table stays memory-mapped and is read in row chunks: a second in-memory copy of a
        billion-entry table is not worth one logged number.
        """
        if self._init_table is None:
            self._init_table, _ = load_init_table(self.diag_dir.parent)
            if self._init_table is None:
                return None
        table = ple_table(model).detach()
        moved, size = 0.0, 0.0
        for start in range(0, len(self._init_table), MOVEMENT_CHUNK_ROWS):
            init = torch.from_numpy(np.array(self._init_table[start:start + MOVEMENT_CHUNK_ROWS], dtype=np.float32))
            now = table[start:start + MOVEMENT_CHUNK_ROWS].float().cpu()
            moved += (now - init).pow(2).sum().item()
            size += init.pow(2).sum().item()
        return math.sqrt(moved / size) if size > 0 else None

    def _cadence_ablation(self, model: torch.nn.Module) -> float | None:
        """Loss with every PLE layer zeroed minus loss with PLE, on the first few evaluation batches (fixed)."""
        batches = [b for b in self._eval_batches()[: self.cadence_ablation_batches] if isinstance(b, (tuple, list))]
        batches = [(x, y) for x, y in as_batches(batches, model_device(model)) if y is not None]
        if not batches:
            return None
        full = batch_losses(model, batches)
        with ple_ablated(model, ple_layers(model), "zero"):
            ablated = batch_losses(model, batches)
        tokens = sum(n for _, n in full)
        if not tokens:
            return None
        return (sum(a * n for (a, n) in ablated) - sum(f * n for (f, n) in full)) / tokens

    def _diagnose(self, model: torch.nn.Module) -> dict:
        batches = self._eval_batches()
        init, init_note = load_init_table(self.diag_dir.parent)
        report = diagnose_model(model, batches or None, token_ids=self.token_ids, init_table=init,
                                init_note=init_note, top_k=self.top_k,
                                freq_source=self.freq_source)
        report["notes"] = [*self.notes, *report["notes"]]
        return report

    def _write(self, name: str, obj: dict) -> None:
        atomic_write_bytes(self.diag_dir / name, json.dumps(jsonable(obj), indent=2).encode())


register_callback("ple_monitor", lambda cfg, note: PLEMonitor(every=cfg.diagnostics_every,
                                                             early_fraction=cfg.early_warning_fraction)
                  if cfg.diagnostics_every and cfg.model.ple.dim else None)
