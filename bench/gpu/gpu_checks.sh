#!/usr/bin/env bash
# What to check on a machine with a GPU, in one sitting (a tree built with CUDA, e.g. by
# scripts/build.sh against a pip PyTorch's LibTorch and NCCL): the CUDA test cases
# (NCCL with 1, 2 and 4 ranks and a rank killed in an all-reduce, host staging, CUDA stages,
# the runtime's equivalence suite on CUDA stages over NCCL with 2 and 4 ranks, device
# optimizer, tensor-parallel shards on CUDA, `tandem train` with tensor parallelism over NCCL,
# the elastic job on CUDA stages over NCCL and over host staging), the command-line cases
# against that LibTorch (resume), NCCL against host staging for ranks sharing the GPU, then the
# GPT-2 small bench beside plain PyTorch and one traced step of each, compared kernel by kernel.
# Every step's output goes to OUT_DIR; a failing step does not stop the others.
#
# Several ranks on one GPU talk over NCCL only with NCCL >= 2.30 loaded (PyTorch's wheel brings
# an older one): NCCL_PREFIX names a build of it, loaded ahead of the other for every step
# (LD_PRELOAD); with NCCL_SOURCE (a tarball of NVIDIA/nccl >= 2.30) and no library there yet,
# the first step builds it (bench/gpu/build_nccl.sh with TANDEM_NCCL_FUNCS=tandem; or build it
# beforehand, in the background or on another machine with the CUDA toolkit, and copy the
# folder). Without one those cases skip, saying why, and ranks sharing the GPU use host staging.
# The NCCL checks alone (SECTIONS="cuda elastic shared_gpu") take a few minutes.
#
#   bench/gpu/gpu_checks.sh [BUILD_DIR] [OUT_DIR]
#
# Environment: NCCL_PREFIX and NCCL_SOURCE (above); SECTIONS (default "fused cuda elastic cli
# shared_gpu gpt_bench moe traces"; fused: the fused kernels against LibTorch's compositions;
# moe: a Mixtral-shaped model on one rank, and on two with its experts split or placed whole);
# TEST_TIMEOUT (seconds a test may take, default 600) and TEST_JOBS (tests run at once, default
# 1); STEPS (default 6), SHAPES (default small) and VOCABS (default 50257) for the benches;
# LD_LIBRARY_PATH as the build needs (it is passed to the ranks).
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

sections=" ${SECTIONS:-fused cuda elastic cli shared_gpu gpt_bench moe traces} "
timeout="${TEST_TIMEOUT:-600}"
jobs="${TEST_JOBS:-1}"
wanted() { case "$sections" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if [ -n "${NCCL_PREFIX:-}" ] && [ -n "${NCCL_SOURCE:-}" ] &&
   [ ! -f "$NCCL_PREFIX/lib/libnccl.so.2" ]; then
  step build_nccl env TANDEM_NCCL_FUNCS="${TANDEM_NCCL_FUNCS:-tandem}" \
    bench/gpu/build_nccl.sh "$NCCL_SOURCE" "$NCCL_PREFIX"
fi
if [ -n "${NCCL_PREFIX:-}" ]; then
  if [ ! -f "$NCCL_PREFIX/lib/libnccl.so.2" ]; then
    echo "gpu_checks: NCCL_PREFIX=$NCCL_PREFIX has no lib/libnccl.so.2" >&2
    exit 2
  fi
  export LD_PRELOAD="$NCCL_PREFIX/lib/libnccl.so.2${LD_PRELOAD:+:$LD_PRELOAD}"
fi
export LD_PRELOAD="${LD_PRELOAD:-}"

step gpus nvidia-smi -L
if wanted fused; then
  step fused_tests bash -c "cd '$build' && ctest --output-on-failure --timeout $timeout -R 'fused'"
fi
if wanted cuda; then
  step cuda_tests bash -c "cd '$build' && ctest --output-on-failure --timeout $timeout -j $jobs \
    -R 'nccl|host_staged|torch_cuda|device_ops|torch_tensor_parallel|equivalence_cuda'"
  step tensor_parallel_cuda "$build/tests/runtime/runtime_tensor_parallel_test" \
    "$build/bin/tandem" --gtest_filter='*Cuda*'
fi
if wanted elastic; then
  step elastic_cuda "$build/tests/elastic/elastic_train_test" "$build/bin/tandem" \
    --gtest_filter='*Cuda*'
fi
if wanted cli; then
  step train_cli bash -c "cd '$build' && ctest --output-on-failure --timeout $timeout -R train_cli"
fi
if wanted shared_gpu; then
  step shared_gpu_comm env STEPS="${STEPS:-6}" bench/gpu/shared_gpu_comm_bench.sh "$build" \
    "$out/shared_gpu_comm"
fi
if wanted gpt_bench; then
  step gpt_bench env STEPS="${STEPS:-6}" SHAPES="${SHAPES:-small}" VOCABS="${VOCABS:-50257}" \
    bench/gpu/gpt_gpu_bench.sh "$build" "$out/gpt"
fi
if wanted moe; then
  # A Mixtral-shaped model on the GPU: one rank, then two ranks sharing it with the experts
  # split (--tensor-parallel 2) and placed whole (--expert-parallel 2); tokens/s on the
  # "trained" lines.
  moe=(--model llama --experts 8 --experts-per-token 2 --layers 4 --hidden 1024 --heads 16
       --kv-heads 8 --intermediate 2816 --seq-len 1024 --vocab 32000 --global-batch 8
       --steps "${STEPS:-6}" --optimizer adamw --device cuda --schedule 1f1b --stages 1
       --microbatches 2)
  step moe_one mpirun -np 1 --bind-to none -x LD_LIBRARY_PATH -x LD_PRELOAD \
    "$build/bin/tandem" train "${moe[@]}"
  step moe_tp2 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x LD_PRELOAD \
    "$build/bin/tandem" train "${moe[@]}" --tensor-parallel 2
  step moe_ep2 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x LD_PRELOAD \
    "$build/bin/tandem" train "${moe[@]}" --tensor-parallel 2 --expert-parallel 2
fi
if wanted traces; then
  gpt2=(--layers 12 --hidden 768 --heads 12 --seq-len 1024 --vocab 50257)
  step trace_tandem mpirun -np 1 --bind-to none -x LD_LIBRARY_PATH -x LD_PRELOAD \
    "$build/bin/tandem" train "${gpt2[@]}" --device cuda --global-batch 16 --steps 4 \
    --optimizer adamw --schedule gpipe --stages 1 --microbatches 1 \
    --torch-trace "$out/trace_tandem.json"
  step trace_pytorch python3 bench/gpu/pytorch_gpt_bench.py "${gpt2[@]}" --modes eager-bf16 \
    --steps 3 --warmup 2 --trace "$out/trace_pytorch"
  step trace_summary python3 bench/gpu/trace_summary.py "$out/trace_tandem.json" \
    "$out/trace_pytorch.eager-bf16.json"
fi
