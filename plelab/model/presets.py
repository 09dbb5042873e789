"""Named model presets and the one function that turns a name or file plus overrides into a config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.model.config import ModelConfig
from plelab.util.dataclass_config import ConfigError, apply_overrides, from_dict, read_file

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "seed-3b": (
        "the seed study's 3B dense model (SPEC §2); add PLE with ple.dim",
        dict(
            vocab_size=100096, hidden_size=2560, num_layers=32, num_heads=20, num_kv_heads=4,
            head_dim=128, max_seq_len=4096, tie_embeddings=True,
            ffn=dict(kind="swiglu", intermediate_size=6912),
        ),
    ),
    "esp32-28m": (
        "the public ESP32-S3 PLE model (SPEC §2, §6): 28.9M params, 87% PLE table",
        dict(
            vocab_size=32768, hidden_size=96, num_layers=6, num_heads=4, num_kv_heads=4,
            max_seq_len=256, tie_embeddings=True,
            ffn=dict(kind="swiglu", intermediate_size=66),
            ple=dict(dim=128, context=True, gate="input", output_norm=True, output_norm_init=0.0),
        ),
    ),
    "gemma3n-e2b-ple": (
        "Gemma 3n E2B's PLE dimensions (H 2048, 30 layers, dP 256, V_ple 262,144); the core is a stand-in",
        dict(
            vocab_size=262144, hidden_size=2048, num_layers=30, num_heads=8, num_kv_heads=2,
            head_dim=256, max_seq_len=4096, tie_embeddings=True, embed_scale=True,
            ffn=dict(kind="swiglu", intermediate_size=8192),
            ple=dict(dim=256, vocab_size=262144),
        ),
    ),
    "small-ple": (
        "~6M dense params + PLE dP=128, trains on 2 CPU cores in minutes (the issue-3 study size)",
        dict(
            vocab_size=8192, hidden_size=256, num_layers=6, num_heads=8, num_kv_heads=4,
            max_seq_len=256, ffn=dict(intermediate_size=688), ple=dict(dim=128),
        ),
    ),
    "mini-ple": (
        "~1M dense params + PLE dP=64: the README demo and quick experiments",
        dict(
            vocab_size=4096, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
            max_seq_len=128, ffn=dict(intermediate_size=344), ple=dict(dim=64),
        ),
    ),
    "tiny": (
        "a few thousand parameters for unit tests",
        dict(
            vocab_size=256, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
            max_seq_len=64, ffn=dict(intermediate_size=64), ple=dict(dim=16),
        ),
    ),
}


def preset_dict(name: str) -> dict[str, Any]:
    """The raw override dict of a preset (a copy)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return apply_overrides(PRESETS[name][1], [])


def load_model_config(source: str | Path | dict[str, Any], overrides: list[str] | None = None) -> ModelConfig:
    """Build a ModelConfig from a preset name, a TOML/YAML/JSON file or a dict, plus `key=value` overrides.

    A file may name a base preset with `preset = "esp32-28m"` and override fields below it, and may hold the
    model either at the top level or under a `[model]` table (so a training config file also works).
    """
    if isinstance(source, dict):
        data = dict(source)
    elif str(source) in PRESETS:
        data = preset_dict(str(source))
    else:
        path = Path(source)
        if not path.exists():
            raise ConfigError(f"{source!r} is neither a preset ({', '.join(PRESETS)}) nor an existing file")
        data = read_file(path)
    if isinstance(data.get("model"), dict):
        data = data["model"]
    if "preset" in data:
        base = preset_dict(data.pop("preset"))
        data = _deep_merge(base, data)
    data = apply_overrides(data, overrides or [])
    return from_dict(ModelConfig, data)


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
