// The kernels of layer_norm.h. One block normalises one row (the forward) or a run of rows (the
// backward); each thread keeps its packs of the row in registers: pack p of a row holds
// elements [p * kVector, (p + 1) * kVector), and thread t owns packs t, t + blockDim.x, ...,
// at most kPacks of them. Means and variances are two-pass over the registers, in float32;
// block sums go through warp shuffles and a 33-element shared buffer.
#include "runtime/torch/kernels/layer_norm.h"

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::runtime::kernels {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxThreads = 512;
// The backward's blocks: about this many threads in all (1,024 per SM of an H100/H200), so
// that each block accumulates its column sums over several rows and the scratch stays small.
// A constant, not the device's SM count: the summation order, hence the bits of the weight
// gradient, is the same on every device.
constexpr int64_t kBackwardTargetThreads = 132 * 1024;
// The column-sum kernel: 32 columns by kColumnSumGroups groups of partial rows per block.
constexpr int kColumnSumGroups = 16;
// Forward grids stride over rows beyond this many blocks.
constexpr int64_t kMaxForwardBlocks = 1 << 20;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__device__ __forceinline__ float BFloat16BitsToFloat(unsigned short bits) {
  return __bfloat162float(__ushort_as_bfloat16(bits));
}

__device__ __forceinline__ unsigned short FloatToBFloat16Bits(float value) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

// `value` rounded to `type` and back: what storing it in `type` keeps.
__device__ __forceinline__ float RoundTo(NormElementType type, float value) {
  return type == NormElementType::kBFloat16 ? __bfloat162float(__float2bfloat16_rn(value))
                                            : value;
}

// Elements [index, index + N) of `base` (of `type`) as floats; aligned to N elements.
template <int N>
__device__ __forceinline__ void LoadFloats(const void* base, NormElementType type, int64_t index,
                                           float (&out)[N]) {
  if (type == NormElementType::kBFloat16) {
    const Pack<unsigned short, N> pack =
        *reinterpret_cast<const Pack<unsigned short, N>*>(
            static_cast<const unsigned short*>(base) + index);
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = BFloat16BitsToFloat(pack.v[j]);
  } else {
    const Pack<float, N> pack =
        *reinterpret_cast<const Pack<float, N>*>(static_cast<const float*>(base) + index);
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = pack.v[j];
  }
}

template <int N>
__device__ __forceinline__ void LoadWeights(const float* base, int64_t index, float (&out)[N]) {
  const Pack<float, N> pack = *reinterpret_cast<const Pack<float, N>*>(base + index);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = pack.v[j];
}

// Stores `in` as elements [index, index + N) of `base` (of `type`), rounding to nearest even.
template <int N>
__device__ __forceinline__ void StoreFloats(void* base, NormElementType type, int64_t index,
                                            const float (&in)[N]) {
  if (type == NormElementType::kBFloat16) {
    Pack<unsigned short, N> pack;
#pragma unroll
    for (int j = 0; j < N; ++j) pack.v[j] = FloatToBFloat16Bits(in[j]);
    *reinterpret_cast<Pack<unsigned short, N>*>(static_cast<unsigned short*>(base) + index) = pack;
  } else {
    Pack<float, N> pack;
#pragma unroll
    for (int j = 0; j < N; ++j) pack.v[j] = in[j];
    *reinterpret_cast<Pack<float, N>*>(static_cast<float*>(base) + index) = pack;
  }
}

// The sum over the warp, in every lane (a butterfly: every lane adds the same pairs, so all
// lanes hold the same bits).
__device__ __forceinline__ float WarpSum(float value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

__device__ __forceinline__ float2 WarpSum(float2 value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value.x += __shfl_xor_sync(kFullMask, value.x, offset);
    value.y += __shfl_xor_sync(kFullMask, value.y, offset);
  }
  return value;
}

// The sum over the block, in every thread. Every thread of the block calls it (blockDim.x a
// multiple of 32); `shared` holds kWarpSize + 1 values. Two barriers: the second keeps the
// warp sums from being overwritten by the next call before warp 0 has read them, and every
// thread reads the result before it can reach the next call's first barrier.
template <typename T>
__device__ __forceinline__ T BlockSum(T value, T* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  value = WarpSum(value);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    T total = lane < warps ? shared[lane] : T{};
    total = WarpSum(total);
    if (lane == 0) shared[kWarpSize] = total;
  }
  __syncthreads();
  return shared[kWarpSize];
}

// One row per block (striding over rows beyond the grid). kPacks packs of kVector elements
// per thread; hidden == packs * kVector.
template <int kVector, int kPacks, bool kRms>
__global__ void __launch_bounds__(kMaxThreads)
    NormForwardKernel(const NormForwardArgs args) {
  __shared__ float reduce_buffer[kWarpSize + 1];
  const int packs = static_cast<int>(args.hidden / kVector);
  const float hidden = static_cast<float>(args.hidden);
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    const int64_t row_start = row * args.hidden;
    float values[kPacks][kVector];
    float local = 0.0f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int pack = threadIdx.x + k * blockDim.x;
      if (pack < packs) {
        const int64_t index = row_start + static_cast<int64_t>(pack) * kVector;
        LoadFloats<kVector>(args.x, args.x_type, index, values[k]);
        if (args.delta != nullptr) {
          float delta[kVector];
          LoadFloats<kVector>(args.delta, args.delta_type, index, delta);
#pragma unroll
          for (int j = 0; j < kVector; ++j) {
            // The sum as stored: the norm and its backward see the same values.
            values[k][j] = RoundTo(args.x_type, values[k][j] + delta[j]);
          }
          if (args.sum != nullptr) StoreFloats<kVector>(args.sum, args.x_type, index, values[k]);
        }
#pragma unroll
        for (int j = 0; j < kVector; ++j) {
          local += kRms ? values[k][j] * values[k][j] : values[k][j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVector; ++j) values[k][j] = 0.0f;
      }
    }
    float mean = 0.0f;
    float rstd;
    if (kRms) {
      rstd = rsqrtf(BlockSum(local, reduce_buffer) / hidden + args.epsilon);
    } else {
      mean = BlockSum(local, reduce_buffer) / hidden;
      float squares = 0.0f;
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        if (static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x) < packs) {
#pragma unroll
          for (int j = 0; j < kVector; ++j) {
            const float centred = values[k][j] - mean;
            squares += centred * centred;
          }
        }
      }
      rstd = rsqrtf(BlockSum(squares, reduce_buffer) / hidden + args.epsilon);
    }
    if (threadIdx.x == 0) {
      if (!kRms) args.mean[row] = mean;
      args.rstd[row] = rstd;
    }
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int pack = threadIdx.x + k * blockDim.x;
      if (pack < packs) {
        const int64_t column = static_cast<int64_t>(pack) * kVector;
        float weight[kVector];
        LoadWeights<kVector>(args.weight, column, weight);
        float bias[kVector];
        if (!kRms && args.bias != nullptr) {
          LoadWeights<kVector>(args.bias, column, bias);
        } else {
#pragma unroll
          for (int j = 0; j < kVector; ++j) bias[j] = 0.0f;
        }
        float out[kVector];
#pragma unroll
        for (int j = 0; j < kVector; ++j) {
          out[j] = (values[k][j] - mean) * rstd * weight[j] + bias[j];
        }
        StoreFloats<kVector>(args.normed, args.normed_type, row_start + column, out);
      }
    }
  }
}

// Rows [blockIdx.x * rows_per_block, ...) of one block; their column sums of grad_normed * xhat
// (and of grad_normed, with `bias_partials`) go to row blockIdx.x of `weight_partials` (and
// `bias_partials`), [gridDim.x, hidden] each, where given.
template <int kVector, int kPacks, bool kRms>
__global__ void __launch_bounds__(kMaxThreads)
    NormBackwardKernel(const NormBackwardArgs args, int64_t rows_per_block,
                       float* weight_partials, float* bias_partials) {
  __shared__ float2 reduce_buffer[kWarpSize + 1];
  const int packs = static_cast<int>(args.hidden / kVector);
  const float hidden = static_cast<float>(args.hidden);
  float weight_sums[kPacks][kVector];
  float bias_sums[kPacks][kVector];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
#pragma unroll
    for (int j = 0; j < kVector; ++j) weight_sums[k][j] = bias_sums[k][j] = 0.0f;
  }
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t end_row =
      first_row + rows_per_block < args.rows ? first_row + rows_per_block : args.rows;
  for (int64_t row = first_row; row < end_row; ++row) {
    const int64_t row_start = row * args.hidden;
    const float mean = kRms ? 0.0f : args.mean[row];
    const float rstd = args.rstd[row];
    float xhat[kPacks][kVector];
    float dxhat[kPacks][kVector];  // grad_normed * weight
    float2 local = make_float2(0.0f, 0.0f);  // sums of dxhat and dxhat * xhat
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int pack = threadIdx.x + k * blockDim.x;
      if (pack < packs) {
        const int64_t column = static_cast<int64_t>(pack) * kVector;
        const int64_t index = row_start + column;
        LoadFloats<kVector>(args.input, args.input_type, index, xhat[k]);
        float dy[kVector];
        LoadFloats<kVector>(args.grad_normed, args.grad_normed_type, index, dy);
        float weight[kVector];
        LoadWeights<kVector>(args.weight, column, weight);
#pragma unroll
        for (int j = 0; j < kVector; ++j) {
          xhat[k][j] = (xhat[k][j] - mean) * rstd;
          weight_sums[k][j] += dy[j] * xhat[k][j];
          if (!kRms) bias_sums[k][j] += dy[j];
          dxhat[k][j] = dy[j] * weight[j];
          local.x += dxhat[k][j];
          local.y += dxhat[k][j] * xhat[k][j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVector; ++j) xhat[k][j] = dxhat[k][j] = 0.0f;
      }
    }
    const float2 total = BlockSum(local, reduce_buffer);
    // RMSNorm has no mean to subtract, so no mean(dxhat) term.
    const float mean_dxhat = kRms ? 0.0f : total.x / hidden;
    const float mean_dxhat_xhat = total.y / hidden;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int pack = threadIdx.x + k * blockDim.x;
      if (pack < packs) {
        const int64_t index = row_start + static_cast<int64_t>(pack) * kVector;
        float grad[kVector];
        if (args.grad_sum != nullptr) {
          LoadFloats<kVector>(args.grad_sum, args.grad_sum_type, index, grad);
        } else {
#pragma unroll
          for (int j = 0; j < kVector; ++j) grad[j] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kVector; ++j) {
          grad[j] += rstd * (dxhat[k][j] - mean_dxhat - xhat[k][j] * mean_dxhat_xhat);
        }
        StoreFloats<kVector>(args.grad_input, args.grad_input_type, index, grad);
        if (args.grad_delta != nullptr) {
          StoreFloats<kVector>(args.grad_delta, args.grad_delta_type, index, grad);
        }
      }
    }
  }
  if (weight_partials == nullptr) return;
  const int64_t partial_start = static_cast<int64_t>(blockIdx.x) * args.hidden;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int pack = threadIdx.x + k * blockDim.x;
    if (pack < packs) {
      const int64_t index = partial_start + static_cast<int64_t>(pack) * kVector;
      StoreFloats<kVector>(weight_partials, NormElementType::kFloat32, index, weight_sums[k]);
      if (bias_partials != nullptr) {
        StoreFloats<kVector>(bias_partials, NormElementType::kFloat32, index, bias_sums[k]);
      }
    }
  }
}

// grad_weight[c] = sum over p of weight_partials[p, c] (and the same for the bias), in a fixed
// order. Blocks of 32 columns x kColumnSumGroups threads; group g adds partial rows g,
// g + kColumnSumGroups, ...; then the groups' sums are added in order.
__global__ void __launch_bounds__(kWarpSize * kColumnSumGroups)
    ColumnSumKernel(const float* weight_partials, const float* bias_partials, int64_t blocks,
                    int64_t hidden, float* grad_weight, float* grad_bias) {
  __shared__ float weight_groups[kColumnSumGroups][kWarpSize + 1];
  __shared__ float bias_groups[kColumnSumGroups][kWarpSize + 1];
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kWarpSize + threadIdx.x;
  float weight_sum = 0.0f;
  float bias_sum = 0.0f;
  if (column < hidden) {
    for (int64_t p = threadIdx.y; p < blocks; p += kColumnSumGroups) {
      weight_sum += weight_partials[p * hidden + column];
      if (bias_partials != nullptr) bias_sum += bias_partials[p * hidden + column];
    }
  }
  weight_groups[threadIdx.y][threadIdx.x] = weight_sum;
  bias_groups[threadIdx.y][threadIdx.x] = bias_sum;
  __syncthreads();
  if (threadIdx.y != 0 || column >= hidden) return;
  weight_sum = 0.0f;
  bias_sum = 0.0f;
  for (int g = 0; g < kColumnSumGroups; ++g) {
    weight_sum += weight_groups[g][threadIdx.x];
    bias_sum += bias_groups[g][threadIdx.x];
  }
  if (grad_weight != nullptr) grad_weight[column] = weight_sum;
  if (grad_bias != nullptr) grad_bias[column] = bias_sum;
}

size_t ElementBytes(NormElementType type) {
  return type == NormElementType::kBFloat16 ? 2 : 4;
}

// Whether `pointer` (null: no constraint) is aligned to `vector` elements of `bytes` each.
bool Aligned(const void* pointer, size_t bytes, int vector) {
  return reinterpret_cast<uintptr_t>(pointer) % (bytes * vector) == 0;
}

// How a row is spread over a block: `vector` elements per pack, `packs_per_thread` packs per
// thread (a power of two), `threads` a multiple of 32 no larger than kMaxThreads.
struct RowShape {
  int vector;
  int packs_per_thread;
  int threads;
};

constexpr int kWideVector = 4;
constexpr int kMaxWidePacks = 8;     // 4 * 8 * 512 = kMaxNormHidden
constexpr int kMaxNarrowPacks = 32;  // 1 * 32 * 512 = kMaxNormHidden
static_assert(kWideVector * kMaxWidePacks * kMaxThreads == kMaxNormHidden, "wide capacity");
static_assert(kMaxNarrowPacks * kMaxThreads == kMaxNormHidden, "narrow capacity");

RowShape ShapeFor(int64_t hidden, bool wide) {
  RowShape shape;
  shape.vector = wide ? kWideVector : 1;
  const int64_t packs = hidden / shape.vector;
  const int max_packs = wide ? kMaxWidePacks : kMaxNarrowPacks;
  shape.packs_per_thread = 1;
  while (shape.packs_per_thread < max_packs &&
         packs > static_cast<int64_t>(shape.packs_per_thread) * kMaxThreads) {
    shape.packs_per_thread *= 2;
  }
  const int64_t threads = (packs + shape.packs_per_thread - 1) / shape.packs_per_thread;
  shape.threads = static_cast<int>((threads + kWarpSize - 1) / kWarpSize * kWarpSize);
  return shape;
}

// The backward's grid: a function of (rows, hidden) alone, so that the scratch can be sized
// before the pointers (and so the vector width) are known.
struct BackwardGrid {
  int64_t blocks;
  int64_t rows_per_block;
};

BackwardGrid BackwardGridFor(int64_t rows, int64_t hidden) {
  const RowShape shape = ShapeFor(hidden, hidden % kWideVector == 0);
  const int64_t target = (kBackwardTargetThreads + shape.threads - 1) / shape.threads;
  const int64_t blocks = rows < target ? rows : target;
  BackwardGrid grid;
  grid.rows_per_block = (rows + blocks - 1) / blocks;
  grid.blocks = (rows + grid.rows_per_block - 1) / grid.rows_per_block;
  return grid;
}

bool HiddenInRange(int64_t hidden) { return hidden >= 1 && hidden <= kMaxNormHidden; }

using ForwardKernel = void (*)(NormForwardArgs);
using BackwardKernel = void (*)(NormBackwardArgs, int64_t, float*, float*);

// The instantiation for `packs_per_thread` (a power of two: at most kMaxWidePacks for the wide
// vector, kMaxNarrowPacks for single elements).
template <bool kRms, int kVector>
ForwardKernel ForwardKernelFor(int packs_per_thread) {
  switch (packs_per_thread) {
    case 1: return NormForwardKernel<kVector, 1, kRms>;
    case 2: return NormForwardKernel<kVector, 2, kRms>;
    case 4: return NormForwardKernel<kVector, 4, kRms>;
    case 8: return NormForwardKernel<kVector, 8, kRms>;
    default: break;
  }
  if constexpr (kVector == 1) {
    if (packs_per_thread == 16) return NormForwardKernel<1, 16, kRms>;
    if (packs_per_thread == 32) return NormForwardKernel<1, 32, kRms>;
  }
  return nullptr;
}

template <bool kRms, int kVector>
BackwardKernel BackwardKernelFor(int packs_per_thread) {
  switch (packs_per_thread) {
    case 1: return NormBackwardKernel<kVector, 1, kRms>;
    case 2: return NormBackwardKernel<kVector, 2, kRms>;
    case 4: return NormBackwardKernel<kVector, 4, kRms>;
    case 8: return NormBackwardKernel<kVector, 8, kRms>;
    default: break;
  }
  if constexpr (kVector == 1) {
    if (packs_per_thread == 16) return NormBackwardKernel<1, 16, kRms>;
    if (packs_per_thread == 32) return NormBackwardKernel<1, 32, kRms>;
  }
  return nullptr;
}

template <bool kRms>
int Forward(const NormForwardArgs& args, void* stream) {
  if (args.rows < 0 || !HiddenInRange(args.hidden)) return static_cast<int>(cudaErrorInvalidValue);
  if (args.rows == 0) return static_cast<int>(cudaSuccess);
  if (args.x == nullptr || args.weight == nullptr || args.normed == nullptr ||
      args.rstd == nullptr || (!kRms && args.mean == nullptr)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const bool wide =
      args.hidden % kWideVector == 0 &&
      Aligned(args.x, ElementBytes(args.x_type), kWideVector) &&
      Aligned(args.delta, ElementBytes(args.delta_type), kWideVector) &&
      Aligned(args.sum, ElementBytes(args.x_type), kWideVector) &&
      Aligned(args.normed, ElementBytes(args.normed_type), kWideVector) &&
      Aligned(args.weight, sizeof(float), kWideVector) &&
      Aligned(args.bias, sizeof(float), kWideVector);
  const RowShape shape = ShapeFor(args.hidden, wide);
  const ForwardKernel kernel = wide ? ForwardKernelFor<kRms, kWideVector>(shape.packs_per_thread)
                                    : ForwardKernelFor<kRms, 1>(shape.packs_per_thread);
  if (kernel == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t blocks = args.rows < kMaxForwardBlocks ? args.rows : kMaxForwardBlocks;
  kernel<<<static_cast<unsigned>(blocks), shape.threads, 0, static_cast<cudaStream_t>(stream)>>>(
      args);
  return static_cast<int>(cudaGetLastError());
}

template <bool kRms>
int Backward(const NormBackwardArgs& args, void* stream_pointer) {
  const bool column_sums = args.grad_weight != nullptr || (!kRms && args.grad_bias != nullptr);
  if (args.rows < 0 || !HiddenInRange(args.hidden)) return static_cast<int>(cudaErrorInvalidValue);
  const auto stream = static_cast<cudaStream_t>(stream_pointer);
  if (args.rows == 0) {
    // No rows: the column sums are zero.
    if (args.grad_weight != nullptr) {
      cudaMemsetAsync(args.grad_weight, 0, args.hidden * sizeof(float), stream);
    }
    if (!kRms && args.grad_bias != nullptr) {
      cudaMemsetAsync(args.grad_bias, 0, args.hidden * sizeof(float), stream);
    }
    return static_cast<int>(cudaGetLastError());
  }
  if (args.input == nullptr || args.rstd == nullptr || (!kRms && args.mean == nullptr) ||
      args.weight == nullptr || args.grad_normed == nullptr || args.grad_input == nullptr ||
      (column_sums &&
       (args.scratch == nullptr || !Aligned(args.scratch, 16, 1) ||
        args.scratch_bytes < NormBackwardScratchBytes(args.rows, args.hidden)))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const BackwardGrid grid = BackwardGridFor(args.rows, args.hidden);
  // [2, blocks, hidden]: the weight's partial sums, then the bias's (the scratch is sized for
  // both). Their rows start at multiples of hidden floats from a 16-byte aligned scratch, so
  // they are aligned for the wide stores whenever hidden % 4 == 0.
  float* weight_partials = column_sums ? static_cast<float*>(args.scratch) : nullptr;
  float* bias_partials = column_sums && !kRms && args.grad_bias != nullptr
                             ? weight_partials + grid.blocks * args.hidden
                             : nullptr;
  const bool wide =
      args.hidden % kWideVector == 0 &&
      Aligned(args.input, ElementBytes(args.input_type), kWideVector) &&
      Aligned(args.weight, sizeof(float), kWideVector) &&
      Aligned(args.grad_normed, ElementBytes(args.grad_normed_type), kWideVector) &&
      Aligned(args.grad_sum, ElementBytes(args.grad_sum_type), kWideVector) &&
      Aligned(args.grad_input, ElementBytes(args.grad_input_type), kWideVector) &&
      Aligned(args.grad_delta, ElementBytes(args.grad_delta_type), kWideVector);
  const RowShape shape = ShapeFor(args.hidden, wide);
  const BackwardKernel kernel = wide
                                    ? BackwardKernelFor<kRms, kWideVector>(shape.packs_per_thread)
                                    : BackwardKernelFor<kRms, 1>(shape.packs_per_thread);
  if (kernel == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  kernel<<<static_cast<unsigned>(grid.blocks), shape.threads, 0, stream>>>(
      args, grid.rows_per_block, weight_partials, bias_partials);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess || !column_sums) return static_cast<int>(launched);
  const dim3 threads(kWarpSize, kColumnSumGroups);
  const auto column_blocks = static_cast<unsigned>((args.hidden + kWarpSize - 1) / kWarpSize);
  ColumnSumKernel<<<column_blocks, threads, 0, stream>>>(
      weight_partials, bias_partials, grid.blocks, args.hidden, args.grad_weight,
      kRms ? nullptr : args.grad_bias);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

size_t NormBackwardScratchBytes(int64_t rows, int64_t hidden) {
  if (rows <= 0 || !HiddenInRange(hidden)) return 0;
  const BackwardGrid grid = BackwardGridFor(rows, hidden);
  return 2 * static_cast<size_t>(grid.blocks) * static_cast<size_t>(hidden) * sizeof(float);
}

int LayerNormForward(const NormForwardArgs& args, void* stream) {
  return Forward</*kRms=*/false>(args, stream);
}

int RmsNormForward(const NormForwardArgs& args, void* stream) {
  return Forward</*kRms=*/true>(args, stream);
}

int LayerNormBackward(const NormBackwardArgs& args, void* stream) {
  return Backward</*kRms=*/false>(args, stream);
}

int RmsNormBackward(const NormBackwardArgs& args, void* stream) {
  return Backward</*kRms=*/true>(args, stream);
}

const char* NormKernelErrorString(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace tandem::runtime::kernels
