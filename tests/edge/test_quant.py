"""Group-wise symmetric int8/int4 with fp16 scales, fp16/fp32, 1-bit masks: exact layouts and error bounds."""

from __future__ import annotations

import numpy as np
import pytest

from plelab.edge.quant import Encoding, QuantError, dequantize, quantize


@pytest.mark.parametrize("length", [1, 7, 96, 128, 301])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int8", "int4"])
def test_roundtrip_shapes_and_error_bound(dtype, length):
    x = np.random.default_rng(0).standard_normal((5, length)).astype(np.float32)
    enc = Encoding(dtype, 32)
    codes, scales = quantize(x, enc)
    assert codes.shape == (5, enc.code_bytes(length)) and codes.dtype == np.uint8
    assert scales.shape == (5, enc.scale_count(length)) and scales.dtype == np.float16
    y = dequantize(codes, scales, enc, length)
    if dtype == "fp32":
        assert np.array_equal(x, y)
        return
    if dtype == "fp16":
        bound = np.abs(x) * 2**-11 + 1e-7  # fp16 keeps 11 significant bits
    else:  # half a quantisation step of the value's group
        bound = 0.5 * np.repeat(scales.astype(np.float32), 32, axis=1)[:, :length] + 1e-6
    assert np.all(np.abs(y - x) <= bound)


def test_int4_packing_is_two_per_byte_low_nibble_first():
    x = np.array([[1.0, -1.0, 7.0, -7.0, 3.0]], np.float32)
    codes, scales = quantize(x, Encoding("int4", 8))
    assert float(scales[0, 0]) == 1.0
    # 1 -> 0x1, -1 -> 0xF, 7 -> 0x7, -7 -> 0x9, 3 -> 0x3, pad 0.
    assert codes.tolist() == [[0xF1, 0x97, 0x03]]
    assert dequantize(codes, scales, Encoding("int4", 8), 5).tolist() == x.tolist()


def test_groups_have_their_own_scales_and_zero_groups_are_exact():
    x = np.zeros((1, 256), np.float32)
    x[0, :128] = np.linspace(-100, 100, 128)
    x[0, 128:] = np.linspace(-0.01, 0.01, 128)
    codes, scales = quantize(x, Encoding("int8", 128))
    y = dequantize(codes, scales, Encoding("int8", 128), 256)
    assert np.abs(y[0, 128:] - x[0, 128:]).max() < 1e-4  # the small group is not drowned by the big one
    z = np.zeros((2, 10), np.float32)
    assert np.array_equal(dequantize(*quantize(z, Encoding("int4", 4)), Encoding("int4", 4), 10), z)


def test_scale_search_never_increases_the_error():
    x = np.random.default_rng(1).standard_t(3, (64, 512)).astype(np.float32)  # heavy tails: clipping pays
    enc = Encoding("int4", 128)
    plain = np.square(dequantize(*quantize(x, enc), enc, 512) - x).sum()
    searched = np.square(dequantize(*quantize(x, enc, search=True), enc, 512) - x).sum()
    assert searched < plain


def test_bit_masks_roundtrip():
    m = np.random.default_rng(2).random((3, 13)) > 0.5
    codes, _ = quantize(m.astype(np.float32), Encoding("u1"))
    assert codes.shape == (3, 2)
    assert np.array_equal(dequantize(codes, np.zeros((3, 0), np.float16), Encoding("u1"), 13), m)


def test_bad_encodings_are_refused():
    with pytest.raises(QuantError, match="unknown"):
        Encoding("int3", 8)
    with pytest.raises(QuantError, match="group"):
        Encoding("int4", 0)
