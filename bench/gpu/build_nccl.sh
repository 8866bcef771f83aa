#!/usr/bin/env bash
# Builds NCCL >= 2.30 (whose multi-rank mode lets ranks that share a GPU talk over NCCL) from a
# source tarball of NVIDIA/nccl (e.g. the v2.30.7-1 release), for one GPU architecture, into
# PREFIX (lib/libnccl.so.2, include/nccl.h). On 16 cores a few minutes; on 2 cores over an hour,
# or about 16 minutes with TANDEM_NCCL_FUNCS=tandem (sm_90: a 37.6 MB library, 12.6 MB
# stripped; the CUDA toolkit suffices, no GPU), which compiles only the device kernels
# tandem calls (all-reduce sum/min/max/average with ring and tree, reduce-scatter, all-gather
# and broadcast with ring, send/receive; every integer and floating type but fp8): NCCL picks
# no other algorithm for ranks on one node without NVLS or CollNet, which the multi-rank mode
# turns off anyway (a job over several nodes needs the full build: PAT, NVLS, CollNet). Put
# the result first for every rank (it keeps the soname libnccl.so.2):
#   LD_PRELOAD=PREFIX/lib/libnccl.so.2 mpirun -x LD_PRELOAD ...
# and check it took: tandem's comm_nccl_test prints the NCCL loaded, NCCL_DEBUG=VERSION too.
#
#   bench/gpu/build_nccl.sh SOURCE_TARBALL [PREFIX]
#
# Environment: NVCC_GENCODE (default sm_90: -gencode=arch=compute_90,code=sm_90), JOBS
# (default nproc), CUDA_HOME (default the folder above nvcc's), TANDEM_NCCL_FUNCS (all |
# tandem, default all).
set -euo pipefail
if [ $# -lt 1 ]; then sed -n '2,18p' "$0"; exit 2; fi
tarball="$1"
prefix="${2:-/tmp/nccl}"
if [ -f "$prefix/lib/libnccl.so.2" ]; then echo "already built: $prefix/lib/libnccl.so.2"; exit 0; fi
source_dir=$(mktemp -d)
trap 'rm -rf "$source_dir"' EXIT
tar -xf "$tarball" -C "$source_dir"
top="$source_dir"
[ -f "$top/Makefile" ] || top=$(dirname "$(find "$source_dir" -maxdepth 2 -name Makefile | head -1)")
cuda="${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}"
# Some CUDA installs carry an older NCCL's headers in include/; NCCL's Makefile puts the CUDA
# include folder before its own, so build against a view of the toolkit without them.
view="$source_dir/cuda-view"
mkdir -p "$view/include"
for entry in "$cuda"/*; do
  [ "$(basename "$entry")" = include ] || ln -s "$(readlink -f "$entry")" "$view/$(basename "$entry")"
done
for entry in "$cuda"/include/*; do
  case "$(basename "$entry")" in nccl*) ;; *) ln -s "$(readlink -f "$entry")" "$view/include/";; esac
done
funcs=""
if [ "${TANDEM_NCCL_FUNCS:-all}" = tandem ]; then
  types="(i8|u8|i32|u32|i64|u64|f16|f32|f64|bf16)"
  funcs="AllReduce (Sum|MinMax|PreMulSum|SumPostDiv) $types (RING|TREE) *"
  funcs+="|ReduceScatter (Sum|MinMax|PreMulSum|SumPostDiv) $types RING *"
  funcs+="|AllGather RING *|Broadcast RING *|SendRecv"
fi
make -C "$top" -j"${JOBS:-$(nproc)}" src.build CUDA_HOME="$view" BUILDDIR="$prefix" \
  NVCC_GENCODE="${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}" ONLY_FUNCS="$funcs"
ls -la "$prefix/lib/libnccl.so.2" "$prefix/include/nccl.h"
