"""Build the C runtime (plelab/edge/c) with the system compiler, cached by a hash of sources and flags, and run it.

`build()` compiles `plerun` (or `plefuzz`, `plektest`) once per (sources, flags, compiler) into
~/.cache/plelab/c/<hash>/ (or $PLELAB_CACHE/c/<hash>/), atomically (compile to a temporary name, then rename),
so concurrent first uses and edited sources are both safe. `run()` calls it with `--json` and returns the parsed
result; a one-line error from the binary becomes a `PlelabError`. `devices_inc()` generates c/devices.inc from
devices.toml; `kernel_check()` runs the integer kernel's self-check (`plelab c build|kernels|devices`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError
from plelab.util.cbuild import CBuildError, c_compiler, cache_dir

C_DIR = Path(__file__).with_name("c")
LIBRARY = ("ple_format.c", "ple_storage.c", "ple_device.c", "ple_model.c", "ple_int_kernels.c", "ple_ngram.c")
HEADERS = ("ple.h", "ple_float_simd.h", "ple_int_kernels.h", "ple_kcheck.h", "ple_tanh.h", "devices.inc",
           "ple_mutate.h")
# program -> its sources besides LIBRARY (plektest: the integer kernels' self-check, ple_kcheck.h; plengram: the
# n-gram hash on given inputs; pletanh: the integer tanh, ple_tanh.h, against the double-precision one)
PROGRAMS = {"plerun": ("plerun.c",), "plefuzz": ("plefuzz.c",), "plektest": ("plektest.c", "ple_kcheck.c"),
            "plengram": ("plengram.c",), "pletanh": ("pletanh.c",)}
# fp-contract: let a * b + c become one fused multiply-add (C99 mode turns it off; +40% int4 tok/s here)
BASE_FLAGS = "-std=c99 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -Wall -Wextra -ffp-contract=fast"
SANITIZE = "-O2 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"


class CEngineError(PlelabError):
    """The C runtime cannot be built or refused to run (its one-line message)."""


def compiler() -> str:
    """The C compiler: $CC, else cc / gcc / clang from PATH (plelab.util.cbuild.c_compiler)."""
    try:
        return c_compiler()
    except CBuildError:
        raise CEngineError("no C compiler found (install gcc or clang, or set CC) to use the C engine") from None


def _key(program: str, cc: str, flags: list[str]) -> str:
    h = hashlib.sha256()
    for name in (*LIBRARY, *HEADERS, *PROGRAMS[program]):
        h.update(name.encode() + b"\0" + (C_DIR / name).read_bytes())
    version = subprocess.run([*shlex.split(cc), "--version"], capture_output=True, text=True).stdout
    h.update("\0".join([program, cc, version, *flags]).encode())
    return h.hexdigest()[:16]


def compile_flags(cflags: str = "-O3 -march=native", openmp: bool = False, sanitize: bool = False) -> list[str]:
    """Every flag `build` passes to the compiler for these options (benchmarks give a reference build the same)."""
    return shlex.split(BASE_FLAGS) + shlex.split(SANITIZE if sanitize else cflags) + (["-fopenmp"] if openmp else [])


def build(cflags: str = "-O3 -march=native", openmp: bool = False, sanitize: bool = False,
          program: str = "plerun") -> Path:
    """Compile `program` (a key of PROGRAMS) if its cached binary is missing; returns the binary's path."""
    cc = compiler()
    flags = compile_flags(cflags, openmp, sanitize)
    try:
        out_dir = cache_dir("c", _key(program, cc, flags))
    except CBuildError as exc:
        raise CEngineError(str(exc)) from None
    binary = out_dir / program
    if binary.is_file():
        return binary
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{program}.")
    os.close(fd)
    sources = [str(C_DIR / s) for s in (*LIBRARY, *PROGRAMS[program])]
    cmd = [*shlex.split(cc), *flags, "-I", str(C_DIR), *sources, "-o", tmp, "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
            raise CEngineError(f"building the C runtime failed: {first.strip()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, binary)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return binary


def device_profile(name: str, devices_file: str | None = None) -> str:
    """A device in the C runtime's profile format (`device NAME` then `tier NAME KIND BYTES` lines)."""
    from plelab.edge.placement import get_device

    dev = get_device(name, devices_file)
    return f"device {dev.name}\n" + "".join(f"tier {t.name} {t.kind} {t.capacity}\n" for t in dev.tiers)


def devices_inc(devices_file: str | None = None) -> str:
    """The text of c/devices.inc: the built-in profiles of devices.toml as a C string."""
    from plelab.edge.placement import load_devices

    devs = load_devices(devices_file)
    text = "".join(device_profile(n, devices_file) for n in devs)
    body = "\n".join(f'    "{line}\\n"' for line in text.splitlines())
    return ("/* Generated from plelab/edge/devices.toml by plelab.edge.c_engine.devices_inc(); do not edit.\n"
            " * Regenerate: plelab c devices > plelab/edge/c/devices.inc */\n"
            f"static const char BUILTIN_DEVICES[] =\n{body};\n"
            f'static const char BUILTIN_DEVICE_NAMES[] = "{", ".join(devs)}";\n')


def run(model: str | Path, ids: list[int], steps: int, temperature: float = 0.0, top_k: int | None = None,
        seed: int = 0, threads: int = 1, verify: str = "full", device: str | None = None, top_p: float = 1.0,
        devices_file: str | None = None, extra: list[str] | None = None, act: str = "fp32", kv_dtype: str = "fp32",
        **build_opts: Any) -> dict[str, Any]:
    """Run `plerun --json` on `model` and return its result (tokens, tok/s, traffic, arena).

    act: "fp32" (the reference) or "int8" (int8 activations into int8 / int4 weights); kv_dtype: the KV cache's
    "fp32" or "int8" (docs/c-runtime.md).
    """
    binary = build(openmp=threads > 1, **build_opts)
    cmd = [str(binary), str(model), "--ids", ",".join(map(str, ids)), "--steps", str(steps), "--json",
           "--temperature", str(temperature), "--seed", str(seed), "--threads", str(threads), "--act", act,
           "--kv", kv_dtype]
    if top_k:
        cmd += ["--top-k", str(top_k)]
    if top_p < 1:
        cmd += ["--top-p", str(top_p)]
    if verify == "core":
        cmd.append("--no-verify-table")
    elif verify == "none":
        cmd.append("--verify-none")
    with tempfile.TemporaryDirectory() as tmp:
        if device and devices_file:  # a custom profile: hand the C runtime the same tiers
            profile = Path(tmp) / "device.txt"
            profile.write_text(device_profile(device, devices_file))
            cmd += ["--device", str(profile)]
        elif device:
            cmd += ["--device", device]
        proc = subprocess.run(cmd + list(extra or []), capture_output=True, text=True)
    if proc.returncode:
        line = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit status {proc.returncode}"
        raise CEngineError(line.removeprefix("plerun: "))
    return json.loads(proc.stdout)


def kernel_check(cases: int = 2000, seed: int = 1, cflags: str = "-O3 -march=native") -> dict[str, Any]:
    """plektest: the integer kernel this build selects against its scalar reference on `cases` random dot products
    (`mismatches` counts results that differ in any bit)."""
    if cases < 1:
        raise CEngineError(f"cases must be a positive integer, got {cases}")
    binary = build(cflags=cflags, program="plektest")
    proc = subprocess.run([str(binary), "--cases", str(cases), "--seed", str(seed)], capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise CEngineError(proc.stderr.strip().removeprefix("plektest: ") or f"plektest exit status {proc.returncode}")
    return json.loads(proc.stdout)
