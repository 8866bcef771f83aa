#!/usr/bin/env bash
# Real LibTorch GPT on CPU with the pipeline runtime: tokens/s for 1, 2 and 4 ranks and each
# schedule, with the timeline of the last iteration of every run (Chrome trace with the
# simulator's prediction beside it).
#
#   bench/runtime/gpt_cpu_bench.sh [BUILD_DIR] [OUT_DIR]
#
# BUILD_DIR defaults to build (with LibTorch), OUT_DIR to out/gpt_bench. Each run trains
# --steps iterations; the figure is tandem train's summary (mean over all but the first and the
# last, which --timeline records).
# Ranks share the machine's cores (one LibTorch thread each); on fewer cores than ranks the
# figures measure oversubscription as much as the schedule.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
out="${2:-out/gpt_bench}"
bin="$build/bin/tandem"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
model=(--model gpt --layers 6 --hidden 64 --heads 4 --seq-len 32 --global-batch 32
       --steps "${STEPS:-6}" --seed 1 --optimizer adamw --lr 1e-3)

run() {  # ranks label schedule extra-flags...
  local ranks=$1 label=$2 schedule=$3
  shift 3
  local name="np${ranks}_${label}"
  local output line timeline
  output=$(mpirun -np "$ranks" --bind-to none "$bin" train "${model[@]}" --schedule "$schedule" \
             --timeline "$out/$name.trace.json" "$@" 2>&1 || true)
  line=$(echo "$output" | grep "^trained" || true)
  timeline=$(echo "$output" | grep "^timeline of iteration" || true)
  local tokens ms ratio
  tokens=$(echo "$line" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
  ms=$(echo "$line" | sed -n 's/.* \([0-9.]*\) ms per iteration.*/\1/p')
  # The simulator's prediction of the last iteration (measured stage times and optimizer
  # step) over its measured length.
  ratio=$(echo "$timeline" | sed -n 's/.*, \([0-9.]*\)x).*/\1/p')
  printf "%-6s %-14s %10s %12s %10s   %s\n" "$ranks" "$label" "${ms:-failed}" \
    "${tokens:-failed}" "${ratio:--}" "$out/$name.trace.json"
}

echo "GPT L=6 H=64 A=4 S=32, global batch 32 (tokens per iteration 1024), $(getconf _NPROCESSORS_ONLN) cores"
printf "%-6s %-14s %10s %12s %10s   %s\n" ranks schedule ms/iter tokens/s sim/meas timeline
run 1 1f1b 1f1b --stages 1 --microbatches 4
for ranks in 2 4; do
  for schedule in gpipe 1f1b chimera zb-h1; do
    run "$ranks" "$schedule" "$schedule" --stages "$ranks" --microbatches 8
  done
  run "$ranks" interleaved interleaved --stages "$ranks" --chunks 2 --microbatches 8
  run "$ranks" hanayo hanayo --stages "$ranks" --waves 1 --microbatches 8
done
run 4 1f1b-2x2 1f1b --stages 2 --data-parallel 2 --microbatches 4
