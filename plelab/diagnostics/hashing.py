"""What is specific to a hashed (n-gram) PLE table: rows touched per token and per step, load per row, collisions
on the evaluation data, and the share of rows never trained.

A token table gives each token its own row; a hashed table gives each position S rows, one per head, and lets
distinct n-grams share a row. Measured per head on a token stream (the evaluation data, read as one sequence):
  collision_rate           share of the distinct n-grams (of the head's order) whose row also holds another
                           distinct n-gram of the same data; beside it the rate uniformly random rows would give,
                           1 - (1 - 1/rows)^(distinct - 1)
  token_collision_rate     share of positions whose n-gram shares its row with another one (frequency-weighted)
  load                     reads per row: rows read at all, the busiest row, the busiest 1 % of rows' share
Per step: distinct rows among windows of one step's tokens (what the lazy Adam updates, what a table on disk
reads). Never trained: rows whose values still equal the initial table's (the run's PLE monitor snapshot, or the
table rebuilt from the run's seed and config, which is what the trainer drew).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from plelab.diagnostics.batches import token_frequencies
from plelab.diagnostics.model_parts import ple_table, unwrap
from plelab.model.config import ModelConfig
from plelab.util.dataclass_config import from_dict

HASH_CHUNK = 1 << 20
"""Tokens hashed at a time."""
STEP_WINDOWS = 32
"""Windows of one step's tokens whose distinct rows are counted."""

DEFINITIONS = {
    "rows_per_token": "table rows one position reads: one per hash head (S)",
    "distinct_rows_per_step": "distinct table rows among one training step's tokens (windows of batch_size x "
    "seq_len x grad_accum consecutive evaluation tokens, averaged): the rows the lazy Adam updates per step",
    "collision_rate": "share of the distinct n-grams of the head's order in the data whose row also holds another "
    "distinct n-gram of the data; random_collision_rate = 1 - (1 - 1/rows)^(distinct - 1), what uniformly random "
    "rows would give",
    "token_collision_rate": "share of the data's positions whose n-gram shares its row with another distinct n-gram",
    "rows_read / max_reads / top_1pct_share": "rows of the head read at least once, the most reads of one row, and "
    "the share of all reads that go to the busiest 1 % of the head's rows",
    "never_trained": "share of table rows whose values equal the initial table's (bit for bit)",
}


def row_ids(model: nn.Module, token_ids: np.ndarray) -> np.ndarray:
    """(T, S) table rows a token stream reads, as one sequence (the first positions read the pad id before it)."""
    index = unwrap(model).per_layer_inputs.index
    flat = np.asarray(token_ids).reshape(-1).astype(np.int64)
    out = []
    for start in range(0, len(flat), HASH_CHUNK):
        lo = max(0, start - index.history)  # the ids before the chunk that its first positions hash
        ids = torch.from_numpy(flat[lo : start + HASH_CHUNK]).to(index_device(index)).unsqueeze(0)
        with torch.no_grad():
            out.append(index.rows(ids, start - lo)[0].cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, index.heads), dtype=np.int64)


def index_device(index: nn.Module) -> torch.device:
    """Where the index's tensors live (the id map's device; the CPU without one)."""
    buffers = list(index.buffers())
    return buffers[0].device if buffers else torch.device("cpu")


def table_row_reads(model: nn.Module, token_ids: np.ndarray) -> np.ndarray:
    """Reads of each table row by a token stream: for a token table the ids' frequencies (ids past the table count
    for row 0, as the model maps them), for an n-gram table every head's hashed rows."""
    bare = unwrap(model)
    rows = bare.config.ple_table_rows
    if bare.config.ple_layout is None:
        return token_frequencies(token_ids, rows)
    return np.bincount(row_ids(bare, token_ids).reshape(-1), minlength=rows)


def _head_stats(grams: np.ndarray, rows: np.ndarray, size: int) -> dict:
    """Collisions and load of one head: grams (M, n) the n-gram ending at each position, rows (M,) its row."""
    _, first, gram_of = np.unique(grams, axis=0, return_index=True, return_inverse=True)
    distinct = len(first)
    # Distinct n-grams per row: count each (row, n-gram) pair once.
    row_of_gram = rows[first]
    grams_per_row = np.bincount(row_of_gram, minlength=size)
    shared = grams_per_row[row_of_gram] > 1
    reads = np.bincount(rows, minlength=size)
    top = max(1, size // 100)
    return {
        "distinct_ngrams": distinct,
        "collision_rate": float(shared.mean()) if distinct else 0.0,
        "random_collision_rate": 1 - (1 - 1 / size) ** max(distinct - 1, 0),
        "token_collision_rate": float(shared[gram_of.reshape(-1)].mean()) if len(rows) else 0.0,
        "rows_read": int((reads > 0).sum()),
        "share_of_rows_read": float((reads > 0).mean()),
        "max_reads": int(reads.max()) if len(reads) else 0,
        "top_1pct_share": float(np.sort(reads)[-top:].sum() / max(1, reads.sum())),
    }


def _compressed(model: nn.Module, token_ids: np.ndarray) -> np.ndarray:
    """The ids the hash sees (through the id map when the model has one)."""
    index = unwrap(model).per_layer_inputs.index
    if index.id_map_file is None:
        return token_ids
    return index.id_map.cpu().numpy()[token_ids]


def distinct_rows_per_step(rows: np.ndarray, tokens_per_step: int) -> float | None:
    """Mean distinct rows among STEP_WINDOWS evenly spaced windows of `tokens_per_step` positions (None when the
    data is shorter than one step)."""
    n = len(rows)
    if n < tokens_per_step or tokens_per_step <= 0:
        return None
    starts = np.linspace(0, n - tokens_per_step, num=min(STEP_WINDOWS, n - tokens_per_step + 1)).astype(np.int64)
    return float(np.mean([len(np.unique(rows[s : s + tokens_per_step])) for s in starts]))


def never_trained(model: nn.Module, initial: torch.Tensor | np.ndarray) -> dict:
    """Share of the table's rows equal to the initial table's, overall and per head."""
    table = ple_table(unwrap(model)).detach().cpu()
    # compared in NumPy: the initial table is often a read-only memory map, which torch would have to copy
    init = initial.detach().cpu().numpy() if isinstance(initial, torch.Tensor) else np.asarray(initial)
    if init.shape != tuple(table.shape):
        return {"share": None, "note": f"initial table has shape {tuple(init.shape)}, the model's {tuple(table.shape)}"}
    same = (table.numpy() == init).all(axis=1)
    layout = unwrap(model).config.ple_layout
    heads = [float(same[o : o + r].mean()) for o, r in zip(layout.offsets, layout.head_rows, strict=True)] \
        if layout is not None else [float(same.mean())]
    return {"share": float(same.mean()), "rows": int(same.sum()), "per_head": heads}


def initial_table(checkpoint_config: dict) -> tuple[torch.Tensor | None, str]:
    """The PLE table a run started from, rebuilt as the trainer drew it (seeded, on the CPU), and how it was got."""
    from plelab.model.transformer import LanguageModel

    train = checkpoint_config.get("train") or {}
    if train.get("init_from_hf"):
        return None, "the run started from a Hugging Face checkpoint's table"
    if "seed" not in train:
        return None, "the checkpoint records no training seed to rebuild the initial table from"
    cfg = from_dict(ModelConfig, checkpoint_config["model"])
    # The id map draws nothing: leave it out, so the rebuild needs no file.
    ngram = dataclasses.replace(cfg.ple.ngram, id_map=None, id_map_sha256=None)
    cfg = dataclasses.replace(cfg, ple=dataclasses.replace(cfg.ple, ngram=ngram))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(train["seed"])
        model = LanguageModel(cfg, device="cpu")
    return ple_table(model).detach(), f"initial table rebuilt from the run's seed {train['seed']}"


def diagnose_hashing(model: nn.Module, checkpoint_config: dict, token_ids: np.ndarray | None,
                     initial: np.ndarray | torch.Tensor | None = None, initial_note: str = "") -> dict:
    """`hash_diagnostics` of a checkpoint's model ({} unless its table is n-gram indexed): the initial table from
    the PLE monitor's snapshot when given, else rebuilt; one step's tokens from the run's training config."""
    if unwrap(model).config.ple_layout is None or not unwrap(model).config.ple_layers:
        return {}
    if initial is None:
        initial, initial_note = initial_table(checkpoint_config)
    train = checkpoint_config.get("train") or {}
    step = None
    if train.get("batch_size"):
        step = train["batch_size"] * train.get("grad_accum", 1) * (train.get("seq_len") or
                                                                  unwrap(model).config.max_seq_len)
    data = np.zeros(0, dtype=np.int64) if token_ids is None else token_ids
    out = hash_diagnostics(model, data, step, initial, initial_note)
    if token_ids is None:
        out["note"] = "no data: collisions, load and rows per step need --data"
    return out


@torch.no_grad()
def hash_diagnostics(model: nn.Module, token_ids: np.ndarray, tokens_per_step: int | None = None,
                     initial: torch.Tensor | np.ndarray | None = None, initial_note: str = "") -> dict:
    """The measurements of the module docstring for an n-gram table on `token_ids` ({} for a token table)."""
    bare = unwrap(model)
    layout = bare.config.ple_layout
    if layout is None or not bare.config.ple_layers:
        return {}
    ids = np.asarray(token_ids).reshape(-1).astype(np.int64)
    rows = row_ids(bare, ids)
    seen = _compressed(bare, ids)
    heads = []
    for j, ((n, k), offset, size) in enumerate(zip(layout.head_keys, layout.offsets, layout.head_rows,
                                                   strict=True)):
        if len(seen) < n:
            continue
        grams = np.stack([seen[n - 1 - i : len(seen) - i] for i in range(n)], axis=1)  # positions n-1.. (no pads)
        heads.append({"order": n, "head": k, "rows": size,
                      **_head_stats(grams, rows[n - 1 :, j] - offset, size)})
    out = {
        "index": "ngram", "orders": list(layout.orders), "heads_per_order": layout.heads,
        "rows_per_token": layout.num_heads, "table_rows": layout.total_rows, "tokens": len(ids),
        "distinct_rows_read": int(len(np.unique(rows))),
        "tokens_per_step": tokens_per_step,
        "distinct_rows_per_step": distinct_rows_per_step(rows, tokens_per_step) if tokens_per_step else None,
        "heads": heads,
        "never_trained": never_trained(bare, initial) if initial is not None else {"share": None},
        "definitions": DEFINITIONS,
    }
    out["never_trained"]["source"] = initial_note
    return out


def format_hashing(h: dict) -> list[str]:
    """Text lines of `hash_diagnostics` for `plelab diagnose`."""
    if not h:
        return []
    lines = [] if "note" not in h else [f"n-gram table: {h['note']}"]
    lines += [f"n-gram table: orders {h['orders']} x {h['heads_per_order']} heads, {h['table_rows']:,} rows; "
             f"{h['rows_per_token']} rows read per token; {h['tokens']:,} tokens read "
             f"{h['distinct_rows_read']:,} distinct rows"]
    if h.get("distinct_rows_per_step") is not None:
        lines.append(f"  distinct rows per training step ({h['tokens_per_step']:,} tokens): "
                     f"{h['distinct_rows_per_step']:,.0f}")
    nt = h["never_trained"]
    lines.append("  rows never trained: " + (f"{100 * nt['share']:.1f} % ({nt['rows']:,} rows)"
                                             if nt.get("share") is not None else "unknown")
                 + (f" [{nt['source']}]" if nt.get("source") else ""))
    lines.append(f"  {'order':>5} {'head':>4} {'rows':>9} {'n-grams':>9} {'collide':>8} {'random':>8} "
                 f"{'by token':>8} {'rows read':>9} {'max reads':>9} {'top 1%':>7}")
    for x in h["heads"]:
        lines.append(f"  {x['order']:>5} {x['head']:>4} {x['rows']:>9,} {x['distinct_ngrams']:>9,} "
                     f"{x['collision_rate']:>8.1%} {x['random_collision_rate']:>8.1%} "
                     f"{x['token_collision_rate']:>8.1%} {x['share_of_rows_read']:>9.1%} {x['max_reads']:>9,} "
                     f"{x['top_1pct_share']:>7.1%}")
    return lines
