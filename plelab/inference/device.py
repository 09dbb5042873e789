"""Which torch device to run on: `auto` picks the best available, a named one is checked before use."""

from __future__ import annotations

import contextlib

import torch

from plelab.errors import PlelabError


def _available(kind: str) -> bool:
    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    module = getattr(torch, kind, None)  # xpu, ...: backends that follow torch.cuda's interface
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


def pick_device(name: str = "auto") -> torch.device:
    """cuda if present, then mps, else cpu; or the named device, refused (PlelabError) if unknown or absent."""
    if name == "auto":
        for kind in ("cuda", "mps"):
            if _available(kind):
                return torch.device(kind)
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise PlelabError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if not _available(device.type):
        raise PlelabError(f"device {name!r} is not available on this machine (torch {torch.__version__}); "
                          "use --device auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise PlelabError(f"device {name!r} does not exist: this machine has {count} CUDA device(s)")
    return device


def autocast_context(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """bf16 autocast where the hardware has it (or when asked), otherwise a no-op context."""
    use_bf16 = dtype == "bf16" or (
        dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    if use_bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
