#!/usr/bin/env bash
# The Python packages some tests compare against (the reference implementations tandem must
# agree with) and scripts/prepare_data.py uses: numpy (nanoGPT's token files), safetensors
# (Hugging Face's tensor files), tokenizers (BPE) and transformers (Llama and GPT-2), in a
# virtual environment FOLDER (default build/python-env) made from Debian's Python with its
# system packages visible, so that Debian's CPU PyTorch (python3-torch, the same release as
# libtorch-dev; scripts/setup.sh installs it) is transformers' torch. Prints the environment's
# bin folder: put it first on PATH before ctest. Idempotent. Without network the tests that
# need a package skip, naming it; this script then warns and still succeeds.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${1:-${TANDEM_BUILD_DIR:-build}/python-env}"
# numpy < 2: Debian's torch 1.13 was built against numpy 1. transformers 4.46 is the newest
# release that runs on torch 1.13 (and brings tokenizers 0.20).
packages=("numpy<2" safetensors tokenizers "transformers==4.46.3")
modules="numpy, safetensors, tokenizers, transformers"
base_python=/usr/bin/python3
[[ -x "$base_python" ]] || base_python=python3
if [[ -f "$env_dir/pyvenv.cfg" ]] &&
   ! grep -q "include-system-site-packages = true" "$env_dir/pyvenv.cfg"; then
  rm -rf "$env_dir"  # an environment of an earlier layout: made again
fi
if [[ ! -x "$env_dir/bin/python3" ]]; then
  "$base_python" -m venv --system-site-packages "$env_dir" >&2 ||
    { echo "python_env: cannot create $env_dir (python3-venv)" >&2; exit 1; }
fi
if ! "$env_dir/bin/python3" -c "import $modules" 2>/dev/null; then
  echo "python_env: installing ${packages[*]} into $env_dir" >&2
  "$env_dir/bin/python3" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2 ||
    echo "python_env: warning: pip could not install ${packages[*]}; the tests that compare against them will skip" >&2
fi
if ! "$env_dir/bin/python3" -c "import torch" 2>/dev/null; then
  echo "python_env: warning: no torch for Python (Debian: python3-torch); the tests against transformers will skip" >&2
fi
echo "$(cd "$env_dir/bin" && pwd)"
