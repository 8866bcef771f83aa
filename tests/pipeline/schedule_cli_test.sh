#!/usr/bin/env bash
# CLI checks for `tandem schedule`: figures through --format json, files written by --trace,
# --svg and --output, and bad input (exit code 2, one-line error, nothing written).
# Usage: schedule_cli_test.sh PATH_TO_TANDEM
set -u
tandem="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect_figure FIELD VALUE ARGS...: `--format json` output has "FIELD": VALUE (a regex).
expect_figure() {
  local field="$1" value="$2"
  shift 2
  local out
  if ! out="$("$tandem" schedule "$@" --format json 2>&1)"; then
    fail "tandem schedule $* exited non-zero: $out"
    return
  fi
  if ! grep -Eq "\"$field\": $value(,|$)" <<<"$out"; then
    fail "tandem schedule $*: expected \"$field\": $value in:"$'\n'"$out"
  fi
}

# expect_bad_input MESSAGE ARGS...: exit code 2, MESSAGE on one stderr line, no files.
expect_bad_input() {
  local message="$1"
  shift
  rm -f "$work"/out.*
  local err code
  err="$("$tandem" schedule "$@" --trace "$work/out.trace.json" --svg "$work/out.svg" \
         --output "$work/out.schedule.json" 2>&1 >/dev/null)"
  code=$?
  [ "$code" -eq 2 ] || fail "tandem schedule $*: exit code $code, expected 2"
  [ "$(wc -l <<<"$err")" -eq 1 ] || fail "tandem schedule $*: error is not one line: $err"
  grep -qF -- "$message" <<<"$err" || fail "tandem schedule $*: '$err' lacks '$message'"
  if ls "$work"/out.* >/dev/null 2>&1; then
    fail "tandem schedule $*: wrote $(ls "$work"/out.*)"
  fi
}

# The issue's figures (zero communication cost).
expect_figure makespan 33.0 --schedule 1f1b --stages 4 --microbatches 8 --forward 1 --backward 2
expect_figure makespan 33.0 --schedule gpipe --stages 4 --microbatches 8 --forward 1 --backward 2
expect_figure makespan 28.5 --schedule interleaved --stages 4 --microbatches 8 --chunks 2 \
  --forward 1 --backward 2
expect_figure makespan 27.0 --schedule zb-h1 --stages 4 --microbatches 8 --forward 1 \
  --backward 1 --weight 1
expect_figure makespan 33.0 --schedule 1f1b --stages 4 --microbatches 8 --forward 1 \
  --backward 1 --weight 1
expect_figure makespan 10.0 --schedule chimera --stages 4 --microbatches 4 --forward 1 --backward 1
expect_figure bubble_ratio "0\\.(2|19999999[0-9]*)" --schedule chimera --stages 4 --microbatches 4 --forward 1 \
  --backward 1
# 1 + 2 * latency per hop: F0 [0,1], F1 [1.5,2.5], B1 [2.5,4.5], B0 [5,7].
expect_figure makespan 7.0 --schedule gpipe --stages 2 --microbatches 1 --latency 0.5
# Transfers of 1 GB at 1 GB/s: F 1, send 1, F 1, B 2, gradient 1, B 2.
expect_figure makespan 8.0 --schedule gpipe --stages 2 --microbatches 1 --activation-bytes 1GB \
  --bandwidth 1GB/s

# DualPipe(V): the README's bubble at F=1, B=3 (Bi=2, W=1): 8 * 4 + (4/2 - 1) * (4 + 3 - 3),
# and with 4 ranks of two half stages 2 * 8 * 4 + (8/2 - 1) * 4.
expect_figure makespan 36.0 --schedule dualpipe --stages 4 --microbatches 8 --forward 1 \
  --backward 2 --weight 1
expect_figure makespan 76.0 --schedule dualpipev --stages 4 --microbatches 8 --forward 2 \
  --backward 4 --weight 2

# Heterogeneous costs from a file: 1 + 4 * (2 + 2) + 1.
cat >"$work/costs.json" <<'JSON'
{"forward": [1, 2], "backward": [1, 2]}
JSON
expect_figure makespan 18.0 --schedule 1f1b --stages 2 --microbatches 4 --costs "$work/costs.json"

# Statistics alone are streamed for the list-scheduled kinds (validated and simulated while
# generated, pipeline/streamed.h); with --output the programs are held whole. Both print the
# same report, byte for byte, for uniform and uneven costs.
cat >"$work/uneven.json" <<'JSON'
{"forward": [0.1, 0.3, 0.2, 0.7, 0.1, 0.3, 0.2, 0.7], "backward": [0.3, 0.2, 0.5, 0.1, 0.3, 0.2, 0.5, 0.1],
 "weight": [0.1, 0.1, 0.2, 0.05, 0.1, 0.1, 0.2, 0.05], "latency_seconds": 0.01,
 "grad_sync_seconds": [1, 1, 1, 1, 1, 1, 1, 1], "optimizer_seconds": 0.5}
JSON
for args in "--schedule zb-v --stages 4 --microbatches 12" \
    "--schedule zb-v --stages 4 --microbatches 9 --costs $work/uneven.json" \
    "--schedule hanayo --stages 2 --microbatches 6 --waves 2 --costs $work/uneven.json" \
    "--schedule hanayo --stages 16 --microbatches 64 --waves 2" \
    "--schedule chimera --stages 8 --microbatches 32 --latency 0.25"; do
  # shellcheck disable=SC2086
  streamed="$("$tandem" schedule $args --format json 2>&1)" ||
    fail "tandem schedule $args --format json: $streamed"
  # shellcheck disable=SC2086
  whole="$("$tandem" schedule $args --format json --output "$work/whole.json" 2>&1)" ||
    fail "tandem schedule $args --output: $whole"
  [ "$streamed" = "$whole" ] || fail "streamed and whole reports differ for $args"
done
# The text report streams past 4,000 computes, its grid drawn from the kept start of the first
# ranks' programs; small schedules are drawn whole. Both equal the whole path's.
for args in "--schedule zb-v --stages 8 --microbatches 300" \
    "--schedule zb-v --stages 16 --microbatches 200 --transfers" \
    "--schedule chimera --stages 20 --microbatches 120" \
    "--schedule hanayo --stages 4 --microbatches 8 --waves 2"; do
  # shellcheck disable=SC2086
  streamed="$("$tandem" schedule $args 2>&1)" || fail "tandem schedule $args: $streamed"
  # shellcheck disable=SC2086
  whole="$("$tandem" schedule $args --output "$work/whole.json" 2>&1)" ||
    fail "tandem schedule $args --output: $whole"
  [ "$streamed" = "$whole" ] || fail "streamed and whole text reports differ for $args"
done

# Files.
if "$tandem" schedule --schedule hanayo --stages 4 --microbatches 8 --waves 2 \
    --trace "$work/t.json" --svg "$work/g.svg" --output "$work/s.json" >"$work/text.txt"; then
  grep -q '"traceEvents"' "$work/t.json" || fail "--trace did not write a Chrome trace"
  grep -q '"F3.1"' "$work/t.json" || fail "--trace lacks event F3.1"
  grep -q '<svg' "$work/g.svg" || fail "--svg did not write an SVG"
  grep -q '"programs"' "$work/s.json" || fail "--output did not write the schedule"
  grep -q '^rank 0 |' "$work/text.txt" || fail "text output lacks the grid"
  grep -q '^bubble ratio' "$work/text.txt" || fail "text output lacks the bubble ratio"
else
  fail "hanayo run with files failed"
fi
# Files of a large schedule are streamed, not held: GPipe p=32, m=4096 (262,144 computes) gets
# a binned chart of a few kB and a trace of every event; the schedule file is as before.
if "$tandem" schedule --schedule gpipe --stages 32 --microbatches 4096 --trace "$work/big.json" \
    --svg "$work/big.svg" --output "$work/big_schedule.json" --format json >/dev/null; then
  [ "$(stat -c %s "$work/big.svg")" -lt 200000 ] || fail "the large chart is not binned"
  grep -q 'too many to draw one by one' "$work/big.svg" || fail "the large chart lacks its note"
  python3 - "$work/big.json" "$work/big_schedule.json" <<'PY' || fail "large trace or schedule file"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
computes = [e for e in events if e.get("ph") == "X" and e["tid"] == 0]
assert len(computes) == 32 * 4096 * 2, len(computes)
programs = json.load(open(sys.argv[2]))["programs"]
assert len(programs) == 32 and programs[0][0] == "F0.0", programs[0][:2]
PY
else
  fail "gpipe p=32 m=4096 with files failed"
fi
# An output that cannot be written stops the command before any file appears: the trace,
# streamed first, is not left behind, nor its temporary.
rm -f "$work"/late.*
"$tandem" schedule --schedule 1f1b --stages 4 --microbatches 8 --trace "$work/late.json" \
  --svg "$work" >/dev/null 2>"$work/late.err"
code=$?
[ "$code" -eq 2 ] || fail "--svg onto a folder: exit code $code, expected 2"
grep -q "is a directory" "$work/late.err" || fail "--svg onto a folder: $(cat "$work/late.err")"
if ls "$work"/late.json* >/dev/null 2>&1; then
  fail "--svg onto a folder left $(ls "$work"/late.json*)"
fi
# Large schedules print a truncated grid with a note.
"$tandem" schedule --schedule 1f1b --stages 64 --microbatches 256 >"$work/big.txt" ||
  fail "1f1b p=64 m=256 failed"
grep -q 'grid truncated' "$work/big.txt" || fail "large grid not truncated"

# torch's CSV format: a file torch wrote is read, simulated and written back without its idle
# cells (compute only) or its bookkeeping cells (lowered); a schedule written by --to-csv reads
# back to the same figures.
torch_data="$(dirname "$0")/../data/torch_schedules"
expect_figure num_stages 8 --from-csv "$torch_data/zbv_p4_m8.csv"
if "$tandem" schedule --from-csv "$torch_data/interleaved1f1b_p2_m6.csv" \
    --to-csv "$work/back.csv" >/dev/null; then
  tr -d '\r' <"$torch_data/interleaved1f1b_p2_m6.csv" | sed -e 's/,,*/,/g' -e 's/^,//' \
    -e 's/,$//' >"$work/expected.csv"
  tr -d '\r' <"$work/back.csv" | cmp -s - "$work/expected.csv" ||
    fail "--to-csv did not write back torch's compute order"
else
  fail "--from-csv of torch's interleaved schedule failed"
fi
"$tandem" schedule --from-csv "$torch_data/zbv_p2_m4_comms.csv" --to-csv "$work/lowered.csv" \
  >/dev/null || fail "--from-csv of a lowered schedule failed"
grep -q "SEND_F" "$work/lowered.csv" || fail "a lowered schedule was not written back lowered"
"$tandem" schedule --schedule zb-v --stages 4 --microbatches 8 --format json \
  --to-csv "$work/zbv.csv" >"$work/zbv.json" || fail "--to-csv of zb-v failed"
"$tandem" schedule --from-csv "$work/zbv.csv" --format json >"$work/zbv_back.json" ||
  fail "--from-csv of tandem's own csv failed"
grep '"makespan"' "$work/zbv.json" | cmp -s - <(grep '"makespan"' "$work/zbv_back.json") ||
  fail "zb-v read back from CSV simulates differently"

# Bad input.
expect_bad_input "unknown schedule 'zigzag'" --schedule zigzag --stages 4 --microbatches 8
expect_bad_input "missing --schedule" --stages 4 --microbatches 8
expect_bad_input "stages (ranks) must be in" --schedule 1f1b --stages 0 --microbatches 8
expect_bad_input "microbatches must be in" --schedule gpipe --stages 4 --microbatches 0
expect_bad_input "needs an even number of ranks, got 3" --schedule chimera --stages 3 \
  --microbatches 6
expect_bad_input "multiple of the ranks" --schedule chimera --stages 4 --microbatches 6
expect_bad_input "chunks apply only to interleaved" --schedule 1f1b --stages 4 \
  --microbatches 8 --chunks 2
expect_bad_input "--forward must be" --schedule 1f1b --stages 4 --microbatches 8 --forward -1
expect_bad_input "unknown flag" --schedule 1f1b --stages 4 --microbatches 8 --nonsense 1
echo '{"forward": [1, 2, 3], "backward": [1, 1, 1, 1]}' >"$work/short.json"
expect_bad_input "forward: expected 4 values" --schedule 1f1b --stages 4 --microbatches 8 \
  --costs "$work/short.json"
echo '{"forward": [1, 2' >"$work/broken.json"
expect_bad_input "malformed JSON" --schedule 1f1b --stages 4 --microbatches 8 \
  --costs "$work/broken.json"
expect_bad_input "no such file" --schedule 1f1b --stages 4 --microbatches 8 \
  --costs "$work/missing.json"
expect_bad_input "even number of ranks, got 3" --schedule dualpipe --stages 3 --microbatches 12
printf '0F0,0Q0\r\n' >"$work/bad.csv"
expect_bad_input "rank 0, cell 2 ('0Q0'): unknown action type 'Q'" --from-csv "$work/bad.csv"
printf '0B0,0F0\r\n' >"$work/order.csv"
expect_bad_input "not a valid schedule" --from-csv "$work/order.csv"
expect_bad_input "not both" --from-csv "$torch_data/zbv_p2_m4.csv" --schedule 1f1b
expect_bad_input "come from the file" --from-csv "$torch_data/zbv_p2_m4.csv" --stages 2
expect_bad_input "no such file" --from-csv "$work/missing.csv"
expect_bad_input "one pipeline" --schedule chimera --stages 4 --microbatches 8 \
  --to-csv "$work/chimera.csv"
# Flags that would change nothing: refused, naming what they need.
expect_bad_input "--csv-transfers applies to --to-csv FILE; there is none" --schedule 1f1b \
  --stages 2 --microbatches 4 --csv-transfers
expect_bad_input "--forward and --costs $work/costs.json both give the stages' costs" \
  --schedule 1f1b --stages 2 --microbatches 4 --costs "$work/costs.json" --forward 2
expect_bad_input "--activation-bytes and --costs" --schedule 1f1b --stages 2 --microbatches 4 \
  --costs "$work/costs.json" --activation-bytes 1MiB
expect_bad_input "there are none: give --activation-bytes too" --schedule 1f1b --stages 2 \
  --microbatches 4 --bandwidth 1GB/s
expect_bad_input "--activation-bytes needs a --bandwidth" --schedule 1f1b --stages 2 \
  --microbatches 4 --activation-bytes 16MiB

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all schedule CLI checks passed"
