"""NumPy runtime for .ple files: the exact PLE forward pass with a KV cache, rows streamed from the file.

The dense core (and a tied output head) is dequantised into memory once; MGLU masks stay packed at 1 bit
and are applied a block of rows at a time, and MoE experts are read only by the tokens routed to them. The
PLE table and, when it is not resident, the main embedding stay in the memory-mapped file and only the
records the positions read are touched (one contiguous read each): a token table's record of the token id, or
an n-gram table's S records, one per hash head, whose rows the hash of the ids ending at the position chooses
(plelab.model.ngram; the cache keeps the ids before a position that its n-grams reach back to). Every read is
counted per memory tier: records really read from the file, and the dense reads a device would make (from the
placement when one is given, plelab.edge.placement). Mirrors plelab/model/{transformer,ple,ffn,moe,norm}.py operation
for operation in float32, so an fp32 export reproduces the PyTorch logits; imports no torch.
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

from plelab.edge.format import GATE_CODES, ID_MAP, PleFile
from plelab.edge.placement import kv_bytes_per_position
from plelab.errors import PlelabError, token_id_message
from plelab.inference.generate import check_fits, generate_ids
from plelab.inference.sampling import Sampling
from plelab.model.ngram import hash_rows_numpy

HOST_TIERS = {"rows": "file", "dense": "ram"}
# FFN kinds a file can hold (a pruned FFN is exported as the swiglu it becomes)
FFN_KINDS = ("swiglu", "mglu", "lowrank", "moe")
SWIGLU = ("gate_proj", "up_proj", "down_proj")
ACTS = ("fp32", "int8")  # activations into int8 / int4 weights: float, or int8 codes with one scale per vector
KV_DTYPES = ("fp32", "int8")  # what the KV cache keeps (int8: codes + one float32 scale per head vector)
PREFILL_CHUNK = 32  # prompt tokens per forward call during prefill
MGLU_BLOCK = 1 << 16  # mask elements unpacked at a time (a 64 KB bool block: cache-sized, not matrix-sized)


class EdgeRuntimeError(PlelabError):
    """Input the runtime cannot run (bad token ids, unsupported model variant, context overflow)."""


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """`x * rsqrt(mean(x^2) + eps) * w` over the last axis, in float32."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * w


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), written with tanh so large |x| cannot overflow."""
    return x * np.float32(0.5) * (np.float32(1) + np.tanh(x * np.float32(0.5)))


def quantize_i8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes and float32 scales of each vector (last axis) of x, exactly as the C runtime makes them.

    scale = max|x| / 127; code = x * (127 / max|x|) (a float32 product) rounded half away from zero; a vector of
    zeros (or one that is not finite) gets zero codes. x ~= codes * scale. ple_int_kernels.c: ple_kact_quantize.
    """
    x = np.asarray(x, np.float32)
    mx = np.abs(x).max(axis=-1, keepdims=True)
    ok = (mx > 0) & (mx <= np.float32(3.0e38))
    safe = np.where(ok, mx, np.float32(1))
    v = x * (np.float32(127) / safe)
    codes = np.clip(np.trunc(v + np.copysign(np.float32(0.5), v)), -127, 127)
    codes = np.where(ok, codes, 0).astype(np.int8)
    return codes, np.where(ok, safe / np.float32(127), np.float32(0)).astype(np.float32)


def int8_roundtrip(x: np.ndarray) -> np.ndarray:
    """x as its int8 codes times their scale (float32): what an int8 activation or KV vector stands for."""
    codes, scale = quantize_i8(x)
    return codes.astype(np.float32) * scale


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (torch's approximate='tanh')."""
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def unpack_bits(packed: np.ndarray, start: int, count: int) -> np.ndarray:
    """Bits start..start+count-1 of an MSB-first packed array (np.packbits order) as booleans."""
    lo = start // 8
    raw = np.unpackbits(packed[lo : (start + count + 7) // 8])
    return raw[start - 8 * lo : start - 8 * lo + count].view(bool)


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
    """Keys and values per layer, (kv_heads, capacity, head_dim) float32; `pos` positions filled; the ids an
    n-gram index hashed at each position (compressed ones when the file maps them), uint32."""

    keys: np.ndarray
    values: np.ndarray
    ids: np.ndarray
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


def refuse_table_only(path: str | Path, layout: Any) -> None:
    """EdgeRuntimeError for a table-only export (a foreign checkpoint's PLE table, for planning only): no engine
    can run it. One wording for both engines (`plelab run --engine c` asks here first)."""
    if layout.source.get("table_only"):
        raise EdgeRuntimeError(f"{path} is a table-only export ({layout.source.get('core', 'no core')}); "
                               "there is no core to run: use it with `plelab place` or the record reader")


class EdgeModel:
    """A .ple model ready to run: resident dense weights, memory-mapped row tables, traffic counters."""

    def __init__(self, path: str | Path, verify: str = "full", placement: dict[str, str] | None = None,
                 kv_dtype: str = "fp32", act: str = "fp32"):
        """Open `path`; `placement` (placement item -> tier) models a device's traffic.

        kv_dtype: what the KV cache keeps, "fp32" or "int8" (codes + a scale per head vector; its traffic counts
        those bytes). act: "fp32", or "int8": every product with int8 / int4 weights first rounds its input
        vectors to int8 codes times one scale, as the C runtime's integer kernels do (docs/c-runtime.md).
        """
        if kv_dtype not in KV_DTYPES or act not in ACTS:
            raise EdgeRuntimeError(f"kv dtype must be one of {KV_DTYPES} and activations one of {ACTS}, "
                                   f"got {kv_dtype!r} and {act!r}")
        self.kv_dtype, self.act = kv_dtype, act
        self.file = PleFile(path, verify)
        try:
            self._load(path, placement)
        except BaseException:
            self.file.close()
            raise

    def _load(self, path: str | Path, placement: dict[str, str] | None) -> None:
        lay = self.file.layout
        refuse_table_only(path, lay)
        m, d = lay.model, lay.derived
        self.cfg = m
        self.H, self.n_layers, self.n_heads = m["hidden_size"], m["num_layers"], m["num_heads"]
        self.n_kv, self.head_dim = d["kv_heads"], d["head_dim"]
        self.vocab, self.eps, self.theta = m["vocab_size"], m["norm_eps"], m["rope_theta"]
        self.ffn_kind, self.ple = m["ffn"]["kind"], m["ple"]
        if self.ffn_kind not in FFN_KINDS:
            raise EdgeRuntimeError(f"FFN kind {self.ffn_kind!r} is not supported by the edge runtime ({FFN_KINDS})")
        self.ple_layers = list(d["ple_layers"])
        if self.ple_layers and self.ple["gate"] not in GATE_CODES:
            raise EdgeRuntimeError(f"PLE gate {self.ple['gate']!r} is not supported by the edge runtime "
                                   f"({', '.join(GATE_CODES)})")
        self.slot = {layer: i for i, layer in enumerate(self.ple_layers)}
        self.ple_vocab = d["ple_vocab_size"]
        self.ngram, self.ple_reads, self.id_map = lay.ngram, lay.ple_reads, lay.id_map
        missing = [n for n in self._required() if n not in {t.name for t in lay.tensors}]
        if missing:
            raise EdgeRuntimeError(f"{path} lacks tensors this model needs: {', '.join(missing[:3])}")
        # MGLU masks stay packed (1 bit per element): _mglu applies them block by block, never W*m whole.
        self.w = {t.name: self.file.read_codes(t.name) if t.enc.dtype == "u1" else self.file.read_tensor(t.name)
                  for t in lay.tensors}
        self.ple_table = lay.table("ple")
        self.embed_table = lay.table("embed")
        if (self.ple_layers and self.ple_table is None) or (m["tie_embeddings"] and self.embed_table is None):
            raise EdgeRuntimeError(f"{path} lacks a row table this model needs (ple or embed)")
        # The input row comes from the PLE record when it carries one (no extra read), else the embed table.
        self.embed_in_record = self.ple_table is not None and self.ple_table.part("embed") is not None
        self.head = (self.file.read_table(self.embed_table, "embed") if m["tie_embeddings"]
                     else self.w["lm_head.weight"])
        self._check_ffn(path)
        self.placement = placement
        self.traffic = Traffic()
        # Routed experts are counted when a token reaches them (_moe), every other tensor on every token.
        self._stored_bytes = {t.name: t.nbytes for t in lay.tensors}
        if m["tie_embeddings"]:
            self._stored_bytes["table:embed"] = self.embed_table.nbytes
        self._dense = [n for n in self._stored_bytes if ".mlp.experts." not in n]
        # products whose input the int8 path rounds: those with integer weights
        int_enc = {t.name for t in lay.tensors if t.enc.is_int}
        head_enc = self.embed_table.part("embed").enc if m["tie_embeddings"] else lay.tensor("lm_head.weight").enc
        if head_enc.is_int:
            int_enc.add("head")
        self._int_inputs = int_enc if self.act == "int8" else set()

    def _ffn_tensors(self) -> dict[str, tuple[int, ...]]:
        """Name (after `layers.{i}.mlp.`) -> shape of one layer's FFN tensors."""
        ffn, H = self.cfg["ffn"], self.H
        F = ffn["intermediate_size"]
        if self.ffn_kind == "moe":
            F = ffn.get("expert_size") or F
            shapes = dict(zip(SWIGLU, ((F, H), (F, H), (H, F)), strict=True))
            out = {"router.weight": (ffn["num_experts"], H)}
            out.update((f"experts.{e}.{n}", s) for e in range(ffn["num_experts"]) for n, s in shapes.items())
            out.update((f"shared_{n}", s) for n, s in shapes.items() if ffn.get("shared_expert"))
            return out
        if self.ffn_kind == "mglu":
            return {"weight": (F, H), "mask_logits": (ffn["mask_count"], F, H), "down_proj.weight": (H, F)}
        if self.ffn_kind == "lowrank":
            r = ffn["rank"]
            return {"gate_proj_a.weight": (r, H), "gate_proj_b.weight": (F, r), "up_proj_a.weight": (r, H),
                    "up_proj_b.weight": (F, r), "down_proj.weight": (H, F)}
        return {"gate_proj.weight": (F, H), "up_proj.weight": (F, H), "down_proj.weight": (H, F)}

    def _required(self) -> list[str]:
        """Dense tensors the forward pass reads (a file without them cannot be run)."""
        names = ["norm.weight"] + ([] if self.cfg["tie_embeddings"] else ["lm_head.weight"])
        for i in range(self.n_layers):
            p = f"layers.{i}."
            names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
            names += [f"{p}self_attn.{n}_proj.weight" for n in "qkvo"] + [p + "mlp." + n for n in self._ffn_tensors()]
            if i in self.slot:
                gate = "per_layer_input_gate.weight" if self.ple["gate"] == "input" else "gate"
                names += [p + "ple." + gate, p + "ple.per_layer_projection.weight"]
                names += [p + "ple.post_per_layer_input_norm.weight"] if self.ple["output_norm"] else []
        if self.ple_layers and self.ple["context"]:
            names += ["per_layer_inputs.per_layer_model_projection.weight",
                      "per_layer_inputs.per_layer_projection_norm.weight"]
        return names

    def _check_ffn(self, path: str | Path) -> None:
        """FFN tensors of the shapes the config implies, MGLU masks u1 with zero pad bits: else one clear line."""
        shapes = self._ffn_tensors()
        for i in range(self.n_layers):
            for suffix, want in shapes.items():
                t = self.file.layout.tensor(f"layers.{i}.mlp.{suffix}")
                if tuple(t.shape) != want or (t.enc.dtype == "u1") != (suffix == "mask_logits"):
                    raise EdgeRuntimeError(f"{path}: {t.name} is {t.enc.dtype} {list(t.shape)}, the model's "
                                           f"{self.ffn_kind} FFN needs {list(want)}")
                pad = -t.numel % 8 if t.enc.dtype == "u1" else 0
                if pad and self.w[t.name][-1] & ((1 << pad) - 1):
                    raise EdgeRuntimeError(f"{path}: layer {i}'s MGLU mask has bits set past its end (corrupt mask)")

    # --- accounting -------------------------------------------------------------------------------------------

    def tier(self, item: str, kind: str) -> str:
        """Memory tier of a placement item (a tensor name, `table:NAME` or `kv_cache`)."""
        if self.placement and item in self.placement:
            return self.placement[item]
        return HOST_TIERS[kind]

    @property
    def resident_bytes(self) -> int:
        """Bytes of weights held in memory (the dequantised dense core, MGLU masks packed, plus a tied head)."""
        extra = self.head.nbytes if self.cfg["tie_embeddings"] else 0
        return sum(v.nbytes for v in self.w.values()) + extra

    def _count_token(self, pos: int) -> None:
        """Count one token's reads of the dense weights and the KV cache (the row reads are counted as made)."""
        t = self.traffic
        t.tokens += 1
        for name in self._dense:
            t.add(self.tier(name, "dense"), self._read_bytes(name))
        per_position = kv_bytes_per_position(self.n_layers, self.n_kv, self.head_dim, self.kv_dtype)
        t.add(self.tier("kv_cache", "dense"), per_position * (pos + 1), 2 * self.n_layers)

    def _read_bytes(self, name: str) -> int:
        """Bytes one read of dense item `name` moves: as stored on a device, the resident copy on the host."""
        if self.placement is not None:
            return self._stored_bytes[name]
        return self.head.nbytes if name == "table:embed" else self.w[name].nbytes

    # --- forward ------------------------------------------------------------------------------------------

    def new_cache(self, capacity: int) -> KVCache:
        """An empty KV cache for `capacity` positions."""
        shape = (self.n_layers, self.n_kv, capacity, self.head_dim)
        return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32), np.zeros(capacity, np.uint32))

    def check_ids(self, ids: list[int]) -> None:
        """Raise a clear error for ids outside [0, vocab_size)."""
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise EdgeRuntimeError(token_id_message(self.vocab, bad))

    def _table_rows(self, ids: list[int], cache: KVCache) -> np.ndarray:
        """(T, S) PLE table rows of the new positions: the token's own (row 0 past a token table), or one per hash
        head of the n-grams ending there (the cache keeps the ids hashed so far, for the positions after)."""
        if self.ngram is None:
            return np.array([[tok if tok < self.ple_vocab else 0] for tok in ids], np.int64)
        hashed = ids
        if self.id_map:
            hashed = [self.file.read_id(tok) for tok in ids]
            self.traffic.add(self.tier(ID_MAP, "rows"), 4 * len(ids), len(ids))
        start, stop = cache.pos, cache.pos + len(ids)
        cache.ids[start:stop] = hashed
        first = max(0, start - self.ngram.max_order + 1)  # the earliest id the n-grams of `start` reach
        return hash_rows_numpy(cache.ids[first:stop], self.ngram)[start - first :]

    def _rows(self, ids: list[int], cache: KVCache) -> tuple[np.ndarray, np.ndarray | None]:
        """Input embeddings (T, H) and raw PLE rows (T, L_ple*dP): per position one record of each table, S of an
        n-gram table (each holds every layer's slice of one head; layer l's values are the heads' slices side by
        side)."""
        emb = np.empty((len(ids), self.H), np.float32)
        ple = None
        if self.ple_table is not None:
            ple = np.empty((len(ids), len(self.ple_layers) * self.ple["dim"]), np.float32)
            tier = self.tier("table:ple", "rows")
            table_rows = self._table_rows(ids, cache)
        for i, tok in enumerate(ids):
            if ple is not None:
                heads = ple[i].reshape(len(self.ple_layers), self.ple_reads, -1)  # (L_ple, S, dP / S), a view
                for j, row in enumerate(table_rows[i]):
                    rec = self.file.read_record(self.ple_table, int(row))
                    self.traffic.add(tier, self.ple_table.record_bytes)
                    heads[:, j] = rec["ple"].reshape(len(self.ple_layers), -1)
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
        x, raw = self._rows(ids, cache)
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
        return (self.head @ self._in(rms_norm(x, self.w["norm.weight"], self.eps), "head").T).T

    def _in(self, x: np.ndarray, name: str) -> np.ndarray:
        """The input of a product with weights `name` ("head": the tied head): int8-rounded on the int8 path."""
        return int8_roundtrip(x) if name in self._int_inputs else x

    def _mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x @ W.T for the dense tensor `name` (nn.Linear layout)."""
        return self._in(x, name) @ self.w[name].T

    def _swiglu(self, x: np.ndarray, gate: str, up: str, down: str) -> np.ndarray:
        """down(silu(gate x) * up x) for the tensors named gate, up, down."""
        return self._mm(silu(self._mm(x, gate)) * self._mm(x, up), down)

    def _per_layer_inputs(self, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
        """(T, L_ple, dP): identity * sqrt(dP), fused with the normed context projection when enabled."""
        n, dp = len(self.ple_layers), self.ple["dim"]
        ident = (raw * np.float32(math.sqrt(dp))).reshape(len(raw), n, dp)
        if not self.ple["context"]:
            return ident
        ctx = self._mm(x, "per_layer_inputs.per_layer_model_projection.weight") * np.float32(self.H**-0.5)
        ctx = rms_norm(ctx.reshape(len(raw), n, dp), self.w["per_layer_inputs.per_layer_projection_norm.weight"],
                       self.eps)
        return (ctx + ident) * np.float32(2.0**-0.5)

    def _inject(self, h: np.ndarray, ple_l: np.ndarray, p: str) -> np.ndarray:
        """One layer's PLE contribution: norm(proj(gate(h) * ple_l))."""
        if self.ple["gate"] == "input":
            g = gelu_tanh(self._mm(h, p + "per_layer_input_gate.weight"))
        else:
            g = self.w[p + "gate"]
        y = self._mm(g * ple_l, p + "per_layer_projection.weight")
        if self.ple["output_norm"]:
            y = rms_norm(y, self.w[p + "post_per_layer_input_norm.weight"], self.eps)
        return y

    def _ffn(self, x: np.ndarray, p: str) -> np.ndarray:
        """The FFN variant of the file: SwiGLU, MGLU (masks applied from their bits), low-rank SwiGLU or MoE."""
        if self.ffn_kind == "swiglu":
            return self._swiglu(x, *(f"{p}{n}.weight" for n in SWIGLU))
        if self.ffn_kind == "moe":
            return self._moe(x, p)
        if self.ffn_kind == "lowrank":
            gate = self._mm(self._mm(x, p + "gate_proj_a.weight"), p + "gate_proj_b.weight")
            up = self._mm(self._mm(x, p + "up_proj_a.weight"), p + "up_proj_b.weight")
            return self._mm(silu(gate) * up, p + "down_proj.weight")
        return self._mm(self._mglu(x, p), p + "down_proj.weight")

    def _moe(self, x: np.ndarray, p: str) -> np.ndarray:
        """Router softmax, top-k renormalised weights, and only the routed experts run (and are counted read)."""
        ffn = self.cfg["ffn"]
        logits = self._mm(x, p + "router.weight")
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, : ffn["top_k"]]
        weights = np.take_along_axis(probs, top, -1)
        weights /= weights.sum(-1, keepdims=True)
        out = np.zeros_like(x)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)  # each token reaches expert e at most once
            names = [f"{p}experts.{e}.{n}" for n in SWIGLU]
            out[rows] += weights[rows, slot, None] * self._swiglu(x[rows], *names)
            for n in names:
                self.traffic.add(self.tier(n, "dense"), len(rows) * self._read_bytes(n), len(rows))
        if ffn.get("shared_expert"):
            out += self._swiglu(x, *(f"{p}shared_{n}" for n in SWIGLU))
        return out

    def _mglu(self, x: np.ndarray, p: str) -> np.ndarray:
        """sum_k silu(gate_k) * up_k with gate_k = (W*m_k) x and up_k = W x - gate_k: one pass over W.

        The packed mask bits are unpacked one block of rows at a time, so neither W*m nor a whole unpacked
        mask is ever held: memory and the bytes read per token are W once plus n_m bits per element.
        """
        w, bits = self.w[p + "weight"], self.w[p + "mask_logits"]
        n_rows, cols = w.shape
        out = np.empty((len(x), n_rows), np.float32)
        step = max(1, MGLU_BLOCK // cols)
        for a in range(0, n_rows, step):
            b = min(n_rows, a + step)
            block = w[a:b]
            total = x @ block.T
            acc = np.zeros_like(total)
            for k in range(self.cfg["ffn"]["mask_count"]):
                mask = unpack_bits(bits, (k * n_rows + a) * cols, (b - a) * cols).reshape(b - a, cols)
                gate = x @ np.where(mask, block, np.float32(0)).T
                acc += silu(gate) * (total - gate)
            out[:, a:b] = acc
        return out

    def _attention(self, x: np.ndarray, layer: int, pos: np.ndarray, cache: KVCache) -> np.ndarray:
        """Causal grouped-query attention over the cache plus the new positions."""
        p = f"layers.{layer}.self_attn."
        T, hd = len(x), self.head_dim
        q = self._mm(x, p + "q_proj.weight").reshape(T, self.n_heads, hd).transpose(1, 0, 2)
        k = self._mm(x, p + "k_proj.weight").reshape(T, self.n_kv, hd).transpose(1, 0, 2)
        v = self._mm(x, p + "v_proj.weight").reshape(T, self.n_kv, hd).transpose(1, 0, 2)
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        s, e = int(pos[0]), int(pos[-1]) + 1
        if self.kv_dtype == "int8":  # each head vector kept as int8 codes and one scale
            k, v = int8_roundtrip(k), int8_roundtrip(v)
        cache.keys[layer][:, s:e], cache.values[layer][:, s:e] = k, v
        keys, vals = cache.keys[layer][:, :e], cache.values[layer][:, :e]
        rep = self.n_heads // self.n_kv
        qg = q.reshape(self.n_kv, rep * T, hd)  # head h uses kv head h // rep, as the PyTorch expand does
        scores = (qg @ keys.transpose(0, 2, 1)).reshape(self.n_heads, T, e) * np.float32(hd**-0.5)
        scores = np.where(np.arange(e)[None, :] <= pos[:, None], scores, -np.inf)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = (scores / scores.sum(-1, keepdims=True)).reshape(self.n_kv, rep * T, e)
        y = (probs @ vals).reshape(self.n_heads, T, hd).transpose(1, 0, 2).reshape(T, -1)
        return self._mm(y, p + "o_proj.weight")

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

    def __enter__(self) -> EdgeModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

