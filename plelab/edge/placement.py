"""Placement (`plelab place`): every part of a .ple model in a device's memory tiers, and the time per token.

Items and how a token uses them:
    row tables (PLE records, an untied embedding)  stay in storage; one record read per token each, S PLE records
                                                     for an n-gram index (one per hash head)
    an n-gram index's id map                         stays in storage; one 4-byte read per token
    dense tensors and a tied head (embedding table)  loaded into RAM; read whole once per token
    MoE expert tensors                               loaded into RAM; read by the tokens routed to them
                                                     (top_k / num_experts of the tokens, on average)
    KV cache                                         RAM; at context c, 2 x layers reads of c positions
Resident items go to the fastest RAM tier with room, first-fit decreasing by traffic density (bytes
read per token / bytes stored; the KV cache counts 1/2, its average over a full context), then size.
If anything does not fit, the placement says what and how many bytes are missing instead of placing it.
Estimated time per token: per tier, reads x latency + transferred bytes / bandwidth (storage reads
move whole pages), plus FLOPs / flops_per_s (see devices.toml).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from plelab.edge.format import ID_MAP, Layout, Part, Table
from plelab.errors import PlelabError
from plelab.util.dataclass_config import ConfigError, read_file

DEFAULT_DEVICES = Path(__file__).with_name("devices.toml")
KV_BYTES = {"fp32": 4, "fp16": 2, "int8": 1}
# int8 keys / values carry one float32 scale per head vector (the C and NumPy runtimes' int8 KV cache)
KV_SCALE_BYTES = {"fp32": 0, "fp16": 0, "int8": 4}
ROUTED = ".mlp.experts."  # in the name of every MoE expert tensor (plelab.edge.export.file_tensors)


TierKind = Literal["ram", "storage"]


class PlacementError(PlelabError):
    """A device file or device name that cannot be used."""


@dataclass
class Tier:
    """One memory of a device (see devices.toml for the fields)."""

    name: str
    kind: TierKind
    capacity: int
    read_mb_s: float
    latency_us: float = 0.0
    page: int = 1

    def read_us(self, nbytes: float, reads: float, pages: float | None = None) -> float:
        """Microseconds for `reads` reads moving `nbytes` (or `pages` whole pages) from this tier."""
        moved = pages * self.page if pages is not None else nbytes
        return reads * self.latency_us + moved / self.read_mb_s


@dataclass
class Device:
    """A device profile: tiers fastest first, exactly one of kind storage."""

    name: str
    description: str
    flops_per_s: float
    tiers: list[Tier]
    sources: str = ""

    @property
    def storage(self) -> Tier:
        """The tier the .ple file lives in."""
        return next(t for t in self.tiers if t.kind == "storage")

    @property
    def ram(self) -> list[Tier]:
        """Tiers that can hold loaded weights, fastest first."""
        return [t for t in self.tiers if t.kind == "ram"]


# Field -> (smallest allowed value, whether it must be an integer, whether the minimum itself is allowed).
_TIER_FIELDS = {"capacity": (1, True, True), "read_mb_s": (0, False, False), "latency_us": (0, False, True),
                "page": (1, True, True)}


def _number(value: Any, where: str, field: str, low: float, integer: bool, inclusive: bool) -> float:
    """`value` checked to be a finite (integer) number above `low`, else a PlacementError naming profile and field."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if ok:
        ok = value >= low if inclusive else value > low
    if not ok:
        want = f"{'an integer' if integer else 'a finite number'} {'>=' if inclusive else '>'} {low}"
        raise PlacementError(f"{where}: {field} must be {want}, got {value!r}")
    return int(value) if integer else float(value)


def _tier(t: Any, where: str) -> Tier:
    if not isinstance(t, dict):
        raise PlacementError(f"{where}: each tier must be a table of fields, got {t!r}")
    where = f"{where}, tier {t.get('name', '?')!r}"
    unknown = set(t) - {"name", "kind", *_TIER_FIELDS}
    if unknown:
        raise PlacementError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for key in ("name", "kind", "capacity", "read_mb_s"):
        if key not in t:
            raise PlacementError(f"{where}: missing field {key}")
    if not isinstance(t["name"], str) or not t["name"]:
        raise PlacementError(f"{where}: name must be a non-empty string, got {t['name']!r}")
    if t["kind"] not in get_args(TierKind):
        raise PlacementError(f"{where}: kind must be \"ram\" or \"storage\", got {t['kind']!r}")
    values = {k: _number(t[k], where, k, *rule) for k, rule in _TIER_FIELDS.items() if k in t}
    return Tier(t["name"], t["kind"], **values)


def _device(name: str, d: Any, path: Path) -> Device:
    """One profile, every field range-checked (a zero bandwidth or NaN would make every estimate wrong)."""
    where = f"{path}: device {name!r}"
    if not isinstance(d, dict):
        raise PlacementError(f"{where} must be a table of fields")
    if "flops_per_s" not in d or not isinstance(d.get("tiers"), list) or not d["tiers"]:
        raise PlacementError(f"{where} needs flops_per_s and at least one [[tiers]] entry")
    flops = _number(d["flops_per_s"], where, "flops_per_s", 0, False, False)
    tiers = [_tier(t, where) for t in d["tiers"]]
    if [t.kind for t in tiers].count("storage") != 1:
        raise PlacementError(f"{where} needs exactly one tier of kind storage, the rest ram")
    if len({t.name for t in tiers}) != len(tiers):
        raise PlacementError(f"{where}: tier names must be unique")
    return Device(name, str(d.get("description", "")), flops, tiers, str(d.get("sources", "")))


def load_devices(path: str | Path | None = None) -> dict[str, Device]:
    """Device profiles from a TOML/YAML/JSON file (the built-in devices.toml by default), range-checked."""
    path = Path(path) if path else DEFAULT_DEVICES
    try:
        data = read_file(path).get("devices", {})
    except (OSError, ConfigError) as exc:
        raise PlacementError(f"cannot read device file {path}: {exc}") from exc
    if not isinstance(data, dict) or not data:
        raise PlacementError(f"{path} has no [devices.NAME] profiles")
    return {name: _device(name, d, path) for name, d in data.items()}


def get_device(name: str, path: str | Path | None = None) -> Device:
    """One device profile by name, with the known names in the error."""
    devices = load_devices(path)
    if name not in devices:
        raise PlacementError(f"unknown device {name!r}; known: {', '.join(devices)} (add yours with --devices FILE)")
    return devices[name]


@dataclass
class Item:
    """Something the model keeps in memory and what one token reads of it."""

    name: str
    what: str
    stored: int
    bytes_per_token: float
    reads_per_token: float
    resident: bool
    density: float = 1.0
    pages_per_token: float | None = field(default=None, repr=False)


def _record_pages(layout: Layout, table: Table, page: int) -> float:
    """Average number of `page`-byte pages one record of `table` touches (exact, over every row)."""
    if page <= 1:
        return 1.0
    offs = layout.section(table.name).offset + table.row_offsets(0, table.rows)
    return float(np.mean((offs + table.record_bytes - 1) // page - offs // page + 1))


def kv_bytes_per_position(layers: int, kv_heads: int, head_dim: int, kv_dtype: str) -> int:
    """Bytes of keys and values one position adds to the KV cache (scales included)."""
    return 2 * layers * kv_heads * (head_dim * KV_BYTES[kv_dtype] + KV_SCALE_BYTES[kv_dtype])


def items(layout: Layout, context: int, kv_dtype: str) -> list[Item]:
    """Everything to place, with per-token traffic at position `context`."""
    m, d = layout.model, layout.derived
    tied = m["tie_embeddings"]
    ple, embed = layout.table("ple"), layout.table("embed")
    out = []
    if ple is not None:
        what = "PLE records (codes + scales" + (" + embedding row" if ple.part("embed") else "") + ")"
        if layout.ngram is not None:
            what += f", {layout.ple_reads} per token (n-gram hash heads)"
        out.append(Item("table:ple", what, ple.nbytes, layout.ple_reads * ple.record_bytes, layout.ple_reads,
                        resident=False))
    if layout.id_map:
        out.append(Item(ID_MAP, "compressed token ids (uint32 per token id)", layout.section(ID_MAP).nbytes, 4, 1,
                        resident=False))
    if embed is not None:
        row = 0 if ple is not None and ple.part("embed") else embed.record_bytes
        if tied:  # the output head: read whole per token, so it is loaded; the input row comes from that copy
            out.append(Item("table:embed", "main embedding = tied output head", embed.nbytes,
                            embed.nbytes + row, 1 + (row > 0), resident=True))
        else:
            out.append(Item("table:embed", "main embedding rows", embed.nbytes, row, 1 if row else 0, resident=False))
    share = routed_share(layout)
    for t in layout.tensors:
        f = share if ROUTED in t.name else 1.0
        out.append(Item(t.name, f"{t.enc.dtype} {'x'.join(map(str, t.shape))}", t.nbytes, t.nbytes * f, f,
                        resident=True, density=f))
    kv = kv_bytes_per_position(m["num_layers"], d["kv_heads"], d["head_dim"], kv_dtype)
    out.append(Item("kv_cache", f"KV cache, {kv_dtype}, {context} positions", kv * context, kv * context,
                    2 * m["num_layers"], resident=True, density=0.5))
    return out


def routed_share(layout: Layout) -> float:
    """Fraction of tokens that read one MoE expert, top_k / num_experts (1 for the other FFN kinds)."""
    ffn = layout.model["ffn"]
    return ffn["top_k"] / ffn["num_experts"] if ffn["kind"] == "moe" else 1.0


def flops_per_token(layout: Layout, context: int) -> int:
    """Matmul FLOPs of one token at position `context` (2 per multiply-add; norms and activations ignored)."""
    m, d = layout.model, layout.derived
    n_masks = m["ffn"].get("mask_count", 1) if m["ffn"]["kind"] == "mglu" else 1
    share = routed_share(layout)
    flops = 0.0
    for t in layout.tensors:
        if len(t.shape) == 2:
            flops += 2 * t.numel * (2 * n_masks if t.name.endswith("mlp.weight") else share if ROUTED in t.name else 1)
    if m["tie_embeddings"]:
        flops += 2 * m["vocab_size"] * m["hidden_size"]
    flops += m["num_layers"] * 4 * m["num_heads"] * d["head_dim"] * context
    return round(flops)


def place(layout: Layout, device: Device, context: int | None = None, kv_dtype: str = "fp16") -> dict[str, Any]:
    """Place every item in a tier (or say why not) and estimate per-token traffic and time."""
    if kv_dtype not in KV_BYTES:
        raise PlacementError(f"kv dtype must be one of {', '.join(KV_BYTES)}, got {kv_dtype!r}")
    context = context or layout.model["max_seq_len"]
    storage = device.storage
    problems = []
    host_only = layout.tokenizer["bytes"] if layout.tokenizer else 0
    need = layout.file_bytes - host_only
    if need > storage.capacity:
        problems.append({"what": f"model file ({need:,} bytes) in {storage.name}", "tier": storage.name,
                         "missing_bytes": need - storage.capacity})
    used = {t.name: 0 for t in device.tiers}
    used[storage.name] = need
    placement: dict[str, str] = {}
    its = items(layout, context, kv_dtype)
    for it in its:
        if not it.resident:
            placement[it.name] = storage.name
    resident = sorted((it for it in its if it.resident), key=lambda it: (-it.density, -it.stored))
    unplaced = []
    for it in resident:
        tier = next((t for t in device.ram if used[t.name] + it.stored <= t.capacity), None)
        if tier is None:
            unplaced.append(it)
            continue
        placement[it.name] = tier.name
        used[tier.name] += it.stored
    if unplaced:
        ram_total = sum(t.capacity for t in device.ram)
        need_ram = sum(it.stored for it in resident)
        missing = max(need_ram - ram_total, min(it.stored for it in unplaced))
        names = ", ".join(it.name for it in unplaced[:4]) + (" ..." if len(unplaced) > 4 else "")
        problems.append({"what": f"{need_ram:,} bytes of weights + KV cache in RAM "
                                 f"({', '.join(t.name for t in device.ram)}: {ram_total:,}); not placed: {names}",
                         "tier": "ram", "missing_bytes": missing})
    tiers = {t.name: t for t in device.tiers}
    bytes_pt = {t.name: 0.0 for t in device.tiers}
    reads_pt = {t.name: 0.0 for t in device.tiers}
    time_ms = {t.name: 0.0 for t in device.tiers}
    for it in its:
        tier = placement.get(it.name)
        if tier is None:
            continue
        bytes_pt[tier] += it.bytes_per_token
        reads_pt[tier] += it.reads_per_token
        pages = None
        if tiers[tier].page > 1 and it.name.startswith("table:"):
            pages = _record_pages(layout, layout.table(it.name[6:]), tiers[tier].page) * it.reads_per_token
        elif tiers[tier].page > 1:
            pages = -(-it.bytes_per_token // tiers[tier].page)
        time_ms[tier] += tiers[tier].read_us(it.bytes_per_token, it.reads_per_token, pages) / 1000
    flops = flops_per_token(layout, context)
    time_ms["compute"] = flops / device.flops_per_s * 1000
    est = sum(time_ms.values())
    return {
        "device": device.name,
        "description": device.description,
        "fits": not problems,
        "problems": problems,
        "file_bytes": layout.file_bytes,
        "context": context,
        "kv_dtype": kv_dtype,
        "tiers": {t.name: {"kind": t.kind, "capacity": t.capacity, "used": used[t.name],
                           "free": t.capacity - used[t.name]} for t in device.tiers},
        "placement": placement,
        "items": [{"name": it.name, "what": it.what, "tier": placement.get(it.name), "bytes": it.stored,
                   "bytes_per_token": it.bytes_per_token, "reads_per_token": it.reads_per_token} for it in its],
        "bytes_per_token": bytes_pt,
        "reads_per_token": reads_pt,
        "flops_per_token": flops,
        "est_ms_per_token": est if not problems else None,
        "est_ms_breakdown": time_ms,
        "est_tokens_per_s": 1000.0 / est if not problems and est > 0 else None,
    }


def flip_embed_in_record(layout: Layout) -> Layout | None:
    """The same model with the embedding-in-record choice reversed (None when it cannot be)."""
    m = layout.model
    ple, embed = layout.table("ple"), layout.table("embed")
    if ple is None or layout.ngram is not None or layout.derived["ple_vocab_size"] != m["vocab_size"]:
        return None
    in_record = ple.part("embed")
    tables = [t for t in layout.tables if t.name not in ("ple", "embed")]
    if in_record:
        parts = [replace(p) for p in ple.parts if p.name != "embed"]
        new = [Table("ple", ple.rows, parts, ple.align, ple.page),
               Table("embed", m["vocab_size"], [replace(in_record)])]
    else:
        ep = embed.part("embed")
        new = [Table("ple", ple.rows, [replace(p) for p in ple.parts] + [Part("embed", ep.enc, ep.length)],
                     ple.align, ple.page)]
        if m["tie_embeddings"]:
            new.append(Table("embed", m["vocab_size"], [replace(ep)]))
    quant = {**layout.quant, "embed_in_record": not in_record}
    return Layout(m, layout.derived, quant, [replace(t) for t in layout.tensors], new + tables, layout.tokenizer,
                  layout.source)


def place_with_trade(layout: Layout, device: Device, context: int | None = None, kv_dtype: str = "fp16") -> dict:
    """`place`, plus what the other embedding-in-record choice would cost (file size, reads, time, fit)."""
    result = place(layout, device, context, kv_dtype)
    other = flip_embed_in_record(layout)
    if other is None:
        return result
    alt = place(other, device, context, kv_dtype)
    st = device.storage.name
    result["embed_in_record_trade"] = {
        "current": bool(layout.quant.get("embed_in_record")),
        "alternative": {
            "embed_in_record": bool(other.quant["embed_in_record"]),
            "fits": alt["fits"],
            "file_bytes": other.file_bytes,
            "file_bytes_delta": other.file_bytes - layout.file_bytes,
            "storage_tier": st,
            "storage_bytes_per_token": alt["bytes_per_token"][st],
            "storage_reads_per_token": alt["reads_per_token"][st],
            "bytes_per_token": alt["bytes_per_token"],
            "reads_per_token": alt["reads_per_token"],
            "est_ms_per_token": alt["est_ms_per_token"],
            "problems": alt["problems"],
        },
    }
    return result
