"""The C runtime as microcontroller toolchains build it (arm-none-eabi-gcc standing in for ESP-IDF's)."""

from __future__ import annotations

import shutil

import pytest

from plelab.edge import c_engine, mcu

needs_arm_gcc = pytest.mark.skipif(
    shutil.which(mcu.ARM_GCC) is None,
    reason="arm-none-eabi-gcc not installed (bash scripts/setup.sh --test installs gcc-arm-none-eabi)")


def test_the_esp_idf_component_lists_the_runtime_library():
    names = {p.name for p in mcu.esp_idf_sources()}
    assert set(c_engine.LIBRARY) | {"ple_storage_esp.c"} == names
    assert all(p.is_file() for p in mcu.esp_idf_sources())


@needs_arm_gcc
@pytest.mark.parametrize("opt", ["-O0", "-O2", "-Os"])
def test_every_esp_idf_source_builds_warning_free_under_esp_idf_flags(opt):
    """uint32_t is unsigned long on ESP-IDF v5's and arm's compilers: %u for it fails -Werror=all there only."""
    for src in mcu.esp_idf_sources():
        proc = mcu.esp_idf_compile(src, opt)
        assert proc.returncode == 0, proc.stderr
        warnings = [ln for ln in proc.stderr.splitlines() if "warning:" in ln or "error:" in ln]
        assert not warnings, "\n".join(warnings)


@needs_arm_gcc
def test_the_strict_check_sees_a_uint32_printed_with_percent_u(tmp_path):
    """The check can fail: the bug the issue found (%u with a uint32_t) is an error under these flags."""
    src = tmp_path / "bad.c"
    src.write_text('#include <stdio.h>\n#include <stdint.h>\n'
                   'int f(char *b, uint32_t n) { return snprintf(b, 8, "%u", n); }\n')
    proc = mcu.esp_idf_compile(src)
    assert proc.returncode != 0 and "-Werror=format" in proc.stderr
