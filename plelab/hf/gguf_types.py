"""GGUF tensor types: names, sizes, which tensor shapes llama.cpp can load them for, quantize and dequantize.

A GGUF tensor of type T stores each row (its first dimension, ne0: the input width of a matrix) as blocks of
`block` values in `type_size` bytes, so a row length that is not a multiple of the block cannot be stored
(llama.cpp refuses such a file). Quantisation is done by:
    the `gguf` package (NumPy, no native code)   f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1
    ggml itself, the library llama.cpp is built on, through the libggml-base shared library that
    llama-cpp-python installs (`ggml_quantize_chunk`, the code llama-quantize runs, without an importance
    matrix)                                       q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs
The gguf package dequantizes every type (NumPy), which the recipe measurements use.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plelab.errors import PlelabError


class GGUFTypeError(PlelabError):
    """A GGUF type that is unknown, unavailable here, or cannot hold a tensor of a given shape."""


@dataclass(frozen=True)
class GGUFType:
    """One GGUF tensor type: its name (lower case, as llama.cpp prints it), ggml id, block and block bytes."""

    name: str
    ggml: int
    block: int
    type_size: int
    native: bool
    """True when the gguf package quantizes it in NumPy; False: needs ggml (llama-cpp-python)."""

    @property
    def bits_per_value(self) -> float:
        """Stored bits per weight, scales included."""
        return 8.0 * self.type_size / self.block

    def row_bytes(self, n: int) -> int:
        """Bytes of one row of `n` values (n must be a multiple of the block)."""
        return n // self.block * self.type_size

    def fits(self, row: int) -> bool:
        """Whether a row of `row` values can be stored in this type."""
        return row % self.block == 0


def _types() -> dict[str, GGUFType]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    native = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1")
    ggml = ("Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS")
    out = {}
    for name in native + ggml:
        t = GGMLQuantizationType[name]
        block, size = GGML_QUANT_SIZES[t]
        out[name.lower()] = GGUFType(name.lower(), int(t), block, size, name in native)
    return out


@functools.cache
def gguf_types() -> dict[str, GGUFType]:
    """Every type plelab writes, by name (needs the `gguf` package)."""
    try:
        return _types()
    except ImportError as exc:
        raise GGUFTypeError(f"GGUF needs the gguf package (pip install gguf): {exc}") from None


def gguf_type(name: str) -> GGUFType:
    """The type called `name` (case-insensitive), or one clear error listing the known ones."""
    t = gguf_types().get(name.lower())
    if t is None:
        raise GGUFTypeError(f"unknown GGUF type {name!r}; known: {', '.join(gguf_types())}")
    return t


def check_fits(t: GGUFType, tensor: str, shape: tuple[int, ...]) -> None:
    """Raise (one line) when llama.cpp could not load `tensor` of HF `shape` (rows, ..., row length) as `t`."""
    row = shape[-1] if shape else 1
    if not t.fits(row):
        raise GGUFTypeError(
            f"{tensor} has rows of {row} values, not a multiple of {t.name}'s block of {t.block}: llama.cpp cannot "
            f"load it as {t.name} (choose another --type, override it with --tensor-type {tensor}=q8_0 / f16, or "
            "drop --strict-types to let it fall back)")


FALLBACK = {"q2_k": "iq4_nl", "q3_k": "iq4_nl", "iq4_xs": "iq4_nl", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
"""The type llama.cpp's quantizer (llama-quantize) uses for a k-quant whose 256-value blocks do not divide a row:
one of the 32-value blocks, at about the same bits; when that does not divide the row either, it writes f16."""


def fitting_type(t: GGUFType, row: int) -> GGUFType:
    """`t` when it can store rows of `row` values, else llama.cpp's fallback for it (FALLBACK, then f16)."""
    if t.fits(row):
        return t
    nearer = FALLBACK.get(t.name)
    if nearer is not None and gguf_type(nearer).fits(row):
        return gguf_type(nearer)
    return gguf_type("f16")


# ---------------------------------------------------------------------------------------------------------------
# ggml through ctypes (the k-quants and iq4 types)


def ggml_library_path() -> Path | None:
    """libggml-base of the installed llama-cpp-python, or None."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
            hit = next(Path(folder).rglob(name), None)
            if hit is not None:
                return hit
    return None


@functools.cache
def _ggml() -> ctypes.CDLL:
    path = ggml_library_path()
    if path is None:
        raise GGUFTypeError("k-quant and iq4 types are quantized by ggml, which comes with llama-cpp-python "
                            "(pip install llama-cpp-python; or use f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1)")
    lib = ctypes.CDLL(str(path))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    return lib


def quantize(values: np.ndarray, t: GGUFType) -> np.ndarray:
    """(rows, n) float values -> (rows, row_bytes) uint8 (f32 / f16 as their own dtype) in GGUF type `t`."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    if x.ndim != 2:
        raise GGUFTypeError(f"quantize wants (rows, n) values, got shape {x.shape}")
    rows, n = x.shape
    if not t.fits(n):
        raise GGUFTypeError(f"rows of {n} values do not fit {t.name}'s block of {t.block}")
    if t.name == "f32":
        return x
    if t.name == "f16":
        if np.abs(x).max(initial=0.0) > np.finfo(np.float16).max:
            raise GGUFTypeError("weights exceed the f16 range; use f32 or bf16")
        return x.astype(np.float16)
    if t.native:
        from gguf import quants
        from gguf.constants import GGMLQuantizationType

        return quants.quantize(x, GGMLQuantizationType(t.ggml))
    lib = _ggml()
    if lib.ggml_quantize_requires_imatrix(t.ggml):
        raise GGUFTypeError(f"{t.name} needs an importance matrix; plelab does not make one")
    out = np.empty((rows, t.row_bytes(n)), np.uint8)
    written = lib.ggml_quantize_chunk(t.ggml, x.ctypes.data, out.ctypes.data, 0, rows, n, None)
    if written != out.nbytes:
        raise GGUFTypeError(f"ggml wrote {written} bytes quantizing to {t.name}, expected {out.nbytes}")
    return out


def dequantize(data: np.ndarray, t: GGUFType, n: int) -> np.ndarray:
    """Stored rows (from `quantize`) -> (rows, n) float32 values."""
    if t.name in ("f32", "f16"):
        return np.asarray(data, dtype=np.float32).reshape(-1, n)
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    return quants.dequantize(np.ascontiguousarray(data, dtype=np.uint8), GGMLQuantizationType(t.ggml)).reshape(-1, n)


def round_trip(values: np.ndarray, t: GGUFType) -> np.ndarray:
    """What llama.cpp computes with: `values` (rows, n) stored as `t` and read back, float32."""
    return dequantize(quantize(values, t), t, values.shape[1])
