"""Trainer callbacks: the extension point for checkpoints, evaluation, progress, logging and monitors.

The trainer's loop only computes steps; everything else hangs on these hooks. A callback reads
`trainer.model`, `trainer.optimizer`, `trainer.step`, `trainer.config`, `trainer.run_dir` and may add keys
to the `metrics` dict it is handed in `on_step_end`, which the trainer then appends to
RUN_DIR/metrics.jsonl as one JSON object per line. Per step the order is:

    on_after_backward -> (clip, optimizer step) -> on_step_end -> metrics.jsonl line -> on_step_logged

Callbacks run in list order. A callback's `state_dict` is saved in every checkpoint under its `name`,
so adding, removing or reordering callbacks between a run and its resume is safe.

Which callbacks a run gets is decided by a registry, not by the trainer: a callback's module calls
`register_callback(name, build)` once, where `build(config, note)` returns the callback the training config
asks for (reading its own settings from it), or None. `plelab.training.callback_factory.callbacks_for` builds
every registered one in registration order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plelab.errors import PlelabError


class TrainingStopped(PlelabError):
    """Training stopped on purpose (non-finite losses, disk full, ...); the message says which checkpoints exist."""


class Callback:
    """Base class: override the hooks you need; every hook is a no-op by default."""

    @property
    def name(self) -> str:
        """Key of this callback's state in checkpoints; override when one run holds two of a kind."""
        return type(self).__name__

    def on_train_start(self, trainer: Any) -> None:
        """Once, after the model, optimizer and (on resume) state are ready, before the first step."""

    def on_after_backward(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """After the last micro-batch's backward, before clipping and the optimizer step: gradients exist."""

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """After the optimizer step; `metrics` (step, loss, lr, step_time, ...) is about to be logged."""

    def on_step_logged(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """After the step's metrics line was written: the place for progress lines, evaluations, checkpoints."""

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


def unique_names(callbacks: list[Callback]) -> list[str]:
    """Each callback's state key: its name, with `#2`, `#3`, ... for later callbacks of the same name."""
    seen: dict[str, int] = {}
    names = []
    for cb in callbacks:
        seen[cb.name] = seen.get(cb.name, 0) + 1
        names.append(cb.name if seen[cb.name] == 1 else f"{cb.name}#{seen[cb.name]}")
    return names


CallbackBuilder = Callable[[Any, Callable[[str], None]], "Callback | None"]
"""build(training config, note) -> the callback that config asks for, or None; `note` takes one line for the user."""

_REGISTRY: dict[str, CallbackBuilder] = {}


def register_callback(name: str, build: CallbackBuilder) -> None:
    """Add a callback to every run whose config asks for it (`build` decides); names are unique."""
    if name in _REGISTRY:
        raise ValueError(f"a callback named {name!r} is already registered")
    _REGISTRY[name] = build


def registered_callbacks() -> dict[str, CallbackBuilder]:
    """{name: builder} in registration order."""
    return dict(_REGISTRY)
