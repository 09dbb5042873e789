"""The C runtime on microcontrollers: ESP-IDF's compile flags, and bare-metal images run under QEMU.

Bare metal (plelab/edge/c/mcu/, README.md there): `build_image(board, model)` compiles the runtime with
arm-none-eabi-gcc for a Cortex-M board of QEMU (`mps2-an500`: Cortex-M7, `mps3-an547`: Cortex-M55 with
Helium), links the .ple file into the board's flash, and `run_image` runs it under `qemu-system-arm -icount
shift=0` (one instruction = one nanosecond of virtual time, which the board's timer counts).

    python -m plelab.edge.mcu run model.ple --board mps2-an500 --ids 1,2,3 --steps 8     # one JSON line
    python -m plelab.edge.mcu run model.ple --board mps3-an547 --act int8 --kv int8 --head-skip --kernel helium

ESP-IDF v5 builds components with `-Wall -Werror=all` and its toolchains (Xtensa, RISC-V) define `uint32_t`
as `unsigned long`, as arm-none-eabi-gcc does; on x86-64 it is `unsigned int`, so a `%u` given a `uint32_t`
only fails on the MCU compilers. `esp_idf_compile` compiles the ESP-IDF component's sources the way ESP-IDF
would, with arm-none-eabi-gcc standing in for the Xtensa compiler (same integer model, same GCC warnings).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plelab.edge import c_engine
from plelab.errors import PlelabError

C_DIR = Path(__file__).with_name("c")
MCU_DIR = C_DIR / "mcu"
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


# ---- bare-metal images ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Board:
    """A QEMU Cortex-M board the harness targets (memory map: its linker script in plelab/edge/c/mcu/)."""

    name: str
    cpu: str
    cpu_flags: tuple[str, ...]
    timer: str  # startup.c's timer driver: "CMSDK" (APB timer 0) or "SSE_COUNTER" (SSE-300 System Counter)
    timer_base: int  # the timer's registers (the counter's control frame)
    timer_read: int  # where its count is read (the counter's read frame; the timer itself for CMSDK)
    timer_hz: int  # its clock in virtual time: the board's main clock
    kernels: tuple[str, ...]  # integer kernels this core runs (KERNELS)


BOARDS = {
    # QEMU hw/arm/mps2.c: SYSCLK 25 MHz drives the CMSDK APB timers at 0x40000000
    "mps2-an500": Board("mps2-an500", "Cortex-M7", ("-mcpu=cortex-m7", "-mfpu=fpv5-d16", "-mfloat-abi=hard"),
                        "CMSDK", 0x40000000, 0x40000000, 25_000_000, ("portable", "dsp")),
    # QEMU hw/arm/mps2-tz.c + armsse.c: the SSE-300 System Counter runs on MAINCLK, 32 MHz on the AN547
    "mps3-an547": Board("mps3-an547", "Cortex-M55 + Helium", ("-mcpu=cortex-m55", "-mfloat-abi=hard"),
                        "SSE_COUNTER", 0x58100000, 0x48101000, 32_000_000, ("portable", "helium")),
}
# ple.h's compile-time kernel switch (-DPLE_KERNEL=...): the integer kernels of the int8 path (ple_int_kernels.h), and
# for the float path plain C loops (portable) or the compiler's vector extensions (the others). No switch: the
# best the core has.
KERNELS = {k: f"-DPLE_KERNEL=PLE_KERNEL_{k.upper()}" for k in ("portable", "vector", "dsp", "helium")}
SOURCES = (*(C_DIR / s for s in c_engine.LIBRARY), MCU_DIR / "startup.c", MCU_DIR / "plemcu.c",
           MCU_DIR / "ple_storage_flash.c", C_DIR / "ple_kcheck.c")
# -Wstack-usage: no function may take more than 4 KiB of stack (an ESP-IDF task's whole stack can be 3.5 KiB)
# -mfp16-format=ieee: fp16 scales convert in one instruction (VCVTB) where the FPU has it (ple_int_kernels.h: ple_f16)
COMPILE_FLAGS = ("-std=gnu99", "-O2", "-Wall", "-Wextra", "-Werror", "-Wstack-usage=4096", "-ffp-contract=fast",
                 "-ffunction-sections", "-fdata-sections", "-mfp16-format=ieee", "-DPLE_BARE_METAL")
PARTITION_ALIGN = 4096  # flash erase block: the partition ends on one, padded with 0xff (erased flash)


def _board(name: str) -> Board:
    if name not in BOARDS:
        raise McuError(f"unknown board {name!r}; known: {', '.join(BOARDS)}")
    return BOARDS[name]


def _require() -> None:
    missing = missing_tools()
    if missing:
        raise McuError(f"the MCU harness needs {', '.join(missing)} (bash scripts/setup.sh --test installs them)")


def _cache_dir(*parts: str) -> Path:
    root = os.environ.get("PLELAB_CACHE")
    base = Path(root) / "mcu" if root else Path.home() / ".cache" / "plelab" / "mcu"
    return base.joinpath(*parts)


def image_flags(board: Board, kernel: str | None) -> list[str]:
    """Every compile flag of the board's image for this kernel choice."""
    if kernel is not None and kernel not in KERNELS:
        raise McuError(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")
    flags = [*board.cpu_flags, *COMPILE_FLAGS, f"-DPLE_MCU_TIMER_{board.timer}",
             f"-DPLE_MCU_TIMER_BASE={board.timer_base:#x}u", f"-DPLE_MCU_TIMER_READ={board.timer_read:#x}u",
             f"-DPLE_MCU_TIMER_HZ={board.timer_hz}u", f'-DPLE_MCU_BOARD="{board.name}"', "-I", str(C_DIR),
             "-I", str(MCU_DIR)]
    return flags + ([KERNELS[kernel]] if kernel else [])


def _objects(board: Board, kernel: str | None) -> list[Path]:
    """The runtime and harness compiled for the board (cached by sources, flags and compiler version)."""
    flags = image_flags(board, kernel)
    h = hashlib.sha256()
    version = subprocess.run([ARM_GCC, "--version"], capture_output=True, text=True).stdout
    headers = [*(C_DIR / n for n in c_engine.HEADERS), *MCU_DIR.glob("*.h")]
    for path in (*SOURCES, *sorted(headers)):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update("\0".join([version, *flags]).encode())
    out = _cache_dir("obj", h.hexdigest()[:16])
    objs = [out / (src.stem + ".o") for src in SOURCES]
    if all(o.is_file() for o in objs):
        return objs
    out.mkdir(parents=True, exist_ok=True)
    for src, obj in zip(SOURCES, objs, strict=True):
        tmp = obj.with_name(f".{obj.name}.{os.getpid()}")
        proc = subprocess.run([ARM_GCC, *flags, "-c", str(src), "-o", str(tmp)], capture_output=True, text=True)
        if proc.returncode:
            tmp.unlink(missing_ok=True)
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:300])
            raise McuError(f"building {src.name} for {board.name} failed: {first.strip()}")
        os.replace(tmp, obj)
    return objs


def build_image(board_name: str, model: str | Path, kernel: str | None = None, out: str | Path | None = None) -> Path:
    """An ELF image of the harness for `board_name` with `model` (.ple bytes) linked into its flash partition."""
    _require()
    board = _board(board_name)
    model = Path(model).resolve()
    if not model.is_file():
        raise McuError(f"{model}: no such file")
    objs = _objects(board, kernel)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()[:16]
    key = hashlib.sha256("\0".join([*map(str, objs), digest, (MCU_DIR / f"{board.name}.ld").read_text(),
                                     (MCU_DIR / "plemcu.ld").read_text()]).encode()).hexdigest()[:16]
    image = Path(out) if out else _cache_dir("img", key, f"plemcu-{board.name}.elf")
    if out is None and image.is_file():
        return image
    image.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        asm = Path(tmp) / "partition.S"
        quoted = str(model).replace("\\", "\\\\").replace('"', '\\"')
        asm.write_text(f'''    .section .ple_partition, "a"
    .balign 64
    .global ple_partition_start
ple_partition_start:
    .incbin "{quoted}"
    .balign {PARTITION_ALIGN}, 0xff
    .global ple_partition_end
ple_partition_end:
''')
        tmp_image = Path(tmp) / image.name
        cmd = [ARM_GCC, *board.cpu_flags, "-nostartfiles", "--specs=nosys.specs", "-Wl,--gc-sections",
               "-Wl,--no-warn-rwx-segments", "-L", str(MCU_DIR), "-T", f"{board.name}.ld", *map(str, objs), str(asm),
               "-lm", "-o", str(tmp_image)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            raise McuError(f"linking the {board.name} image failed: {' | '.join(lines[-3:])}")
        shutil.copyfile(tmp_image, image.with_name(f".{image.name}.{os.getpid()}"))
        os.replace(image.with_name(f".{image.name}.{os.getpid()}"), image)
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

    @property
    def message(self) -> str:
        """The image's one-line error or fault message (empty when it printed none)."""
        lines = [ln for ln in self.stderr.splitlines() if ln.startswith("plemcu: ")]
        if lines:
            return lines[-1].removeprefix("plemcu: ")
        lockup = next((ln for ln in self.stderr.splitlines() if "Lockup" in ln), None)
        return f"fault: CPU lockup ({lockup.strip()})" if lockup else ""


def qemu_command(board_name: str, image: str | Path, args: list[str]) -> list[str]:
    """The qemu-system-arm command that runs `image` with `args` on its semihosting command line."""
    board = _board(board_name)
    # QEMU's option syntax: commas separate fields, a literal comma is doubled
    semi = ",".join(["enable=on", "target=native", *(f"arg={a.replace(',', ',,')}" for a in ["plemcu", *args])])
    return [QEMU_ARM, "-M", board.name, "-display", "none", "-monitor", "none", "-serial", "none", "-nodefaults",
            "-nic", "none", "-icount", "shift=0", "-semihosting-config", semi, "-kernel", str(image)]


def run_image(board_name: str, image: str | Path, args: list[str], timeout: float = 60) -> McuRun:
    """Run the image under QEMU until it exits (McuError when it does not within `timeout` seconds)."""
    cmd = qemu_command(board_name, image, args)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise McuError(f"the {board_name} image did not finish within {timeout:.0f} s ({' '.join(args)})") from exc
    return McuRun(proc.returncode, proc.stdout, proc.stderr, cmd)


def run_args(ids: list[int] | str, steps: int, verify: int = 2, act: str = "fp32", kv: str = "fp32",
             head_skip: bool = False) -> list[str]:
    """The image's command line for a greedy run (plemcu.c)."""
    ids = ids if isinstance(ids, str) else ",".join(map(str, ids))
    return ["run", "--ids", ids, "--steps", str(steps), "--verify", str(verify), "--act", act, "--kv", kv,
            *(["--head-skip"] if head_skip else [])]


def run_model(board_name: str, model: str | Path, ids: list[int], steps: int, kernel: str | None = None,
              timeout: float = 60, **options: Any) -> dict[str, Any]:
    """Greedy decode of `model` on the board (image built as needed): the image's JSON result."""
    image = build_image(board_name, model, kernel)
    return run_image(board_name, image, run_args(ids, steps, **options), timeout).result


def instructions(ticks: int, timer_hz: int) -> float:
    """Instructions executed in `ticks` of the board timer under -icount shift=0 (1 ns per instruction)."""
    return ticks * 1e9 / timer_hz


def main(argv: list[str] | None = None) -> int:
    """`python -m plelab.edge.mcu build|run|fuzz MODEL --board B`: print the image path or its JSON result."""
    p = argparse.ArgumentParser(prog="python -m plelab.edge.mcu", description="Bare-metal images of the C runtime "
                                "under QEMU. Example: python -m plelab.edge.mcu run m.ple --board mps3-an547 "
                                "--ids 1,2,3 --steps 8")
    p.add_argument("action", choices=["build", "run", "fuzz", "calibrate", "kernels"])
    p.add_argument("model", help=".ple file to link into the board's flash")
    p.add_argument("--board", default="mps2-an500", choices=list(BOARDS))
    p.add_argument("--kernel", choices=list(KERNELS), help="integer kernels (default: the best the core has)")
    p.add_argument("--act", default="fp32", choices=["fp32", "int8"], help="activations of the products (run)")
    p.add_argument("--kv", default="fp32", choices=["fp32", "int8"], help="KV cache (run)")
    p.add_argument("--head-skip", action="store_true", help="greedy head that skips rows (run; needs --act int8)")
    p.add_argument("--ids", default="1", help="prompt token ids, comma separated (run)")
    p.add_argument("--steps", type=int, default=8, help="positions to run, prompt included (run)")
    p.add_argument("--verify", type=int, default=2, choices=[0, 1, 2], help="checksums: 0 none, 1 core, 2 all")
    p.add_argument("--cases", type=int, default=200, help="mutated files (fuzz) or dot products (kernels)")
    p.add_argument("--seed", type=int, default=1, help="mutation or case seed (fuzz, kernels)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before the QEMU run counts as hung")
    args = p.parse_args(argv)
    try:
        image = build_image(args.board, args.model, args.kernel)
        if args.action == "build":
            print(image)
            return 0
        extra = {"run": run_args(args.ids, args.steps, args.verify, args.act, args.kv, args.head_skip),
                 "fuzz": ["fuzz", "--cases", str(args.cases), "--seed", str(args.seed)],
                 "calibrate": ["calibrate", "--loops", "1000000"],
                 "kernels": ["kernels", "--cases", str(args.cases), "--seed", str(args.seed)]}[args.action]
        run = run_image(args.board, image, extra, args.timeout)
        print(json.dumps(run.result))
    except PlelabError as exc:
        print(f"plelab: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
