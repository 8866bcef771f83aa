#include "runtime/split_grad_sync.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::runtime {
namespace {

class SplitGradientSync : public GradientSync {
 public:
  SplitGradientSync(std::unique_ptr<GradientSync> shared, std::unique_ptr<GradientSync> placed,
                    std::vector<std::pair<int, int>> where, std::map<std::string, int> side)
      : parts_{std::move(shared), std::move(placed)},
        where_(std::move(where)),
        side_(std::move(side)) {}

  absl::Status GradReady(int parameter) override {
    TANDEM_RETURN_IF_ERROR(Check(parameter));
    const auto [part, index] = where_[parameter];
    return parts_[part]->GradReady(index);
  }
  absl::Status BucketReady(int bucket) override {
    const int first = parts_[0]->num_buckets();
    if (bucket < 0 || bucket >= num_buckets()) {
      return absl::OutOfRangeError(absl::StrCat("bucket ", bucket, " of ", num_buckets()));
    }
    return bucket < first ? parts_[0]->BucketReady(bucket) : parts_[1]->BucketReady(bucket - first);
  }
  absl::Status FinishBackward() override {
    TANDEM_RETURN_IF_ERROR(parts_[0]->FinishBackward());
    return parts_[1]->FinishBackward();
  }
  double LocalGradNormSquared() const override {
    return parts_[0]->LocalGradNormSquared() + parts_[1]->LocalGradNormSquared();
  }
  absl::Status FinishBackwardNormLater() override {
    TANDEM_RETURN_IF_ERROR(parts_[0]->FinishBackwardNormLater());
    return parts_[1]->FinishBackwardNormLater();
  }
  absl::Status CollectGradNorm() override {
    TANDEM_RETURN_IF_ERROR(parts_[0]->CollectGradNorm());
    return parts_[1]->CollectGradNorm();
  }
  absl::Status Step(double lr, double grad_scale) override {
    TANDEM_RETURN_IF_ERROR(parts_[0]->Step(lr, grad_scale));
    return parts_[1]->Step(lr, grad_scale);
  }
  absl::Status WaitForParameters(int parameter) override {
    TANDEM_RETURN_IF_ERROR(Check(parameter));
    const auto [part, index] = where_[parameter];
    return parts_[part]->WaitForParameters(index);
  }
  absl::Status Flush() override {
    TANDEM_RETURN_IF_ERROR(parts_[0]->Flush());
    return parts_[1]->Flush();
  }
  absl::StatusOr<std::vector<ParameterOptimizerState>> GatherOptimizerState() override {
    TANDEM_ASSIGN_OR_RETURN(std::vector<ParameterOptimizerState> shared,
                            parts_[0]->GatherOptimizerState());
    TANDEM_ASSIGN_OR_RETURN(std::vector<ParameterOptimizerState> placed,
                            parts_[1]->GatherOptimizerState());
    // In the stage's (backward) order.
    std::vector<ParameterOptimizerState> out(where_.size());
    size_t next[2] = {0, 0};
    for (size_t i = 0; i < where_.size(); ++i) {
      std::vector<ParameterOptimizerState>& from = where_[i].first == 0 ? shared : placed;
      size_t& at = next[where_[i].first];
      if (at >= from.size()) {
        return absl::InternalError("split gradient sync: optimizer state of fewer parameters");
      }
      out[i] = std::move(from[at++]);
    }
    return out;
  }
  absl::Status LoadOptimizerState(const std::vector<ParameterOptimizerState>& state) override {
    std::vector<ParameterOptimizerState> by_part[2];
    for (const ParameterOptimizerState& s : state) {
      auto it = side_.find(s.name);
      if (it == side_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state of unknown parameter '", s.name, "'"));
      }
      by_part[it->second].push_back(s);
    }
    TANDEM_RETURN_IF_ERROR(parts_[0]->LoadOptimizerState(by_part[0]));
    return parts_[1]->LoadOptimizerState(by_part[1]);
  }

  GradSyncStrategy strategy() const override { return parts_[0]->strategy(); }
  int num_parameters() const override { return static_cast<int>(where_.size()); }
  int num_buckets() const override { return parts_[0]->num_buckets() + parts_[1]->num_buckets(); }
  int BucketOf(int parameter) const override {
    if (parameter < 0 || parameter >= num_parameters()) return -1;
    const auto [part, index] = where_[parameter];
    const int bucket = parts_[part]->BucketOf(index);
    return part == 0 || bucket < 0 ? bucket : parts_[0]->num_buckets() + bucket;
  }
  bool BucketInPlace(int bucket) const override {
    const int first = parts_[0]->num_buckets();
    return bucket < first ? parts_[0]->BucketInPlace(bucket)
                          : parts_[1]->BucketInPlace(bucket - first);
  }
  int64_t bucket_bytes() const override { return parts_[0]->bucket_bytes(); }
  bool tuning() const override { return parts_[0]->tuning() || parts_[1]->tuning(); }
  std::string TuningReport() const override {
    const std::string placed = parts_[1]->TuningReport();
    return placed.empty() ? parts_[0]->TuningReport()
                          : absl::StrCat(parts_[0]->TuningReport(), "; experts: ", placed);
  }

 private:
  absl::Status Check(int parameter) const {
    if (parameter < 0 || parameter >= num_parameters()) {
      return absl::OutOfRangeError(absl::StrCat("parameter ", parameter, " of ", num_parameters()));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<GradientSync> parts_[2];  // every replica's parameters, the placed ones
  std::vector<std::pair<int, int>> where_;  // per parameter: its part and index there
  std::map<std::string, int> side_;         // per name: its part
};

}  // namespace

absl::StatusOr<std::unique_ptr<GradientSync>> CreateSplitGradientSync(
    comm::Communicator& group, comm::Communicator& expert_group,
    std::vector<SyncParameter> parameters, const std::vector<bool>& placed,
    const GradSyncOptions& options) {
  if (placed.size() != parameters.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split gradient sync: ", placed.size(), " flags for ", parameters.size(), " parameters"));
  }
  std::vector<SyncParameter> parts[2];
  std::vector<std::pair<int, int>> where;
  std::map<std::string, int> side;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const int part = placed[i] ? 1 : 0;
    where.emplace_back(part, static_cast<int>(parts[part].size()));
    side[parameters[i].name] = part;
    parts[part].push_back(std::move(parameters[i]));
  }
  GradSyncOptions expert_options = options;
  // The host group's members are the gradient group's; the experts' are fewer.
  expert_options.host_group = nullptr;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> shared,
                          GradientSync::Create(group, std::move(parts[0]), options));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> experts,
                          GradientSync::Create(expert_group, std::move(parts[1]), expert_options));
  return std::unique_ptr<GradientSync>(new SplitGradientSync(std::move(shared), std::move(experts),
                                                             std::move(where), std::move(side)));
}

}  // namespace tandem::runtime
