#!/usr/bin/env bash
# Install plelab on a fresh machine (Python >= 3.10 and pip). `--test` adds the test extras and the Debian
# packages the microcontroller tests need (arm-none-eabi-gcc, newlib, qemu-system-arm: tests/edge/test_mcu.py).
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
  # the MCU tests: the C runtime cross-compiled for Cortex-M and run bare-metal under QEMU
  mcu_packages="gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"
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
fi
