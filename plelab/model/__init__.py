"""The model: config, presets, the transformer with PLE, FFN variants and parameter accounting.

Names are imported on first use, so `plelab.model.config` (the variant lists included) stays importable
without torch, as the edge runtime requires.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_SOURCES = {
    "FFNConfig": "config", "ModelConfig": "config", "NgramConfig": "config", "PLEConfig": "config",
    "count_params": "params",
    "PRESETS": "presets", "load_model_config": "presets", "KVCache": "kv_cache",
    "LanguageModel": "transformer", "TokenIdError": "transformer",
}
__all__ = [
    "FFNConfig", "ModelConfig", "NgramConfig", "PLEConfig", "count_params", "PRESETS", "load_model_config",
    "KVCache", "LanguageModel", "TokenIdError",
]

if TYPE_CHECKING:
    from plelab.model.config import FFNConfig, ModelConfig, NgramConfig, PLEConfig
    from plelab.model.kv_cache import KVCache
    from plelab.model.params import count_params
    from plelab.model.presets import PRESETS, load_model_config
    from plelab.model.transformer import LanguageModel, TokenIdError


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module 'plelab.model' has no attribute {name!r}")
    return getattr(importlib.import_module(f"plelab.model.{_SOURCES[name]}"), name)
