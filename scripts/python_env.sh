#!/usr/bin/env bash
# The Python packages some tests compare against (the reference implementations tandem must
# agree with): numpy (nanoGPT's token files) and safetensors (Hugging Face's tensor files), and
# tokenizers (Hugging Face's, which scripts/prepare_data.py uses), installed from PyPI into a
# virtual environment, FOLDER (default build/python-env). Prints the environment's bin folder;
# put it first on PATH before ctest. Idempotent. Without network the tests that need a package
# skip, naming it; this script then warns and still succeeds.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${1:-${TANDEM_BUILD_DIR:-build}/python-env}"
packages=(numpy safetensors tokenizers)
if [[ ! -x "$env_dir/bin/python3" ]]; then
  python3 -m venv "$env_dir" >&2 || { echo "python_env: cannot create $env_dir (python3-venv)" >&2; exit 1; }
fi
if ! "$env_dir/bin/python3" -c 'import numpy, safetensors, tokenizers' 2>/dev/null; then
  echo "python_env: installing ${packages[*]} into $env_dir" >&2
  "$env_dir/bin/python3" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2 ||
    echo "python_env: warning: pip could not install ${packages[*]}; the tests that compare against them will skip" >&2
fi
echo "$(cd "$env_dir/bin" && pwd)"
