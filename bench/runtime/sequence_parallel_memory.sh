#!/usr/bin/env bash
# Sequence parallelism's activation memory, as the planner measures it: `tandem train
# --tensor-parallel 0` under a memory limit profiles every degree's shards without and with
# sequence parallelism, and prints each one's forward + backward time and the activations its
# layers keep between forward and backward ("stashed"). This prints those figures side by side
# for the GPT and Llama, T = 2 on 2 ranks (one iteration is trained after the profiles), and
# the stash with sequence parallelism over the stash without it. Megatron-LM's formula (their
# activation-memory paper, per layer s b h (34 + 5 a s / h) / t bytes against
# s b h (10 + 24 / t + 5 a s / (h t))) is printed beside the GPT's for comparison.
#
#   bench/runtime/sequence_parallel_memory.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
bin="$build/bin/tandem"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
shape=(--layers 2 --hidden 256 --heads 4 --seq-len 128 --microbatch-size 2 --global-batch 16
       --steps 1 --seed 1 --tensor-parallel 0 --device-memory-mb 512)

# The "measured" lines of one model's run: "plain_ms plain_stash unit sp_ms sp_stash unit".
measure() {
  local output
  output=$(mpirun -np 2 --bind-to none "$bin" train "$@" "${shape[@]}" 2>&1) || {
    echo "$output" | tail -3 >&2
    return 1
  }
  echo "$output" | awk '
    /tensor parallelism 2 measured:/ { p_ms = $(NF-15); p_stash = $(NF-3) " " $(NF-2) }
    /tensor parallelism 2 with sequence parallelism measured:/ {
      s_ms = $(NF-15); s_stash = $(NF-3) " " $(NF-2)
    }
    END { print p_ms, p_stash, s_ms, s_stash }'
}

echo "L=2 H=256 A=4 S=128, micro-batch 2, T = 2 on 2 ranks, $(getconf _NPROCESSORS_ONLN) cores"
printf "%-8s %12s %12s %12s %12s %8s %10s\n" model "TP ms" "TP stash" "TP+SP ms" "TP+SP stash" \
  ratio Megatron
for model in gpt llama; do
  flags=(--model "$model")
  [[ $model == llama ]] && flags+=(--kv-heads 2 --intermediate 512)
  read -r p_ms p_stash p_unit s_ms s_stash s_unit <<< "$(measure "${flags[@]}")"
  ratio="-"
  if [[ $p_unit == "$s_unit" ]]; then
    ratio=$(awk -v a="$s_stash" -v b="$p_stash" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
  fi
  megatron="-"
  if [[ $model == gpt ]]; then
    # 5 a s / h with a=4, s=128, h=256; t=2.
    megatron=$(awk 'BEGIN { q = 5 * 4 * 128 / 256; printf "%.2f", (34 / 2 + q / 2) / (10 + 24 / 2 + q / 2) }')
  fi
  printf "%-8s %12s %12s %12s %12s %8s %10s\n" "$model" "$p_ms" "$p_stash $p_unit" "$s_ms" \
    "$s_stash $s_unit" "$ratio" "$megatron"
done
