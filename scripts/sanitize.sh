#!/usr/bin/env bash
# Builds tandem with AddressSanitizer and UndefinedBehaviorSanitizer into
# ${TANDEM_BUILD_DIR:-build-asan} and runs every test that does not need LibTorch or a GPU
# (the planner, the schedule engine, the MPI backend and its multi-rank tests, the runtime with
# emulated stages, the elastic layer with real SIGKILLs, the cluster allocator, the command
# line), the multi-rank ones under mpirun as usual. An invalid access (use after free, overflow)
# or undefined behaviour fails the test that hits it (UBSan halts on its first report).
#
#   scripts/sanitize.sh            # build and run all (about 25 minutes on 2 cores)
#   scripts/sanitize.sh -R comm_   # extra arguments go to ctest
#
# LibTorch stays out: its headers make every translation unit slow to build, and the library
# itself is not instrumented. Leak checking is off (MPI keeps allocations until exit).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${TANDEM_BUILD_DIR:-build-asan}"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_WITH_TORCH=OFF \
  -DTANDEM_WITH_CUDA=OFF -DTANDEM_SANITIZE=address,undefined >/dev/null
echo "sanitize: building $build_dir (address, undefined)"
cmake --build "$build_dir" -j"$(nproc)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
echo "sanitize: running the tests"
ctest --test-dir "$build_dir" -j"$(nproc)" --timeout 1200 --output-on-failure "$@"
