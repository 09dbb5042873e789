"""Which linear layers get a LoRA adapter: names and groups resolved against the checkpoint's decoder layers.

A target is a group of TARGET_GROUPS (attention, mlp, ple) or a linear layer's path inside a decoder layer,
given whole (self_attn.q_proj) or by its last part(s) (q_proj). The result is one regular expression over
module names, anchored to the decoder layers, so it never reaches a vision or audio tower's layers of the
same name; peft matches it with re.fullmatch (the form adapter_config.json stores).
"""

from __future__ import annotations

import re

from torch import nn

from plelab.hf.finetune.config import TARGET_GROUPS
from plelab.util.dataclass_config import ConfigError


def layer_linear_paths(layers: nn.ModuleList) -> list[str]:
    """Paths of the nn.Linear modules inside the decoder layers, relative to a layer, in first-seen order."""
    seen: dict[str, None] = {}
    for layer in layers:
        for name, module in layer.named_modules():
            if isinstance(module, nn.Linear):
                seen.setdefault(name, None)
    return list(seen)


def resolve_targets(requested: list[str], available: list[str]) -> list[str]:
    """The layer-relative paths `requested` names; an unknown name is a ConfigError listing the known ones."""
    chosen: dict[str, None] = {}
    for name in requested:
        wanted = TARGET_GROUPS.get(name, (name,))
        hits = [p for p in available if any(p == w or p.endswith("." + w) for w in wanted)]
        if not hits:
            leaves = sorted({p.rsplit(".", 1)[-1] for p in available})
            raise ConfigError(f"finetune.targets: no linear layer named {name!r} in this checkpoint's decoder layers; "
                              f"use {', '.join(TARGET_GROUPS)} or one of {', '.join(leaves)}")
        chosen.update(dict.fromkeys(hits))
    return list(chosen)


def target_regex(layers_prefix: str, paths: list[str]) -> str:
    """A re.fullmatch pattern for `{layers_prefix}.layers.<i>.<path>` (e.g. layers_prefix 'model.language_model')."""
    alternatives = "|".join(re.escape(p) for p in paths)
    return rf"{re.escape(layers_prefix)}\.layers\.\d+\.({alternatives})"
