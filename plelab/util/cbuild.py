"""Compile a small C shared library on first use, cached by sources, flags, compiler and CPU, and load it.

For speed paths that torch has no fused operation for. The library lands in ~/.cache/plelab/lib/<hash>/
(or $PLELAB_CACHE/lib/<hash>/), written under a temporary name and renamed, so concurrent first uses and
edited sources are both safe. The CPU is part of the key because the flags may say -march=native: a home
folder shared by machines of different CPUs never loads a library built for another one.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from plelab.errors import PlelabError


class CBuildError(PlelabError):
    """A C library could not be built (no compiler, or the compiler failed)."""


def c_compiler() -> str:
    """The C compiler: $CC, else cc / gcc / clang from PATH; CBuildError when there is none."""
    for cc in [os.environ.get("CC")] + ["cc", "gcc", "clang"]:
        if cc and shutil.which(shlex.split(cc)[0]):
            return cc
    raise CBuildError("no C compiler found (install gcc or clang, or set CC)")


def cache_root() -> Path:
    """Where built libraries are kept."""
    root = os.environ.get("PLELAB_CACHE")
    return Path(root) / "lib" if root else Path.home() / ".cache" / "plelab" / "lib"


def cache_dir(*parts: str) -> Path:
    """The build cache folder $PLELAB_CACHE/PARTS (default ~/.cache/plelab/PARTS), created; CBuildError in one line
    naming it and PLELAB_CACHE when it cannot be created or written."""
    root = os.environ.get("PLELAB_CACHE")
    path = (Path(root) if root else Path.home() / ".cache" / "plelab").joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()  # writable, not only present (a read-only mount)
    except OSError as exc:
        where = f"PLELAB_CACHE={root}" if root else "the default ~/.cache/plelab (PLELAB_CACHE unset)"
        raise CBuildError(f"cannot write built binaries to {path}: {exc.strerror or exc} ({where}); set "
                          "PLELAB_CACHE to a writable folder") from None
    return path


def cpu_identity() -> str:
    """The CPU's model name and feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return platform.machine() + " " + platform.processor()
    keys = ("model name", "flags", "Features", "CPU part")
    seen: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in keys and key.strip() not in seen:
            seen[key.strip()] = value.strip()
    return platform.machine() + "\n" + "\n".join(f"{k}: {v}" for k, v in sorted(seen.items()))


def build_library(name: str, sources: list[Path], flags: list[str]) -> Path:
    """Compile `sources` into lib`name`.so once per (sources, flags, compiler, CPU); returns its path."""
    cc = c_compiler()
    version = subprocess.run([*shlex.split(cc), "--version"], capture_output=True, text=True).stdout
    h = hashlib.sha256()
    for src in sources:
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    h.update("\0".join([cc, version, cpu_identity(), *flags]).encode())
    out_dir = cache_root() / h.hexdigest()[:16]
    library = out_dir / f"lib{name}.so"
    if library.is_file():
        return library
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".lib{name}.", suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run([*shlex.split(cc), *flags, "-shared", "-fPIC", *map(str, sources), "-o", tmp, "-lm"],
                              capture_output=True, text=True)
        if proc.returncode:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
            raise CBuildError(f"building {name} failed: {first.strip()}")
        os.replace(tmp, library)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return library


def load_library(name: str, sources: list[Path], flags: list[str]) -> ctypes.CDLL:
    """`build_library`, then load it."""
    return ctypes.CDLL(str(build_library(name, sources, flags)))
