#!/usr/bin/env bash
# Installs everything spectrakit needs on a fresh machine that has only Python.
# - torch==2.13.0 first (a bare `torch` requirement may pull a multi-GB CUDA build),
# - spectrakit itself (editable) with its test tools and the frameworks of examples/,
# - Debian's Fashion-MNIST (real images for the conv experiment), when apt-get is available.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[test,examples]"  # examples: transformers, accelerate, lightning (~20 s)
if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist; } \
        >/dev/null 2>&1 || echo "note: could not install dataset-fashion-mnist (conv experiment tests will skip)"
fi
