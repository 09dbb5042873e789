#!/usr/bin/env bash
# Install plelab on a fresh machine (Python >= 3.10 and pip). `--test` adds the test extras, among them
# llama-cpp-python, which pip builds from source the first time (a C++ compiler is needed; pip caches the wheel),
# unpacks llama.cpp's converter from the same release into ~/.cache/plelab (tests/hf/test_llama_cpp.py), and
# installs the Debian packages the microcontroller tests need when they are missing: arm-none-eabi-gcc, newlib and
# qemu-system-arm for the Cortex-M boards, riscv64-unknown-elf-gcc, picolibc and qemu-system-misc (its
# qemu-system-riscv32) for the RISC-V ones (tests/edge/test_mcu.py).
# torch 2.13.0 goes in first when torch is absent: a looser requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install --quiet torch==2.13.0
fi
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
"$PY" -m pip install --quiet -e ".${extras}"

if [ "${1:-}" = "--test" ]; then
  # the MCU tests: the C runtime cross-compiled for Cortex-M and RISC-V and run bare-metal under QEMU
  mcu_packages="gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf qemu-system-misc"
  missing=""
  for pkg in $mcu_packages; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
  done
  if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then as_root=""; elif sudo -n true 2>/dev/null; then as_root="sudo -n"; else as_root="no"; fi
    if ! command -v apt-get >/dev/null 2>&1 || [ "$as_root" = "no" ]; then
      echo "setup.sh: cannot install${missing} (needs apt-get as root or sudo): the MCU tests in tests/edge/test_mcu.py will skip"
    else
      $as_root apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
  fi

  # llama.cpp's own converter, from the llama-cpp-python release the tests run against
  ver=$("$PY" -c "from plelab.hf.llama_cpp import LLAMA_CPP_PYTHON_VERSION as v; print(v)")
  dest=$("$PY" -c "from plelab.hf.llama_cpp import cache_root; print(cache_root())")/llama-cpp-python-$ver
  if [ ! -f "$dest/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
    tmp=$(mktemp -d)
    # the sdist pip just built from (pip's HTTP cache serves it again): its vendor/llama.cpp holds the converter
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$tmp"
    top="llama_cpp_python-$ver/vendor/llama.cpp"
    mkdir -p "$tmp/x"
    tar -xzf "$tmp/llama_cpp_python-$ver.tar.gz" -C "$tmp/x" \
      "$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py" "$top/LICENSE"
    mkdir -p "$(dirname "$dest")"
    rm -rf "$dest"
    mv "$tmp/x/llama_cpp_python-$ver" "$dest"
    rm -rf "$tmp"
  fi
fi
