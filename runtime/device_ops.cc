#include "runtime/device_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::runtime {

absl::Status DeviceOptimizer::CheckStep(int first_span, size_t params, size_t grads, double lr,
                                        double grad_scale) const {
  const size_t spans = counts().size();
  if (first_span < 0 || params != grads || first_span + params > spans) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: spans [", first_span, ", ", first_span + params,
                     ") with ", grads, " gradients, of ", spans, " spans of state"));
  }
  if (!std::isfinite(lr) || !std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step: non-finite lr ", lr, " or grad scale ", grad_scale));
  }
  return absl::OkStatus();
}

namespace {

// The CPU optimizer: one OptimizerState (PyTorch-exact float loops) per span.
class CpuOptimizer final : public DeviceOptimizer {
 public:
  CpuOptimizer(const OptimizerConfig& config, std::vector<int64_t> counts)
      : config_(config), counts_(std::move(counts)) {
    for (int64_t c : counts_) states_.push_back(std::make_unique<OptimizerState>(config, c));
  }

  absl::Status Step(int first_span, absl::Span<float* const> params,
                    absl::Span<float* const> grads, double lr, double grad_scale) override {
    TANDEM_RETURN_IF_ERROR(CheckStep(first_span, params.size(), grads.size(), lr, grad_scale));
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t n = counts_[first_span + i];
      TANDEM_RETURN_IF_ERROR(states_[first_span + i]->Step(
          absl::MakeSpan(params[i], n), absl::MakeConstSpan(grads[i], n), lr, grad_scale));
    }
    return absl::OkStatus();
  }

  const std::vector<int64_t>& counts() const override { return counts_; }
  int64_t steps() const override { return states_.empty() ? steps_ : states_[0]->steps(); }
  void set_steps(int64_t steps) override {
    steps_ = steps;
    for (auto& s : states_) s->set_steps(steps);
  }
  std::vector<std::string> BufferNames() const override {
    if (config_.kind == OptimizerKind::kSgd) return {"momentum_buffer"};
    return {"exp_avg", "exp_avg_sq"};
  }
  absl::StatusOr<float*> StateBuffer(int span, absl::string_view name, bool create) override {
    TANDEM_RETURN_IF_ERROR(CheckSpan(span));
    for (auto& named : states_[span]->Buffers()) {
      if (named.name != name) continue;
      if (named.values->empty()) {
        if (!create) return nullptr;
        named.values->assign(static_cast<size_t>(counts_[span]), 0.0f);
      }
      return named.values->data();
    }
    return absl::InvalidArgumentError(absl::StrCat("optimizer has no state buffer '", name, "'"));
  }
  absl::Status ResetStateBuffer(int span, absl::string_view name) override {
    TANDEM_RETURN_IF_ERROR(CheckSpan(span));
    for (auto& named : states_[span]->Buffers()) {
      if (named.name != name) continue;
      named.values->clear();
      if (config_.kind == OptimizerKind::kAdamW) {
        named.values->assign(static_cast<size_t>(counts_[span]), 0.0f);
      }
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat("optimizer has no state buffer '", name, "'"));
  }

 private:
  absl::Status CheckSpan(int span) const {
    if (span < 0 || span >= static_cast<int>(counts_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer span ", span, " out of range [0, ", counts_.size(), ")"));
    }
    return absl::OkStatus();
  }

  OptimizerConfig config_;
  std::vector<int64_t> counts_;
  std::vector<std::unique_ptr<OptimizerState>> states_;
  int64_t steps_ = 0;
};

class CpuDeviceOps final : public DeviceOps {
 public:
  comm::Device device() const override { return comm::Device::Cpu(); }
  std::string name() const override { return "cpu loops"; }

  absl::StatusOr<DeviceArray> Zeros(int64_t count) override {
    if (count < 0) return absl::InvalidArgumentError("negative array size");
    auto storage = std::make_shared<std::vector<float>>(static_cast<size_t>(count), 0.0f);
    DeviceArray a;
    a.data = storage->data();
    a.count = count;
    a.holder = std::move(storage);
    return a;
  }
  absl::Status Copy(float* dst, const float* src, int64_t count) override {
    if (count > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(count) * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(float* dst, const float* host, int64_t count) override {
    return Copy(dst, host, count);
  }
  absl::Status CopyToHost(float* host, const float* src, int64_t count) override {
    return Copy(host, src, count);
  }

  absl::Status ToBFloat16(uint16_t* dst, const float* src, int64_t count) override {
    for (int64_t i = 0; i < count; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &src[i], sizeof(bits));
      if ((bits & 0x7fffffffu) > 0x7f800000u) {
        dst[i] = static_cast<uint16_t>((bits >> 16) | 0x40u);  // a quiet NaN
        continue;
      }
      bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
      dst[i] = static_cast<uint16_t>(bits >> 16);
    }
    return absl::OkStatus();
  }
  absl::Status FromBFloat16(float* dst, const uint16_t* src, int64_t count) override {
    for (int64_t i = 0; i < count; ++i) {
      const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
      std::memcpy(&dst[i], &bits, sizeof(bits));
    }
    return absl::OkStatus();
  }

  // Squares are summed in double, in eight independent lanes so that the loop vectorises;
  // the norm is then exact to double rounding whatever the grouping of elements (DeAR's
  // shards or the all-reduce's parameters), so both strategies clip by the same coefficient.
  absl::Status AverageAndAddSquaredNorm(float* dst, const float* src, int64_t count,
                                        float divisor, bool divide, bool add_to_norm) override {
    constexpr int kLanes = 8;
    constexpr int64_t kBlock = 4096;
    double total = 0;
    for (int64_t begin = 0; begin < count; begin += kBlock) {
      const int64_t end = std::min(count, begin + kBlock);
      double lanes[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = begin;
      for (; i + kLanes <= end; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
          const float g = divide ? src[i + l] / divisor : src[i + l];
          dst[i + l] = g;
          lanes[l] += static_cast<double>(g) * g;
        }
      }
      for (; i < end; ++i) {
        const float g = divide ? src[i] / divisor : src[i];
        dst[i] = g;
        lanes[0] += static_cast<double>(g) * g;
      }
      for (double lane : lanes) total += lane;
    }
    if (add_to_norm) running_norm_ += total;
    return absl::OkStatus();
  }
  absl::StatusOr<double> TakeSquaredNorm() override {
    const double total = running_norm_;
    running_norm_ = 0;
    return total;
  }

  absl::StatusOr<std::unique_ptr<DeviceOptimizer>> NewOptimizer(
      const OptimizerConfig& config, std::vector<int64_t> counts) override {
    absl::Status valid = ValidateOptimizerConfig(config);
    if (!valid.ok()) return valid;
    return std::unique_ptr<DeviceOptimizer>(new CpuOptimizer(config, std::move(counts)));
  }

  bool prefers_fused_steps() const override { return false; }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  // Shared by every CPU synchroniser of the process: one running norm per thread.
  static thread_local double running_norm_;
};

thread_local double CpuDeviceOps::running_norm_ = 0;

}  // namespace

DeviceOps& DefaultCpuDeviceOps() {
  static CpuDeviceOps* ops = new CpuDeviceOps();
  return *ops;
}

}  // namespace tandem::runtime
