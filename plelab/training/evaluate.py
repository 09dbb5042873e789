"""Per-domain evaluation: loss in nats per token and bits per byte, plus their macro average.

Bits per byte makes models with different tokenizers comparable: bpb = summed NLL / (UTF-8 bytes * ln 2).
A capped evaluation scores whole documents only (EvalDomain.head), so its byte count stays exact.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import torch

from plelab.data.loader import eval_batches
from plelab.data.prepare import HELDOUT_DOMAIN, EvalDomain
from plelab.errors import PlelabError
from plelab.model.transformer import LanguageModel, check_token_ids


def check_seq_len(seq_len: int, max_seq_len: int) -> int:
    """`seq_len` (0 = the model's context), refused beyond the context the model was built for."""
    if seq_len > max_seq_len:
        raise PlelabError(f"--seq-len {seq_len} is beyond the model's context of {max_seq_len} tokens")
    return seq_len or max_seq_len


@torch.no_grad()
def domain_nll(model: LanguageModel, domain: EvalDomain, seq_len: int, batch_size: int, autocast=None) -> float:
    """Summed next-token NLL (nats) over every target of the domain."""
    device = next(model.parameters()).device
    check_token_ids(domain.tokens, model.config.vocab_size)  # once per domain, on the host
    total = 0.0
    for x, y in eval_batches(domain.tokens, seq_len, batch_size, pad_id=0):
        with autocast if autocast is not None else contextlib.nullcontext():
            _, loss = model(x.to(device), y.to(device))
        total += float(loss) * int((y != -100).sum())
    return total


def evaluate_domains(
    model: LanguageModel,
    domains: dict[str, EvalDomain],
    seq_len: int,
    batch_size: int = 8,
    max_tokens: int | None = None,
    autocast=None,
) -> dict[str, Any]:
    """{"domains": {name: {loss, bpb, tokens}}, "macro": {loss, bpb}}; max_tokens caps each domain."""
    was_training = model.training
    model.eval()
    out: dict[str, Any] = {}
    for name, dom in sorted(domains.items()):
        if max_tokens is not None:
            dom = dom.head(max_tokens)
        if dom.n_targets < 1:
            continue
        nll = domain_nll(model, dom, seq_len, batch_size, autocast)
        out[name] = {
            "loss": nll / dom.n_targets,
            "bpb": nll / (max(dom.n_bytes, 1) * math.log(2)),
            "tokens": dom.n_targets,
        }
    model.train(was_training)
    # The prepared data's held-out split rides along as HELDOUT_DOMAIN when evaluation folders are given too:
    # it is reported, but the macro stays the average over the folders' domains (its meaning before).
    averaged = [d for name, d in out.items() if name != HELDOUT_DOMAIN] or list(out.values())
    macro = {k: float(np.mean([d[k] for d in averaged])) if out else float("nan") for k in ("loss", "bpb")}
    return {"domains": out, "macro": macro, "max_tokens_per_domain": max_tokens}
