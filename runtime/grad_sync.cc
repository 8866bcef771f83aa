#include "runtime/grad_sync.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/buffer.h"
#include "common/status.h"
#include "runtime/device_ops.h"

namespace tandem::runtime {

using comm::Buffer;
using comm::Communicator;
using comm::CpuBuffer;
using comm::MakeBuffer;
using comm::DataType;
using comm::DeviceKind;
using comm::ReduceOp;
using comm::Shard;
using comm::ShardRange;
using comm::WorkPtr;
namespace {

constexpr int64_t kFloatBytes = sizeof(float);

// Consecutive AverageAndAddSquaredNorm calls whose buffers adjoin (each destination next to
// the run so far, above or below it, its source at the same distance from it as the run's)
// and which the norm counts alike, issued as one call: one pass over a stage's gradient arena
// instead of one per parameter (three kernels each on a GPU: about 440 for GPT-2 small,
// mostly too small to fill the device).
class CoalescedAverage {
 public:
  CoalescedAverage(DeviceOps& ops, float divisor, bool divide)
      : ops_(ops), divisor_(divisor), divide_(divide) {}
  CoalescedAverage(const CoalescedAverage&) = delete;
  CoalescedAverage& operator=(const CoalescedAverage&) = delete;

  absl::Status Add(float* dst, const float* src, int64_t count, bool add_to_norm) {
    if (count <= 0) return absl::OkStatus();
    const intptr_t shift = reinterpret_cast<intptr_t>(src) - reinterpret_cast<intptr_t>(dst);
    if (count_ > 0 && add_to_norm == add_to_norm_ && shift == shift_) {
      if (dst == low_ + count_) {
        count_ += count;
        return absl::OkStatus();
      }
      if (dst + count == low_) {
        low_ = dst;
        count_ += count;
        return absl::OkStatus();
      }
    }
    TANDEM_RETURN_IF_ERROR(Flush());
    low_ = dst;
    count_ = count;
    shift_ = shift;
    add_to_norm_ = add_to_norm;
    return absl::OkStatus();
  }

  absl::Status Flush() {
    if (count_ == 0) return absl::OkStatus();
    const auto* src = reinterpret_cast<const float*>(reinterpret_cast<intptr_t>(low_) + shift_);
    const int64_t count = count_;
    count_ = 0;
    return ops_.AverageAndAddSquaredNorm(low_, src, count, divisor_, divide_, add_to_norm_);
  }

 private:
  DeviceOps& ops_;
  const float divisor_;
  const bool divide_;
  float* low_ = nullptr;
  int64_t count_ = 0;
  intptr_t shift_ = 0;  // source address minus destination address
  bool add_to_norm_ = false;
};

// One fusion bucket.
struct Bucket {
  std::vector<int> parameters;   // registration indices, in order
  std::vector<int64_t> offsets;  // offset of each parameter in the flat layout
  int64_t count = 0;
  ShardRange shard;              // this rank's shard (DeAR)
  // Gradients in the flat layout: reduced in place (all-reduce) or the reduce-scatter's input
  // (DeAR). When the parameters' grad buffers are adjacent in registration order they are used
  // as they are (grads_in_place); otherwise they are packed into packed_grad.
  float* grad = nullptr;
  bool grads_in_place = false;
  DeviceArray packed_grad;
  DeviceArray shard_grad;  // DeAR: the reduced shard
  // Gradients communicated in bfloat16: the bucket (and DeAR's reduced shard) as bfloat16,
  // two per float of storage.
  DeviceArray wire;
  DeviceArray shard_wire;
  // DeAR: parameters in the flat layout, updated (own shard) and all-gathered in place; the
  // value buffers themselves when adjacent (params_in_place), else packed_param.
  float* param = nullptr;
  bool params_in_place = false;
  DeviceArray packed_param;
  int ready = 0;
  bool launched = false;
  WorkPtr reduction;  // this iteration's all-reduce / reduce-scatter
  WorkPtr gather;     // DeAR: all-gather of the updated parameters
};

class BucketedGradientSync : public GradientSync {
 public:
  BucketedGradientSync(Communicator& group, std::vector<SyncParameter> parameters,
                       const GradSyncOptions& options)
      : group_(group),
        host_group_(options.host_group != nullptr ? *options.host_group : group),
        ops_(options.device_ops != nullptr ? *options.device_ops : DefaultCpuDeviceOps()),
        parameters_(std::move(parameters)),
        options_(options),
        local_(group.size() == 1) {}

  absl::Status Init();

  absl::Status GradReady(int parameter) override;
  absl::Status BucketReady(int bucket) override;
  absl::Status FinishBackward() override { return FinishBackward(/*norm_later=*/false); }
  double LocalGradNormSquared() const override { return norm_squared_; }
  absl::Status FinishBackwardNormLater() override { return FinishBackward(/*norm_later=*/true); }
  absl::Status CollectGradNorm() override;
  absl::Status Step(double lr, double grad_scale) override;
  absl::Status WaitForParameters(int parameter) override;
  absl::Status Flush() override;
  absl::StatusOr<std::vector<ParameterOptimizerState>> GatherOptimizerState() override;
  absl::Status LoadOptimizerState(const std::vector<ParameterOptimizerState>& state) override;

  GradSyncStrategy strategy() const override { return options_.strategy; }
  int num_parameters() const override { return static_cast<int>(parameters_.size()); }
  int num_buckets() const override { return static_cast<int>(buckets_.size()); }
  int BucketOf(int parameter) const override {
    return parameter >= 0 && parameter < num_parameters() ? bucket_of_[parameter] : -1;
  }
  bool BucketInPlace(int bucket) const override {
    if (bucket < 0 || bucket >= num_buckets() || local_) return local_;
    const Bucket& b = buckets_[bucket];
    return b.grads_in_place && (!sharded() || b.params_in_place);
  }
  int64_t bucket_bytes() const override { return bucket_bytes_; }
  bool tuning() const override { return tuning_; }
  std::string TuningReport() const override;

 private:
  // Both FinishBackwards: the norm taken now, or only started towards the host.
  absl::Status FinishBackward(bool norm_later);
  // Sharded state (DeAR over a real group) versus one full state per parameter.
  bool sharded() const { return options_.strategy == GradSyncStrategy::kDeAR && !local_; }
  // The collectives sum; averaging happens in the pass that also unpacks and takes the norm
  // (one pass over the data instead of three).
  bool averaging() const { return options_.reduction == GradientReduction::kAverage; }
  bool bf16_wire() const { return options_.communication_type == DataType::kBFloat16; }
  static uint16_t* Wire(DeviceArray& array) { return reinterpret_cast<uint16_t*>(array.data); }
  // A bfloat16 buffer on the stage's device.
  Buffer WireBuffer(uint16_t* data, int64_t count) const {
    Buffer b = MakeBuffer(data, count, DataType::kBFloat16);
    b.device = ops_.device();
    return b;
  }
  int64_t Count(int parameter) const { return parameters_[parameter].value.count; }
  float* Value(int parameter) const { return static_cast<float*>(parameters_[parameter].value.data); }
  float* Grad(int parameter) const { return static_cast<float*>(parameters_[parameter].grad.data); }

  void BuildBuckets(int64_t bucket_bytes);
  // Whether the bucket's buffers (Grad or Value) follow each other in memory in registration
  // order, so the bucket can use them without copies.
  bool Adjacent(const Bucket& bucket, float* (BucketedGradientSync::*buffer)(int) const) const {
    for (size_t j = 1; j < bucket.parameters.size(); ++j) {
      const int previous = bucket.parameters[j - 1];
      if ((this->*buffer)(bucket.parameters[j]) != (this->*buffer)(previous) + Count(previous)) {
        return false;
      }
    }
    return !bucket.parameters.empty() && (this->*buffer)(bucket.parameters[0]) != nullptr;
  }
  absl::Status LaunchReadyBuckets();
  // DeAR: averages this rank's reduced shard of `bucket` and adds it to the norm (leaving out
  // the parameters not counted in it).
  absl::Status AverageShard(Bucket& bucket, float group_size);
  absl::Status Launch(Bucket& bucket);
  absl::Status WaitBucketParameters(Bucket& bucket);
  absl::Status AfterStep();  // auto-bucket bookkeeping
  absl::Status Rebucket(int64_t bucket_bytes);
  std::string Where(const std::string& what) const {
    return absl::StrCat("gradient sync (", GradSyncStrategyName(options_.strategy), ", rank ",
                        group_.rank(), " of ", group_.size(), ", iteration ", iteration_, "): ",
                        what);
  }

  // A float32 buffer on the stage's device, for the group's collectives.
  Buffer DeviceBuffer(float* data, int64_t count) const {
    Buffer b = CpuBuffer(data, count);
    b.device = ops_.device();
    return b;
  }
  // Span pointers for the optimizers.
  std::vector<float*> ParameterValues() const;
  std::vector<float*> ParameterGrads() const;
  absl::Status BuildBucketsAndState(int64_t bucket_bytes);
  void StartGather(Bucket& bucket, float* shard_param) {
    bucket.gather = group_.AllGather(
        DeviceBuffer(bucket.shard.count > 0 ? shard_param : nullptr, bucket.shard.count),
        DeviceBuffer(bucket.param, bucket.count));
  }

  Communicator& group_;       // collectives on the device buffers
  Communicator& host_group_;  // same ranks, host buffers (agreements)
  DeviceOps& ops_;
  std::vector<SyncParameter> parameters_;
  GradSyncOptions options_;
  const bool local_;
  int64_t bucket_bytes_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
  std::vector<bool> grad_ready_;
  int next_launch_ = 0;
  bool backward_finished_ = false;
  double norm_squared_ = 0;
  bool norm_on_its_way_ = false;  // FinishBackwardNormLater's, until CollectGradNorm
  int64_t iteration_ = 0;
  // All-reduce strategy (or a group of one): one span per parameter, full state. DeAR: one
  // span per bucket, this rank's shard of it.
  std::unique_ptr<DeviceOptimizer> optimizer_;

  // auto_bucket.
  bool tuning_ = false;
  std::vector<int64_t> candidates_;
  size_t candidate_ = 0;
  int intervals_seen_ = 0;
  std::vector<double> interval_sums_;
  std::vector<int> interval_counts_;
  std::vector<double> agreed_means_;
  bool has_last_step_ = false;
  absl::Time last_step_end_;
};

absl::Status BucketedGradientSync::Init() {
  TANDEM_RETURN_IF_ERROR(ValidateOptimizerConfig(options_.optimizer));
  for (int i = 0; i < num_parameters(); ++i) {
    const SyncParameter& p = parameters_[i];
    const std::string what = absl::StrCat("parameter ", i, " ('", p.name, "')");
    if (p.value.dtype != DataType::kFloat32 || p.grad.dtype != DataType::kFloat32) {
      return absl::InvalidArgumentError(Where(what + " is not float32"));
    }
    if (p.value.device != ops_.device() || p.grad.device != ops_.device()) {
      return absl::InvalidArgumentError(Where(absl::StrCat(
          what, " is not on the device of the synchroniser's operations (", ops_.name(), ")")));
    }
    if (p.value.count != p.grad.count) {
      return absl::InvalidArgumentError(Where(absl::StrCat(
          what, " has ", p.value.count, " values but ", p.grad.count, " gradients")));
    }
    if (p.value.count < 0 || (p.value.count > 0 && (p.value.data == nullptr || p.grad.data == nullptr))) {
      return absl::InvalidArgumentError(Where(what + " has a null buffer or negative count"));
    }
  }
  if (options_.bucket_bytes <= 0 && !options_.auto_bucket) {
    return absl::InvalidArgumentError(
        Where(absl::StrCat("bucket_bytes must be positive, got ", options_.bucket_bytes)));
  }
  if (options_.auto_bucket && ops_.device().kind != DeviceKind::kCpu) {
    return absl::UnimplementedError(Where("automatic bucket sizes are tuned on CPU stages only"));
  }
  if (options_.auto_bucket && options_.tune_iterations < 1) {
    return absl::InvalidArgumentError(Where("tune_iterations must be at least 1"));
  }
  // Every rank must register the same parameters: compare element counts (and the number of
  // parameters) across the group with one all-reduce of (max, -min).
  if (!local_) {
    const int n = num_parameters();
    std::vector<int64_t> signature(2 * (n + 1));
    signature[0] = n;
    signature[n + 1] = -n;
    for (int i = 0; i < n; ++i) {
      signature[1 + i] = Count(i);
      signature[n + 2 + i] = -Count(i);
    }
    // Different numbers of parameters give different lengths: compare the lengths first.
    int64_t lengths[2] = {n, -n};
    TANDEM_RETURN_IF_ERROR(
        host_group_.AllReduce(CpuBuffer(lengths, 2), ReduceOp::kMax)->Wait());
    if (lengths[0] != -lengths[1]) {
      return absl::InvalidArgumentError(Where(absl::StrCat(
          "ranks register different numbers of parameters (this rank ", n, ", min ",
          -lengths[1], ", max ", lengths[0], ")")));
    }
    TANDEM_RETURN_IF_ERROR(host_group_
                               .AllReduce(CpuBuffer(signature.data(),
                                                    static_cast<int64_t>(signature.size())),
                                          ReduceOp::kMax)
                               ->Wait());
    for (int i = 0; i < n; ++i) {
      const int64_t max_count = signature[1 + i];
      const int64_t min_count = -signature[n + 2 + i];
      if (max_count != min_count) {
        return absl::InvalidArgumentError(Where(absl::StrCat(
            "parameter ", i, " ('", parameters_[i].name, "') has ", Count(i),
            " elements here; across the group between ", min_count, " and ", max_count)));
      }
    }
  }
  int64_t initial_bytes = options_.bucket_bytes;
  if (options_.auto_bucket) {
    // Distinct bucketings only (e.g. every candidate at or above the model's size gives one
    // bucket): a candidate is kept if it groups the parameters differently from the last kept.
    std::vector<int64_t> counts(num_parameters());
    for (int i = 0; i < num_parameters(); ++i) counts[i] = Count(i);
    std::vector<int64_t> sorted = options_.candidate_bucket_bytes;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> last_assignment;
    for (int64_t c : sorted) {
      if (c <= 0) continue;
      std::vector<int> assignment = AssignBuckets(counts, c);
      if (!candidates_.empty() && assignment == last_assignment) continue;
      candidates_.push_back(c);
      last_assignment = std::move(assignment);
    }
    if (candidates_.empty()) {
      return absl::InvalidArgumentError(Where("auto_bucket needs a positive candidate size"));
    }
    tuning_ = candidates_.size() > 1;
    interval_sums_.assign(candidates_.size(), 0.0);
    interval_counts_.assign(candidates_.size(), 0);
    initial_bytes = candidates_[0];
  }
  return BuildBucketsAndState(initial_bytes);
}

absl::Status BucketedGradientSync::BuildBucketsAndState(int64_t bucket_bytes) {
  BuildBuckets(bucket_bytes);
  std::vector<int64_t> counts;
  if (sharded()) {
    for (const Bucket& bucket : buckets_) counts.push_back(bucket.shard.count);
  } else {
    for (int i = 0; i < num_parameters(); ++i) counts.push_back(Count(i));
  }
  TANDEM_ASSIGN_OR_RETURN(optimizer_, ops_.NewOptimizer(options_.optimizer, std::move(counts)));
  for (Bucket& bucket : buckets_) {
    if (local_) continue;
    if (!bucket.grads_in_place) {
      TANDEM_ASSIGN_OR_RETURN(bucket.packed_grad, ops_.Zeros(bucket.count));
      bucket.grad = bucket.packed_grad.data;
    }
    if (bf16_wire()) {
      TANDEM_ASSIGN_OR_RETURN(bucket.wire, ops_.Zeros((bucket.count + 1) / 2));
    }
    if (!sharded()) continue;
    TANDEM_ASSIGN_OR_RETURN(bucket.shard_grad, ops_.Zeros(bucket.shard.count));
    if (bf16_wire()) {
      TANDEM_ASSIGN_OR_RETURN(bucket.shard_wire, ops_.Zeros((bucket.shard.count + 1) / 2));
    }
    if (!bucket.params_in_place) {
      TANDEM_ASSIGN_OR_RETURN(bucket.packed_param, ops_.Zeros(bucket.count));
      bucket.param = bucket.packed_param.data;
    }
  }
  return absl::OkStatus();
}

std::vector<float*> BucketedGradientSync::ParameterValues() const {
  std::vector<float*> out(num_parameters());
  for (int p = 0; p < num_parameters(); ++p) out[p] = Value(p);
  return out;
}

std::vector<float*> BucketedGradientSync::ParameterGrads() const {
  std::vector<float*> out(num_parameters());
  for (int p = 0; p < num_parameters(); ++p) out[p] = Grad(p);
  return out;
}

void BucketedGradientSync::BuildBuckets(int64_t bucket_bytes) {
  bucket_bytes_ = bucket_bytes;
  std::vector<int64_t> counts(num_parameters());
  for (int i = 0; i < num_parameters(); ++i) counts[i] = Count(i);
  bucket_of_ = AssignBuckets(counts, bucket_bytes);
  const int num = bucket_of_.empty() ? 0 : bucket_of_.back() + 1;
  buckets_.clear();
  buckets_.resize(num);
  for (int i = 0; i < num_parameters(); ++i) {
    Bucket& bucket = buckets_[bucket_of_[i]];
    bucket.parameters.push_back(i);
    bucket.offsets.push_back(bucket.count);
    bucket.count += Count(i);
  }
  for (Bucket& bucket : buckets_) {
    if (local_) continue;  // nothing to pack
    // Buffers that are not in place are allocated by BuildBucketsAndState.
    bucket.grads_in_place = Adjacent(bucket, &BucketedGradientSync::Grad);
    if (bucket.grads_in_place) bucket.grad = Grad(bucket.parameters[0]);
    if (sharded()) {
      bucket.shard = Shard(bucket.count, group_.size(), group_.rank());
      bucket.params_in_place = Adjacent(bucket, &BucketedGradientSync::Value);
      if (bucket.params_in_place) bucket.param = Value(bucket.parameters[0]);
    }
  }
  grad_ready_.assign(num_parameters(), false);
  next_launch_ = 0;
}

absl::Status BucketedGradientSync::GradReady(int parameter) {
  if (parameter < 0 || parameter >= num_parameters()) {
    return absl::InvalidArgumentError(
        Where(absl::StrCat("GradReady: parameter ", parameter, " out of range [0, ",
                           num_parameters(), ")")));
  }
  if (backward_finished_) {
    return absl::FailedPreconditionError(
        Where("GradReady after FinishBackward (call Step first)"));
  }
  if (grad_ready_[parameter]) {
    return absl::FailedPreconditionError(Where(absl::StrCat(
        "GradReady called twice for parameter ", parameter, " ('", parameters_[parameter].name,
        "') in one iteration")));
  }
  grad_ready_[parameter] = true;
  ++buckets_[bucket_of_[parameter]].ready;
  return LaunchReadyBuckets();
}

absl::Status BucketedGradientSync::BucketReady(int bucket) {
  if (bucket < 0 || bucket >= num_buckets()) {
    return absl::InvalidArgumentError(Where(absl::StrCat(
        "BucketReady: bucket ", bucket, " out of range [0, ", num_buckets(), ")")));
  }
  for (int p : buckets_[bucket].parameters) {
    if (!grad_ready_[p]) TANDEM_RETURN_IF_ERROR(GradReady(p));
  }
  return absl::OkStatus();
}

absl::Status BucketedGradientSync::LaunchReadyBuckets() {
  // In bucket order, so every rank issues its collectives in the same order.
  while (next_launch_ < num_buckets()) {
    Bucket& bucket = buckets_[next_launch_];
    if (bucket.ready < static_cast<int>(bucket.parameters.size())) break;
    TANDEM_RETURN_IF_ERROR(Launch(bucket));
    ++next_launch_;
  }
  return absl::OkStatus();
}

absl::Status BucketedGradientSync::Launch(Bucket& bucket) {
  bucket.launched = true;
  if (local_) return absl::OkStatus();
  // A parameter's gradient may only be packed once its all-gather (previous iteration) has
  // landed: the runtime waits for parameters before forward, so this is already the case.
  TANDEM_RETURN_IF_ERROR(WaitBucketParameters(bucket));
  for (size_t j = 0; j < bucket.parameters.size() && !bucket.grads_in_place; ++j) {
    const int p = bucket.parameters[j];
    if (Count(p) > 0) {
      TANDEM_RETURN_IF_ERROR(ops_.Copy(bucket.grad + bucket.offsets[j], Grad(p), Count(p)));
    }
  }
  if (bf16_wire()) {
    TANDEM_RETURN_IF_ERROR(ops_.ToBFloat16(Wire(bucket.wire), bucket.grad, bucket.count));
    const Buffer wire = WireBuffer(Wire(bucket.wire), bucket.count);
    bucket.reduction =
        sharded() ? group_.ReduceScatter(
                        wire, WireBuffer(Wire(bucket.shard_wire), bucket.shard.count),
                        ReduceOp::kSum)
                  : group_.AllReduce(wire, ReduceOp::kSum);
    return absl::OkStatus();
  }
  const Buffer flat = DeviceBuffer(bucket.grad, bucket.count);
  if (sharded()) {
    bucket.reduction = group_.ReduceScatter(
        flat, DeviceBuffer(bucket.shard_grad.data, bucket.shard.count), ReduceOp::kSum);
  } else {
    bucket.reduction = group_.AllReduce(flat, ReduceOp::kSum);
  }
  return absl::OkStatus();
}

absl::Status BucketedGradientSync::CollectGradNorm() {
  if (!norm_on_its_way_) return absl::OkStatus();
  norm_on_its_way_ = false;
  TANDEM_ASSIGN_OR_RETURN(norm_squared_, ops_.TakeSquaredNorm());
  return absl::OkStatus();
}

absl::Status BucketedGradientSync::FinishBackward(bool norm_later) {
  if (backward_finished_) {
    return absl::FailedPreconditionError(Where("FinishBackward called twice (call Step first)"));
  }
  for (Bucket& bucket : buckets_) bucket.ready = static_cast<int>(bucket.parameters.size());
  std::fill(grad_ready_.begin(), grad_ready_.end(), true);
  TANDEM_RETURN_IF_ERROR(LaunchReadyBuckets());
  TANDEM_RETURN_IF_ERROR(ops_.TakeSquaredNorm().status());  // start from zero
  if (local_) {
    // Nothing to average: the norm of the counted gradients, a run of adjoining ones at a time.
    CoalescedAverage norm(ops_, 1.0f, /*divide=*/false);
    for (int p = 0; p < num_parameters(); ++p) {
      if (!parameters_[p].counted_in_norm) continue;
      TANDEM_RETURN_IF_ERROR(norm.Add(Grad(p), Grad(p), Count(p), /*add_to_norm=*/true));
    }
    TANDEM_RETURN_IF_ERROR(norm.Flush());
  }
  const float group_size = static_cast<float>(group_.size());
  CoalescedAverage average(ops_, group_size, averaging());
  for (size_t b = 0; b < buckets_.size() && !local_; ++b) {
    Bucket& bucket = buckets_[b];
    const absl::Status status = bucket.reduction->Wait();
    if (!status.ok()) return Annotate(status, Where(absl::StrCat("bucket ", b)));
    bucket.reduction.reset();
    if (bf16_wire()) {  // back to float32 where the float32 path would have it
      TANDEM_RETURN_IF_ERROR(
          sharded() ? ops_.FromBFloat16(bucket.shard_grad.data, Wire(bucket.shard_wire),
                                        bucket.shard.count)
                    : ops_.FromBFloat16(bucket.grad, Wire(bucket.wire), bucket.count));
    }
    if (sharded()) {
      TANDEM_RETURN_IF_ERROR(AverageShard(bucket, group_size));
      continue;
    }
    // All-reduce: the reduced gradients go back into the parameters' grad buffers, averaged on
    // the way; group rank 0 alone counts them in the norm. In-place buckets of adjoining
    // parameters are one pass (across buckets too).
    for (size_t j = 0; j < bucket.parameters.size(); ++j) {
      const int p = bucket.parameters[j];
      const float* reduced = bucket.grad + bucket.offsets[j];  // == Grad(p) when in place
      TANDEM_RETURN_IF_ERROR(
          average.Add(Grad(p), reduced, Count(p),
                      /*add_to_norm=*/group_.rank() == 0 && parameters_[p].counted_in_norm));
    }
  }
  TANDEM_RETURN_IF_ERROR(average.Flush());
  bool started = false;
  if (norm_later) {
    TANDEM_ASSIGN_OR_RETURN(started, ops_.StartTakingSquaredNorm());
  }
  if (started) {
    norm_on_its_way_ = true;
    norm_squared_ = 0;
  } else {
    TANDEM_ASSIGN_OR_RETURN(norm_squared_, ops_.TakeSquaredNorm());
  }
  backward_finished_ = true;
  return absl::OkStatus();
}

absl::Status BucketedGradientSync::AverageShard(Bucket& bucket, float group_size) {
  float* shard = bucket.shard_grad.data;
  bool all_counted = true;
  for (int p : bucket.parameters) all_counted = all_counted && parameters_[p].counted_in_norm;
  if (all_counted) {
    return ops_.AverageAndAddSquaredNorm(shard, shard, bucket.shard.count, group_size,
                                         averaging(), /*add_to_norm=*/true);
  }
  // Piece by piece: where the shard overlaps each parameter.
  const int64_t first = bucket.shard.offset, end = first + bucket.shard.count;
  for (size_t j = 0; j < bucket.parameters.size(); ++j) {
    const int p = bucket.parameters[j];
    const int64_t from = std::max(first, bucket.offsets[j]);
    const int64_t to = std::min(end, bucket.offsets[j] + Count(p));
    if (from >= to) continue;
    TANDEM_RETURN_IF_ERROR(ops_.AverageAndAddSquaredNorm(
        shard + (from - first), shard + (from - first), to - from, group_size, averaging(),
        /*add_to_norm=*/parameters_[p].counted_in_norm));
  }
  return absl::OkStatus();
}

absl::Status BucketedGradientSync::Step(double lr, double grad_scale) {
  if (!backward_finished_) {
    return absl::FailedPreconditionError(Where("Step before FinishBackward"));
  }
  if (!sharded()) {
    TANDEM_RETURN_IF_ERROR(
        optimizer_->Step(/*first_span=*/0, ParameterValues(), ParameterGrads(), lr, grad_scale));
  } else {
    // Per bucket, in forward order (last bucket first: the first layers' parameters arrive
    // first): this rank's shard of the current parameter values (they may have been changed
    // outside, e.g. by a checkpoint load, so they are read from the parameters each time), the
    // optimizer on the shard, the all-gather. A fused optimizer steps every shard in one call
    // before the all-gathers start.
    const bool fused = ops_.prefers_fused_steps();
    std::vector<float*> shard_params(buckets_.size());
    std::vector<float*> shard_grads(buckets_.size());
    for (int b = num_buckets() - 1; b >= 0; --b) {
      Bucket& bucket = buckets_[b];
      const ShardRange shard = bucket.shard;
      for (size_t j = 0; j < bucket.parameters.size() && !bucket.params_in_place; ++j) {
        const int p = bucket.parameters[j];
        const int64_t begin = std::max(shard.offset, bucket.offsets[j]);
        const int64_t end = std::min(shard.offset + shard.count, bucket.offsets[j] + Count(p));
        if (begin < end) {
          TANDEM_RETURN_IF_ERROR(ops_.Copy(bucket.param + begin,
                                           Value(p) + (begin - bucket.offsets[j]), end - begin));
        }
      }
      shard_params[b] = bucket.param + shard.offset;
      shard_grads[b] = bucket.shard_grad.data;
      if (fused) continue;
      TANDEM_RETURN_IF_ERROR(optimizer_->Step(b, absl::MakeConstSpan(&shard_params[b], 1),
                                              absl::MakeConstSpan(&shard_grads[b], 1), lr,
                                              grad_scale));
      StartGather(bucket, shard_params[b]);
    }
    if (fused) {
      TANDEM_RETURN_IF_ERROR(
          optimizer_->Step(/*first_span=*/0, shard_params, shard_grads, lr, grad_scale));
      for (int b = num_buckets() - 1; b >= 0; --b) StartGather(buckets_[b], shard_params[b]);
    }
  }
  for (Bucket& bucket : buckets_) {
    bucket.ready = 0;
    bucket.launched = false;
  }
  std::fill(grad_ready_.begin(), grad_ready_.end(), false);
  next_launch_ = 0;
  backward_finished_ = false;
  ++iteration_;
  return AfterStep();
}

absl::Status BucketedGradientSync::WaitBucketParameters(Bucket& bucket) {
  if (!bucket.gather) return absl::OkStatus();
  const absl::Status status = bucket.gather->Wait();
  if (!status.ok()) return Annotate(status, Where("parameter all-gather"));
  bucket.gather.reset();
  for (size_t j = 0; j < bucket.parameters.size() && !bucket.params_in_place; ++j) {
    const int p = bucket.parameters[j];
    if (Count(p) > 0) {
      TANDEM_RETURN_IF_ERROR(ops_.Copy(Value(p), bucket.param + bucket.offsets[j], Count(p)));
    }
  }
  return absl::OkStatus();
}

absl::Status BucketedGradientSync::WaitForParameters(int parameter) {
  if (parameter < 0 || parameter >= num_parameters()) {
    return absl::InvalidArgumentError(Where(absl::StrCat(
        "WaitForParameters: parameter ", parameter, " out of range [0, ", num_parameters(), ")")));
  }
  return WaitBucketParameters(buckets_[bucket_of_[parameter]]);
}

absl::Status BucketedGradientSync::Flush() {
  // In issue order (forward order), which is also the order they complete in.
  for (int b = num_buckets() - 1; b >= 0; --b) {
    TANDEM_RETURN_IF_ERROR(WaitBucketParameters(buckets_[b]));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ParameterOptimizerState>>
BucketedGradientSync::GatherOptimizerState() {
  TANDEM_RETURN_IF_ERROR(Flush());
  std::vector<ParameterOptimizerState> result(num_parameters());
  for (int p = 0; p < num_parameters(); ++p) {
    result[p].name = parameters_[p].name;
    result[p].steps = optimizer_->steps();
  }
  const std::vector<std::string> names = optimizer_->BufferNames();
  if (!sharded()) {
    for (int p = 0; p < num_parameters(); ++p) {
      for (const std::string& name : names) {
        TANDEM_ASSIGN_OR_RETURN(float* buffer, optimizer_->StateBuffer(p, name, false));
        std::vector<float> values;
        if (buffer != nullptr) {
          values.resize(static_cast<size_t>(Count(p)));
          TANDEM_RETURN_IF_ERROR(ops_.CopyToHost(values.data(), buffer, Count(p)));
        }
        result[p].buffers.emplace_back(name, std::move(values));
      }
    }
    return result;
  }
  // A buffer exists on every rank once the optimizer has stepped (SGD's momentum buffer is
  // created by the first step; steps agree across the group), so the all-gathers match.
  const bool has_state = optimizer_->steps() > 0 &&
                         (options_.optimizer.kind == OptimizerKind::kAdamW ||
                          options_.optimizer.momentum != 0.0);
  for (int b = 0; b < num_buckets(); ++b) {
    Bucket& bucket = buckets_[b];
    for (const std::string& name : names) {
      std::vector<float> full;
      if (has_state) {
        TANDEM_ASSIGN_OR_RETURN(float* shard, optimizer_->StateBuffer(b, name, true));
        TANDEM_ASSIGN_OR_RETURN(DeviceArray gathered, ops_.Zeros(bucket.count));
        TANDEM_RETURN_IF_ERROR(
            group_
                .AllGather(DeviceBuffer(bucket.shard.count > 0 ? shard : nullptr,
                                        bucket.shard.count),
                           DeviceBuffer(gathered.data, bucket.count))
                ->Wait());
        full.resize(static_cast<size_t>(bucket.count));
        TANDEM_RETURN_IF_ERROR(ops_.CopyToHost(full.data(), gathered.data, bucket.count));
      }
      for (size_t j = 0; j < bucket.parameters.size(); ++j) {
        const int p = bucket.parameters[j];
        std::vector<float> values;
        if (has_state) {
          values.assign(full.begin() + bucket.offsets[j],
                        full.begin() + bucket.offsets[j] + Count(p));
        }
        result[p].buffers.emplace_back(name, std::move(values));
      }
    }
  }
  return result;
}

absl::Status BucketedGradientSync::LoadOptimizerState(
    const std::vector<ParameterOptimizerState>& state) {
  if (static_cast<int>(state.size()) != num_parameters()) {
    return absl::InvalidArgumentError(Where(absl::StrCat("optimizer state has ", state.size(),
                                                         " parameters, expected ",
                                                         num_parameters())));
  }
  // Checks names and sizes, and returns the named buffer of parameter p (nullptr if empty).
  auto find = [&](int p, const std::string& name) -> absl::StatusOr<const std::vector<float>*> {
    if (state[p].name != parameters_[p].name) {
      return absl::InvalidArgumentError(Where(absl::StrCat("optimizer state ", p, " is for '",
                                                           state[p].name, "', expected '",
                                                           parameters_[p].name, "'")));
    }
    for (const auto& [buffer_name, values] : state[p].buffers) {
      if (buffer_name != name) continue;
      if (values.empty()) return nullptr;
      if (static_cast<int64_t>(values.size()) != Count(p)) {
        return absl::InvalidArgumentError(Where(absl::StrCat(
            "optimizer state '", name, "' of '", parameters_[p].name, "' has ", values.size(),
            " elements, expected ", Count(p))));
      }
      return &values;
    }
    return nullptr;
  };
  optimizer_->set_steps(state.empty() ? 0 : state[0].steps);
  const std::vector<std::string> names = optimizer_->BufferNames();
  if (!sharded()) {
    for (int p = 0; p < num_parameters(); ++p) {
      for (const std::string& name : names) {
        TANDEM_ASSIGN_OR_RETURN(const std::vector<float>* values, find(p, name));
        if (values == nullptr) {
          TANDEM_RETURN_IF_ERROR(optimizer_->ResetStateBuffer(p, name));
          continue;
        }
        TANDEM_ASSIGN_OR_RETURN(float* buffer, optimizer_->StateBuffer(p, name, true));
        TANDEM_RETURN_IF_ERROR(ops_.CopyFromHost(buffer, values->data(), Count(p)));
      }
    }
    return absl::OkStatus();
  }
  for (int b = 0; b < num_buckets(); ++b) {
    Bucket& bucket = buckets_[b];
    for (const std::string& name : names) {
      bool any = false;
      std::vector<float> shard(bucket.shard.count, 0.0f);
      for (size_t j = 0; j < bucket.parameters.size(); ++j) {
        const int p = bucket.parameters[j];
        TANDEM_ASSIGN_OR_RETURN(const std::vector<float>* values, find(p, name));
        if (values == nullptr) continue;
        any = true;
        const int64_t begin = std::max(bucket.shard.offset, bucket.offsets[j]);
        const int64_t end =
            std::min(bucket.shard.offset + bucket.shard.count, bucket.offsets[j] + Count(p));
        for (int64_t i = begin; i < end; ++i) {
          shard[i - bucket.shard.offset] = (*values)[i - bucket.offsets[j]];
        }
      }
      if (!any) {  // SGD before its first step; AdamW zeroes
        TANDEM_RETURN_IF_ERROR(optimizer_->ResetStateBuffer(b, name));
        continue;
      }
      TANDEM_ASSIGN_OR_RETURN(float* buffer, optimizer_->StateBuffer(b, name, true));
      TANDEM_RETURN_IF_ERROR(ops_.CopyFromHost(buffer, shard.data(), bucket.shard.count));
    }
  }
  return absl::OkStatus();
}

absl::Status BucketedGradientSync::Rebucket(int64_t bucket_bytes) {
  if (bucket_bytes == bucket_bytes_) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(std::vector<ParameterOptimizerState> state, GatherOptimizerState());
  TANDEM_RETURN_IF_ERROR(BuildBucketsAndState(bucket_bytes));
  return LoadOptimizerState(state);
}

absl::Status BucketedGradientSync::AfterStep() {
  if (!tuning_) return absl::OkStatus();
  const absl::Time now = absl::Now();
  if (has_last_step_) {
    ++intervals_seen_;
    if (intervals_seen_ > 1) {  // the first iteration of a candidate is a warm-up
      interval_sums_[candidate_] += absl::ToDoubleSeconds(now - last_step_end_);
      ++interval_counts_[candidate_];
    }
  }
  has_last_step_ = true;
  last_step_end_ = now;
  if (interval_counts_[candidate_] < options_.tune_iterations) return absl::OkStatus();
  ++candidate_;
  intervals_seen_ = 0;
  if (candidate_ < candidates_.size()) {
    TANDEM_RETURN_IF_ERROR(Rebucket(candidates_[candidate_]));
    last_step_end_ = absl::Now();  // rebucketing is not part of the next iteration
    return absl::OkStatus();
  }
  // Agree on the slowest rank's mean per candidate, then keep the fastest candidate.
  agreed_means_.assign(candidates_.size(), 0.0);
  for (size_t c = 0; c < candidates_.size(); ++c) {
    agreed_means_[c] = interval_sums_[c] / std::max(1, interval_counts_[c]);
  }
  if (!local_) {
    TANDEM_RETURN_IF_ERROR(
        host_group_
            .AllReduce(CpuBuffer(agreed_means_.data(), static_cast<int64_t>(agreed_means_.size())),
                       ReduceOp::kMax)
            ->Wait());
  }
  const size_t best = static_cast<size_t>(
      std::min_element(agreed_means_.begin(), agreed_means_.end()) - agreed_means_.begin());
  tuning_ = false;
  return Rebucket(candidates_[best]);
}

std::string BucketedGradientSync::TuningReport() const {
  std::string out;
  for (size_t c = 0; c < candidates_.size(); ++c) {
    const double mean = c < agreed_means_.size()
                            ? agreed_means_[c]
                            : interval_sums_[c] / std::max(1, interval_counts_[c]);
    absl::StrAppendFormat(&out, "%s%.2f MiB: %.3f ms", out.empty() ? "" : ", ",
                          candidates_[c] / 1048576.0, mean * 1e3);
  }
  if (!tuning_ && !candidates_.empty()) {
    absl::StrAppendFormat(&out, " -> %.2f MiB", bucket_bytes_ / 1048576.0);
  }
  return out;
}

}  // namespace

const char* GradSyncStrategyName(GradSyncStrategy strategy) {
  return strategy == GradSyncStrategy::kAllReduce ? "allreduce" : "dear";
}

absl::StatusOr<GradSyncStrategy> ParseGradSyncStrategy(absl::string_view name) {
  if (name == "allreduce") return GradSyncStrategy::kAllReduce;
  if (name == "dear") return GradSyncStrategy::kDeAR;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown gradient sync strategy '", name, "' (known: allreduce, dear)"));
}

std::vector<int> AssignBuckets(const std::vector<int64_t>& element_counts, int64_t bucket_bytes) {
  std::vector<int> bucket_of(element_counts.size());
  int bucket = 0;
  int64_t filled = 0;
  for (size_t i = 0; i < element_counts.size(); ++i) {
    if (filled >= bucket_bytes && filled > 0) {
      ++bucket;
      filled = 0;
    }
    bucket_of[i] = bucket;
    filled += element_counts[i] * static_cast<int64_t>(kFloatBytes);
  }
  return bucket_of;
}

absl::StatusOr<std::unique_ptr<GradientSync>> GradientSync::Create(
    Communicator& group, std::vector<SyncParameter> parameters, const GradSyncOptions& options) {
  if (options.communication_type != DataType::kFloat32 &&
      options.communication_type != DataType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradients travel as float32 or bfloat16, not ",
                     comm::DataTypeName(options.communication_type)));
  }
  auto sync = std::make_unique<BucketedGradientSync>(group, std::move(parameters), options);
  TANDEM_RETURN_IF_ERROR(sync->Init());
  return std::unique_ptr<GradientSync>(std::move(sync));
}

}  // namespace tandem::runtime
