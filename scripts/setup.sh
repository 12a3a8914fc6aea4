#!/usr/bin/env bash
# Creates .venv in the repository root and installs protospec with its test tools. Safe to re-run.
#   scripts/setup.sh            # then: .venv/bin/python -m protospec.bench
# Torch: an existing install in .venv is kept (a GPU user's own CUDA build stays). Otherwise a machine
# without an NVIDIA driver asks for torch==2.13.0 first (the machines this was written on keep a CPU
# build of it on disk, so it installs in seconds); a machine with one takes PyPI's default build.
# Override with TORCH_SPEC, e.g. TORCH_SPEC='torch==2.11.0' scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_SPEC:-}" ]; then
    "${pip[@]}" "$TORCH_SPEC"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${pip[@]}" torch
  else
    "${pip[@]}" "torch==2.13.0" || "${pip[@]}" torch
  fi
fi
"${pip[@]}" -e ".[test]"
.venv/bin/python -c "import protospec, torch, numba; print('protospec ready: torch', torch.__version__, '| numba', numba.__version__, '| cuda', torch.cuda.is_available())"
