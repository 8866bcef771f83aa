#!/usr/bin/env bash
# `tandem schedule` as a user runs it: for every built-in schedule at p=64, m=512 and
# p=1024, m=4096, the whole command (generate, validate, simulate, statistics, JSON output to
# /dev/null) pinned to one core, with its wall time and peak resident memory from
# /usr/bin/time. The goals: p=1024, m=4096 within 2 s and 1 GiB; p=64, m=512 within 0.1 s.
# The processor time (user + system) is printed beside the wall time: on a machine shared with
# other work it is what the wall time would be alone, and the goal is judged on it.
# Unlike pipeline_schedule_bench (which times the engine's parts inside one process), this is
# the figure a user sees, process start and output included.
#
#   bench/pipeline/schedule_command_bench.sh BUILD/bin/tandem [CORE] [kind:p:m[:v or W] ...]
#   REPEAT=3 bench/pipeline/schedule_command_bench.sh BUILD/bin/tandem
#   FILES="trace svg output csv" bench/pipeline/schedule_command_bench.sh BUILD/bin/tandem 0 \
#       zb-v:1024:4096
#
# FILES runs every case once per file the command writes (--trace, --svg, --output, --to-csv
# with transfers) into a temporary folder, and prints the file's size too; the goal column
# then judges memory alone (the file's writing takes time in proportion to its size: a
# 3.4 GB trace at p=1024, m=4096).
#
# Prints one line per case; the exit status is 0 even when a goal is missed (the figures
# depend on the machine), 1 when a command fails. With REPEAT=N each case runs N times and the
# line gives the run with the least processor time, followed by the range of the N processor
# times: on a shared machine the same binary varies by 10-15% from run to run.
set -u
repeat=${REPEAT:-1}
if ! [[ $repeat =~ ^[1-9][0-9]*$ ]]; then
  echo "REPEAT must be a positive integer, got '$repeat'" >&2
  exit 2
fi
tandem=${1:?usage: $0 path/to/tandem [core] [kind:p:m[:extra] ...]}
core=${2:-0}
shift $(( $# >= 2 ? 2 : 1 ))
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
  for size in 64:512 1024:4096; do
    cases+=(gpipe:$size 1f1b:$size interleaved:$size:2 chimera:$size hanayo:$size:1
            hanayo:$size:2 zb-h1:$size zb-v:$size dualpipe:$size dualpipev:$size)
  done
fi
pin=()
if command -v taskset > /dev/null; then pin=(taskset -c "$core"); fi
status=0
read -r -a files <<< "${FILES:-}"
for file in "${files[@]}"; do
  case $file in
    trace | svg | output | csv) ;;
    *) echo "FILES: unknown file '$file' (trace, svg, output, csv)" >&2; exit 2 ;;
  esac
done
variants=("${files[@]}")
[ ${#variants[@]} -eq 0 ] && variants=("")
outputs=$(mktemp -d)
trap 'rm -rf "$outputs"' EXIT
printf "%-12s %6s %6s %5s %9s %9s %9s  %s\n" schedule p m extra "wall (s)" "cpu (s)" "peak MiB" \
  goal
for case in "${cases[@]}"; do
for file in "${variants[@]}"; do
  IFS=: read -r kind p m extra <<< "$case"
  args=(schedule --schedule "$kind" --stages "$p" --microbatches "$m" --format json)
  case $kind in
    interleaved) args+=(--chunks "${extra:-2}") ;;
    hanayo) args+=(--waves "${extra:-1}") ;;
  esac
  written=""
  case $file in
    trace) written=$outputs/trace.json; args+=(--trace "$written") ;;
    svg) written=$outputs/chart.svg; args+=(--svg "$written") ;;
    output) written=$outputs/schedule.json; args+=(--output "$written") ;;
    csv) written=$outputs/schedule.csv; args+=(--to-csv "$written" --csv-transfers) ;;
  esac
  best_cpu="" failed=0 cpus=()
  for (( run = 0; run < repeat; ++run )); do
    measure=$(mktemp)
    if ! /usr/bin/time -f "%e %U %S %M" -o "$measure" "${pin[@]}" "$tandem" "${args[@]}" \
        > /dev/null; then
      echo "$case: tandem failed" >&2
      failed=1
      rm -f "$measure"
      break
    fi
    read -r run_wall user system kib < <(tail -n 1 "$measure")
    rm -f "$measure"
    run_cpu=$(awk -v u="$user" -v s="$system" 'BEGIN { printf "%.2f", u + s }')
    cpus+=("$run_cpu")
    if [ -z "$best_cpu" ] || awk -v a="$run_cpu" -v b="$best_cpu" 'BEGIN { exit !(a < b) }'; then
      best_cpu=$run_cpu wall=$run_wall run_mib=$(( kib / 1024 ))
    fi
  done
  if [ "$failed" -ne 0 ]; then
    status=1
    continue
  fi
  cpu=$best_cpu mib=$run_mib
  if [ "$p" -ge 1024 ]; then
    limit_s=2; limit_mib=1024
  else
    limit_s=0.1; limit_mib=1024
  fi
  [ -n "$file" ] && limit_s=inf
  goal=$(awk -v w="$cpu" -v r="$mib" -v ls="$limit_s" -v lm="$limit_mib" \
    'BEGIN { print ((ls == "inf" || w <= ls + 0) && r <= lm) ? "ok" : "MISSED" }')
  spread=""
  if [ "$repeat" -gt 1 ]; then
    spread=$(printf "%s\n" "${cpus[@]}" | sort -n | sed -n '1p;$p' | paste -sd- -)
    spread="  cpu over $repeat runs: $spread s"
  fi
  if [ -n "$file" ]; then
    size=$(stat -c %s "$written")
    rm -f "$written"
    printf "%-12s %6s %6s %5s %9s %9s %9s  %s (%s MiB) --%s: %s MB%s\n" "$kind" "$p" "$m" \
      "${extra:--}" "$wall" "$cpu" "$mib" "$goal" "$limit_mib" "$file" \
      "$(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1e6 }')" "$spread"
  else
    printf "%-12s %6s %6s %5s %9s %9s %9s  %s (%ss, %s MiB)%s\n" "$kind" "$p" "$m" \
      "${extra:--}" "$wall" "$cpu" "$mib" "$goal" "$limit_s" "$limit_mib" "$spread"
  fi
done
done
exit $status
