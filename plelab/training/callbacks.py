"""Trainer callbacks: the extension point for logging, diagnostics and monitors (as in OLMo-core).

The trainer calls these hooks; a callback reads `trainer.model`, `trainer.optimizer`, `trainer.step`,
`trainer.config`, `trainer.run_dir` and may add keys to the `metrics` dict it is handed, which the
trainer then appends to RUN_DIR/metrics.jsonl as one JSON object per line.
"""

from __future__ import annotations

from typing import Any


class Callback:
    """Base class: override the hooks you need; every hook is a no-op by default."""

    def on_train_start(self, trainer: Any) -> None:
        """Once, after the model, optimizer and (on resume) state are ready, before the first step."""

    def on_after_backward(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """After the last micro-batch's backward, before clipping and the optimizer step: gradients exist."""

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """After the optimizer step; `metrics` (step, loss, lr, ...) is about to be logged."""

    def on_eval(self, trainer: Any, results: dict[str, Any]) -> None:
        """After an evaluation; `results` is the evaluation JSON (domains, macro)."""

    def on_checkpoint(self, trainer: Any, ckpt_dir: Any) -> None:
        """After a checkpoint was written."""

    def on_train_end(self, trainer: Any) -> None:
        """Once, after the last step (not called when the run is interrupted)."""

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints so a resumed run continues the callback exactly."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
