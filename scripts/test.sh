#!/usr/bin/env bash
# Sets up (Debian packages), builds and runs every test: unit tests, multi-rank tests under
# mpirun and end-to-end runs. GPU tests skip with a message where no GPU is present.
# Extra arguments go to ctest (e.g. -L unit, -R planner).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build_dir="${TANDEM_BUILD_DIR:-build}"
# The reference Python packages some tests compare against (numpy, safetensors), in a virtual
# environment first on PATH.
PATH="$(scripts/python_env.sh "$build_dir/python-env"):$PATH"
export PATH
# Open MPI refuses root without these, and more ranks than cores needs oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
ctest --test-dir "$build_dir" --output-on-failure --timeout 900 "$@"
