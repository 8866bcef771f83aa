// Gradient synchronisation of data-parallel replicas, and the optimizer step after it.
//
// Two strategies behind one interface:
//   * kAllReduce (baseline): parameters are grouped into buckets; when a bucket's gradients are
//     final during the last backward, its gradients are packed and all-reduced. FinishBackward
//     waits for all buckets and writes the reduced gradients back into every `grad` buffer;
//     Step runs the full optimizer on every rank.
//   * kDeAR (decoupled all-reduce): a bucket's reduce-scatter starts as soon as its gradients
//     are final; after backward each rank updates only its shard of every bucket (optimizer
//     state is sharded across the group) and starts the bucket's all-gather, which overlaps the
//     next iteration's forward: WaitForParameters(p) waits only for the all-gather of p's
//     bucket. The `grad` buffers keep the local (unreduced) gradients.
//
// Use per iteration (one thread; the runtime's engine thread):
//   forward:        WaitForParameters(p) before the first forward that reads parameter p
//   last backward:  GradReady(p) when p's gradient is final (any order; buckets are launched
//                   in bucket order so every rank issues collectives in the same order)
//   after backward: FinishBackward(); LocalGradNormSquared() for clipping; Step(lr, scale)
//   on demand:      Flush() makes every parameter complete (before evaluation, checkpoints,
//                   the end of training); no update is lost.
//
// What is averaged: with GradientReduction::kAverage (default) the synchronised gradient is
// (1 / group size) * sum over the group's ranks of each rank's `grad` buffer. It equals the
// gradient of a single process over the global batch when each rank's gradient is the mean
// over its own samples (i.e. each micro-batch loss is scaled by 1 / micro-batches per replica).
// With kSum the buffers are summed (use it when losses are already scaled by
// 1 / global micro-batches, so the per-rank gradients add up to the global one).
//
// Buckets: parameters are registered in backward order (the first whose gradient is ready
// first). A bucket collects consecutive parameters until it holds at least `bucket_bytes`;
// a parameter larger than that gets a bucket of its own. With `auto_bucket` the synchroniser
// runs `tune_iterations` measured iterations (after one warm-up) with each candidate size,
// agrees with the group on the fastest (by the slowest rank's mean iteration time) and keeps
// it; rebucketing flushes parameters and moves the sharded optimizer state, so no update is
// lost.
//
// Parameters must be float32 buffers on the device of `device_ops` (the CPU by default) whose
// `value` and `grad` stay at the same address for the synchroniser's lifetime; packing,
// averaging, the norm and the optimizer run there (nothing is mirrored on the host), and the
// group's collectives get device buffers. A group of size 1 (no data parallelism)
// communicates nothing.
//
// Copies: a bucket packs its gradients (and, for DeAR, its parameters) into a flat buffer,
// unless the parameters' grad (value) buffers already follow each other in memory in
// registration order, e.g. views into one arena laid out in backward order; then the
// collectives run on them in place (BucketInPlace). In place, DeAR writes this rank's updated
// shard into the parameters at Step and the others' as the all-gather lands, so a parameter's
// values are only defined after WaitForParameters (which is the contract anyway).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"
#include "runtime/device_ops.h"
#include "runtime/optimizer.h"

namespace tandem::runtime {

enum class GradSyncStrategy : uint8_t { kAllReduce, kDeAR };
const char* GradSyncStrategyName(GradSyncStrategy strategy);  // "allreduce", "dear"
absl::StatusOr<GradSyncStrategy> ParseGradSyncStrategy(absl::string_view name);

enum class GradientReduction : uint8_t { kAverage, kSum };

inline constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;  // 25 MiB, as PyTorch DDP

struct GradSyncOptions {
  GradSyncStrategy strategy = GradSyncStrategy::kDeAR;
  int64_t bucket_bytes = kDefaultBucketBytes;  // fusion threshold
  bool auto_bucket = false;
  // Candidates for auto_bucket (sizes above the model's total collapse to one bucket).
  std::vector<int64_t> candidate_bucket_bytes = {int64_t{1} << 20, int64_t{4} << 20,
                                                 int64_t{16} << 20, int64_t{25} << 20,
                                                 int64_t{64} << 20};
  int tune_iterations = 3;
  GradientReduction reduction = GradientReduction::kAverage;
  OptimizerConfig optimizer;
  // The type gradients travel in: float32, or bfloat16 (half the bytes; each bucket is
  // rounded to bfloat16 before its all-reduce or reduce-scatter, summed in bfloat16 by the
  // backend, widened back to float32 before averaging, the norm and the optimizer, which stay
  // float32). Others are InvalidArgument.
  comm::DataType communication_type = comm::DataType::kFloat32;
  // Memory operations and optimizer on the parameters' device (runtime/device_ops.h); null:
  // the CPU loops. Must outlive the synchroniser.
  DeviceOps* device_ops = nullptr;
  // The same ranks as `group`, for small host-side agreements (parameter sizes, bucket
  // tuning) when `group` communicates device buffers only (NCCL); null: `group` itself.
  comm::Communicator* host_group = nullptr;
};

// One parameter as flat buffers (runtime::ParameterView carries the same fields).
struct SyncParameter {
  std::string name;
  comm::Buffer value;
  comm::Buffer grad;
  // False leaves the parameter out of LocalGradNormSquared: a copy whose gradient another
  // group counts already (the whole parameters of tensor-parallel lanes other than the first).
  bool counted_in_norm = true;
};

// Full (unsharded) optimizer state of one parameter, for checkpoints and state transfer.
struct ParameterOptimizerState {
  std::string name;
  int64_t steps = 0;
  std::vector<std::pair<std::string, std::vector<float>>> buffers;  // e.g. "exp_avg"
};

class GradientSync {
 public:
  // `group` is the stage's gradient group (runtime/groups.h) and must outlive the synchroniser.
  // `parameters` in backward order. Collective over `group`: checks that every rank registers
  // the same number of parameters with the same sizes (InvalidArgument names the parameter).
  static absl::StatusOr<std::unique_ptr<GradientSync>> Create(
      comm::Communicator& group, std::vector<SyncParameter> parameters,
      const GradSyncOptions& options);
  virtual ~GradientSync() = default;

  virtual absl::Status GradReady(int parameter) = 0;
  // All parameters of `bucket` are final (same as GradReady for each).
  virtual absl::Status BucketReady(int bucket) = 0;
  // Launches what is left and waits for the gradient reductions of this iteration.
  virtual absl::Status FinishBackward() = 0;
  // After FinishBackward: this rank's share of the squared L2 norm of the synchronised
  // gradients. Summed over all ranks of the group, every element counts exactly once (DeAR:
  // the rank's shards; all-reduce: group rank 0 counts everything, the others 0), except
  // those of parameters registered with counted_in_norm false.
  virtual double LocalGradNormSquared() const = 0;
  // FinishBackward that leaves the norm on its way to the host (DeviceOps::
  // StartTakingSquaredNorm): Step may follow at once, and LocalGradNormSquared holds the norm
  // after CollectGradNorm, which waits for the norm alone, not for the step. For a step that
  // does not depend on the norm (no clipping).
  virtual absl::Status FinishBackwardNormLater() = 0;
  virtual absl::Status CollectGradNorm() = 0;
  // Multiplies the synchronised gradients by `grad_scale`, then applies the optimizer with
  // learning rate `lr`. DeAR then starts the all-gathers (in forward order) and returns.
  virtual absl::Status Step(double lr, double grad_scale = 1.0) = 0;
  // Waits until parameter `parameter` holds this iteration's updated values.
  virtual absl::Status WaitForParameters(int parameter) = 0;
  // Makes every parameter complete.
  virtual absl::Status Flush() = 0;

  // Full optimizer state per parameter (collective over the group for DeAR: the shards are
  // gathered; flushes first). LoadOptimizerState is the inverse (names must match).
  virtual absl::StatusOr<std::vector<ParameterOptimizerState>> GatherOptimizerState() = 0;
  virtual absl::Status LoadOptimizerState(const std::vector<ParameterOptimizerState>& state) = 0;

  virtual GradSyncStrategy strategy() const = 0;
  virtual int num_parameters() const = 0;
  virtual int num_buckets() const = 0;
  virtual int BucketOf(int parameter) const = 0;
  // Whether bucket `bucket` communicates its gradients in place (no packing); for DeAR also
  // its parameters.
  virtual bool BucketInPlace(int bucket) const = 0;
  virtual int64_t bucket_bytes() const = 0;
  // While auto_bucket is still measuring.
  virtual bool tuning() const = 0;
  // Candidates and their measured mean iteration times (empty without auto_bucket).
  virtual std::string TuningReport() const = 0;
};

// Bucket assignment used by GradientSync: bucket index per parameter (in registration order),
// for parameters of `element_counts` float32 elements and a `bucket_bytes` threshold.
std::vector<int> AssignBuckets(const std::vector<int64_t>& element_counts, int64_t bucket_bytes);

}  // namespace tandem::runtime
