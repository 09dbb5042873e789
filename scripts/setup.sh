#!/usr/bin/env bash
# Install plelab on a fresh machine (Python >= 3.10 and pip). `--test` adds the test extras.
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
