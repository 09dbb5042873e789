"""The adapter folder others load: peft's format, named for the checkpoint's own layout, plus the table delta.

    adapter_config.json        peft LoraConfig (r, alpha, target_modules as one regex over the decoder layers)
    adapter_model.safetensors  base_model.model.<checkpoint's name of the layer>.lora_A/B.weight, float32
    table_delta.safetensors    only when the table trained: rows + their change (see table_delta.py)
    plelab_finetune.json       what was trained from what: base folder and its fingerprint (resume and merge
                               refuse a base that now holds other weights), step, targets, table mode

`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), FOLDER)` loads it: names carry
`model.` for a text-only checkpoint and `model.language_model.` for a multimodal one, as transformers
builds each. peft ignores the delta file; `apply_table_delta(model, FOLDER / DELTA_FILE)` adds it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from plelab.errors import PlelabError
from plelab.hf.checkpoint import TABLE_SUFFIX, HFCheckpoint, read_json_object
from plelab.hf.finetune.model import INTERNAL_PREFIX, FinetuneModel, lora_config
from plelab.hf.finetune.table_delta import DELTA_FILE, check_trained_values, load_delta, save_delta
from plelab.util.fs import replace_folder, staging_dir

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
RECORD = "plelab_finetune.json"
"""Written into adapter folders and merged folders: what was fine-tuned from what."""


def layers_prefix(ckpt: HFCheckpoint) -> str:
    """Where the checkpoint's decoder layers sit in the model transformers builds from it ('model' or
    'model.language_model')."""
    return ckpt.prefix.rstrip(".")


def peft_key(ckpt: HFCheckpoint, internal_path: str, which: str) -> str:
    """peft's state-dict key of one adapter matrix for the model transformers builds from `ckpt`."""
    rel = internal_path.removeprefix(INTERNAL_PREFIX + ".")
    return f"base_model.model.{ckpt.prefix}{rel}.{which}.weight"


def write_adapter(model: FinetuneModel, ckpt: HFCheckpoint, out: Path, record: dict[str, Any]) -> Path:
    """Write the adapter folder `out` atomically (a temp folder renamed into place, replacing an older one)."""
    out = Path(out)
    tmp = staging_dir(out)
    try:
        weights = {}
        for path, (a, b) in model.adapter_tensors().items():
            weights[peft_key(ckpt, path, "lora_A")] = a.float().contiguous()
            weights[peft_key(ckpt, path, "lora_B")] = b.float().contiguous()
        save_file(weights, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        lora_config(model.settings, model.paths, layers_prefix(ckpt), str(ckpt.path)).save_pretrained(str(tmp))
        files = [ADAPTER_WEIGHTS, ADAPTER_CONFIG]
        if model.table is not None:
            rows, delta = model.table.changed()
            save_delta(tmp / DELTA_FILE, rows, delta, ckpt.prefix + TABLE_SUFFIX, ckpt.table.shape)
            files.append(DELTA_FILE)
            record = {**record, "table_rows_changed": len(rows)}
        (tmp / RECORD).write_text(json.dumps({**record, "files": files}, indent=2))
        for name in [*files, RECORD]:
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_record(folder: Path) -> dict[str, Any] | None:
    """The plelab_finetune.json of an adapter or merged folder, or None when it has none."""
    f = Path(folder) / RECORD
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{f}: unreadable ({exc})") from None
    return data if isinstance(data, dict) else None


def check_base_unchanged(record: dict[str, Any] | None, ckpt: HFCheckpoint, fingerprint: str | None = None) -> None:
    """Refuse (one line) a base folder whose weights differ from those an adapter record says it was trained on
    (records written before fingerprints were kept are not checked)."""
    expected = (record or {}).get("base_fingerprint")
    if expected and expected != (fingerprint or ckpt.fingerprint()):
        raise PlelabError(f"{ckpt.path} no longer holds the weights this fine-tune was trained on (its fingerprint "
                          f"changed since step 0): the adapters fit only those; put the original folder back, or "
                          "fine-tune the new one in a new run")


def read_adapter(folder: Path, ckpt: HFCheckpoint) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float,
                                                              tuple[torch.Tensor, torch.Tensor] | None]:
    """({checkpoint tensor name of the adapted weight: (A, B)}, alpha / r, (rows, delta) or None) of an adapter
    folder written for `ckpt`."""
    folder = Path(folder)
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        if not (folder / name).is_file():
            raise PlelabError(f"{folder}: no {name} (not an adapter folder)")
    rank, alpha = _rank_and_alpha(folder / ADAPTER_CONFIG)
    try:
        weights = load_file(str(folder / ADAPTER_WEIGHTS))
    except Exception as exc:  # safetensors raises its own error types for a truncated or corrupt file
        raise PlelabError(f"{folder / ADAPTER_WEIGHTS}: not readable safetensors ({str(exc).splitlines()[0][:120]}); "
                          "the file is damaged") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in weights.items():
        parts = key.removeprefix("base_model.model.").rsplit(".", 2)
        if len(parts) != 3 or parts[1] not in ("lora_A", "lora_B"):
            raise PlelabError(f"{folder / ADAPTER_WEIGHTS}: {key} is not a LoRA weight (NAME.lora_A.weight or "
                              "NAME.lora_B.weight)")
        pairs.setdefault(parts[0] + ".weight", {})[parts[1]] = t
    out = {}
    for name, p in pairs.items():
        if set(p) != {"lora_A", "lora_B"}:
            raise PlelabError(f"{folder}: {name} has {sorted(p)} but needs lora_A and lora_B")
        if name.removeprefix(ckpt.prefix) not in ckpt.tensors:
            raise PlelabError(f"{folder}: the adapter changes {name}, which {ckpt.path} does not hold")
        a, b = p["lora_A"], p["lora_B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise PlelabError(f"{folder}: {name}'s lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are not of "
                              f"rank r = {rank} (adapter_config.json)")
        for which, t in (("lora_A", a), ("lora_B", b)):
            check_trained_values(folder / ADAPTER_WEIGHTS, f"{name}'s {which}", t.float())
        out[name] = (a, b)
    delta = None
    if (folder / DELTA_FILE).is_file():
        rows, values, _ = load_delta(folder / DELTA_FILE, ckpt.table.shape)
        delta = (rows, values)
    return out, alpha / rank, delta


def _rank_and_alpha(path: Path) -> tuple[int, float]:
    """(r, lora_alpha) of an adapter_config.json, each required and checked (one line for a damaged file)."""
    cfg = read_json_object(path)
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise PlelabError(f"{path}: r must be a positive integer (the LoRA rank), got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        what = "missing" if alpha is None else repr(alpha)
        raise PlelabError(f"{path}: lora_alpha must be a positive number (the LoRA scale is lora_alpha / r), got "
                          f"{what}")
    return rank, float(alpha)
