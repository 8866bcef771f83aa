#!/usr/bin/env bash
# Pollux's eight workloads on a heterogeneous cluster (tests/data/cluster/gavel/v100-p100-k80.json:
# 48 V100, 16 P100, 16 K80 GPUs, speeds from Gavel's measured throughputs), 60 s rounds, 30 s
# restarts: average / p99 JCT in hours per policy and workload, and the mean of each.
#
#   bench/cluster/heterogeneous_bench.sh [BUILD_DIR] [POLICIES]   (default: build "tandem gavel tiresias")
set -euo pipefail
build=${1:-build}
policies=${2:-"tandem gavel tiresias"}
root=$(cd "$(dirname "$0")/../.." && pwd)
data="$root/tests/data/cluster"
tandem="$build/bin/tandem"
[ -x "$tandem" ] || { echo "heterogeneous_bench: no $tandem (build first)" >&2; exit 2; }
printf "%-10s" policy
for w in 1 2 3 4 5 6 7 8; do printf " %15s" "workload $w"; done
printf " %15s %8s\n" mean seconds
for policy in $policies; do
  printf "%-10s" "$policy"
  sum_avg=0; sum_p99=0; start=$(date +%s.%N)
  for w in 1 2 3 4 5 6 7 8; do
    out=$("$tandem" cluster simulate --workload "$data/pollux/workloads/workload-$w.csv" \
          --cluster "$data/gavel/v100-p100-k80.json" --policy "$policy" --format json)
    read -r avg p99 < <(python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["avg_jct_seconds"]/3600, d["p99_jct_seconds"]/3600)' <<<"$out")
    printf " %7.3f / %5.1f" "$avg" "$p99"
    sum_avg=$(python3 -c "print($sum_avg + $avg)"); sum_p99=$(python3 -c "print($sum_p99 + $p99)")
  done
  end=$(date +%s.%N)
  printf " %7.3f / %5.1f %8.1f\n" "$(python3 -c "print($sum_avg / 8)")" \
    "$(python3 -c "print($sum_p99 / 8)")" "$(python3 -c "print($end - $start)")"
done
