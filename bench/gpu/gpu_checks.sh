#!/usr/bin/env bash
# What to check on a machine with a GPU, in one sitting (a tree built with CUDA, e.g. by
# scripts/build.sh against a pip PyTorch's LibTorch and NCCL): the CUDA test cases
# (NCCL, host staging, CUDA stages, device optimizer, tensor-parallel shards on CUDA, the
# elastic job on CUDA stages), the command-line cases against that LibTorch (resume), then the
# GPT-2 small bench beside plain PyTorch and one traced step of each, compared kernel by
# kernel. Every step's output goes to OUT_DIR; a failing step does not stop the others.
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
step train_cli bash -c "cd '$build' && ctest --output-on-failure --timeout 300 -R train_cli"
step gpt_bench env STEPS="${STEPS:-6}" SHAPES="${SHAPES:-small}" \
  bench/gpu/gpt_gpu_bench.sh "$build" "$out/gpt"
gpt2=(--layers 12 --hidden 768 --heads 12 --seq-len 1024 --vocab 50257)
step trace_tandem mpirun -np 1 --bind-to none -x LD_LIBRARY_PATH "$build/bin/tandem" train \
  "${gpt2[@]}" --device cuda --global-batch 16 --steps 4 --optimizer adamw --schedule gpipe \
  --stages 1 --microbatches 1 --torch-trace "$out/trace_tandem.json"
step trace_pytorch python3 bench/gpu/pytorch_gpt_bench.py "${gpt2[@]}" --modes eager-bf16 \
  --steps 3 --warmup 2 --trace "$out/trace_pytorch"
step trace_summary python3 bench/gpu/trace_summary.py "$out/trace_tandem.json" \
  "$out/trace_pytorch.eager-bf16.json"
