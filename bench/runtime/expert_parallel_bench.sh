#!/usr/bin/env bash
# Expert parallelism on CPU: `tandem train` of a Mixtral-shaped model (8 experts, 2 a token;
# EXPERTS, TOPK and UNITS change them, e.g. 32 experts, 4 a token, of 128 units for a
# fine-grained mixture as Qwen2-MoE's and DeepSeek's)
# on one rank, on 2 ranks with every expert split over them (expert tensor parallelism), and
# on 2 ranks each holding 4 experts whole (--expert-parallel 2), with and without sequence
# parallelism; then the planner's choice (--expert-parallel 0: the shards measured both ways,
# AdaPipe takes the faster; the lines after the table say what was measured and chosen); with
# FOUR=1 also 4 ranks (TP 4; EP 2 x ETP 2; EP 4; the planner's choice). The ratio column is
# tokens/s over the first row's, measured side by side in one sitting (compare ratios on a
# noisy machine). Each row is the command as a user runs it, end to end; tokens/s, the time
# per iteration and the peak memory (rank 0's) are the run's own "trained ..." line, the
# first two over the steps after the first. Then 2 data-parallel replicas with every expert
# on both, and with the experts spread over them (--expert-parallel-replicas 2: 4 each, the
# routed tokens moved by all-to-all).
#
#   bench/runtime/expert_parallel_bench.sh [BUILD_DIR]
#
# Ranks share the machine's cores (one LibTorch thread each). Both layouts hold 1/T of the
# experts' parameters per rank and communicate alike (one all-reduce, or a reduce-scatter, per
# block); they differ in the experts each rank runs: all E at 1/T of their units, or E/T whole.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
bin="$build/bin/tandem"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
experts=${EXPERTS:-8} topk=${TOPK:-2} units=${UNITS:-512}
model=(--model llama --experts "$experts" --experts-per-token "$topk" --layers 2 --hidden 256
       --heads 8 --kv-heads 4 --intermediate "$units" --seq-len 128 --vocab 256 --global-batch 8
       --steps "${STEPS:-6}" --seed 1 --optimizer adamw --lr 1e-3 --moe-aux-loss-coef 0.01)
base=""
last_output=""
choices=()

run() {  # ranks label flags...
  local ranks=$1 label=$2
  shift 2
  local output line tokens ms ratio loss peak
  output=$(mpirun -np "$ranks" --bind-to none "$bin" train "${model[@]}" "$@" 2>&1 || true)
  last_output=$output
  line=$(echo "$output" | grep "^trained" || true)
  tokens=$(echo "$line" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
  ms=$(echo "$line" | sed -n 's/.* \([0-9.]*\) ms per iteration.*/\1/p')
  loss=$(echo "$output" | grep -o "loss [0-9.]*" | tail -1 | cut -d' ' -f2)
  peak=$(echo "$line" | sed -n 's/.*peak host memory \([0-9.]* [KMG]iB\).*/\1/p' | tr -d ' ')
  if [[ -z "$base" && -n "$tokens" ]]; then base=$tokens; fi
  ratio=$(awk -v t="${tokens:-0}" -v b="${base:-0}" 'BEGIN { if (b > 0 && t > 0) printf "%.2f", t / b; else print "-" }')
  printf "%-6s %-30s %10s %12s %8s %12s %10s\n" "$ranks" "$label" "${ms:-failed}" \
    "${tokens:-failed}" "$ratio" "${loss:--}" "${peak:--}"
  if [[ -z "$tokens" ]]; then echo "$output" | tail -3; fi
}

echo "llama with $experts experts ($topk a token) of $units units, L=2 H=256 S=128 V=256, global" \
  "batch 8 (1024 tokens per iteration), $(getconf _NPROCESSORS_ONLN) cores"
printf "%-6s %-30s %10s %12s %8s %12s %10s\n" ranks layout ms/iter tokens/s vs-1 "last loss" \
  "peak"
one=(--schedule 1f1b --stages 1 --microbatches 4)
run 1 "1 rank" "${one[@]}"
run 2 "TP 2 (experts split)" "${one[@]}" --tensor-parallel 2
run 2 "TP 2, EP 2 ($((experts / 2)) whole each)" "${one[@]}" --tensor-parallel 2 --expert-parallel 2
run 2 "TP 2 + SP (experts split)" "${one[@]}" --tensor-parallel 2 --sequence-parallel
run 2 "TP 2 + SP, EP 2" "${one[@]}" --tensor-parallel 2 --sequence-parallel --expert-parallel 2
# The planner's choice: a planned run (no --schedule) of the same 4 micro-batches of 2.
chosen() {  # ranks tensor-parallel
  run "$1" "TP $2, EP chosen (planner)" --microbatch-size 2 --tensor-parallel "$2" \
    --expert-parallel 0
  choices+=("$(echo "$last_output" | grep -E "measured: forward|^  experts:" || true)")
}
chosen 2 2
dp=(--schedule 1f1b --stages 1 --data-parallel 2 --microbatches 2)
run 2 "DP 2 (every expert on both)" "${dp[@]}"
run 2 "DP 2, experts over replicas" "${dp[@]}" --expert-parallel-replicas 2
if [[ "${FOUR:-0}" == 1 ]]; then
  run 4 "TP 4 (experts split)" "${one[@]}" --tensor-parallel 4
  run 4 "TP 4, EP 2 x ETP 2" "${one[@]}" --tensor-parallel 4 --expert-parallel 2
  run 4 "TP 4, EP 4 ($((experts / 4)) whole each)" "${one[@]}" --tensor-parallel 4 --expert-parallel 4
  chosen 4 4
fi
for choice in "${choices[@]}"; do
  echo
  echo "$choice"
done
