#!/usr/bin/env bash
# Tensor parallelism on CPU: iteration time and tokens/s of one GPT split over 2 and 4 ranks by
# tensor parallelism, beside the same ranks used for pipeline or data parallelism, and beside
# one rank. The ratio column is tokens/s over the one-rank run of the same process (ratios,
# measured side by side in one sitting, are what to compare on a noisy machine).
#
#   bench/runtime/tensor_parallel_bench.sh [BUILD_DIR]
#
# Ranks share the machine's cores (one LibTorch thread each): on fewer cores than ranks the
# figures measure oversubscription as much as the split. The collectives of a tensor-parallel
# block (two all-reduces forward, two backward, of the activations) sit on the critical path;
# the log-json's compute share shows how much of each iteration they take. "+ SP" rows add
# sequence parallelism (an all-gather and a reduce-scatter in place of each all-reduce, layer
# norms and pipeline transfers on S/T tokens).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
bin="$build/bin/tandem"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
model=(--model gpt --layers 4 --hidden 256 --heads 8 --seq-len 64 --vocab 64 --global-batch 16
       --steps "${STEPS:-6}" --seed 1 --optimizer adamw --lr 1e-3)
base=""

run() {  # ranks label flags...
  local ranks=$1 label=$2
  shift 2
  local output line tokens ms ratio
  output=$(mpirun -np "$ranks" --bind-to none "$bin" train "${model[@]}" "$@" 2>&1 || true)
  line=$(echo "$output" | grep "^trained" || true)
  tokens=$(echo "$line" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
  ms=$(echo "$line" | sed -n 's/.* \([0-9.]*\) ms per iteration.*/\1/p')
  if [[ -z "$base" && -n "$tokens" ]]; then base=$tokens; fi
  ratio=$(awk -v t="${tokens:-0}" -v b="${base:-0}" 'BEGIN { if (b > 0 && t > 0) printf "%.2f", t / b; else print "-" }')
  printf "%-6s %-22s %10s %12s %8s\n" "$ranks" "$label" "${ms:-failed}" "${tokens:-failed}" "$ratio"
  if [[ -z "$tokens" ]]; then echo "$output" | tail -3; fi
}

echo "GPT L=4 H=256 A=8 S=64 V=64, global batch 16 (1024 tokens per iteration), $(getconf _NPROCESSORS_ONLN) cores"
printf "%-6s %-22s %10s %12s %8s\n" ranks layout ms/iter tokens/s vs-1
run 1 "1 rank" --schedule 1f1b --stages 1 --microbatches 4
run 2 "TP 2" --schedule 1f1b --stages 1 --tensor-parallel 2 --microbatches 4
run 2 "TP 2 + SP" --schedule 1f1b --stages 1 --tensor-parallel 2 --microbatches 4 \
    --sequence-parallel
run 2 "PP 2 (1f1b)" --schedule 1f1b --stages 2 --microbatches 4
run 2 "DP 2" --schedule 1f1b --stages 1 --data-parallel 2 --microbatches 2
run 4 "TP 4" --schedule 1f1b --stages 1 --tensor-parallel 4 --microbatches 4
run 4 "TP 2 x PP 2" --schedule 1f1b --stages 2 --tensor-parallel 2 --microbatches 4
run 4 "TP 2 x PP 2 + SP" --schedule 1f1b --stages 2 --tensor-parallel 2 --microbatches 4 \
    --sequence-parallel
run 4 "DP 2 x PP 2" --schedule 1f1b --stages 2 --data-parallel 2 --microbatches 2
