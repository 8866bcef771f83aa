#!/usr/bin/env bash
# Installs what tandem's build needs from Debian packages. Idempotent: quiet when everything
# is already installed. The CUDA toolkit (nvcc, NCCL) is used when present (/usr/local/cuda);
# it is not a Debian package and the build works without it.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libabsl-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libtorch-dev
  # LibTorch alone pulls Debian's reference BLAS, about 10x slower at its CPU matrix products;
  # OpenBLAS takes over the libblas.so.3 alternative (the OpenMP build, so that LibTorch's thread
  # count governs it too).
  libopenblas0-openmp
  libglpk-dev
  python3 python3-venv
  # Debian's CPU PyTorch for Python (the release of libtorch-dev): transformers' torch in the
  # tests that compare tandem's Llama and GPT-2 with it (scripts/python_env.sh).
  python3-torch
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
