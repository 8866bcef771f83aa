#!/usr/bin/env bash
# One rank of tandem beside plain PyTorch on the CPU, the same GPT and batch (float32, explicit
# attention, AdamW), alternating ROUNDS times because a shared machine's noise is larger than the
# difference: milliseconds per iteration of each, and tandem / PyTorch. Launched as a user would
# (`mpirun -np 1`, Open MPI's default binding, which tandem widens to the host's cores) and with
# that binding kept (`--bind-to core`: one thread on one core).
#
#   bench/runtime/gpt_cpu_vs_pytorch.sh [BUILD_DIR]
#
# Environment: PYTHON (a Python with PyTorch; default python3), ROUNDS (3), STEPS (20),
# SHAPE ("4 256 4 128": layers hidden heads sequence), BATCH (8).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
python="${PYTHON:-python3}"
rounds="${ROUNDS:-3}"
steps="${STEPS:-20}"
batch="${BATCH:-8}"
read -r layers hidden heads seq <<<"${SHAPE:-4 256 4 128}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMP_NUM_THREADS

if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "gpt_cpu_vs_pytorch: $python has no torch module (set PYTHON to one that has)" >&2
  exit 1
fi

tandem() {  # extra mpirun flags...
  mpirun -np 1 "$@" "$build/bin/tandem" train --layers "$layers" --hidden "$hidden" \
      --heads "$heads" --seq-len "$seq" --global-batch "$batch" --microbatches 1 \
      --schedule gpipe --stages 1 --steps "$steps" --precision fp32 --attention explicit \
      --optimizer adamw 2>&1 | sed -n 's/.* \([0-9.]*\) ms per iteration.*/\1/p'
}

pytorch() {
  "$python" bench/gpu/pytorch_gpt_bench.py --layers "$layers" --hidden "$hidden" \
      --heads "$heads" --seq-len "$seq" --vocab 16 --batch "$batch" --steps "$steps" \
      --modes eager-fp32 --device cpu 2>/dev/null |
    "$python" -c 'import json, sys; print(round(json.loads(sys.stdin.read())["iteration_ms"], 1))'
}

echo "# GPT L=$layers H=$hidden A=$heads S=$seq, batch $batch, fp32 on $(nproc) CPU(s): ms per iteration"
printf "%6s %12s %12s %12s %9s\n" round tandem "tandem-bound" pytorch "ratio"
for round in $(seq 1 "$rounds"); do
  t=$(tandem)
  b=$(tandem --bind-to core)
  p=$(pytorch)
  ratio=$(awk -v t="$t" -v p="$p" 'BEGIN { if (t > 0) printf "%.2fx", p / t; else print "-" }')
  printf "%6s %12s %12s %12s %9s\n" "$round" "${t:-failed}" "${b:-failed}" "${p:-failed}" "$ratio"
done
echo "# ratio: PyTorch's time over tandem's (above 1: tandem faster); tandem-bound keeps"
echo "# mpirun's one-core binding (one thread)"
