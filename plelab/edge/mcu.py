"""The C runtime on microcontrollers: bare-metal images run under QEMU, and ESP-IDF's compile flags.

Bare metal (plelab/edge/c/mcu/, README.md there): `build_image(board, model)` cross-compiles the runtime for one
of QEMU's boards (`BOARDS`), links the .ple file into the board's flash, and `run_image` runs it under QEMU with
`-icount shift=0` (one instruction = one nanosecond of virtual time, which the board's timer counts). The
commands: `plelab mcu build|run|fuzz|calibrate|kernels` and `plelab run --engine mcu --board B`.

ESP-IDF v5 builds components with `-Wall -Werror=all` and its toolchains (Xtensa, RISC-V) define `uint32_t`
as `unsigned long`, as arm-none-eabi-gcc does; on x86-64 it is `unsigned int`, so a `%u` given a `uint32_t`
only fails on the MCU compilers. `esp_idf_compile` compiles the ESP-IDF component's sources the way ESP-IDF
would, with arm-none-eabi-gcc standing in for the Xtensa compiler (same integer model, same GCC warnings).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plelab.edge import c_engine
from plelab.errors import PlelabError
from plelab.util.cbuild import CBuildError, cache_dir

C_DIR = Path(__file__).with_name("c")
MCU_DIR = C_DIR / "mcu"
ESP_IDF_DIR = C_DIR / "esp-idf"
ARM_GCC = "arm-none-eabi-gcc"
# ESP-IDF v5's defaults for component sources (-Werror=all) plus the component's own options (CMakeLists.txt)
ESP_IDF_FLAGS = ("-std=gnu99", "-DESP_PLATFORM", "-Wall", "-Werror=all", "-Wextra", "-ffp-contract=fast")
DEFAULT_DEVICE = "esp32-s3"  # the device profile the harness places the model by (plemcu --device)
MAX_STEPS = 1024  # positions one run may decode (plemcu.c)
CMDLINE_BYTES = 8192  # the harness's command line buffer (plemcu.c), terminating zero included
VERIFY = {"none": 0, "core": 1, "full": 2}  # plemcu --verify: checksums checked on open


class McuError(PlelabError):
    """The MCU toolchain is missing, a bare-metal build failed, or a bare-metal run did not finish."""


# The compiler's helpers for double precision and 64-bit division, and libm's double functions: every call is
# counted on the board (the link wraps each name: `helper_wrappers`), and none may come from the token path.
SOFT_DOUBLE = ("__adddf3", "__subdf3", "__muldf3", "__divdf3", "__negdf2", "__extendsfdf2", "__truncdfsf2",
               "__fixdfsi", "__fixunsdfsi", "__fixdfdi", "__fixunsdfdi", "__floatsidf", "__floatunsidf",
               "__floatdidf", "__floatundidf", "__eqdf2", "__nedf2", "__ltdf2", "__ledf2", "__gtdf2", "__gedf2",
               "__unorddf2")
DIV64 = ("__udivdi3", "__divdi3", "__umoddi3", "__moddi3", "__udivmoddi4", "__divmoddi4")
DOUBLE_MATH = ("pow", "sqrt", "exp", "exp2", "log", "log2", "log10", "sin", "cos", "tan", "tanh", "atan", "atan2",
               "fmod")
ARM_SOFT_DOUBLE = ("__aeabi_dadd", "__aeabi_dsub", "__aeabi_drsub", "__aeabi_dmul", "__aeabi_ddiv", "__aeabi_f2d",
                   "__aeabi_d2f", "__aeabi_i2d", "__aeabi_ui2d", "__aeabi_l2d", "__aeabi_ul2d", "__aeabi_d2iz",
                   "__aeabi_d2uiz", "__aeabi_d2lz", "__aeabi_d2ulz", "__aeabi_dcmpeq", "__aeabi_dcmplt",
                   "__aeabi_dcmple", "__aeabi_dcmpge", "__aeabi_dcmpgt", "__aeabi_dcmpun", "__aeabi_cdcmpeq",
                   "__aeabi_cdcmple", "__aeabi_cdrcmple")
ARM_DIV64 = ("__aeabi_uldivmod", "__aeabi_ldivmod")
HELPER_GROUPS = ("soft_double", "div64", "double_math")  # board.h's counters: board_<group>_calls


@dataclass(frozen=True)
class Toolchain:
    """A cross compiler with its C library and the board startup it links, and the QEMU that runs its images
    (each tool named by its Debian package)."""

    cc: str
    cc_package: str
    libc_package: str
    qemu: str
    qemu_package: str
    libc_file: str  # a file the C library package installs where the compiler finds it (-print-file-name)
    startup: str  # the architecture's reset, traps, semihosting trap and counter (plelab/edge/c/mcu/)
    cflags: tuple[str, ...]  # compile flags of every source besides the board's
    ldflags: tuple[str, ...]  # link flags before the objects (C library specs)
    libs: tuple[str, ...]  # link libraries after the objects
    helpers: tuple[tuple[str, tuple[str, ...]], ...]  # (counter group, helper names) wrapped at link

    @property
    def packages(self) -> tuple[str, ...]:
        """The Debian packages, in install order."""
        return self.cc_package, self.libc_package, self.qemu_package


# -mfp16-format=ieee: fp16 scales convert in one instruction (VCVTB) where the FPU has it (ple_int_kernels.h)
ARM = Toolchain(ARM_GCC, "gcc-arm-none-eabi", "libnewlib-arm-none-eabi", "qemu-system-arm", "qemu-system-arm",
                "libc.a", "startup_arm.c", ("-mfp16-format=ieee",), ("--specs=nosys.specs",), ("-lm",),
                (("soft_double", SOFT_DOUBLE + ARM_SOFT_DOUBLE), ("div64", DIV64 + ARM_DIV64),
                 ("double_math", DOUBLE_MATH)))
# picolibc's specs give its headers and libraries; the harness supplies stdout / stderr and _exit itself
RISCV = Toolchain("riscv64-unknown-elf-gcc", "gcc-riscv64-unknown-elf", "picolibc-riscv64-unknown-elf",
                  "qemu-system-riscv32", "qemu-system-misc", "picolibc.specs", "startup_riscv.c",
                  ("--specs=picolibc.specs",), ("--specs=picolibc.specs",), ("-lm",),
                  (("soft_double", SOFT_DOUBLE), ("div64", DIV64), ("double_math", DOUBLE_MATH)))


@dataclass(frozen=True)
class Board:
    """A QEMU board the harness targets (memory map: its linker script in plelab/edge/c/mcu/)."""

    name: str
    cpu: str
    toolchain: Toolchain
    machine: tuple[str, ...]  # QEMU's options that pick the board and core
    cpu_flags: tuple[str, ...]
    timer: str  # the counter: "CMSDK" (APB timer 0), "SSE_COUNTER" (SSE-300 System Counter) or "INSTRET" (RISC-V)
    timer_base: int  # the timer's registers (the counter's control frame)
    timer_read: int  # where its count is read (the counter's read frame; the timer itself for CMSDK)
    timer_hz: int  # its clock in virtual time: the board's main clock
    int_kernels: tuple[str, ...]  # the integer kernels this core runs, best last (BUILD_SWITCH)
    flash_bytes: int  # the FLASH region of its linker script: the largest .ple file the image can hold
    linker_script: str  # its memory map (plelab/edge/c/mcu/), which includes plemcu.ld
    stands_for: str  # which shipping chips the core is a stand-in for


BOARDS = {
    # QEMU hw/arm/mps2.c: SYSCLK 25 MHz drives the CMSDK APB timers at 0x40000000
    "mps2-an500": Board("mps2-an500", "Cortex-M7", ARM, ("-M", "mps2-an500"),
                        ("-mcpu=cortex-m7", "-mfpu=fpv5-d16", "-mfloat-abi=hard"),
                        "CMSDK", 0x40000000, 0x40000000, 25_000_000, ("portable", "dsp"), 16 << 20, "mps2-an500.ld",
                        "Cortex-M4 / M7 / M33 parts (Arm DSP extension); no ESP32"),
    # QEMU hw/arm/mps2-tz.c + armsse.c: the SSE-300 System Counter runs on MAINCLK, 32 MHz on the AN547
    "mps3-an547": Board("mps3-an547", "Cortex-M55 + Helium", ARM, ("-M", "mps3-an547"),
                        ("-mcpu=cortex-m55", "-mfloat-abi=hard"),
                        "SSE_COUNTER", 0x58100000, 0x48101000, 32_000_000, ("portable", "helium"), 16 << 20,
                        "mps3-an547.ld", "Cortex-M55 / M85 parts (Helium); no ESP32"),
    # QEMU hw/riscv/virt.c, one hart from reset in machine mode (-bios none); instret counts instructions retired,
    # its "clock" 1 GHz: one per nanosecond of virtual time under -icount shift=0
    "virt-rv32imafc": Board("virt-rv32imafc", "RV32IMAFC", RISCV,
                            ("-M", "virt", "-bios", "none", "-m", "128M", "-cpu", "rv32,d=false"),
                            ("-march=rv32imafc", "-mabi=ilp32f"), "INSTRET", 0, 0, 1_000_000_000,
                            ("portable", "rv32"), 16 << 20, "virt-rv32.ld",
                            "the ESP32-P4's RISC-V cores (single-precision FPU; the P4's own SIMD unused)"),
    # no float instruction can hide: the core has neither F nor D, as the ESP32-C6 / C3 / H2 have not
    "virt-rv32imac": Board("virt-rv32imac", "RV32IMAC", RISCV,
                           ("-M", "virt", "-bios", "none", "-m", "128M", "-cpu", "rv32,f=false,d=false"),
                           ("-march=rv32imac", "-mabi=ilp32"), "INSTRET", 0, 0, 1_000_000_000,
                           ("portable", "rv32"), 16 << 20, "virt-rv32.ld",
                           "the ESP32-C6 / C5 / H2 (RV32IMAC, no FPU); the C3 and C2 lack A, which this code never "
                           "uses"),
}
# ple.h's build switch (-DPLE_KERNEL=...): the integer kernel of the int8 path (ple_int_kernels.h), and for the
# float path plain C loops (portable) or the compiler's vector extensions (vector, ple_float_simd.h). No switch:
# the best the core has.
BUILD_SWITCH = {k: f"-DPLE_KERNEL=PLE_KERNEL_{k.upper()}" for k in ("portable", "vector", "dsp", "helium", "rv32")}
# what `scripts/setup.sh --test` installs for the MCU tests: every board's toolchain
DEBIAN_PACKAGES = tuple(dict.fromkeys(p for b in BOARDS.values() for p in b.toolchain.packages))
# the harness besides the architecture's startup (Toolchain.startup)
SOURCES = (*(C_DIR / s for s in c_engine.LIBRARY), MCU_DIR / "board.c", MCU_DIR / "plemcu.c",
           MCU_DIR / "ple_storage_flash.c", C_DIR / "ple_kcheck.c")
# what an image runs: the harness (plemcu.c, the runtime on the flashed model), or the n-gram hash alone on the
# inputs of its command line (plengram.c, for the hash's test vectors; no model needed)
PROGRAMS = {"plemcu": SOURCES, "plengram": (MCU_DIR / "board.c", C_DIR / "plengram.c", C_DIR / "ple_ngram.c")}
# -Wstack-usage: no function may take more than 4 KiB of stack (an ESP-IDF task's whole stack can be 3.5 KiB)
COMPILE_FLAGS = ("-std=gnu99", "-O2", "-Wall", "-Wextra", "-Werror", "-Wstack-usage=4096", "-ffp-contract=fast",
                 "-ffunction-sections", "-fdata-sections", "-DPLE_BARE_METAL")
PARTITION_ALIGN = 4096  # flash erase block: the partition ends on one, padded with 0xff (erased flash)


def get_board(name: str) -> Board:
    """The board called `name` (McuError naming the known ones)."""
    if name not in BOARDS:
        raise McuError(f"unknown board {name!r}; known: {', '.join(BOARDS)}")
    return BOARDS[name]


def kernels_of(board: str) -> tuple[str, ...]:
    """The build switch values a board's core compiles: portable and vector (float paths) and its integer kernels."""
    return tuple(dict.fromkeys(("portable", "vector", *get_board(board).int_kernels)))


def check_kernel(board: str, kernel: str | None) -> str | None:
    """`kernel` when the board's core runs it (None: the best it has); McuError otherwise."""
    if kernel is not None and kernel not in kernels_of(board):
        b = get_board(board)
        raise McuError(f"the {b.name} ({b.cpu}) builds the kernels {', '.join(kernels_of(board))}, not {kernel!r}")
    return kernel


def check_timeout(seconds: float) -> float:
    """A timeout in seconds, positive and finite (McuError otherwise)."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise McuError(f"the timeout must be a positive number of seconds, got {seconds}")
    return float(seconds)


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 1:
        raise McuError(f"{name} must be a positive integer, got {value}")
    return value


def missing_tools(board: str | None = None) -> list[str]:
    """The Debian packages `board` (every board when None) needs that this machine lacks (empty when all are there)."""
    chains = [get_board(board).toolchain] if board else list(dict.fromkeys(b.toolchain for b in BOARDS.values()))
    missing = []
    for tc in chains:
        if not shutil.which(tc.cc):
            missing.append(tc.cc_package)
        elif not _has_libc(tc):
            missing.append(tc.libc_package)
        if not shutil.which(tc.qemu):
            missing.append(tc.qemu_package)
    return list(dict.fromkeys(missing))


def missing_message(board: str, packages: list[str]) -> str:
    """One line: what the board needs and how to install it."""
    return (f"the {board} board needs the Debian package{'s' if len(packages) > 1 else ''} {', '.join(packages)} "
            f"(apt-get install {' '.join(packages)}, or bash scripts/setup.sh --test)")


def _has_libc(tc: Toolchain) -> bool:
    proc = subprocess.run([tc.cc, f"-print-file-name={tc.libc_file}"], capture_output=True, text=True)
    return proc.returncode == 0 and Path(proc.stdout.strip()).is_file()


def _require(board: Board) -> None:
    missing = missing_tools(board.name)
    if missing:
        raise McuError(missing_message(board.name, missing))


def esp_idf_sources() -> list[Path]:
    """Every source file the ESP-IDF component compiles (its CMakeLists.txt SRCS), as paths."""
    cmake = (ESP_IDF_DIR / "CMakeLists.txt").read_text()
    srcs = re.search(r"SRCS((?:\s+\"[^\"]+\")+)", cmake)
    if not srcs:
        raise McuError(f"{ESP_IDF_DIR / 'CMakeLists.txt'}: no SRCS list")
    return [(ESP_IDF_DIR / s).resolve() for s in re.findall(r"\"([^\"]+)\"", srcs.group(1))]


def esp_idf_compile(src: Path, opt: str = "-O2", board: str | None = None) -> subprocess.CompletedProcess:
    """Compile one component source as ESP-IDF would (host stub for esp_partition.h), with arm-none-eabi-gcc standing
    in for the Xtensa compiler, or with a RISC-V board's compiler and core flags (ESP32-P4 / C6, which select the
    RV32 integer kernel); the finished process."""
    tc, core = (get_board(board).toolchain, get_board(board).cpu_flags) if board else (ARM, ())
    if not shutil.which(tc.cc):
        raise McuError(f"{tc.cc} is not installed (Debian: apt-get install {tc.cc_package})")
    cmd = [tc.cc, *core, *(f for f in tc.cflags if f.startswith("--specs")), *ESP_IDF_FLAGS, opt, "-I",
           str(ESP_IDF_DIR), "-I", str(C_DIR), "-I", str(ESP_IDF_DIR / "host_stub"), "-c", str(src), "-o", "/dev/null"]
    return subprocess.run(cmd, capture_output=True, text=True)


# ---- bare-metal images ------------------------------------------------------------------------------------


def _cache(*parts: str) -> Path:
    try:
        return cache_dir("mcu", *parts)
    except CBuildError as exc:
        raise McuError(str(exc)) from None


def image_flags(board: Board, kernel: str | None) -> list[str]:
    """Every compile flag of the board's image for this build switch (None: the core's best)."""
    check_kernel(board.name, kernel)
    flags = [*board.cpu_flags, *COMPILE_FLAGS, *board.toolchain.cflags,
             f"-DPLE_MCU_TIMER_{board.timer}", f"-DPLE_MCU_TIMER_BASE={board.timer_base:#x}u",
             f"-DPLE_MCU_TIMER_READ={board.timer_read:#x}u", f"-DPLE_MCU_TIMER_HZ={board.timer_hz}u",
             f'-DPLE_MCU_BOARD="{board.name}"', f"-DPLE_MCU_CMDLINE_BYTES={CMDLINE_BYTES}",
             f"-DPLE_MCU_MAX_STEPS={MAX_STEPS}", "-I", str(C_DIR), "-I", str(MCU_DIR)]
    return flags + ([BUILD_SWITCH[kernel]] if kernel else [])


def helper_wrappers(toolchain: Toolchain) -> str:
    """Assembly of the link's wrappers: each helper call bumps its group's counter (board.h), then jumps on to the
    helper itself. Each wrapper sits in its own section, so the link keeps only those of helpers in use."""
    out = []
    for group, names in toolchain.helpers:
        for name in names:
            sym, counter = f"__wrap_{name}", f"board_{group}_calls"
            if toolchain is ARM:
                body = (f"    .thumb_func\n{sym}:\n    push {{r0, r1}}\n    ldr r0, ={counter}\n"
                        f"    ldr r1, [r0]\n    adds r1, r1, #1\n    str r1, [r0]\n    pop {{r0, r1}}\n"
                        f"    b.w __real_{name}\n    .ltorg\n")
            else:
                body = (f"{sym}:\n    la t0, {counter}\n    lw t1, 0(t0)\n    addi t1, t1, 1\n    sw t1, 0(t0)\n"
                        f"    tail __real_{name}\n")
            kind = "%function" if toolchain is ARM else "@function"
            out.append(f'    .section .text.{sym}, "ax", {"%" if toolchain is ARM else "@"}progbits\n'
                       f"    .global {sym}\n    .type {sym}, {kind}\n    .balign 4\n{body}")
    head = "    .syntax unified\n    .thumb\n" if toolchain is ARM else ""
    return head + "".join(out)


def _wrap_flags(toolchain: Toolchain) -> list[str]:
    return [f"-Wl,--wrap={name}" for _, names in toolchain.helpers for name in names]


def _objects(board: Board, kernel: str | None, program: str = "plemcu") -> list[Path]:
    """The program's sources (PROGRAMS), the board's startup and the helper wrappers compiled for the board (cached
    by sources, flags and compiler)."""
    flags = image_flags(board, kernel)
    tc = board.toolchain
    cc = tc.cc
    sources = (*PROGRAMS[program], MCU_DIR / tc.startup)
    h = hashlib.sha256()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    headers = [*(C_DIR / n for n in c_engine.HEADERS), *MCU_DIR.glob("*.h")]
    for path in (*sources, *sorted(headers)):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    wrappers = helper_wrappers(tc)
    h.update("\0".join([version, *flags, wrappers]).encode())
    out = _cache("obj", h.hexdigest()[:16])
    objs = [out / (src.stem + ".o") for src in sources] + [out / "helpers.o"]
    if all(o.is_file() for o in objs):
        return objs
    (out / "helpers.S").write_text(wrappers)
    for src, obj in zip([*sources, out / "helpers.S"], objs, strict=True):
        tmp = obj.with_name(f".{obj.name}.{os.getpid()}")
        proc = subprocess.run([cc, *flags, "-c", str(src), "-o", str(tmp)], capture_output=True, text=True)
        if proc.returncode:
            tmp.unlink(missing_ok=True)
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:300])
            raise McuError(f"building {src.name} for {board.name} failed: {first.strip()}")
        os.replace(tmp, obj)
    return objs


def check_fits_flash(board: Board, model: Path) -> int:
    """The file's size, when the board's flash holds it (McuError otherwise: nothing is read)."""
    if not model.is_file():
        raise McuError(f"{model}: no such file")
    size = model.stat().st_size
    if size > board.flash_bytes:
        raise McuError(f"{model} is {size:,} bytes; the {board.name}'s flash holds {board.flash_bytes:,}")
    return size


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def build_image(board_name: str, model: str | Path | None, kernel: str | None = None, out: str | Path | None = None,
                program: str = "plemcu") -> Path:
    """An ELF image of `program` (PROGRAMS: the harness by default) for `board_name` with `model` (.ple bytes) linked
    into its flash partition (None: an empty partition, for a program that reads no model)."""
    board = get_board(board_name)
    check_kernel(board.name, kernel)
    if program not in PROGRAMS:
        raise McuError(f"unknown program {program!r}; known: {', '.join(PROGRAMS)}")
    if model is not None:
        model = Path(model).resolve()
        check_fits_flash(board, model)  # before anything is read or compiled: a file of gigabytes is refused at once
    _cache()  # a cache that cannot be written: one line, before compiling
    _require(board)
    objs = _objects(board, kernel, program)
    linker = [(MCU_DIR / board.linker_script).read_text(), (MCU_DIR / "plemcu.ld").read_text()]
    digest = _file_digest(model) if model is not None else "no model"
    key = hashlib.sha256("\0".join([*map(str, objs), digest, *linker]).encode()).hexdigest()[:16]
    image = Path(out) if out else _cache("img", key) / f"{program}-{board.name}.elf"
    if out is None and image.is_file():
        return image
    with tempfile.TemporaryDirectory() as tmp:
        asm = Path(tmp) / "partition.S"
        quoted = str(model).replace("\\", "\\\\").replace('"', '\\"')
        incbin = f'    .incbin "{quoted}"' if model is not None else ""
        asm.write_text(f'''    .section .ple_partition, "a"
    .balign 64
    .global ple_partition_start
ple_partition_start:
{incbin}
    .balign {PARTITION_ALIGN}, 0xff
    .global ple_partition_end
ple_partition_end:
''')
        tmp_image = Path(tmp) / image.name
        tc = board.toolchain
        cmd = [tc.cc, *board.cpu_flags, *tc.ldflags, "-nostartfiles", "-Wl,--gc-sections", "-Wl,--no-warn-rwx-segments",
               *_wrap_flags(tc), "-L", str(MCU_DIR), "-T", board.linker_script, *map(str, objs), str(asm), *tc.libs,
               "-o", str(tmp_image)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            raise McuError(f"linking the {board.name} image failed: {' | '.join(lines[-3:])}")
        staged = image.with_name(f".{image.name}.{os.getpid()}")
        shutil.copyfile(tmp_image, staged)
        os.replace(staged, image)
    return image


@dataclass
class McuRun:
    """What one QEMU run of an image printed and how it ended."""

    returncode: int
    stdout: str
    stderr: str
    command: list[str]

    @property
    def result(self) -> dict[str, Any]:
        """The JSON line the image printed (McuError with its message when it failed)."""
        if self.returncode:
            raise McuError(self.message or f"the image exited with status {self.returncode}")
        try:
            return json.loads(self.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError) as exc:
            raise McuError(f"the image printed no JSON result: {self.stdout[-200:]!r}") from exc

    def report(self) -> dict[str, Any]:
        """The JSON line of a check (fuzz, kernels), also when the image exits with status 1 for a failed check;
        McuError for an error (2), a fault (3) or no JSON."""
        if self.returncode not in (0, 1):
            raise McuError(self.message or f"the image exited with status {self.returncode}")
        try:
            return json.loads(self.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError) as exc:
            raise McuError(self.message or f"the image printed no JSON result: {self.stdout[-200:]!r}") from exc

    @property
    def message(self) -> str:
        """The image's one-line error or fault message (empty when it printed none)."""
        lines = [ln for ln in self.stderr.splitlines() if ln.startswith("plemcu: ")]
        if lines:
            return lines[-1].removeprefix("plemcu: ")
        lockup = next((ln for ln in self.stderr.splitlines() if "Lockup" in ln), None)
        return f"fault: CPU lockup ({lockup.strip()})" if lockup else ""


def qemu_command(board_name: str, image: str | Path, args: list[str]) -> list[str]:
    """The QEMU command that runs `image` with `args` on its semihosting command line."""
    board = get_board(board_name)
    if len(" ".join(["plemcu", *args])) >= CMDLINE_BYTES:
        raise McuError(f"the image's command line would be {len(' '.join(['plemcu', *args])):,} characters; "
                       f"the harness reads at most {CMDLINE_BYTES - 1:,} (a shorter prompt)")
    # QEMU's option syntax: commas separate fields, a literal comma is doubled
    semi = ",".join(["enable=on", "target=native", *(f"arg={a.replace(',', ',,')}" for a in ["plemcu", *args])])
    return [board.toolchain.qemu, *board.machine, "-display", "none", "-monitor", "none", "-serial", "none",
            "-nodefaults", "-nic", "none", "-icount", "shift=0", "-semihosting-config", semi, "-kernel", str(image)]


def run_image(board_name: str, image: str | Path, args: list[str], timeout: float = 60) -> McuRun:
    """Run the image under QEMU until it exits (McuError when it does not within `timeout` seconds)."""
    timeout = check_timeout(timeout)
    cmd = qemu_command(board_name, image, args)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise McuError(f"the {board_name} image did not finish within {timeout:g} s ({' '.join(args)})") from exc
    return McuRun(proc.returncode, proc.stdout, proc.stderr, cmd)


def run_args(ids: list[int] | str, steps: int, verify: int = 2, act: str = "fp32", kv: str = "fp32",
             head_skip: bool = False, device: str = DEFAULT_DEVICE) -> list[str]:
    """The image's command line for a greedy run (plemcu.c)."""
    ids = ids if isinstance(ids, str) else ",".join(map(str, ids))
    return ["run", "--ids", ids, "--steps", str(_positive("steps", steps)), "--verify", str(verify), "--act", act,
            "--kv", kv, "--device", device, *(["--head-skip"] if head_skip else [])]


def fuzz_args(cases: int, seed: int = 1) -> list[str]:
    """The image's command line for `cases` mutated copies of the flashed file."""
    return ["fuzz", "--cases", str(_positive("cases", cases)), "--seed", str(seed)]


def kernel_check_args(cases: int, seed: int = 1) -> list[str]:
    """The image's command line for the integer kernel's self-check on `cases` random dot products."""
    return ["kernels", "--cases", str(_positive("cases", cases)), "--seed", str(seed)]


def calibrate_args(loops: int = 1_000_000) -> list[str]:
    """The image's command line for the timer check over a loop of 2 x `loops` instructions."""
    return ["calibrate", "--loops", str(_positive("loops", loops))]


def check_run(model: str | Path, board: str, prompt: list[int], positions: int) -> None:
    """McuError, before anything is built, for a run the board cannot do: a file its flash cannot hold, more
    positions than the harness runs, a prompt too long for its command line."""
    check_fits_flash(get_board(board), Path(model))
    if positions > MAX_STEPS:
        raise McuError(f"{positions} positions (prompt and new tokens) are more than the harness runs ({MAX_STEPS})")
    qemu_command(board, "image", run_args(prompt, max(positions, 1)))


def run_model(board_name: str, model: str | Path, ids: list[int], steps: int, kernel: str | None = None,
              timeout: float = 60, **options: Any) -> dict[str, Any]:
    """Greedy decode of `model` on the board (image built as needed): the image's JSON result."""
    args = run_args(ids, steps, **options)
    image = build_image(board_name, model, kernel)
    return run_image(board_name, image, args, timeout).result


@contextlib.contextmanager
def _model_or_seed(model: str | Path | None) -> Iterator[Path]:
    """`model`, or the fuzzer's small seed export (int4, PLE with context, tied head) in a temporary folder."""
    if model is not None:
        yield Path(model)
        return
    from plelab.edge.c_fuzz import seed_file

    with tempfile.TemporaryDirectory(prefix="plemcu.") as tmp:
        yield seed_file(Path(tmp) / "seed.ple")


def fuzz(board: str, model: str | Path | None = None, cases: int = 200, seed: int = 1, timeout: float = 600) -> dict:
    """`cases` mutated copies of `model` (default: the seed export) through ple_open and two decode steps on the
    board: the harness's counts (`bad_messages` > 0 is a rejection that was not one line; a fault is McuError)."""
    args = fuzz_args(cases, seed)
    with _model_or_seed(model) as path:
        return run_image(board, build_image(board, path), args, timeout).report()


def kernel_check(board: str, kernel: str | None = None, cases: int = 2000, seed: int = 1,
                 timeout: float = 600) -> dict:
    """The built integer kernel against its scalar reference on `cases` random dot products, on the board:
    `mismatches` counts results that differ in any bit."""
    args = kernel_check_args(cases, seed)
    with _model_or_seed(None) as path:
        return run_image(board, build_image(board, path, kernel), args, timeout).report()


def calibrate(board: str, loops: int = 1_000_000, timeout: float = 60) -> dict:
    """Timer ticks over a loop of 2 x `loops` instructions: whether the board's timer counts instructions."""
    args = calibrate_args(loops)
    with _model_or_seed(None) as path:
        r = run_image(board, build_image(board, path), args, timeout).result
    return {**r, "instructions": instructions(r["ticks"], r["timer_hz"])}


def instructions(ticks: int, timer_hz: int) -> float:
    """Instructions executed in `ticks` of the board timer under -icount shift=0 (1 ns per instruction)."""
    return ticks * 1e9 / timer_hz
