#!/usr/bin/env bash
# What to check on a machine with a GPU, in one sitting (a tree built with CUDA, e.g. by
# scripts/build.sh against a pip PyTorch's LibTorch and NCCL): the CUDA test cases
# (NCCL, host staging, CUDA stages, device optimizer, tensor-parallel shards on CUDA, the
# elastic job on CUDA stages), then the GPT-2 small bench beside plain PyTorch. Every step's
# output goes to OUT_DIR; a failing step does not stop the others.
#
#   bench/gpu/gpu_checks.sh [BUILD_DIR] [OUT_DIR]
#
# Environment: STEPS (default 6) and SHAPES (default small) for the bench; LD_LIBRARY_PATH as
# the build needs (it is passed to the ranks).
set -uo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
out="${2:-out/gpu_checks}"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

step() {  # name command...
  local name=$1
  shift
  local start=$SECONDS
  echo "== $name"
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log"
  echo "== $name: exit $rc in $((SECONDS - start)) s"
}

step gpus nvidia-smi -L
step cuda_tests bash -c "cd '$build' && ctest --output-on-failure --timeout 300 \
  -R 'nccl|host_staged|torch_cuda|device_ops|torch_tensor_parallel'"
step elastic_cuda "$build/tests/elastic/elastic_train_test" "$build/bin/tandem" \
  --gtest_filter='*Cuda*'
step gpt_bench env STEPS="${STEPS:-6}" SHAPES="${SHAPES:-small}" \
  bench/gpu/gpt_gpu_bench.sh "$build" "$out/gpt"
