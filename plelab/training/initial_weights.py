"""Runs that start from a published checkpoint instead of the random initialisation (`init_from_hf`).

Training knows nothing of checkpoint formats: the package that reads them (plelab.hf, one floor up) registers a
`WeightSource` when it is imported (`plelab train` imports it for a run that sets init_from_hf), and the Trainer
asks for it here when it builds the model. A Python user who sets init_from_hf imports plelab.hf first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from plelab.errors import PlelabError
from plelab.model.config import ModelConfig


@dataclass(frozen=True)
class WeightSource:
    """How to start from a folder: its model config (`like` gives the non-architecture settings) and its weights."""

    model_config: Callable[[str, ModelConfig], ModelConfig]
    """(folder, like) -> the ModelConfig of the folder's model, its weights' names and shapes checked."""
    load_weights: Callable[[nn.Module, str], object]
    """(model just built, folder): the folder's weights into it (this rank's rows of a sharded table)."""


_SOURCES: dict[str, WeightSource] = {}


def register_weight_source(name: str, source: WeightSource) -> None:
    """Make `init_from_<name>` available (called by the package that reads that format, on import)."""
    _SOURCES[name] = source


def weight_source(name: str) -> WeightSource:
    """The registered source for `init_from_<name>`; a clear error when its package was not imported."""
    if name not in _SOURCES:
        raise PlelabError(f"init_from_{name} is set but nothing reads that format here: import plelab.{name} "
                          "before building the Trainer (`plelab train` does)")
    return _SOURCES[name]
