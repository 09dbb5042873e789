"""The C runtime on microcontrollers: the arm-none-eabi toolchain, ESP-IDF's compile flags, bare-metal images.

ESP-IDF v5 builds components with `-Wall -Werror=all` and its toolchains (Xtensa, RISC-V) define `uint32_t`
as `unsigned long`, as arm-none-eabi-gcc does; on x86-64 it is `unsigned int`, so a `%u` given a `uint32_t`
only fails on the MCU compilers. `esp_idf_compile` compiles the ESP-IDF component's sources the way ESP-IDF
would, with arm-none-eabi-gcc standing in for the Xtensa compiler (same integer model, same GCC warnings).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from plelab.errors import PlelabError

C_DIR = Path(__file__).with_name("c")
ESP_IDF_DIR = C_DIR / "esp-idf"
ARM_GCC = "arm-none-eabi-gcc"
QEMU_ARM = "qemu-system-arm"
# ESP-IDF v5's defaults for component sources (-Werror=all) plus the component's own options (CMakeLists.txt)
ESP_IDF_FLAGS = ("-std=gnu99", "-DESP_PLATFORM", "-Wall", "-Werror=all", "-Wextra", "-ffp-contract=fast")
# what `scripts/setup.sh --test` installs for the MCU tests
DEBIAN_PACKAGES = ("gcc-arm-none-eabi", "libnewlib-arm-none-eabi", "qemu-system-arm")


class McuError(PlelabError):
    """The MCU toolchain is missing, a bare-metal build failed, or a bare-metal run did not finish."""


def missing_tools() -> list[str]:
    """The Debian packages the MCU tests need that this machine lacks (empty when all are there)."""
    missing = []
    if not shutil.which(ARM_GCC):
        missing.append("gcc-arm-none-eabi")
    elif not _has_newlib():
        missing.append("libnewlib-arm-none-eabi")
    if not shutil.which(QEMU_ARM):
        missing.append("qemu-system-arm")
    return missing


def _has_newlib() -> bool:
    proc = subprocess.run([ARM_GCC, "-print-file-name=libc.a"], capture_output=True, text=True)
    return proc.returncode == 0 and Path(proc.stdout.strip()).is_file()


def esp_idf_sources() -> list[Path]:
    """Every source file the ESP-IDF component compiles (its CMakeLists.txt SRCS), as paths."""
    cmake = (ESP_IDF_DIR / "CMakeLists.txt").read_text()
    srcs = re.search(r"SRCS((?:\s+\"[^\"]+\")+)", cmake)
    if not srcs:
        raise McuError(f"{ESP_IDF_DIR / 'CMakeLists.txt'}: no SRCS list")
    return [(ESP_IDF_DIR / s).resolve() for s in re.findall(r"\"([^\"]+)\"", srcs.group(1))]


def esp_idf_compile(src: Path, opt: str = "-O2", cc: str = ARM_GCC) -> subprocess.CompletedProcess:
    """Compile one component source as ESP-IDF would (host stub for esp_partition.h); the finished process."""
    if not shutil.which(cc):
        raise McuError(f"{cc} is not installed (Debian: apt-get install gcc-arm-none-eabi)")
    cmd = [cc, *ESP_IDF_FLAGS, opt, "-I", str(ESP_IDF_DIR), "-I", str(C_DIR), "-I", str(ESP_IDF_DIR / "host_stub"),
           "-c", str(src), "-o", "/dev/null"]
    return subprocess.run(cmd, capture_output=True, text=True)
