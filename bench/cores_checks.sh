#!/usr/bin/env bash
# The figures that need a core per rank, in one sitting (any tree built by scripts/build.sh):
# communication against direct MPI on 2 and 4 ranks (comm_bench's goal column: >= 0.9x MPI's
# bus bandwidth from 1 MiB, <= 1.5x its time at 8 bytes) and the runtime against the
# simulator on 4 ranks (runtime_emulated_bench: measured / simulated iteration, goal <= 1.05x
# for every schedule). On a machine with fewer cores than ranks the ranks share cores and the
# figures measure the sharing, not tandem; the script says so and runs anyway.
#
#   bench/cores_checks.sh [BUILD_DIR] [OUT_DIR]
#
# Environment: MAX_BYTES (default 64MiB) and FACTOR (default 4) for the bandwidth rows; RANKS
# (default "2 4") for comm_bench; LATENCY_RUNS (default 3) runs of the 8-byte row, judged on
# their median; BCAST_ALGORITHMS (default "2 3"; empty: none) the libnbc broadcast algorithms
# also timed from 1 MiB on more than 2 ranks; EMULATED=0 leaves out runtime_emulated_bench.
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
out="${2:-out/cores_checks}"
for bin in bench/comm/comm_bench bench/runtime/runtime_emulated_bench; do
  if [ ! -x "$build/$bin" ]; then
    echo "cores_checks.sh: $build/$bin not found: build the tree first (scripts/build.sh) or" \
         "name its build folder" >&2
    exit 2
  fi
done
mkdir -p "$out"
cores=$(nproc)  # before OMP_NUM_THREADS, which nproc obeys
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1
step() {  # name ranks command...
  local name=$1 ranks=$2
  shift 2
  local bind=(--bind-to core)
  if [ "$ranks" -gt "$cores" ]; then
    echo "note: $name runs $ranks ranks on $cores cores (shared cores: not the goal's setting)"
    bind=(--bind-to none --oversubscribe)
  fi
  local start=$SECONDS
  echo "== $name"
  mpirun -np "$ranks" "${bind[@]}" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - start)) s (log $out/$name.log)"
  return $rc
}

# Each goal row as "operation size ratio pass|FAIL", then the bench's own count.
goal_rows() {
  awk '/^# [a-z_]+$/ {op = $2} NF > 5 && ($(NF - 2) == "pass" || $(NF - 2) == "FAIL") {
         print "  " op, $1 " B", "ratio " $(NF - 4), $(NF - 2)} /^# goal/' "$1"
}

for ranks in ${RANKS:-2 4}; do
  # The latency row alone, LATENCY_RUNS times (default 3: a single run moves a row near the
  # line by 0.05 either way), each row's ratios and their median; then the bandwidth rows from
  # 1 MiB.
  for run in $(seq "${LATENCY_RUNS:-3}"); do
    step "comm_np${ranks}_8B_run${run}" "$ranks" "$build/bench/comm/comm_bench" --min_bytes=8 \
      --max_bytes=8
  done
  cat "$out/comm_np${ranks}_8B_run"*.log | goal_rows /dev/stdin | awk '
    $NF == "pass" || $NF == "FAIL" { ratios[$1] = ratios[$1] " " $5 }
    END {
      for (op in ratios) {
        m = split(substr(ratios[op], 2), r, " ")
        for (i = 1; i <= m; i++) {
          for (j = i + 1; j <= m; j++) {
            if (r[j] + 0 < r[i] + 0) { t = r[i]; r[i] = r[j]; r[j] = t }
          }
        }
        if (m % 2 == 1) { median = r[(m + 1) / 2] } else { median = (r[m / 2] + r[m / 2 + 1]) / 2 }
        verdict = "FAIL"
        if (median * 1.5 >= 1) { verdict = "pass" }
        printf "  %-15s 8 B ratios%s  median %.2f %s\n", op, ratios[op], median, verdict
      }
    }' | sort
  step "comm_np${ranks}_bw" "$ranks" "$build/bench/comm/comm_bench" --min_bytes=1MiB \
    --max_bytes="${MAX_BYTES:-64MiB}" --factor="${FACTOR:-4}"
  goal_rows "$out/comm_np${ranks}_bw.log" | grep -E "FAIL|^# goal"
  if [ "$ranks" -gt 2 ] && [ -n "${BCAST_ALGORITHMS-2 3}" ]; then
    # From 1 MiB tandem's broadcast is libnbc's MPI_Ibcast, whose own choice on up to 4 ranks is
    # linear (the root sends the whole buffer to each rank) where the blocking MPI_Bcast tandem
    # is compared with segments a chain. The same rows with libnbc's other algorithms forced
    # (2 binomial, 3 chain, 4 k-nomial), for the choice of tandem's default there.
    for algorithm in ${BCAST_ALGORITHMS-2 3}; do
      step "comm_np${ranks}_bcast_libnbc${algorithm}" "$ranks" \
        --mca coll_libnbc_ibcast_algorithm "$algorithm" "$build/bench/comm/comm_bench" \
        --ops=broadcast --min_bytes=1MiB --max_bytes="${MAX_BYTES:-64MiB}" --factor="${FACTOR:-4}"
      goal_rows "$out/comm_np${ranks}_bcast_libnbc${algorithm}.log" | grep -v "^# goal"
    done
  fi
done

if [ "${EMULATED:-1}" = 1 ]; then
  step emulated_np4 4 "$build/bench/runtime/runtime_emulated_bench"
  tail -n 15 "$out/emulated_np4.log"
fi
