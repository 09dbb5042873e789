"""The .ple layout: one contiguous record per token, page alignment, checksums, clear errors on bad files."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from edge_helpers import lively_model

from plelab.edge import format as fmt
from plelab.edge.format import PleFile, PleFormatError
from plelab.edge.quant import Encoding, dequantize, quantize


def test_a_tokens_ple_record_is_one_contiguous_read_of_codes_and_scales(export_tmp):
    model = lively_model()
    path = export_tmp(model, quant="int4", group=8)
    table = model.per_layer_inputs.embed_tokens_per_layer.weight.detach().numpy()
    raw = Path(path).read_bytes()
    with PleFile(path) as f:
        ple = f.layout.table("ple")
        part = ple.part("ple")
        assert [p.name for p in ple.parts] == ["ple"]
        assert ple.record_bytes == part.enc.code_bytes(32) + part.enc.scale_bytes(32)  # 2 layers x dP 16
        base = f.layout.section("ple").offset
        for tok in (0, 17, 255):
            # Decode the record from nothing but its byte range: codes and scales are both inside it.
            rec = np.frombuffer(raw, np.uint8, ple.record_bytes, base + ple.row_offset(tok))
            codes, scales = rec[: part.scales].reshape(1, -1), rec[part.scales :].view("<f2").reshape(1, -1)
            enc = Encoding("int4", 8)
            expect = dequantize(*quantize(table[tok : tok + 1], enc, search=True), enc, 32)
            assert np.array_equal(dequantize(codes, scales, enc, 32), expect)
            assert np.array_equal(f.read_record(ple, tok)["ple"], expect[0])


def test_page_option_keeps_records_inside_pages_and_align_pads_the_stride(export_tmp):
    model = lively_model("ple.dim=40")  # a 2 x 40 fp16 record = 160 B; 512 B pages hold 3 of them
    with PleFile(export_tmp(model, quant="fp16", page=512, align=32)) as f:
        ple = f.layout.table("ple")
        assert ple.record_bytes == 160 and ple.stride == 160 and ple.per_page == 3
        start = f.layout.section("ple").offset
        assert start % 512 == 0
        offs = start + np.array([ple.row_offset(r) for r in range(ple.rows)])
        assert np.all(offs // 512 == (offs + ple.record_bytes - 1) // 512)
    with PleFile(export_tmp(model, quant="int4", group=16, align=64)) as f:
        ple = f.layout.table("ple")
        assert ple.stride % 64 == 0 and ple.stride >= ple.record_bytes


def test_embedding_row_joins_the_record_on_request(export_tmp):
    tied = lively_model()
    with PleFile(export_tmp(tied, quant="int8", embed_in_record=True)) as f:
        assert [p.name for p in f.layout.table("ple").parts] == ["ple", "embed"]
        assert f.layout.table("embed") is not None  # tied: the head keeps its own copy (stored twice)
    untied = lively_model("tie_embeddings=false")
    with PleFile(export_tmp(untied, quant="int8", embed_in_record=True)) as f:
        assert f.layout.table("embed") is None  # untied: the record is the only copy


def test_write_is_atomic_and_leaves_no_temp_files(export_tmp, tmp_path):
    path = export_tmp(lively_model())
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)


# --- bad files --------------------------------------------------------------------------------------------------


@pytest.fixture
def good(export_tmp) -> Path:
    return export_tmp(lively_model(), quant="int8")


def _patched(path: Path, offset: int, data: bytes) -> Path:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    bad = path.with_name("bad.ple")
    bad.write_bytes(bytes(raw))
    return bad


def test_truncated_file(good):
    bad = good.with_name("cut.ple")
    bad.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(PleFormatError, match="truncated"):
        PleFile(bad)
    bad.write_bytes(good.read_bytes()[:10])
    with pytest.raises(PleFormatError, match="not a .ple file"):
        PleFile(bad)


@pytest.mark.parametrize("section", ["tensors", "ple", "embed", "meta"])
def test_one_flipped_byte_fails_its_section_checksum(good, section):
    with PleFile(good) as f:
        sec = f.layout.section(section)
    off = sec.offset + sec.nbytes // 2
    bad = _patched(good, off, bytes([good.read_bytes()[off] ^ 0x10]))
    with pytest.raises(PleFormatError, match=f"section '{section}' fails its sha256"):
        PleFile(bad)


def test_flipped_byte_in_padding_fails_the_whole_file_crc(good):
    with PleFile(good) as f:
        secs = sorted(f.layout.sections, key=lambda s: s.offset)
    gap = next(b.offset - 1 for a, b in zip(secs, secs[1:], strict=False) if b.offset > a.offset + a.nbytes)
    with pytest.raises(PleFormatError, match="whole-file crc32"):
        PleFile(_patched(good, gap, b"\x01"))


def test_core_verification_skips_the_row_tables_but_not_the_rest(good):
    with PleFile(good) as f:
        ple, tensors = f.layout.section("ple"), f.layout.section("tensors")
    PleFile(_patched(good, ple.offset + 3, b"\xff\xff"), verify="core").close()
    with pytest.raises(PleFormatError, match="tensors"):
        PleFile(_patched(good, tensors.offset + 3, b"\xff\xff"), verify="core")


def test_wrong_magic_and_wrong_version(good):
    with pytest.raises(PleFormatError, match="not a .ple file"):
        PleFile(_patched(good, 0, b"GGUF"))
    head = good.read_bytes()[: fmt.HEADER.size]
    fields = list(fmt.HEADER.unpack(head))
    repacked = fmt._pack_header(fields[3], fields[4], fields[5], fields[6], version=4)  # valid crc, future version
    with pytest.raises(PleFormatError, match="version 4 is not supported"):
        PleFile(_patched(good, 0, repacked))


def test_corrupt_header_and_section_table(good):
    with pytest.raises(PleFormatError, match="header is corrupt"):
        PleFile(_patched(good, 20, b"\x07"))  # inside file_bytes
    with pytest.raises(PleFormatError, match="section table is corrupt"):
        PleFile(_patched(good, fmt.HEADER.size + 2, b"Z"))


def test_trailing_garbage(good):
    bad = good.with_name("long.ple")
    bad.write_bytes(good.read_bytes() + b"\0" * 10)
    with pytest.raises(PleFormatError, match="trailing"):
        PleFile(bad)


def test_header_is_what_the_spec_says(good):
    raw = good.read_bytes()
    magic, version, hbytes, file_bytes, n_sec = struct.unpack_from("<8sIIQI", raw)
    assert magic == b"\x89PLE\r\n\x1a\n" and version == 2 and hbytes == 64 and file_bytes == len(raw)
    assert struct.unpack_from("<I", raw, 60)[0] == zlib.crc32(raw[:60])
    names = [raw[64 + 64 * i : 64 + 64 * i + 16].rstrip(b"\0").decode() for i in range(n_sec)]
    assert names == ["meta", "model", "tensors", "ple", "embed"]
    assert os.path.getsize(good) == file_bytes
