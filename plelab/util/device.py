"""Which torch device to run on, in which precision, and how a run talks to it.

`pick_device("auto")` picks the best available device; a named one is checked before use.
`choose_precision(device, "auto")` picks bf16 autocast wherever the hardware computes bf16 natively
(CUDA devices with bf16, CPUs with AVX512-BF16 or AMX, aarch64 CPUs with FEAT_BF16) and fp32 elsewhere,
and says why. `backend_for(device)` is the torch.distributed backend for a device (NCCL on CUDA, gloo on
the CPU); `fused_adamw` and `host_to_device` are the other per-device choices a training run makes.
"bf16-head" is the CPU training fast path: bf16 GEMMs in the fused output head + loss only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch

from plelab.errors import PlelabError

# CPU feature flags (as /proc/cpuinfo spells them) that mean bf16 arithmetic runs in hardware: x86
# AVX512-BF16 and AMX-BF16, aarch64 FEAT_BF16. Without them oneDNN emulates bf16 and it is slower than fp32.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


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


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (x86 `flags`, aarch64 `Features`); empty where unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_bf16_features(flags: Iterable[str] | None = None) -> list[str]:
    """The native-bf16 features this CPU (or the given flag set) has; empty = bf16 would be emulated."""
    if flags is None:
        flags = cpu_flags()
        if not flags:  # no /proc/cpuinfo (macOS, Windows): ask torch's own x86 probe
            probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
            return ["avx512_bf16"] if probe is not None and probe() else []
    have = set(flags)
    return [f for f in CPU_BF16_FLAGS if f in have]


PrecisionChoice = Literal["auto", "bf16", "bf16-head", "fp32"]
"""How a run's compute precision is asked for: auto (bf16 where the hardware has it natively), bf16, bf16-head
(the CPU fast path: bf16 GEMMs in the fused output head + loss only) or fp32 (see `choose_precision`)."""
PRECISIONS: tuple[str, ...] = get_args(PrecisionChoice)
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""The torch dtype of a precision name (for models held in that dtype rather than autocast)."""
OLD_PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bf16"}
"""Spellings `plelab diagnose --dtype` used to take, still accepted."""


@dataclass(frozen=True)
class Precision:
    """The compute precision of a run: `name` is "bf16" (autocast), "bf16-head" or "fp32"; `reason` says why.

    bf16-head (CPU only; elsewhere it resolves to bf16): the fused output head + cross-entropy takes bf16 GEMM
    inputs with fp32 accumulation (plelab.model.bf16_gemm), everything else is fp32 as under "fp32".
    `native_bf16` says whether those GEMMs run on bf16 hardware or are emulated exactly in fp32.
    """

    name: str
    reason: str
    native_bf16: bool = False

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """torch.bfloat16 under bf16 autocast, None otherwise (fp32, bf16-head)."""
        return torch.bfloat16 if self.name == "bf16" else None

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """The autocast context for `device` (a no-op context for fp32 and bf16-head)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    def __str__(self) -> str:
        what = {
            "bf16": "bf16 autocast (matmuls in bf16; norms, softmax and loss in fp32)",
            "bf16-head": "bf16-head (the output head + cross-entropy GEMMs take bf16 inputs with fp32 accumulation, "
                         + ("on the CPU's bf16 units" if self.native_bf16 else "emulated exactly in fp32")
                         + "; everything else fp32)",
        }.get(self.name, "fp32")
        return f"{what}: {self.reason}"


def choose_precision(
    device: torch.device,
    dtype: str = "auto",
    *,
    cpu_features: Iterable[str] | None = None,
    cuda_bf16: bool | None = None,
) -> Precision:
    """bf16, bf16-head or fp32 for `dtype` in PRECISIONS on `device`; the hardware probes can be injected (tests)."""
    if dtype == "fp32":
        return Precision("fp32", "dtype = fp32")
    if dtype not in PRECISIONS:
        raise PlelabError(f"dtype must be one of {', '.join(PRECISIONS)}, got {dtype!r}")
    if dtype == "bf16-head" and device.type == "cpu":
        found = cpu_bf16_features(cpu_features)
        hw = (f"the CPU has native bf16 ({', '.join(found)})" if found else
              "the CPU has no native bf16, so its GEMMs run in fp32 on bf16-rounded inputs (same numbers)")
        return Precision("bf16-head", f"dtype = bf16-head and {hw}", native_bf16=bool(found))
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported() if cuda_bf16 is None else cuda_bf16
        hw = "this CUDA device " + ("computes bf16 natively" if native else "has no native bf16")
    elif device.type == "cpu":
        found = cpu_bf16_features(cpu_features)
        native = bool(found)
        hw = f"the CPU has native bf16 ({', '.join(found)})" if native else (
            f"the CPU has no native bf16 (none of {', '.join(CPU_BF16_FLAGS)}), so bf16 would be emulated")
    else:
        native, hw = False, f"bf16 autocast is not chosen automatically on {device.type}"
    if dtype == "bf16-head":  # a CPU kernel; on an accelerator the whole forward runs under bf16 autocast
        return Precision("bf16", f"dtype = bf16-head, which on {device.type} is bf16 autocast"
                                 + ("" if native else f"; note: {hw}, slower than fp32"))
    if dtype == "bf16":
        return Precision("bf16", "dtype = bf16" + ("" if native else f"; note: {hw}, slower than fp32"))
    return Precision("bf16" if native else "fp32", f"dtype = auto and {hw}")


def autocast_context(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """The autocast context `choose_precision(device, dtype)` picks: bf16 autocast or a no-op."""
    return choose_precision(device, dtype).autocast(device)


def backend_for(device: torch.device | str, *, nccl_available: bool | None = None) -> str:
    """torch.distributed backend for ranks computing on `device`: nccl on CUDA (when built in), else gloo."""
    if torch.device(device).type == "cuda":
        if nccl_available is None:
            import torch.distributed as dist

            nccl_available = dist.is_available() and dist.is_nccl_available()
        if nccl_available:
            return "nccl"
    return "gloo"


def fused_adamw(device: torch.device) -> bool:
    """Whether AdamW should run its fused kernel: on CUDA, where it is one launch instead of one per tensor."""
    return device.type == "cuda"


def host_to_device(tensor: torch.Tensor, device: torch.device, pin_memory: bool = True) -> torch.Tensor:
    """Move a CPU batch to `device`; on CUDA through pinned memory, so the copy overlaps the running step."""
    if device.type == "cpu":
        return tensor
    if pin_memory and device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
