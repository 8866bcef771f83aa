#!/usr/bin/env bash
# The main job: sets up (Debian packages), builds and runs tandem's demonstration:
#   1. GPT training with the pipeline runtime on 4 CPU ranks (`mpirun -np 4 tandem train`):
#      2 pipelines x 2 stages, 1F1B, AdamW, progress line per iteration, a JSON log and the
#      last iteration's timeline (every rank, with the simulator's prediction beside it);
#   2. the schedule engine on a Chimera and a 1F1B pipeline (per-rank grid, statistics).
# Files land in out/; timelines open in https://ui.perfetto.dev.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
bin="${TANDEM_BUILD_DIR:-build}/bin/tandem"
mkdir -p out
# Open MPI refuses root without these; 4 ranks on fewer cores need oversubscription. One
# LibTorch thread per rank: the ranks share the machine's cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1

echo "== mpirun -np 4 tandem train --model gpt (2 pipelines x 2 stages, 1F1B, CPU) =="
mpirun -np 4 --bind-to none "$bin" train --model gpt --layers 4 --hidden 64 --heads 4 \
  --seq-len 32 --global-batch 32 --microbatches 4 --schedule 1f1b --stages 2 \
  --data-parallel 2 --steps 40 --seed 1 --optimizer adamw --lr 3e-3 --warmup-steps 4 \
  --decay-steps 40 --clip-norm 1.0 --grad-sync dear \
  --log-json out/train.jsonl --timeline out/train.trace.json
echo

for schedule in 1f1b chimera; do
  echo "== tandem schedule --schedule $schedule --stages 4 --microbatches 8 =="
  "$bin" schedule --schedule "$schedule" --stages 4 --microbatches 8 --forward 1 --backward 2 \
    --trace "out/$schedule.trace.json" --svg "out/$schedule.svg"
  echo
done
echo "training log: out/train.jsonl; timelines: out/train.trace.json out/1f1b.trace.json" \
  "out/chimera.trace.json (open in https://ui.perfetto.dev)"
