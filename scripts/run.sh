#!/usr/bin/env bash
# The main job: sets up (Debian packages), builds and runs tandem's demonstration.
# Now: the schedule engine on a Chimera and a 1F1B pipeline (per-rank grid, statistics and a
# timeline file in out/ that opens in https://ui.perfetto.dev).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
bin="${TANDEM_BUILD_DIR:-build}/bin/tandem"
mkdir -p out
for schedule in 1f1b chimera; do
  echo "== tandem schedule --schedule $schedule --stages 4 --microbatches 8 =="
  "$bin" schedule --schedule "$schedule" --stages 4 --microbatches 8 --forward 1 --backward 2 \
    --trace "out/$schedule.trace.json" --svg "out/$schedule.svg"
  echo
done
echo "timelines: out/1f1b.trace.json out/chimera.trace.json (open in https://ui.perfetto.dev)"
