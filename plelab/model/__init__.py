"""The model: config, presets, the transformer with PLE, FFN variants and parameter accounting."""

from plelab.model.config import FFNConfig, ModelConfig, PLEConfig
from plelab.model.params import count_params
from plelab.model.presets import PRESETS, load_model_config
from plelab.model.transformer import KVCache, LanguageModel, TokenIdError

__all__ = [
    "FFNConfig", "ModelConfig", "PLEConfig", "count_params", "PRESETS", "load_model_config",
    "KVCache", "LanguageModel", "TokenIdError",
]
