#!/usr/bin/env bash
# tandem installed and used from a project of its own, as a user does: `cmake --install` into
# a fresh prefix, examples/consumer configured with find_package(tandem 0.1) against it and
# built, its program (a CNN it registers) trained in one process and as a 2-stage 1F1B
# pipeline under mpirun: the losses must agree within 1e-5 relative and fall. The installed
# `tandem` must run and hand `train` to the installed tandem-torch.
#
# usage: install_test.sh CMAKE BUILD_DIR SOURCE_DIR MPIEXEC
set -euo pipefail
cmake=$1 build=$2 source=$3 mpiexec=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/tandem_install_test.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() { echo "install_test: FAILED: $*" >&2; exit 1; }

"$cmake" --install "$build" --prefix "$work/prefix" >"$work/install.log" ||
  { cat "$work/install.log"; fail "cmake --install"; }
for file in bin/tandem bin/tandem-torch lib/cmake/tandem/tandemConfig.cmake \
            lib/cmake/tandem/tandemConfigVersion.cmake include/tandem/common/config.h \
            include/tandem/cli/torch/train_main.h include/tandem/runtime/torch/model.h; do
  [[ -e "$work/prefix/$file" ]] || fail "the install lacks $file"
done
version=$("$work/prefix/bin/tandem" --version)
[[ "$version" == "tandem "* ]] || fail "installed tandem --version printed '$version'"
help=$("$work/prefix/bin/tandem" train --help) || fail "installed tandem train --help failed"
[[ "$help" == *"--model"* ]] ||
  fail "installed tandem train --help (through tandem-torch) lists no --model"

# The consumer knows nothing of the build tree: only the prefix.
"$cmake" -S "$source/examples/consumer" -B "$work/consumer" \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "configuring examples/consumer against the install"; }
grep -i "warning" "$work/configure.log" && fail "configuring the consumer warned"
"$cmake" --build "$work/consumer" -j2 >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; fail "building examples/consumer"; }
program="$work/consumer/cnn_trainer"

flags=(--model cnn --steps 25 --microbatch-size 8 --microbatches 4 --lr 1e-2 --seed 5)
OMP_NUM_THREADS=1 "$program" "${flags[@]}" --log-json "$work/one.jsonl" >"$work/one.out" 2>&1 ||
  { cat "$work/one.out"; fail "one process"; }
OMP_NUM_THREADS=1 "$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -np 2 \
  "$program" "${flags[@]}" --schedule 1f1b --stages 2 --log-json "$work/two.jsonl" \
  >"$work/two.out" 2>&1 || { cat "$work/two.out"; fail "2-stage 1F1B under mpirun"; }
grep -q "stage 1: layers" "$work/two.out" || { cat "$work/two.out"; fail "no second stage"; }

python3 - "$work/one.jsonl" "$work/two.jsonl" <<'PY' || fail "losses"
import json, sys
def losses(path):  # the iterations' lines; events ({"event": "finished"}) left out
    return [j["loss"] for j in map(json.loads, open(path)) if "event" not in j]
one = losses(sys.argv[1])
two = losses(sys.argv[2])
assert len(one) == len(two) == 25, (len(one), len(two))
worst = max(abs(a - b) / abs(a) for a, b in zip(one, two))
print(f"install_test: 1 process vs 2-stage 1F1B: largest relative loss difference {worst:.2e}; "
      f"loss {one[0]:.4f} -> {one[-1]:.4f}")
assert worst <= 1e-5, worst
assert one[-1] < 0.3 * one[0], (one[0], one[-1])
PY
echo "install_test: passed"
