"""The weight formats a quantization recipe chooses from: the .ple encodings and the GGUF types, one interface.

    .ple  ("ple")   fp16, int8/G and int4/G (G values per fp16 scale, symmetric, with the export's scale
                    search; plelab/edge/quant.py). A row table (the PLE table, the main embedding) is
                    quantized row by row, every other matrix as one flattened vector, as `plelab export` does.
    GGUF  ("gguf")  f16, bf16, q8_0 ... q2_k (plelab/hf/gguf_types.py): blocks along each row; a type whose
                    block does not divide the row length cannot hold the tensor (bytes() is None).

`round_trip` returns what the runtime computes with: the values stored in the format and read back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from plelab.errors import PlelabError

PLE_FORMATS = ("fp16", "int8/32", "int8/64", "int8/128", "int4/32", "int4/64", "int4/128")
GGUF_FORMATS = ("f16", "q8_0", "q6_k", "q5_k", "q5_0", "q4_k", "q4_0", "iq4_nl", "q3_k", "q2_k")
DEFAULT_FORMATS = ("fp16", "int8/32", "int8/128", "int4/32", "int4/128",
                   "f16", "q8_0", "q6_k", "q5_k", "q4_k", "q4_0", "q3_k", "q2_k")


class FormatError(PlelabError):
    """An unknown or unusable weight format."""


@dataclass(frozen=True)
class Format:
    """A weight format of one family ('ple' or 'gguf')."""

    name: str
    family: str

    @property
    def bits(self) -> float:
        """Nominal stored bits per weight (scales included; for sorting and display)."""
        if self.family == "gguf":
            from plelab.hf.gguf_types import gguf_type

            return gguf_type(self.name).bits_per_value
        if self.name == "fp16":
            return 16.0
        dtype, group = self._ple()
        return (8 if dtype == "int8" else 4) + 16 / group

    def _ple(self) -> tuple[str, int]:
        dtype, _, group = self.name.partition("/")
        return dtype, int(group)

    def encoding(self):
        """The .ple Encoding (family 'ple' only)."""
        from plelab.edge.quant import Encoding

        if self.name == "fp16":
            return Encoding("fp16")
        dtype, group = self._ple()
        return Encoding(dtype, group)

    def nbytes(self, shape: tuple[int, ...], table: bool) -> int | None:
        """Stored bytes of a matrix of `shape` (rows first), or None when the format cannot hold it."""
        row = shape[-1]
        rows = math.prod(shape[:-1])
        if self.family == "gguf":
            from plelab.hf.gguf_types import gguf_type

            t = gguf_type(self.name)
            return rows * t.row_bytes(row) if t.fits(row) else None
        enc = self.encoding()
        vectors, length = (rows, row) if table else (1, rows * row)
        return vectors * (enc.code_bytes(length) + enc.scale_bytes(length))

    def round_trip(self, values: np.ndarray, table: bool) -> np.ndarray:
        """(rows, row) float32 -> the same values stored in this format and read back."""
        x = np.ascontiguousarray(values, dtype=np.float32)
        if self.family == "gguf":
            from plelab.hf.gguf_types import gguf_type, round_trip

            return round_trip(x, gguf_type(self.name))
        from plelab.edge.quant import dequantize, quantize

        enc = self.encoding()
        flat = x if table else x.reshape(1, -1)
        codes, scales = quantize(flat, enc, search=True)
        return dequantize(codes, scales, enc, flat.shape[1]).reshape(x.shape)


def parse_format(name: str) -> Format:
    """A format from its name ('int4/32', 'fp16', 'q4_k', ...)."""
    from plelab.hf.gguf_types import gguf_types

    key = name.strip().lower()
    if key in PLE_FORMATS or _is_ple_int(key):
        return Format(key, "ple")
    if key in gguf_types():
        return Format(key, "gguf")
    raise FormatError(f"unknown format {name!r}: .ple formats {', '.join(PLE_FORMATS)} (any int8/G, int4/G), "
                      f"GGUF types {', '.join(GGUF_FORMATS)}")


def _is_ple_int(key: str) -> bool:
    dtype, sep, group = key.partition("/")
    return dtype in ("int8", "int4") and sep == "/" and group.isdigit() and int(group) > 0


def available(fmt: Format) -> bool:
    """False for GGUF types that need ggml when llama-cpp-python is not installed."""
    if fmt.family != "gguf":
        return True
    from plelab.hf.gguf_types import ggml_library_path, gguf_type

    return gguf_type(fmt.name).native or ggml_library_path() is not None
