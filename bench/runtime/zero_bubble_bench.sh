#!/usr/bin/env bash
# Zero bubble on real stages: tokens/s and measured bubble of 1F1B, ZB-H1 and ZB-V on the same
# GPT, ranks and batch, run alternately (ROUNDS times each, the median kept) so that a noisy
# machine weighs on all alike, and each zero-bubble schedule's ratio to 1F1B. ZB-V runs twice:
# its order planned with the GPT's FLOP estimates (the default) and with equal costs.
# SCHEDULES="1f1b zb-v@1,1.15,0.8" picks others (@: ZB-V's --planning-costs).
#
#   bench/runtime/zero_bubble_bench.sh [BUILD_DIR]
#   RANKS=4 THREADS=4 LAYERS=8 HIDDEN=512 SEQ=256 bench/runtime/zero_bubble_bench.sh
#
# Defaults fit a 2-core machine (2 ranks x 1 thread, GPT L=8 H=256 S=64, batch 32 in 8
# micro-batches); the zero-bubble paper's comparison is the ratio column.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
bin="$build/bin/tandem"
ranks="${RANKS:-2}"
rounds="${ROUNDS:-3}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS="${THREADS:-1}"
model=(--model gpt --layers "${LAYERS:-8}" --hidden "${HIDDEN:-256}" --heads 8
       --seq-len "${SEQ:-64}" --vocab 256 --global-batch 32 --microbatches 8
       --steps "${STEPS:-3}" --seed 1 --optimizer adamw --lr 1e-3 --stages "$ranks")

# One run: "tokens/s bubble". A schedule may carry ZB-V planning costs: zb-v@1,1,1.
run() {  # schedule[@costs]
  local schedule="${1%@*}" costs=()
  [[ "$1" == *@* ]] && costs=(--planning-costs "${1#*@}")
  mpirun -np "$ranks" --bind-to none "$bin" train "${model[@]}" --schedule "$schedule" \
      "${costs[@]}" 2>&1 |
    sed -n 's/^trained.* \([0-9.]*\) tokens\/s, measured bubble \([0-9.]*\).*/\1 \2/p'
}

schedules=(${SCHEDULES:-1f1b zb-h1 zb-v zb-v@1,1,1})
declare -A runs bubbles
for ((r = 0; r < rounds; r++)); do
  for schedule in "${schedules[@]}"; do
    read -r tokens bubble <<<"$(run "$schedule")"
    runs[$schedule]+="$tokens "
    bubbles[$schedule]+="$bubble "
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
echo "GPT L=${LAYERS:-8} H=${HIDDEN:-256} S=${SEQ:-64}, batch 32 in 8 micro-batches, $ranks ranks x ${OMP_NUM_THREADS} thread(s), $(getconf _NPROCESSORS_ONLN) cores, median of $rounds"
echo "(zb-v: order planned with the GPT's FLOP estimates; zb-v@1,1,1: with equal costs)"
printf "%-12s %10s %8s %8s   %s\n" schedule tokens/s vs-1f1b bubble runs
base=$(echo "${runs[1f1b]}" | median)
for schedule in "${schedules[@]}"; do
  m=$(echo "${runs[$schedule]}" | median)
  printf "%-12s %10s %8s %8s   %s\n" "$schedule" "$m" \
    "$(awk -v a="$m" -v b="$base" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }')" \
    "$(echo "${bubbles[$schedule]}" | median)" "${runs[$schedule]}"
done
