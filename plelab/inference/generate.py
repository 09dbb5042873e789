"""The one decode loop: prefill, then sample / forward one token at a time, and stream the text as it comes.

A model is seen through a `Forward`: token ids appended to its KV cache in, logits of the last position
out (a NumPy row). `plelab generate` wraps the PyTorch model with `model_forward`; the edge runtime
passes its own NumPy forward. Torch is imported only inside `model_forward`, so `plelab run` stays
torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from plelab.errors import PlelabError
from plelab.inference.sampling import Sampling, sample

Forward = Callable[[list[int]], np.ndarray]
"""Append ids to the model's cache and return the logits (V,) at the last of them."""

# A byte-level token can end inside a UTF-8 character; the streamer waits at most this many tokens for the
# rest before printing what it has (a model can emit bytes that never form a valid character).
MAX_PENDING_TOKENS = 8


class GenerationError(PlelabError):
    """A prompt or request that cannot be generated from."""


@dataclass(frozen=True)
class ContextFit:
    """A prompt and a token budget cut to the model's context, and the one line that says what was cut."""

    prompt: list[int]
    max_new_tokens: int
    note: str | None


def fit_context(prompt: list[int], max_new_tokens: int, context: int) -> ContextFit:
    """Cut the prompt (keeping its end) and the budget so prefill + decode stay within `context` positions.

    The last sampled token is never fed back, so n new tokens need len(prompt) + n - 1 positions. A prompt
    longer than the context keeps as many of its last tokens as leave room for the budget, but at least half
    the context.
    """
    if not prompt:
        raise GenerationError("the prompt is empty (it encodes to no tokens)")
    if max_new_tokens < 1 or context < 1:
        raise GenerationError(f"max_new_tokens and context must be >= 1, got {max_new_tokens} and {context}")
    cut = []
    if len(prompt) > context:
        keep = min(context, max(1, context // 2, context - max_new_tokens + 1))
        cut.append(f"kept the last {keep} of the prompt's {len(prompt)} tokens")
        prompt = prompt[-keep:]
    room = context - len(prompt) + 1
    if max_new_tokens > room:
        cut.append(f"generating {room} tokens, not {max_new_tokens}")
        max_new_tokens = room
    note = f"{'; '.join(cut)} (the model's context is {context} tokens)" if cut else None
    return ContextFit(list(prompt), max_new_tokens, note)


def generate_ids(forward: Forward, prompt: list[int], max_new_tokens: int, sampling: Sampling | None = None,
                 stop_id: int | None = None) -> Iterator[int]:
    """Yield up to `max_new_tokens` sampled ids; stops before `stop_id`, never runs a forward after the last."""
    sampling = sampling or Sampling()
    if not prompt:
        raise GenerationError("the prompt is empty (it encodes to no tokens)")
    rng = sampling.rng()
    logits = forward(list(prompt))
    for step in range(max_new_tokens):
        token = sample(logits, sampling, rng)
        if token == stop_id:
            return
        yield token
        if step < max_new_tokens - 1:
            logits = forward([token])


def stream_text(ids: Iterable[int], decode: Callable[[list[int]], str]) -> Iterator[str]:
    """Text of `ids` piece by piece as they arrive, holding back tokens that end inside a UTF-8 character.

    Pieces are decoded separately and always end on a character boundary, so for byte-level tokenizers
    their concatenation equals `decode(all ids)`.
    """
    pending: list[int] = []
    for token in ids:
        pending.append(token)
        text = decode(pending)
        if text.endswith("\ufffd") and len(pending) < MAX_PENDING_TOKENS:
            continue
        pending = []
        if text:
            yield text
    if pending:
        yield decode(pending)


def model_forward(model: Any, capacity: int) -> Forward:
    """A `Forward` over a PyTorch `LanguageModel` with a fresh KV cache of `capacity` positions."""
    import torch

    from plelab.model.kv_cache import KVCache

    weight = next(model.parameters())
    cache = KVCache.empty(model.config, 1, capacity, weight.device, weight.dtype)

    @torch.no_grad()
    def forward(ids: list[int]) -> np.ndarray:
        logits, _ = model(torch.tensor([ids], device=weight.device), cache=cache)
        return logits[0, -1].float().cpu().numpy()

    return forward


def check_fits(prompt: list[int], max_new_tokens: int, context: int) -> None:
    """Raise GenerationError unless prefill + decode fit in `context` positions (use `fit_context` to cut)."""
    need = len(prompt) + max_new_tokens - 1
    if not prompt or max_new_tokens < 1 or need > context:
        raise GenerationError(f"{len(prompt)} prompt tokens and {max_new_tokens} new tokens need {need} positions; "
                              f"the model's context is {context} (cut the request with fit_context)")


def generate(model: Any, prompt: list[int], max_new_tokens: int, sampling: Sampling | None = None,
             stop_id: int | None = None, **settings: Any) -> Iterator[int]:
    """Sample from a PyTorch `LanguageModel` (in eval mode) with a KV cache; `settings` are `Sampling` fields."""
    if sampling is not None and settings:
        raise TypeError("pass either sampling or Sampling fields, not both")
    sampling = sampling or Sampling(**settings)
    check_fits(prompt, max_new_tokens, model.config.max_seq_len)
    model.check_ids(prompt)  # sampled ids lie in the vocabulary: the prompt is the only one to check
    forward = model_forward(model, len(prompt) + max_new_tokens - 1)
    return generate_ids(forward, prompt, max_new_tokens, sampling, stop_id)
