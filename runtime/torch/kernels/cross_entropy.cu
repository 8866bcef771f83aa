#include "runtime/torch/kernels/cross_entropy.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

namespace tandem::runtime::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Elements per 16-byte access.
template <typename T>
constexpr int kPack = 16 / sizeof(T);

template <typename T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

// Running (maximum, sum of exp(x - maximum)) of one thread's elements.
struct MaxSum {
  float max = -FLT_MAX;
  float sum = 0.0f;
  __device__ __forceinline__ void Add(float x) {
    if (x > max) {
      sum = sum * __expf(max - x) + 1.0f;
      max = x;
    } else {
      sum += __expf(x - max);
    }
  }
  __device__ __forceinline__ void Merge(float other_max, float other_sum) {
    if (other_sum == 0.0f) return;
    if (other_max > max) {
      sum = sum * __expf(max - other_max) + other_sum;
      max = other_max;
    } else {
      sum += other_sum * __expf(other_max - max);
    }
  }
};

// Whether a row of `T` at `row` can be read in 16-byte packs: the row's start aligned.
template <typename T>
__device__ __forceinline__ bool Aligned(const T* row) {
  return (reinterpret_cast<uintptr_t>(row) & 15) == 0;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const T* __restrict__ logits, int64_t vocab, int64_t row_stride,
                  const int64_t* __restrict__ targets, int64_t ignore_index,
                  float* __restrict__ row_lse, float* __restrict__ row_loss) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * row_stride;
  MaxSum mine;
  int64_t done = 0;
  if (Aligned(row)) {
    const int64_t packs = vocab / kPack<T>;
    const Pack<T>* packed = reinterpret_cast<const Pack<T>*>(row);
    for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
      const Pack<T> pack = packed[p];
      float local = -FLT_MAX;
#pragma unroll
      for (int k = 0; k < kPack<T>; ++k) local = fmaxf(local, ToFloat(pack.v[k]));
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kPack<T>; ++k) sum += __expf(ToFloat(pack.v[k]) - local);
      mine.Merge(local, sum);
    }
    done = packs * kPack<T>;
  }
  for (int64_t v = done + threadIdx.x; v < vocab; v += kThreads) mine.Add(ToFloat(row[v]));

  // Warp, then block.
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_max = __shfl_xor_sync(0xffffffffu, mine.max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, mine.sum, offset);
    mine.Merge(other_max, other_sum);
  }
  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_max[warp] = mine.max;
    warp_sum[warp] = mine.sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum all;
    for (int w = 0; w < kWarps; ++w) all.Merge(warp_max[w], warp_sum[w]);
    const float lse = all.max + logf(all.sum);
    row_lse[r] = lse;
    const int64_t target = targets[r];
    if (target == ignore_index) {
      row_loss[r] = 0.0f;
    } else if (target < 0 || target >= vocab) {
      row_loss[r] = __int_as_float(0x7fc00000);  // NaN: a target outside the vocabulary
    } else {
      row_loss[r] = lse - ToFloat(row[target]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    BackwardKernel(const T* logits, int64_t vocab, int64_t row_stride,
                   const int64_t* __restrict__ targets, int64_t ignore_index,
                   const float* __restrict__ row_lse, const float* __restrict__ scale_ptr,
                   T* grad) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * row_stride;
  T* out = grad + r * row_stride;
  const int64_t target = targets[r];
  const bool ignored = target == ignore_index;
  const float scale = ignored ? 0.0f : *scale_ptr;
  const float lse = row_lse[r];
  int64_t done = 0;
  if (Aligned(row) && Aligned(out)) {
    const int64_t packs = vocab / kPack<T>;
    const Pack<T>* in_packs = reinterpret_cast<const Pack<T>*>(row);
    Pack<T>* out_packs = reinterpret_cast<Pack<T>*>(out);
    for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
      const Pack<T> pack = in_packs[p];
      Pack<T> result;
#pragma unroll
      for (int k = 0; k < kPack<T>; ++k) {
        const int64_t v = p * kPack<T> + k;
        const float g = (__expf(ToFloat(pack.v[k]) - lse) - (v == target ? 1.0f : 0.0f)) * scale;
        result.v[k] = FromFloat<T>(g);
      }
      out_packs[p] = result;
    }
    done = packs * kPack<T>;
  }
  for (int64_t v = done + threadIdx.x; v < vocab; v += kThreads) {
    const float g = (__expf(ToFloat(row[v]) - lse) - (v == target ? 1.0f : 0.0f)) * scale;
    out[v] = FromFloat<T>(g);
  }
}

}  // namespace

int CrossEntropyForward(const void* logits, LogitType type, int64_t rows, int64_t vocab,
                        int64_t row_stride, const int64_t* targets, int64_t ignore_index,
                        float* row_lse, float* row_loss, void* stream) {
  if (rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (type == LogitType::kBFloat16) {
    ForwardKernel<__nv_bfloat16><<<rows, kThreads, 0, s>>>(
        static_cast<const __nv_bfloat16*>(logits), vocab, row_stride, targets, ignore_index,
        row_lse, row_loss);
  } else {
    ForwardKernel<float><<<rows, kThreads, 0, s>>>(static_cast<const float*>(logits), vocab,
                                                     row_stride, targets, ignore_index, row_lse,
                                                     row_loss);
  }
  return static_cast<int>(cudaGetLastError());
}

int CrossEntropyBackward(const void* logits, LogitType type, int64_t rows, int64_t vocab,
                         int64_t row_stride, const int64_t* targets, int64_t ignore_index,
                         const float* row_lse, const float* scale, void* grad, void* stream) {
  if (rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (type == LogitType::kBFloat16) {
    BackwardKernel<__nv_bfloat16><<<rows, kThreads, 0, s>>>(
        static_cast<const __nv_bfloat16*>(logits), vocab, row_stride, targets, ignore_index,
        row_lse, scale, static_cast<__nv_bfloat16*>(grad));
  } else {
    BackwardKernel<float><<<rows, kThreads, 0, s>>>(static_cast<const float*>(logits), vocab,
                                                      row_stride, targets, ignore_index, row_lse,
                                                      scale, static_cast<float*>(grad));
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace tandem::runtime::kernels
