"""A local Hugging Face Gemma 3n / Gemma 4 folder: its config, where each tensor is, and what is wrong with it.

Accepted: config.json of model_type gemma3n / gemma4 (multimodal: the text part under `text_config`, weights
under `model.language_model.`) or gemma3n_text / gemma4_text (text only, weights under `model.`), with
model.safetensors or sharded model-*.safetensors (+ model.safetensors.index.json). Everything is checked
before any weight is read: a folder that is not Gemma, a missing shard, a table whose shape disagrees
with config.json are each one HFCheckpointError line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError
from plelab.util.fs import sampled_sha256
from plelab.util.safetensors import TensorInfo, read_header

FAMILIES = {"gemma3n": "gemma3n", "gemma3n_text": "gemma3n", "gemma4": "gemma4", "gemma4_text": "gemma4"}
"""config.json model_type -> architecture family."""
TABLE_SUFFIX = "embed_tokens_per_layer.weight"
INDEX = "model.safetensors.index.json"


class HFCheckpointError(PlelabError):
    """A folder that is not a readable Gemma 3n / Gemma 4 checkpoint."""


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of a Hugging Face folder as a dict (one clear error if absent or not JSON)."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise HFCheckpointError(f"{path}: no config.json (not a Hugging Face model folder)")
    return read_json_object(f)


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object (a folder's config files); not JSON or not an object: one error line."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise HFCheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise HFCheckpointError(f"{path}: not a JSON object")
    return data


def is_hf_folder(path: str | Path) -> bool:
    """True for a folder whose config.json names a transformers model_type (plelab checkpoints do not)."""
    try:
        return Path(path).is_dir() and "model_type" in read_config(path)
    except HFCheckpointError:
        return False


def text_config_of(cfg: dict[str, Any], where: str | Path) -> tuple[str, dict[str, Any]]:
    """(family, text config dict) of a Gemma 3n / Gemma 4 config.json; not Gemma, or no PLE: one error."""
    model_type = cfg.get("model_type")
    family = FAMILIES.get(model_type)
    if family is None:
        raise HFCheckpointError(f"{where}: model_type {model_type!r} is not Gemma 3n or Gemma 4 "
                                f"(supported: {', '.join(FAMILIES)})")
    text = cfg.get("text_config", cfg) if not model_type.endswith("_text") else cfg
    if not isinstance(text, dict):
        raise HFCheckpointError(f"{where}: config.json has no text_config object")
    need = ("hidden_size", "num_hidden_layers", "vocab_size", "hidden_size_per_layer_input",
            "vocab_size_per_layer_input")
    missing = [k for k in need if not isinstance(text.get(k), int)]
    if missing:
        raise HFCheckpointError(f"{where}: config.json lacks integer {', '.join(missing)} in its text config")
    if text["hidden_size_per_layer_input"] <= 0:
        raise HFCheckpointError(f"{where}: hidden_size_per_layer_input is {text['hidden_size_per_layer_input']}: "
                                "this model has no per-layer embeddings")
    return family, text


def _shard_files(path: Path) -> list[Path]:
    index = path / INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise HFCheckpointError(f"{index}: not a valid safetensors index ({exc})") from None
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise HFCheckpointError(f"{path}: {len(missing)} of {len(names)} weight shard(s) listed in {INDEX} "
                                    f"are missing: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise HFCheckpointError(f"{path}: no .safetensors weights (only safetensors checkpoints are read)")
    return files


@dataclass
class HFCheckpoint:
    """A checked Gemma folder: its text config and the location of every text-model tensor."""

    path: Path
    family: str
    config: dict[str, Any]
    text_config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    """Text-model tensors by their name inside the text model (e.g. 'layers.0.per_layer_input_gate.weight')."""
    lm_head: TensorInfo | None
    prefix: str
    """What precedes those names in the files ('model.' or 'model.language_model.')."""

    @classmethod
    def open(cls, path: str | Path) -> HFCheckpoint:
        """Read config.json and every shard's header, and check the PLE table against the config."""
        root = Path(path)
        if not root.is_dir():
            raise HFCheckpointError(f"{path}: not a folder (give a Hugging Face model folder)")
        cfg = read_config(root)
        family, text = text_config_of(cfg, root)
        every: dict[str, TensorInfo] = {}
        for f in _shard_files(root):
            every.update(read_header(f))
        tables = [k for k in every if k.endswith(TABLE_SUFFIX)]
        if len(tables) != 1:
            raise HFCheckpointError(f"{root}: the weights hold {len(tables)} tensors named *{TABLE_SUFFIX} "
                                    "(a Gemma 3n / Gemma 4 checkpoint has exactly one)")
        prefix = tables[0][: -len(TABLE_SUFFIX)]
        tensors = {k[len(prefix):]: v for k, v in every.items() if k.startswith(prefix)}
        ckpt = cls(root, family, cfg, text, tensors, every.get("lm_head.weight"), prefix)
        want = (ckpt.ple_vocab_size, ckpt.num_layers * ckpt.ple_dim)
        if ckpt.table.shape != want:
            raise HFCheckpointError(
                f"{root}: config/weights mismatch: {tables[0]} has shape {ckpt.table.shape}, config.json implies "
                f"{want} (vocab_size_per_layer_input, num_hidden_layers x hidden_size_per_layer_input)")
        return ckpt

    def fingerprint(self) -> str:
        """A hash of config.json and of every weight shard (`sampled_sha256`: a few MB read even for GBs), so a
        run can tell that its base folder now holds other weights of the same shape."""
        h = hashlib.sha256((self.path / "config.json").read_bytes())
        for shard in _shard_files(self.path):
            h.update(f"{shard.name}:{sampled_sha256(shard)}".encode())
        return h.hexdigest()

    @property
    def table(self) -> TensorInfo:
        """The packed PLE table (V_ple, L x dP)."""
        return self.tensors[TABLE_SUFFIX]

    @property
    def num_layers(self) -> int:
        """Decoder layers (each carries a PLE slice)."""
        return self.text_config["num_hidden_layers"]

    @property
    def ple_dim(self) -> int:
        """dP, the per-layer width of the table."""
        return self.text_config["hidden_size_per_layer_input"]

    @property
    def ple_vocab_size(self) -> int:
        """Rows of the PLE table."""
        return self.text_config["vocab_size_per_layer_input"]

    @property
    def tokenizer_json(self) -> Path | None:
        """The folder's tokenizer.json, if any."""
        f = self.path / "tokenizer.json"
        return f if f.is_file() else None
