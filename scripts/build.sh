#!/usr/bin/env bash
# Configures and builds tandem into ${TANDEM_BUILD_DIR:-build}. Extra arguments go to CMake's
# configure step (e.g. -DTANDEM_SANITIZE=address).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${TANDEM_BUILD_DIR:-build}"
# The CUDA toolkit is often outside PATH; let CMake find it where it usually is.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [ ! -f "$build_dir/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${TANDEM_BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
fi
jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"
cmake --build "$build_dir" -j "$jobs"
