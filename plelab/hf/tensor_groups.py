"""The tensor groups a quantization recipe gives one format each, by Hugging Face Gemma name.

    ple_table        embed_tokens_per_layer            the per-layer embedding table (V x L*dP)
    ple_context      per_layer_model_projection        context projection of the input embedding (L*dP x H)
    ple_projection   layers.N.per_layer_projection     per-layer projection dP -> H
    ple_gate         layers.N.per_layer_input_gate     per-layer gate H -> dP
    attention        layers.N.self_attn.{q,k,v,o}_proj
    ffn              layers.N.mlp.*                    (every FFN kind plelab builds)
    embedding        embed_tokens, lm_head             main embedding and (untied) output head
    norms            every 1-D tensor (norm weights, layer scalars) and MGLU masks: never quantized
    other            any other matrix (Gemma 3n's AltUp and LAuReL): kept at 16 bits

plelab's own state-dict names map here through `plelab.hf.interop.gemma4_hf_name` (the PLE modules carry
HF's names, the core Llama's), so one table serves plelab runs of either arch and HF folders.
"""

from __future__ import annotations

import re

GROUPS = ("ple_table", "ple_context", "ple_projection", "ple_gate", "attention", "ffn", "embedding")
"""The groups a recipe chooses a format for, in report order."""
FIXED_GROUPS = ("norms", "other")
"""Groups kept unquantized (f32 norms; other matrices at 16 bits)."""

_RULES = (
    ("ple_table", re.compile(r"(.*\.)?embed_tokens_per_layer\.weight")),
    ("ple_context", re.compile(r"(.*\.)?per_layer_model_projection\.weight")),
    ("ple_projection", re.compile(r"(.*\.)?layers\.\d+\.per_layer_projection\.weight")),
    ("ple_gate", re.compile(r"(.*\.)?layers\.\d+\.per_layer_input_gate\.weight")),
    ("attention", re.compile(r"(.*\.)?layers\.\d+\.self_attn\.[qkvo]_proj\.weight")),
    ("ffn", re.compile(r"(.*\.)?layers\.\d+\.mlp\..+")),
    ("embedding", re.compile(r"((.*\.)?embed_tokens|lm_head)\.weight")),
)


def group_of(hf_name: str, ndim: int | None = None) -> str:
    """The group of an HF Gemma tensor name (with or without a 'model.' prefix); 1-D tensors are 'norms'."""
    if ndim is not None and ndim <= 1:
        return "norms"
    if re.search(r"(norm|layer_scalar|mask_logits)(\.weight)?$", hf_name):
        return "norms"
    for group, rule in _RULES:
        if rule.fullmatch(hf_name):
            return group
    return "other"
