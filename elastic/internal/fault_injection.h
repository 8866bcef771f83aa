// Fault injection for the elastic trainer's tests and demonstrations (internal): ranks that
// SIGKILL (or SIGSTOP) themselves at a chosen point of a chosen iteration, as
// ElasticOptions::kill and TANDEM_ELASTIC_KILL describe.
#pragma once

#include <signal.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/logging.h"
#include "runtime/stage.h"

namespace tandem::elastic::internal {

// Where ranks kill themselves (fault injection): RANK:ITERATION:POINT, several separated by
// commas.
struct KillPoint {
  struct Entry {
    int rank = -1;
    int64_t iteration = -1;
    std::string point;
  };
  std::vector<Entry> entries;
  bool Hits(int me, int64_t it, const char* at) const {
    for (const Entry& e : entries) {
      if (e.rank == me && e.iteration == it && e.point == at) return true;
    }
    return false;
  }
  // Whether `me` dies in a stage's computation (forward, backward or stop) at some iteration.
  bool InStage(int me) const {
    for (const Entry& e : entries) {
      if (e.rank == me && (e.point == "forward" || e.point == "backward" || e.point == "stop" ||
                           e.point == "grow")) {
        return true;
      }
    }
    return false;
  }
  bool Idle(int me) const {
    for (const Entry& e : entries) {
      if (e.rank == me && e.point == "idle") return true;
    }
    return false;
  }
};

// Parses RANK:ITERATION:POINT[,...] (empty: no kills). InvalidArgument naming the format.
absl::StatusOr<KillPoint> ParseKill(const std::string& text);

// Logs and kills (SIGKILL; SIGSTOP for the point "stop") this process.
[[noreturn]] void KillSelf(int rank, int64_t iteration, const std::string& point);

// A stage that kills its process at a chosen forward or backward (fault injection).
class KillingStage final : public runtime::Stage {
 public:
  KillingStage(std::unique_ptr<runtime::Stage> inner, KillPoint kill, int rank)
      : inner_(std::move(inner)), kill_(std::move(kill)), rank_(rank) {}
  absl::Status BeginIteration(int64_t iteration) override {
    iteration_ = iteration;
    evaluating_ = false;
    return inner_->BeginIteration(iteration);
  }
  // Evaluation passes are not training iterations: no kill fires in them.
  absl::Status BeginEvaluation(int64_t batch) override {
    evaluating_ = true;
    return inner_->BeginEvaluation(batch);
  }
  absl::StatusOr<std::vector<runtime::Tensor>> Forward(int m,
                                                       std::vector<runtime::Tensor> in) override {
    if (evaluating_) return inner_->Forward(m, std::move(in));
    if (m == 0 && kill_.Hits(rank_, iteration_, "forward")) KillSelf(rank_, iteration_, "forward");
    if (m == 0 && kill_.Hits(rank_, iteration_, "stop")) KillSelf(rank_, iteration_, "stop");
    if (m == 0 && kill_.Hits(rank_, iteration_, "grow")) {
      TANDEM_LOG(INFO) << "fault injection: rank " << rank_ << " asks for a node (SIGUSR2) in "
                       << "iteration " << iteration_;
      ::raise(SIGUSR2);
    }
    return inner_->Forward(m, std::move(in));
  }
  absl::StatusOr<std::vector<runtime::Tensor>> Backward(int m,
                                                        std::vector<runtime::Tensor> g) override {
    MaybeKillInBackward(m);
    return inner_->Backward(m, std::move(g));
  }
  absl::StatusOr<std::vector<runtime::Tensor>> BackwardInput(
      int m, std::vector<runtime::Tensor> g) override {
    MaybeKillInBackward(m);
    return inner_->BackwardInput(m, std::move(g));
  }
  absl::Status BackwardWeight(int m) override { return inner_->BackwardWeight(m); }
  absl::Status FinishGradients() override { return inner_->FinishGradients(); }
  absl::Status StartReadingIterationLoss() override {
    return inner_->StartReadingIterationLoss();
  }
  absl::StatusOr<runtime::Tensor> NewTensor(const runtime::TensorMeta& meta) override {
    return inner_->NewTensor(meta);
  }
  double IterationLoss() const override { return inner_->IterationLoss(); }
  std::vector<runtime::ParameterView> Parameters() override { return inner_->Parameters(); }
  comm::Device device() const override { return inner_->device(); }
  runtime::DeviceOps* device_ops() override { return inner_->device_ops(); }

 private:
  void MaybeKillInBackward(int m) {
    if (m == 0 && kill_.Hits(rank_, iteration_, "backward")) {
      KillSelf(rank_, iteration_, "backward");
    }
  }
  std::unique_ptr<runtime::Stage> inner_;
  KillPoint kill_;
  int rank_;
  int64_t iteration_ = 0;
  bool evaluating_ = false;
};

}  // namespace tandem::elastic::internal
