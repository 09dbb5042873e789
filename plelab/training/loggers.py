"""Optional metric sinks as callbacks: TensorBoard and Weights & Biases, used only when installed and asked for."""

from __future__ import annotations

import numbers
from typing import Any

from plelab.training.callbacks import Callback, register_callback


def _scalars(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update(_scalars(v, f"{prefix}{k}/"))
        elif isinstance(v, numbers.Real) and not isinstance(v, bool):
            out[prefix + k] = float(v)
    return out


class TensorBoardLogger(Callback):
    """Writes every scalar metric and evaluation result to RUN_DIR/tb."""

    def on_train_start(self, trainer: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(trainer.run_dir / "tb"))

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        for k, v in _scalars(metrics).items():
            self.writer.add_scalar(k, v, trainer.step)

    def on_eval(self, trainer: Any, results: dict[str, Any]) -> None:
        for k, v in _scalars(results, "eval/").items():
            self.writer.add_scalar(k, v, trainer.step)

    def on_train_end(self, trainer: Any) -> None:
        self.writer.close()


class WandbLogger(Callback):
    """Logs every scalar metric and evaluation result to a W&B run (project 'plelab')."""

    def on_train_start(self, trainer: Any) -> None:
        import wandb

        from plelab.training.config import train_config_dict

        self.run = wandb.init(project="plelab", dir=str(trainer.run_dir), config=train_config_dict(trainer.config),
                              name=trainer.run_dir.name, resume="allow")

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        self.run.log(_scalars(metrics), step=trainer.step)

    def on_eval(self, trainer: Any, results: dict[str, Any]) -> None:
        self.run.log(_scalars(results, "eval/"), step=trainer.step)

    def on_train_end(self, trainer: Any) -> None:
        self.run.finish()


def _if_installed(module: str, callback: type[Callback], note) -> Callback | None:
    """`callback()` when `module` can be imported, else None and a note saying so."""
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        return callback()
    note(f"note: {module} requested but not installed (pip install {module}); skipping it")
    return None


register_callback("tensorboard", lambda cfg, note: _if_installed("tensorboard", TensorBoardLogger, note)
                  if cfg.tensorboard else None)
register_callback("wandb", lambda cfg, note: _if_installed("wandb", WandbLogger, note) if cfg.wandb else None)
