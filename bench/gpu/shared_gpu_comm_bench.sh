#!/usr/bin/env bash
# Ranks that share one GPU: NCCL's multi-rank mode (NCCL >= 2.30 loaded at run time) against
# MPI through pinned host staging, for the same GPT-2 small training step of `tandem train`
# (the command end to end; its summary's ms per iteration, the first step left out): a 2-rank 1F1B
# pipeline and 2-rank tensor parallelism (vocabulary 50304, which shards), bf16. Prints ms per
# step on each path and host staging's time over NCCL's. These are correctness-setting figures
# (two ranks time-share one GPU), not scaling figures.
#
#   bench/gpu/shared_gpu_comm_bench.sh [BUILD_DIR] [OUT_DIR]
#
# Environment: STEPS (default 6), MPIRUN (mpirun); LD_LIBRARY_PATH / LD_PRELOAD as the build
# needs and to load NCCL >= 2.30 ahead of an older one (both are passed to the ranks).
set -uo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
out="${2:-out/shared_gpu_comm}"
bin="$build/bin/tandem"
mpirun="${MPIRUN:-mpirun}"
steps="${STEPS:-6}"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
model=(--layers 12 --hidden 768 --heads 12 --seq-len 1024 --device cuda --global-batch 16
       --optimizer adamw --steps "$steps")

ms_per_step() {  # log -> the summary's ms per iteration, or "failed"
  local ms
  ms=$(sed -n 's/^trained.*, \([0-9.]*\) ms per iteration.*/\1/p' "$1" | tail -1)
  echo "${ms:-failed}"
}

printf "%-34s %14s %14s %12s\n" run "NCCL ms/step" "MPI ms/step" "MPI / NCCL"
for run in "pipeline 1f1b, 2 stages|--schedule 1f1b --stages 2 --microbatches 8 --vocab 50257" \
           "tensor parallel 2 (V=50304)|--schedule gpipe --stages 1 --microbatches 1 --tensor-parallel 2 --vocab 50304"; do
  IFS='|' read -r label flags <<<"$run"
  tag=$(echo "$label" | tr -c 'A-Za-z0-9\n' '_')
  declare -A ms=()
  for path in nccl mpi; do
    log="$out/${tag}_$path.log"
    # shellcheck disable=SC2086
    TANDEM_COMM_SHARED_GPU=$path timeout 300 "$mpirun" -np 2 --bind-to none \
        -x LD_LIBRARY_PATH -x LD_PRELOAD -x TANDEM_COMM_SHARED_GPU "$bin" train "${model[@]}" \
        $flags >"$log" 2>&1
    ms[$path]=$(ms_per_step "$log")
    grep -E "multi-rank mode|host staging" "$log" | head -2 | sed "s/^/  [$path] /"
  done
  ratio="-"
  if [ "${ms[nccl]}" != failed ] && [ "${ms[mpi]}" != failed ]; then
    ratio=$(awk -v a="${ms[mpi]}" -v b="${ms[nccl]}" 'BEGIN { printf "%.2fx", a / b }')
  fi
  printf "%-34s %14s %14s %12s\n" "$label" "${ms[nccl]}" "${ms[mpi]}" "$ratio"
done
