"""NumPy runtime for .ple files: the exact PLE forward pass with a KV cache, rows streamed from the file.

The dense core (and a tied output head) is dequantised into memory once; the PLE table and, when it is
not resident, the main embedding stay in the memory-mapped file and only the records of the tokens
actually seen are touched (one contiguous read each). Every read is counted per memory tier: records
really read from the file, and the dense reads a device would make (from the planner's placement when
one is given). Mirrors plelab/model/{transformer,ple,ffn,norm}.py operation for operation in float32,
so an fp32 export reproduces the PyTorch logits; imports no torch.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plelab.edge.format import PleFile
from plelab.errors import PlelabError
from plelab.inference.generate import check_fits, generate_ids
from plelab.inference.sampling import Sampling
from plelab.model.config import FFN_KINDS
from plelab.model.config import PLE_GATES as GATES

HOST_TIERS = {"rows": "file", "dense": "ram"}
PREFILL_CHUNK = 32  # prompt tokens per forward call during prefill


class EdgeRuntimeError(PlelabError):
    """Input the runtime cannot run (bad token ids, unsupported model variant, context overflow)."""


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """`x * rsqrt(mean(x^2) + eps) * w` over the last axis, in float32."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * w


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), written with tanh so large |x| cannot overflow."""
    return x * np.float32(0.5) * (np.float32(1) + np.tanh(x * np.float32(0.5)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (torch's approximate='tanh')."""
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def rope(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """Half-rotation RoPE of (heads, T, D) at positions `pos`, computed like rope_tables in float32."""
    d = x.shape[-1]
    inv_freq = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    freqs = np.outer(pos.astype(np.float32), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


@dataclass
class KVCache:
    """Keys and values per layer, (kv_heads, capacity, head_dim) float32; `pos` positions filled."""

    keys: np.ndarray
    values: np.ndarray
    pos: int = 0

    @property
    def capacity(self) -> int:
        """Positions the cache holds."""
        return self.keys.shape[2]


@dataclass
class Traffic:
    """Bytes and reads per memory tier, accumulated over tokens."""

    bytes: Counter = field(default_factory=Counter)
    reads: Counter = field(default_factory=Counter)
    tokens: int = 0

    def add(self, tier: str, nbytes: int, reads: int = 1) -> None:
        """Count `reads` reads totalling `nbytes` from `tier`."""
        self.bytes[tier] += nbytes
        self.reads[tier] += reads

    def per_token(self) -> dict[str, dict[str, float]]:
        """{"bytes_per_token": {tier: x}, "reads_per_token": {tier: x}} averaged over the tokens counted."""
        n = max(self.tokens, 1)
        return {"bytes_per_token": {k: v / n for k, v in sorted(self.bytes.items())},
                "reads_per_token": {k: v / n for k, v in sorted(self.reads.items())}}


class EdgeModel:
    """A .ple model ready to run: resident dense weights, memory-mapped row tables, traffic counters."""

    def __init__(self, path: str | Path, verify: str = "full", placement: dict[str, str] | None = None,
                 kv_value_bytes: int = 4):
        """Open `path`; `placement` (planner item -> tier) and `kv_value_bytes` model a device's traffic."""
        self.file = PleFile(path, verify)
        self.kv_value_bytes = kv_value_bytes
        try:
            self._load(path, placement)
        except BaseException:
            self.file.close()
            raise

    def _load(self, path: str | Path, placement: dict[str, str] | None) -> None:
        lay = self.file.layout
        if lay.source.get("table_only"):  # an export of a foreign checkpoint's PLE table, for planning only
            raise EdgeRuntimeError(f"{path} is a table-only export ({lay.source.get('core', 'no core')}); "
                                   "there is no core to run: use it with `plelab plan` or the record reader")
        m, d = lay.model, lay.derived
        self.cfg = m
        self.H, self.n_layers, self.n_heads = m["hidden_size"], m["num_layers"], m["num_heads"]
        self.n_kv, self.head_dim = d["kv_heads"], d["head_dim"]
        self.vocab, self.eps, self.theta = m["vocab_size"], m["norm_eps"], m["rope_theta"]
        self.ffn_kind, self.ple = m["ffn"]["kind"], m["ple"]
        if self.ffn_kind not in FFN_KINDS:
            raise EdgeRuntimeError(f"FFN kind {self.ffn_kind!r} is not supported by the edge runtime ({FFN_KINDS})")
        self.ple_layers = list(d["ple_layers"])
        if self.ple_layers and self.ple["gate"] not in GATES:
            raise EdgeRuntimeError(f"PLE gate {self.ple['gate']!r} is not supported by the edge runtime ({GATES})")
        self.slot = {layer: i for i, layer in enumerate(self.ple_layers)}
        self.ple_vocab = d["ple_vocab_size"]
        missing = [n for n in self._required() if n not in {t.name for t in lay.tensors}]
        if missing:
            raise EdgeRuntimeError(f"{path} lacks tensors this model needs: {', '.join(missing[:3])}")
        self.w = {t.name: self.file.read_tensor(t.name) for t in lay.tensors}
        self.ple_table = lay.table("ple")
        self.embed_table = lay.table("embed")
        if (self.ple_layers and self.ple_table is None) or (m["tie_embeddings"] and self.embed_table is None):
            raise EdgeRuntimeError(f"{path} lacks a row table this model needs (ple or embed)")
        # The input row comes from the PLE record when it carries one (no extra read), else the embed table.
        self.embed_in_record = self.ple_table is not None and self.ple_table.part("embed") is not None
        self.head = (self.file.read_table(self.embed_table, "embed") if m["tie_embeddings"]
                     else self.w["lm_head.weight"])
        if self.ffn_kind == "mglu":
            self._split_mglu()
        self.placement = placement
        self.traffic = Traffic()
        self._dense_bytes = {t.name: t.nbytes for t in lay.tensors}
        if m["tie_embeddings"]:
            self._dense_bytes["table:embed"] = self.embed_table.nbytes

    def _required(self) -> list[str]:
        """Dense tensors the forward pass reads (a file without them cannot be run)."""
        ffn = {"swiglu": ["gate_proj", "up_proj", "down_proj"], "mglu": ["down_proj"],
               "lowrank": ["gate_proj_a", "gate_proj_b", "up_proj_a", "up_proj_b", "down_proj"]}[self.ffn_kind]
        names = ["norm.weight"] + ([] if self.cfg["tie_embeddings"] else ["lm_head.weight"])
        for i in range(self.n_layers):
            p = f"layers.{i}."
            names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
            names += [f"{p}self_attn.{n}_proj.weight" for n in "qkvo"] + [f"{p}mlp.{n}.weight" for n in ffn]
            if self.ffn_kind == "mglu":
                names += [p + "mlp.weight", p + "mlp.mask_logits"]
            if i in self.slot:
                gate = "per_layer_input_gate.weight" if self.ple["gate"] == "input" else "gate"
                names += [p + "ple." + gate, p + "ple.per_layer_projection.weight"]
                names += [p + "ple.post_per_layer_input_norm.weight"] if self.ple["output_norm"] else []
        if self.ple_layers and self.ple["context"]:
            names += ["per_layer_inputs.per_layer_model_projection.weight",
                      "per_layer_inputs.per_layer_projection_norm.weight"]
        return names

    def _split_mglu(self) -> None:
        """Precompute each mask's gate (W*m) and up (W*(1-m)) matrices once."""
        for i in range(self.n_layers):
            p = f"layers.{i}.mlp."
            w, masks = self.w[p + "weight"], self.w[p + "mask_logits"]
            self.w[p + "gates"] = [w * mk for mk in masks]
            self.w[p + "ups"] = [w * (1 - mk) for mk in masks]

    # --- accounting -------------------------------------------------------------------------------------------

    def tier(self, item: str, kind: str) -> str:
        """Memory tier of a planner item (a tensor name, `table:NAME` or `kv_cache`)."""
        if self.placement and item in self.placement:
            return self.placement[item]
        return HOST_TIERS[kind]

    @property
    def resident_bytes(self) -> int:
        """Bytes of dequantised weights held in memory (the dense core plus a tied head)."""
        extra = self.head.nbytes if self.cfg["tie_embeddings"] else 0
        return sum(v.nbytes if isinstance(v, np.ndarray) else sum(a.nbytes for a in v) for v in self.w.values()) + extra

    def _count_token(self, pos: int) -> None:
        """Count one token's reads of the dense weights and the KV cache (the row reads are counted as made)."""
        t = self.traffic
        t.tokens += 1
        for name, nbytes in self._dense_bytes.items():
            dense_tier = self.tier(name, "dense")
            if self.placement is None:  # host: what this runtime really reads, the float32 copy
                nbytes = self.head.nbytes if name == "table:embed" else self.w[name].nbytes
            t.add(dense_tier, nbytes)
        kv_bytes = 2 * self.n_layers * self.n_kv * self.head_dim * (pos + 1) * self.kv_value_bytes
        t.add(self.tier("kv_cache", "dense"), kv_bytes, 2 * self.n_layers)

    # --- forward ------------------------------------------------------------------------------------------

    def new_cache(self, capacity: int) -> KVCache:
        """An empty KV cache for `capacity` positions."""
        shape = (self.n_layers, self.n_kv, capacity, self.head_dim)
        return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32))

    def check_ids(self, ids: list[int]) -> None:
        """Raise a clear error for ids outside [0, vocab_size)."""
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise EdgeRuntimeError(f"token ids must lie in [0, {self.vocab}); got {bad[:5]} "
                                "(is the tokenizer the one this model was built for?)")

    def _rows(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
        """Input embeddings (T, H) and raw PLE rows (T, L_ple*dP), reading one record per token and table."""
        emb = np.empty((len(ids), self.H), np.float32)
        ple = None
        if self.ple_table is not None:
            ple = np.empty((len(ids), self.ple_table.part("ple").length), np.float32)
            tier = self.tier("table:ple", "rows")
        for i, tok in enumerate(ids):
            if ple is not None:
                rec = self.file.read_record(self.ple_table, tok if tok < self.ple_vocab else 0)
                self.traffic.add(tier, self.ple_table.record_bytes)
                ple[i] = rec["ple"]
                if self.embed_in_record:
                    emb[i] = rec["embed"]
                    continue
            if self.cfg["tie_embeddings"]:
                emb[i] = self.head[tok]  # the head is resident: read the row from there
                nbytes = self.embed_table.record_bytes if self.placement else emb[i].nbytes
                self.traffic.add(self.tier("table:embed", "dense"), nbytes)
            else:
                emb[i] = self.file.read_record(self.embed_table, tok)["embed"]
                self.traffic.add(self.tier("table:embed", "rows"), self.embed_table.record_bytes)
        return emb, ple

    def forward(self, ids: list[int], cache: KVCache) -> np.ndarray:
        """Logits (T, V) for `ids` appended after the `cache.pos` tokens already in the cache."""
        self.check_ids(ids)
        T, start = len(ids), cache.pos
        if start + T > cache.capacity:
            raise EdgeRuntimeError(f"KV cache full: {start} + {T} tokens > capacity {cache.capacity}")
        for p in range(start, start + T):
            self._count_token(p)
        x, raw = self._rows(ids)
        if self.cfg["embed_scale"]:
            x = x * np.float32(math.sqrt(self.H))
        ple = self._per_layer_inputs(raw, x) if raw is not None else None
        pos = np.arange(start, start + T)
        for i in range(self.n_layers):
            p = f"layers.{i}."
            x = x + self._attention(rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps), i, pos, cache)
            x = x + self._ffn(rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps), p + "mlp.")
            if i in self.slot:
                x = x + self._inject(x, ple[:, self.slot[i]], p + "ple.")
        cache.pos += T
        # (V, H) @ (H, T): a row-major gemv over the head, faster than x @ head.T in NumPy.
        return (self.head @ rms_norm(x, self.w["norm.weight"], self.eps).T).T

    def _per_layer_inputs(self, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
        """(T, L_ple, dP): identity * sqrt(dP), fused with the normed context projection when enabled."""
        n, dp = len(self.ple_layers), self.ple["dim"]
        ident = (raw * np.float32(math.sqrt(dp))).reshape(len(raw), n, dp)
        if not self.ple["context"]:
            return ident
        ctx = (x @ self.w["per_layer_inputs.per_layer_model_projection.weight"].T) * np.float32(self.H**-0.5)
        ctx = rms_norm(ctx.reshape(len(raw), n, dp), self.w["per_layer_inputs.per_layer_projection_norm.weight"],
                       self.eps)
        return (ctx + ident) * np.float32(2.0**-0.5)

    def _inject(self, h: np.ndarray, ple_l: np.ndarray, p: str) -> np.ndarray:
        """One layer's PLE contribution: norm(proj(gate(h) * ple_l))."""
        if self.ple["gate"] == "input":
            g = gelu_tanh(h @ self.w[p + "per_layer_input_gate.weight"].T)
        else:
            g = self.w[p + "gate"]
        y = (g * ple_l) @ self.w[p + "per_layer_projection.weight"].T
        if self.ple["output_norm"]:
            y = rms_norm(y, self.w[p + "post_per_layer_input_norm.weight"], self.eps)
        return y

    def _ffn(self, x: np.ndarray, p: str) -> np.ndarray:
        """The FFN variant of the file: SwiGLU, MGLU (precomputed masked matrices) or low-rank SwiGLU."""
        w = self.w
        if self.ffn_kind == "swiglu":
            gate, up = x @ w[p + "gate_proj.weight"].T, x @ w[p + "up_proj.weight"].T
            return (silu(gate) * up) @ w[p + "down_proj.weight"].T
        if self.ffn_kind == "lowrank":
            gate = (x @ w[p + "gate_proj_a.weight"].T) @ w[p + "gate_proj_b.weight"].T
            up = (x @ w[p + "up_proj_a.weight"].T) @ w[p + "up_proj_b.weight"].T
            return (silu(gate) * up) @ w[p + "down_proj.weight"].T
        out = sum(silu(x @ g.T) * (x @ u.T) for g, u in zip(w[p + "gates"], w[p + "ups"], strict=True))
        return out @ w[p + "down_proj.weight"].T

    def _attention(self, x: np.ndarray, layer: int, pos: np.ndarray, cache: KVCache) -> np.ndarray:
        """Causal grouped-query attention over the cache plus the new positions."""
        p = f"layers.{layer}.self_attn."
        T, hd = len(x), self.head_dim
        q = (x @ self.w[p + "q_proj.weight"].T).reshape(T, self.n_heads, hd).transpose(1, 0, 2)
        k = (x @ self.w[p + "k_proj.weight"].T).reshape(T, self.n_kv, hd).transpose(1, 0, 2)
        v = (x @ self.w[p + "v_proj.weight"].T).reshape(T, self.n_kv, hd).transpose(1, 0, 2)
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        s, e = int(pos[0]), int(pos[-1]) + 1
        cache.keys[layer][:, s:e], cache.values[layer][:, s:e] = k, v
        keys, vals = cache.keys[layer][:, :e], cache.values[layer][:, :e]
        rep = self.n_heads // self.n_kv
        qg = q.reshape(self.n_kv, rep * T, hd)  # head h uses kv head h // rep, as the PyTorch expand does
        scores = (qg @ keys.transpose(0, 2, 1)).reshape(self.n_heads, T, e) * np.float32(hd**-0.5)
        scores = np.where(np.arange(e)[None, :] <= pos[:, None], scores, -np.inf)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = (scores / scores.sum(-1, keepdims=True)).reshape(self.n_kv, rep * T, e)
        y = (probs @ vals).reshape(self.n_heads, T, hd).transpose(1, 0, 2).reshape(T, -1)
        return y @ self.w[p + "o_proj.weight"].T

    # --- generation ---------------------------------------------------------------------------------------

    def generate(self, prompt: list[int], max_new_tokens: int, sampling: Sampling | None = None,
                 stop_id: int | None = None, **settings: Any) -> Iterator[int]:
        """Yield sampled ids (the shared decode loop and sampler; `settings` are `Sampling` fields)."""
        if sampling is not None and settings:
            raise TypeError("pass either sampling or Sampling fields, not both")
        sampling = sampling or Sampling(**settings)
        check_fits(prompt, max_new_tokens, self.cfg["max_seq_len"])
        self.check_ids(prompt)
        # The last sampled token is never fed back: prompt + max_new_tokens - 1 positions.
        cache = self.new_cache(len(prompt) + max_new_tokens - 1)
        self.timing = {"prefill_s": 0.0, "decode_s": 0.0, "decoded": 0}

        def forward(ids: list[int]) -> np.ndarray:
            t0, prefill = time.perf_counter(), cache.pos == 0
            for a in range(0, len(ids), PREFILL_CHUNK):  # chunks bound the activation memory of long prompts
                logits = self.forward(ids[a : a + PREFILL_CHUNK], cache)[-1]
            if prefill:
                self.timing["prefill_s"] += time.perf_counter() - t0
            else:
                self.timing["decode_s"] += time.perf_counter() - t0
                self.timing["decoded"] += len(ids)
            return logits

        return generate_ids(forward, prompt, max_new_tokens, sampling, stop_id)

    def close(self) -> None:
        """Release the file."""
        self.file.close()

