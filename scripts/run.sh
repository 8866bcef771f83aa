#!/usr/bin/env bash
# The main job: sets up (Debian packages, and the Python tokenizer package from PyPI), builds
# and runs tandem's demonstration on real text:
#   1. a corpus: Jane Austen's six novels from Debian's r-cran-janeaustenr (public domain;
#      the package is MIT), unpacked without installing R;
#   2. tokenized (scripts/prepare_data.py: a byte-level BPE of 4,096 tokens trained on it, one
#      novel held out for validation) into llm.c token shards;
#   3. a small Llama (RMSNorm, rotary positions, SwiGLU, grouped-query attention) trained with
#      the pipeline runtime on 4 CPU ranks (`mpirun -np 4 tandem train`): 2 pipelines x 2
#      stages, 1F1B, AdamW with warm-up and cosine decay, DeAR gradient synchronisation, the
#      validation loss on the held-out novel every 50 iterations, a JSON log, the last
#      iteration's timeline and a checkpoint;
#   4. text generated from that checkpoint (`tandem generate`, key/value cache);
#   5. the schedule engine on a Chimera and a 1F1B pipeline (per-rank grid, statistics).
# Files land in out/; timelines open in https://ui.perfetto.dev.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build="${TANDEM_BUILD_DIR:-build}"
bin="$build/bin/tandem"
python="$(scripts/python_env.sh "$build/python-env")/python3"
mkdir -p out
# Open MPI refuses root without these; 4 ranks on fewer cores need oversubscription. One
# LibTorch thread per rank: the ranks share the machine's cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1

corpus=out/austen
if [[ ! -f out/austen-shards/dataset.json ]]; then
  echo "== the corpus: r-cran-janeaustenr (Debian), tokenized by scripts/prepare_data.py =="
  rm -rf "$corpus.deb-tmp" && mkdir -p "$corpus.deb-tmp"
  (cd "$corpus.deb-tmp" && apt-get download -qq r-cran-janeaustenr 2>/dev/null)
  dpkg-deb -x "$corpus.deb-tmp"/r-cran-janeaustenr_*.deb "$corpus.deb-tmp/root"
  "$python" scripts/janeausten_text.py "$corpus.deb-tmp/root" "$corpus"
  rm -rf "$corpus.deb-tmp"
  "$python" scripts/prepare_data.py "$corpus" --valid-documents 1 --vocab-size 4096 \
    --overwrite -o out/austen-shards
  echo
fi

echo "== mpirun -np 4 tandem train --model llama (2 pipelines x 2 stages, 1F1B, CPU) =="
rm -rf out/llama-checkpoint
mpirun -np 4 --bind-to none "$bin" train --model llama --layers 4 --hidden 128 --heads 4 \
  --kv-heads 2 --intermediate 384 --seq-len 64 --data out/austen-shards \
  --global-batch 32 --microbatches 4 --schedule 1f1b --stages 2 --data-parallel 2 \
  --steps 300 --seed 1 --optimizer adamw --lr 3e-3 --warmup-steps 20 --decay-steps 300 \
  --min-lr 3e-4 --weight-decay 0.1 --clip-norm 1.0 --grad-sync dear \
  --eval-every 50 --eval-batches 8 --checkpoint-dir out/llama-checkpoint \
  --log-json out/train.jsonl --timeline out/train.trace.json
entropy="$("$python" -c 'import json; print(round(json.load(open("out/austen-shards/dataset.json"))["splits"]["valid"]["unigram_entropy_nats"], 3))')"
echo "(the held-out novel's unigram entropy is $entropy nats: a validation loss below it is"
echo " more than token frequencies)"
echo

echo "== tandem generate --checkpoint out/llama-checkpoint (greedy, then sampled) =="
"$bin" generate --checkpoint out/llama-checkpoint --tokenizer out/austen-shards/tokenizer.json \
  --prompt "It is a truth universally acknowledged" --max-new-tokens 40
"$bin" generate --checkpoint out/llama-checkpoint --tokenizer out/austen-shards/tokenizer.json \
  --prompt "Elizabeth" --max-new-tokens 40 --temperature 0.8 --top-k 40 --seed 7
echo

for schedule in 1f1b chimera; do
  echo "== tandem schedule --schedule $schedule --stages 4 --microbatches 8 =="
  "$bin" schedule --schedule "$schedule" --stages 4 --microbatches 8 --forward 1 --backward 2 \
    --trace "out/$schedule.trace.json" --svg "out/$schedule.svg"
  echo
done
echo "training log: out/train.jsonl; timelines: out/train.trace.json out/1f1b.trace.json" \
  "out/chimera.trace.json (open in https://ui.perfetto.dev)"
