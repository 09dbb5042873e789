"""Write a plelab `arch = "gemma4"` run as a Hugging Face folder that transformers loads as Gemma4ForCausalLM.

The folder holds config.json (a Gemma4TextConfig, see hf_interop.hf_gemma4_config), generation_config.json,
model.safetensors (our weights under HF names, no tensor changed) and the run's tokenizer (tokenizer.json
plus tokenizer_config.json naming its special tokens: eos = bos = the run's end-of-text, and pad). It is
assembled in a hidden temp folder next to OUT and renamed into place, so OUT is either absent, the previous
folder (with --overwrite), or complete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from plelab.errors import PlelabError
from plelab.hf.interop import HFInteropError, hf_gemma4_config, hf_gemma4_state_dict
from plelab.util.fs import check_output_path, replace_folder, resolve_path, staging_dir


def export_hf(run: str | Path, out: str | Path, overwrite: bool = False, transformers_only: bool = False) -> Path:
    """Export the newest checkpoint of `run` (or a checkpoint folder) to the HF folder `out`; returns `out`.

    The folder is what llama.cpp's convert_hf_to_gguf.py reads, which needs a Gemma-style tokenizer: a run with
    another tokenizer is refused unless `transformers_only` (the folder then loads in transformers only).
    """
    from plelab.inference.load import checkpoint_tokenizer, load_model
    from plelab.runs.checkpoint import reading_checkpoint

    out = check_output_path(out, overwrite=overwrite, inputs=(run,), is_dir=True)
    _refuse_losing_data(Path(run), out)
    with reading_checkpoint(run) as ckpt:  # a run still training cannot prune it while it is read
        model, _ = load_model(ckpt)
        tokenizer = checkpoint_tokenizer(ckpt, model.config.vocab_size)
    cfg = model.config
    if cfg.arch != "gemma4":
        raise HFInteropError(
            f"{run} is an arch={cfg.arch!r} model; export-hf writes Gemma 4 and needs a model trained with "
            "arch=gemma4"
        )
    if cfg.ple.dim and cfg.ple_vocab_size != cfg.vocab_size:
        raise HFInteropError(
            f"ple.vocab_size={cfg.ple_vocab_size} differs from vocab_size={cfg.vocab_size}: transformers' Gemma 4 "
            "looks every id up in the PLE table, so it cannot run this model"
        )
    if tokenizer.kind != "gemma" and not transformers_only:
        raise HFInteropError(
            f"{run} uses a {tokenizer.kind} tokenizer; llama.cpp's Gemma 4 converter reads only Gemma-style ones: "
            "train with `plelab data tokenizer --kind gemma` (or `data prepare --tokenizer-kind gemma`), use "
            "`plelab export-gguf` (it converts this vocabulary), or pass --transformers-only"
        )
    # One token per embedding row (llama.cpp checks it); the extra ids are `<unusedN>`, never produced by encoding.
    tokenizer = tokenizer.padded_to(cfg.vocab_size)
    hf_config = hf_gemma4_config(
        cfg, eos_token_id=tokenizer.eot_id, pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.eot_id,
    )
    hf_config.architectures = ["Gemma4ForCausalLM"]
    # Every layer's head width and kv heads spelled out in config.json (transformers drops overrides equal to the
    # global value, leaving `{}`), also through AutoConfig: llama.cpp's converter asserts the full layers' are there.
    hf_config.serialize_explicit_per_layer_config = True
    hf_config.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    weights = {k: v.contiguous() for k, v in hf_gemma4_state_dict(model).items()}

    tmp = staging_dir(out)
    try:
        _write_folder(tmp, hf_config, weights, tokenizer)
        replace_folder(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_write_failure(exc):  # a full disk, a quota: safetensors reports it as its own error type
            raise PlelabError(f"cannot write {out}: {_write_failure_text(exc)}; nothing was written") from None
        raise
    return out


def _refuse_losing_data(run: Path, out: Path) -> None:
    """Refuse an OUT whose replacement would delete the run (OUT holds it; OUT inside a run was refused by
    check_output_path) or a folder of other files (only a Hugging Face model folder, e.g. an earlier export, is
    ever replaced)."""
    from plelab.hf.checkpoint import is_hf_folder

    if resolve_path(run).is_relative_to(resolve_path(out)):
        raise PlelabError(f"{run} lies inside the output folder {out}, which an export replaces; choose an OUT "
                          "outside it")
    if out.is_dir() and any(out.iterdir()) and not is_hf_folder(out):
        raise PlelabError(f"output {out} is not empty and is not a Hugging Face model folder; refusing to replace "
                          "it (choose another OUT)")


def _is_write_failure(exc: BaseException) -> bool:
    from safetensors import SafetensorError

    return isinstance(exc, OSError) or (isinstance(exc, SafetensorError) and "I/O error" in str(exc))


def _write_failure_text(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc).split("I/O error:", 1)[-1].split("(os error")[0].strip()


def _write_folder(folder: Path, hf_config, weights: dict[str, torch.Tensor], tokenizer) -> None:
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    hf_config.save_pretrained(folder)
    GenerationConfig(eos_token_id=tokenizer.eot_id, pad_token_id=tokenizer.pad_id).save_pretrained(folder)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.to_hf().save_pretrained(folder)
    for f in folder.iterdir():
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())
