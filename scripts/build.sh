#!/usr/bin/env bash
# Configures and builds tandem into ${TANDEM_BUILD_DIR:-build}. Extra arguments go to CMake's
# configure step (e.g. -DTANDEM_SANITIZE=address).
#
# LibTorch: Debian's (libtorch-dev) when installed; otherwise that of a pip-installed PyTorch
# (`torch.utils.cmake_prefix_path`), with the NCCL that PyTorch loads (the nvidia-nccl wheel)
# so that one process never mixes two NCCLs. TANDEM_NO_PIP_TORCH=1 skips that search,
# TANDEM_PIP_TORCH=1 prefers the pip PyTorch even beside Debian's (e.g. to test against
# LibTorch 2.x: TANDEM_PIP_TORCH=1 TANDEM_BUILD_DIR=build-torch2 scripts/build.sh
# -DCMAKE_CXX_STANDARD=20; set TORCH_CUDA_ARCH_LIST=9.0 where no GPU can be queried).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${TANDEM_BUILD_DIR:-build}"
# The CUDA toolkit is often outside PATH; let CMake find it where it usually is.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
extra=()
if { [ ! -f /usr/lib/x86_64-linux-gnu/cmake/Torch/TorchConfig.cmake ] || [ -n "${TANDEM_PIP_TORCH:-}" ]; } &&
   [ -z "${TANDEM_NO_PIP_TORCH:-}" ] && command -v python3 >/dev/null 2>&1; then
  python="${TANDEM_PYTHON:-python3}"
  if torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
    echo "build: LibTorch of the pip-installed PyTorch ($torch_prefix)"
    extra+=("-DCMAKE_PREFIX_PATH=$torch_prefix${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}")
    if nccl_dir=$("$python" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) &&
       [ -f "$nccl_dir/include/nccl.h" ] && [ -e "$nccl_dir/lib/libnccl.so.2" ]; then
      echo "build: NCCL of the nvidia-nccl wheel ($nccl_dir)"
      extra+=("-DTANDEM_NCCL_LIBRARY=$nccl_dir/lib/libnccl.so.2" "-DTANDEM_NCCL_INCLUDE_DIR=$nccl_dir/include")
    fi
  fi
fi
if [ ! -f "$build_dir/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${TANDEM_BUILD_TYPE:-RelWithDebInfo}" \
    ${extra[@]+"${extra[@]}"} "$@" >/dev/null
fi
jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"
cmake --build "$build_dir" -j "$jobs"
