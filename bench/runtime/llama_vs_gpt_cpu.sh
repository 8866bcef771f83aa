#!/usr/bin/env bash
# tandem's Llama 3 (RMSNorm, rotary positions, grouped-query attention, SwiGLU) beside its GPT
# of the same size on CPU ranks: tokens/s of `tandem train` end to end, and their ratio, in one
# run (a shared machine's noise cancels in the ratio). About 125M parameters by default: 12
# layers, hidden 768, 12 heads (Llama: 4 key/value heads, SwiGLU width 2048), vocabulary 32000.
#
#   bench/runtime/llama_vs_gpt_cpu.sh [BUILD_DIR]
#
# Environment: RANKS (default 2: a 2-stage 1F1B pipeline), STEPS (default 4), LAYERS, HIDDEN,
# HEADS, KV_HEADS, SEQ_LEN (default 128), VOCAB. Each figure is tandem train's summary (the mean
# over all but the first iteration).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
bin="$build/bin/tandem"
ranks="${RANKS:-2}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
sizes=(--layers "${LAYERS:-12}" --hidden "${HIDDEN:-768}" --heads "${HEADS:-12}"
       --seq-len "${SEQ_LEN:-128}" --vocab "${VOCAB:-32000}")
common=(--global-batch "$((4 * ranks))" --microbatches 4 --microbatch-size 1 --steps "${STEPS:-4}"
        --schedule 1f1b --stages "$ranks" --optimizer adamw --lr 1e-4 --seed 1)

run() {  # label model flags...
  local label=$1
  shift
  local output line tokens ms
  output=$(mpirun -np "$ranks" --bind-to none "$bin" train "$@" "${sizes[@]}" "${common[@]}" 2>&1 || true)
  line=$(echo "$output" | grep "^trained" || true)
  if [[ -z "$line" ]]; then
    echo "$label: failed:" >&2
    echo "$output" | tail -5 >&2
    echo 0
    return
  fi
  tokens=$(echo "$line" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
  ms=$(echo "$line" | sed -n 's/.* \([0-9.]*\) ms per iteration.*/\1/p')
  printf "%-28s %12s ms/iter %10s tokens/s\n" "$label" "$ms" "$tokens" >&2
  echo "$tokens"
}

echo "sizes: ${sizes[*]}; $ranks rank(s), 1F1B over $ranks stage(s), $(getconf _NPROCESSORS_ONLN) cores" >&2
gpt=$(run "gpt (learned positions)" --model gpt)
llama=$(run "llama (GQA ${KV_HEADS:-4} kv heads)" --model llama --kv-heads "${KV_HEADS:-4}")
python3 -c "import sys; g, l = float(sys.argv[1]), float(sys.argv[2]); print(f'llama / gpt tokens/s: {l / g:.3f}' if g > 0 and l > 0 else 'a run failed')" "$gpt" "$llama"
