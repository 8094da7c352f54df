#!/usr/bin/env bash
# Installs everything spectrakit needs on a fresh machine that has only Python; safe to run again.
# - torch==2.13.0 first (a bare `torch` requirement may pull a multi-GB CUDA build). Without an NVIDIA GPU it
#   asks for the CPU build: PyTorch's CPU wheel index is added as an extra index, so pip picks
#   torch 2.13.0+cpu from there and still finds everything else, and a machine that cannot reach that index
#   (a local mirror, an offline wheel folder) gets torch from its configured index instead;
# - spectrakit itself (editable) with its test tools and the frameworks of examples/ (transformers, accelerate,
#   lightning);
# - Debian's Fashion-MNIST (real images for the conv experiment), when apt-get is available.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "install.sh: $*"; }
if torch_version=$("$PY" -c "import torch; print(torch.__version__)" 2>/dev/null); then
    say "torch $torch_version is already installed: kept"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    say "NVIDIA GPU found: installing torch==2.13.0 with CUDA (about 3 GB, a few minutes)"
    "$PY" -m pip install --quiet "torch==2.13.0"
else
    say "no NVIDIA GPU: installing the CPU build of torch==2.13.0 (about 200 MB)"
    "$PY" -m pip install --quiet --retries 1 --timeout 30 \
        --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" 2>/dev/null \
        || "$PY" -m pip install --quiet "torch==2.13.0"
fi
# (a second run skips pip when this folder is installed, editable, with every requirement of pyproject.toml)
if "$PY" -I scripts/installed.py >/dev/null 2>&1; then
    say "spectrakit (editable, this folder) and its requirements are installed: kept"
else
    say "installing spectrakit (editable), its test tools and the frameworks of examples/ (20 s to over 20 min, by machine and pip cache)"
    "$PY" -m pip install --quiet -e ".[test,examples]"
fi
if [ -d /usr/share/datasets/fashion-mnist ]; then
    say "Fashion-MNIST found in /usr/share/datasets/fashion-mnist"
elif command -v apt-get >/dev/null 2>&1; then
    say "installing Debian's dataset-fashion-mnist (30 MB, for the convolution experiment)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist; } \
        >/dev/null 2>&1 || say "could not install dataset-fashion-mnist (the convolution experiment's tests will skip)"
fi
say "done: run 'spectrakit --help'"
