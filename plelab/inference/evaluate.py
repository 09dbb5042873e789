"""Per-domain evaluation: loss in nats per token and bits per byte, their evaluation noise, and the macro average.

Bits per byte makes models with different tokenizers comparable: bpb = summed NLL / (UTF-8 bytes * ln 2).

Which tokens are scored (`sample`, with a cap of `max_tokens` per domain):
- "spread" (the default): windows of `seq_len` tokens at evenly spaced positions through the whole domain,
  the same windows for every model, so a capped evaluation still reads every part of every file;
- "head": the first whole documents that fit in the cap (what runs recorded before `eval_sample` existed
  used: for a long file, a few percent of it from its start);
- "all": every token (the cap is ignored).
The noise of the evaluation is reported as `loss_se`: the standard error of the domain's per-token loss over
its scored windows (a ratio estimate), i.e. how far another sample of windows of the same text could move it.
Two models scored on the same windows differ by less than that; seed-to-seed noise is the studies' business.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from plelab.data.prepare import HELDOUT_DOMAIN, EvalDomain
from plelab.errors import PlelabError
from plelab.model.transformer import LanguageModel, check_token_ids

SAMPLES = ("spread", "head", "all")
"""How a capped evaluation picks its tokens (module docstring)."""


def check_seq_len(seq_len: int, max_seq_len: int) -> int:
    """`seq_len` (0 = the model's context), refused beyond the context the model was built for."""
    if seq_len > max_seq_len:
        raise PlelabError(f"--seq-len {seq_len} is beyond the model's context of {max_seq_len} tokens")
    return seq_len or max_seq_len


def _byte_position(domain: EvalDomain) -> tuple[np.ndarray, np.ndarray]:
    """(token positions, byte counts) to interpolate bytes consumed by token position, exact at document ends."""
    return (np.concatenate([[1], domain.doc_token_ends]).astype(float),
            np.concatenate([[0], domain.doc_byte_ends]).astype(float))


def sample_windows(domain: EvalDomain, seq_len: int, max_tokens: int | None,
                   sample: str = "spread") -> tuple[EvalDomain, list[int], float]:
    """(domain scored, window starts, UTF-8 bytes of the scored targets) for one domain.

    A window starting at s predicts tokens[s + 1 : s + 1 + seq_len] from tokens[s : s + seq_len]. Bytes are exact
    for whole documents ("head", "all") and interpolated within a document for "spread" windows.
    """
    if sample not in SAMPLES:
        raise PlelabError(f"eval sample must be one of {', '.join(SAMPLES)}, got {sample!r}")
    if max_tokens is not None and sample == "head":
        domain = domain.head(max_tokens)
    n = domain.n_targets
    if n < 1:
        return domain, [], 0.0
    count = math.ceil(max_tokens / seq_len) if max_tokens is not None and sample == "spread" else None
    if count is None or count * seq_len >= n:
        return domain, list(range(0, n, seq_len)), float(domain.n_bytes)
    last = n - seq_len
    starts = [round(i * last / (count - 1)) for i in range(count)] if count > 1 else [last // 2]
    xs, bs = _byte_position(domain)
    ends = np.array(starts, dtype=float)
    n_bytes = float(np.sum(np.interp(ends + 1 + seq_len, xs, bs) - np.interp(ends + 1, xs, bs)))
    return domain, starts, n_bytes


@torch.no_grad()
def window_nlls(model: LanguageModel, tokens: np.ndarray, starts: list[int], seq_len: int, batch_size: int,
                autocast=None) -> np.ndarray:
    """(windows, 2) array of summed next-token NLL (nats) and target count per window."""
    device = next(model.parameters()).device
    n_targets = len(tokens) - 1
    out = np.zeros((len(starts), 2))
    for i in range(0, len(starts), batch_size):
        group = starts[i:i + batch_size]
        x = np.zeros((len(group), seq_len), dtype=np.int64)
        y = np.full((len(group), seq_len), -100, dtype=np.int64)
        for row, s in enumerate(group):
            n = min(seq_len, n_targets - s)
            x[row, :n] = tokens[s:s + n]
            y[row, :n] = tokens[s + 1:s + 1 + n]
        xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        with autocast if autocast is not None else contextlib.nullcontext():
            logits, _ = model(xt)
        nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), yt.reshape(-1), ignore_index=-100,
                              reduction="none").reshape(len(group), seq_len)
        out[i:i + len(group), 0] = nll.sum(dim=1).double().cpu().numpy()
        out[i:i + len(group), 1] = (yt != -100).sum(dim=1).cpu().numpy()
    return out


def ratio_se(per_window: np.ndarray) -> float:
    """Standard error of sum(nll) / sum(count) over windows (the ratio estimator's; NaN for one window)."""
    k = per_window.shape[0]
    if k < 2:
        return math.nan
    nll, count = per_window[:, 0], per_window[:, 1]
    loss = nll.sum() / count.sum()
    resid = (nll - loss * count) / count.mean()
    return float(math.sqrt(np.sum(resid**2) / (k * (k - 1))))


def evaluate_domains(
    model: LanguageModel,
    domains: dict[str, EvalDomain],
    seq_len: int,
    batch_size: int = 8,
    max_tokens: int | None = None,
    autocast=None,
    sample: str = "spread",
    whole: Iterable[str] = (),
) -> dict[str, Any]:
    """{"domains": {name: {loss, bpb, tokens, loss_se, windows, sample}}, "macro": {loss, bpb}, ...}.

    max_tokens caps each domain, picked by `sample` (module docstring); None = every token. Domains named in
    `whole` are scored whole whatever the cap (their result says sample "all").
    """
    whole = set(whole)
    was_training = model.training
    model.eval()
    out: dict[str, Any] = {}
    for name, dom in sorted(domains.items()):
        check_token_ids(dom.tokens, model.config.vocab_size)  # once per domain, on the host (forward does not)
        cap = None if name in whole else max_tokens
        scored, starts, n_bytes = sample_windows(dom, seq_len, cap, sample)
        if not starts:
            continue
        per = window_nlls(model, scored.tokens, starts, seq_len, batch_size, autocast)
        nll, targets = float(per[:, 0].sum()), int(per[:, 1].sum())
        out[name] = {
            "loss": nll / targets,
            "bpb": nll / (max(n_bytes, 1.0) * math.log(2)),
            "tokens": targets,
            "loss_se": ratio_se(per),
            "windows": len(starts),
            "sample": sample if cap is not None else "all",
        }
    model.train(was_training)
    # The prepared data's held-out split rides along as HELDOUT_DOMAIN when evaluation folders are given too:
    # it is reported, but the macro stays the average over the folders' domains (its meaning before).
    averaged = [d for name, d in out.items() if name != HELDOUT_DOMAIN] or list(out.values())
    macro = {k: float(np.mean([d[k] for d in averaged])) if out else float("nan") for k in ("loss", "bpb")}
    return {"domains": out, "macro": macro, "max_tokens_per_domain": max_tokens,
            "sample": sample if max_tokens is not None else "all"}
