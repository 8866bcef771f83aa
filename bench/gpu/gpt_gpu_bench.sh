#!/usr/bin/env bash
# GPT-2 small and medium on one GPU: tandem (1 rank; 4 ranks pipelined on the one GPU, which
# communicate over MPI through pinned host memory; 2 ranks of tensor parallelism on the one GPU,
# whose collectives reduce host copies over MPI: the TP=2 line beside the 1-rank line is the
# cost of those collectives) beside plain PyTorch on the same shapes in
# the same run (bench/gpu/pytorch_gpt_bench.py: eager fp32, eager bf16 + SDPA + fused AdamW,
# torch.compile). Prints tokens/s, MFU, peak device memory and tandem / PyTorch ratios, and for
# tandem the simulator's prediction of the last iteration (from its measured stage, optimizer
# and gradient-synchronisation times) over the measured iteration (its timeline is kept in
# OUT_DIR).
#
#   bench/gpu/gpt_gpu_bench.sh [BUILD_DIR] [OUT_DIR]
#
# Each shape runs at each vocabulary of VOCABS (default GPT-2's 50257; 50304 is it padded to a
# multiple of 64, as llm.c, nanoGPT and Megatron-LM train it); the tensor-parallel rows need an
# even one. The tandem rows: 1 rank bf16 (fused kernels, runtime/torch/fused_ops.h), 1 rank
# bf16 with LibTorch's operations instead (--fused-kernels off), 1 rank fp32, 4 ranks 1F1B on
# the one GPU, TP=2 and TP=2 + SP on the one GPU.
#
# Environment: STEPS (default 10), SHAPES ("small medium"), VOCABS ("50257"), MODES
# (PyTorch's, default "eager-fp32,eager-bf16,compile-bf16"; eager-bf16 is the reference), RUNS
# (which tandem rows, by number from 1, default all), PYTHON (python3), MPIRUN (mpirun),
# and LD_LIBRARY_PATH as the build needs (e.g. where a locally unpacked Abseil lives).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
out="${2:-out/gpu_bench}"
bin="$build/bin/tandem"
python="${PYTHON:-python3}"
mpirun="${MPIRUN:-mpirun}"
steps="${STEPS:-10}"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpt_gpu_bench: no CUDA device visible to PyTorch; nothing to measure" >&2
  exit 1
fi

shape_flags() {  # small | medium -> layers hidden heads
  case "$1" in
    small) echo "12 768 12" ;;
    medium) echo "24 1024 16" ;;
    *) echo "unknown shape $1" >&2; exit 2 ;;
  esac
}

# tandem train's summary line -> "tokens_per_second mfu peak"
summary() {
  local line="$1"
  local tokens mfu peak
  tokens=$(echo "$line" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
  mfu=$(echo "$line" | sed -n 's/.*MFU \([0-9.]*\)%.*/\1/p')
  peak=$(echo "$line" | sed -n 's/.*peak device memory \([^ ]* [^ ]*\) .*/\1/p')
  echo "${tokens:-failed}|${mfu:--}|${peak:--}"
}

printf "%-7s %-36s %12s %7s %12s %9s %9s\n" shape run tokens/s MFU% "peak mem" "vs bf16" \
  "sim/meas"
for shape_name in ${SHAPES:-small medium}; do
 for vocab in ${VOCABS:-50257}; do
  read -r layers hidden heads <<<"$(shape_flags "$shape_name")"
  shape="$shape_name"
  [ "$vocab" = 50257 ] || shape="${shape_name}/$vocab"
  tag_shape="${shape_name}_$vocab"
  model=(--layers "$layers" --hidden "$hidden" --heads "$heads" --seq-len 1024 --vocab "$vocab")
  # Plain PyTorch first: its eager bf16 figure is the reference for the ratios.
  "$python" bench/gpu/pytorch_gpt_bench.py --layers "$layers" --hidden "$hidden" \
      --heads "$heads" --seq-len 1024 --vocab "$vocab" --batch 16 --steps "$steps" \
      --modes "${MODES:-eager-fp32,eager-bf16,compile-bf16}" \
      >"$out/pytorch_$tag_shape.jsonl" 2>"$out/pytorch_$tag_shape.log" || true
  reference=$("$python" -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("mode") == "eager-bf16" and "tokens_per_second" in r:
        print(r["tokens_per_second"])' "$out/pytorch_$tag_shape.jsonl")
  reference=${reference:-0}
  "$python" - "$out/pytorch_$tag_shape.jsonl" "$shape" "$reference" <<'PY'
import json, sys
path, shape, reference = sys.argv[1], sys.argv[2], float(sys.argv[3])
for line in open(path):
    r = json.loads(line)
    name = "pytorch " + r["mode"]
    if "tokens_per_second" not in r:
        print(f"{shape:<7} {name:<36} {r.get('error', r.get('skipped', 'failed'))}")
        continue
    mfu = f"{100 * r['mfu']:.1f}" if "mfu" in r else "-"
    mem = f"{r['peak_memory_bytes'] / 2**30:.2f} GiB" if r.get("peak_memory_bytes") else "-"
    ratio = f"{r['tokens_per_second'] / reference:.2f}x" if reference > 0 else "-"
    print(f"{shape:<7} {name:<36} {r['tokens_per_second']:12.0f} {mfu:>7} {mem:>12} {ratio:>9}")
PY
  # The tensor-parallel rows shard the vocabulary: they run where it is even (50304).
  number=0
  for run in "1|1 rank bf16|--schedule gpipe --stages 1 --microbatches 1" \
             "1|1 rank bf16 eager kernels|--schedule gpipe --stages 1 --microbatches 1 --fused-kernels off" \
             "1|1 rank fp32|--schedule gpipe --stages 1 --microbatches 1 --precision fp32" \
             "4|4 ranks 1f1b bf16 (1 GPU)|--schedule 1f1b --stages 4 --microbatches 8" \
             "2|2 ranks TP=2 bf16 (1 GPU)|--schedule gpipe --stages 1 --microbatches 1 --tensor-parallel 2" \
             "2|2 ranks TP=2+SP bf16 (1 GPU)|--schedule gpipe --stages 1 --microbatches 1 --tensor-parallel 2 --sequence-parallel"; do
    number=$((number + 1))
    case " ${RUNS:-1 2 3 4 5 6} " in *" $number "*) ;; *) continue ;; esac
    IFS='|' read -r ranks label flags <<<"$run"
    if [ "$ranks" = 2 ] && [ $((vocab % 2)) = 1 ]; then continue; fi
    tag="${tag_shape}_np${ranks}_$(echo "$label" | tr -c 'A-Za-z0-9=+\n' '_')"
    # shellcheck disable=SC2086
    "$mpirun" -np "$ranks" --bind-to none -x LD_LIBRARY_PATH "$bin" train "${model[@]}" \
        --device cuda --global-batch 16 --steps "$steps" --optimizer adamw $flags \
        --timeline "$out/timeline_$tag.json" >"$out/tandem_$tag.log" 2>&1 || true
    line=$(grep "^trained" "$out/tandem_$tag.log" || true)
    simulated=$(sed -n 's/^timeline of iteration.* \([0-9.]*x\))$/\1/p' "$out/tandem_$tag.log")
    IFS='|' read -r tokens mfu peak <<<"$(summary "$line")"
    ratio="-"
    if [ "$tokens" != failed ] && [ "$reference" != 0 ]; then
      ratio=$("$python" -c "print(f'{$tokens / $reference:.2f}x')")
    fi
    printf "%-7s %-36s %12s %7s %12s %9s %9s\n" "$shape" "tandem $label" "$tokens" "$mfu" \
      "$peak" "$ratio" "${simulated:--}"
  done
 done
done
