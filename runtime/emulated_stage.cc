#include "runtime/emulated_stage.h"

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/engine.h"

namespace tandem::runtime {

EmulatedStageOptions EmulatedStageOptionsFor(const StageSpec& spec) {
  EmulatedStageOptions o;
  o.stage = spec.stage;
  o.num_stages = spec.num_stages;
  o.replica = spec.replica;
  o.data_parallel_index = spec.data_parallel_index;
  o.data_parallel = spec.data_parallel;
  o.num_microbatches = spec.num_microbatches;
  return o;
}

namespace {

// Element patterns repeat with these periods so the checksums stay small exact floats.
constexpr int kIterationPeriod = 16;
constexpr int kDataParallelPeriod = 8;
constexpr int kStagePeriod = 64;
constexpr int kMicrobatchPeriod = 128;
constexpr int kElementPeriod = 4;
constexpr float kWeightGradientUnit = 1.0f / 1024;
constexpr int kWeightGradientPeriod = 16;
constexpr int kLossPeriod = 32;
// The last part of an emulated action spent yielding instead of sleeping (see Work).
constexpr double kYieldTailSeconds = 0.5e-3;

std::shared_ptr<std::vector<float>> Zeros(int64_t count) {
  return std::make_shared<std::vector<float>>(static_cast<size_t>(count), 0.0f);
}

}  // namespace

float EmulatedStage::ActivationValue(int64_t iteration, int dp, int replica, int stage,
                                     int microbatch, int64_t element) {
  int64_t code = iteration % kIterationPeriod;
  code = code * kDataParallelPeriod + dp % kDataParallelPeriod;
  code = code * 2 + replica % 2;
  code = code * kStagePeriod + stage % kStagePeriod;
  code = code * kMicrobatchPeriod + microbatch % kMicrobatchPeriod;
  return static_cast<float>(code * kElementPeriod + element % kElementPeriod + 1);
}

float EmulatedStage::GradientValue(int64_t iteration, int dp, int replica, int stage,
                                   int microbatch, int64_t element) {
  return -ActivationValue(iteration, dp, replica, stage, microbatch, element) - 0.5f;
}

float EmulatedStage::WeightGradientValue(int64_t iteration, int dp, int stage, int microbatch) {
  int64_t k = 1 + (microbatch + 3 * dp + iteration) % kWeightGradientPeriod;
  return static_cast<float>(k * (stage % 8 + 1)) * kWeightGradientUnit;
}

double EmulatedStage::LossValue(int64_t iteration, int dp, int microbatch) {
  return 1.0 + static_cast<double>((microbatch + 5 * dp + 2 * iteration) % kLossPeriod);
}

EmulatedStage::EmulatedStage(EmulatedStageOptions options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
      parameters_(static_cast<size_t>(std::max<int64_t>(options.parameter_elements, 0)), 1.0f),
      gradients_(parameters_.size(), 0.0f) {}

absl::Status EmulatedStage::BeginIteration(int64_t iteration) {
  if (!stash_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("emulated stage ", options_.stage, ": iteration ", iteration,
                     " begins with ", stash_.size(), " micro-batches still stashed"));
  }
  iteration_ = iteration;
  iteration_loss_ = 0;
  std::fill(gradients_.begin(), gradients_.end(), 0.0f);
  return absl::OkStatus();
}

absl::Status EmulatedStage::Work(double seconds) {
  if (seconds <= 0) return absl::OkStatus();
  const double end = clock_->NowSeconds() + seconds;
  if (options_.busy_wait) {
    while (clock_->NowSeconds() < end) {
    }
    return absl::OkStatus();
  }
#ifdef __linux__
  // Wake up on time: the default 50 us timer slack would lengthen every emulated action.
  static thread_local bool precise = prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0) == 0;
  (void)precise;
#endif
  if (clock_ != RealClock::Get()) {  // an injected clock: its sleep is exact
    clock_->SleepFor(seconds);
    return absl::OkStatus();
  }
  // Sleep all but a short tail, then yield until the deadline: a woken thread on a busy
  // machine starts late, and the tail absorbs that delay without holding a core for long.
  if (seconds > kYieldTailSeconds) clock_->SleepFor(seconds - kYieldTailSeconds);
  while (clock_->NowSeconds() < end) std::this_thread::yield();
  return absl::OkStatus();
}

Tensor EmulatedStage::MakeTensor(bool gradient, int stage, int microbatch) const {
  auto data = Zeros(options_.activation_elements);
  for (int64_t i = 0; i < options_.activation_elements; ++i) {
    (*data)[i] = gradient ? GradientValue(iteration_, options_.data_parallel_index,
                                          options_.replica, stage, microbatch, i)
                          : ActivationValue(iteration_, options_.data_parallel_index,
                                            options_.replica, stage, microbatch, i);
  }
  Tensor t;
  t.meta.shape = {options_.activation_elements};
  t.meta.dtype = comm::DataType::kFloat32;
  t.buffer.data = data->data();
  t.buffer.count = options_.activation_elements;
  t.buffer.dtype = comm::DataType::kFloat32;
  t.holder = data;
  return t;
}

absl::Status EmulatedStage::CheckTensors(const std::vector<Tensor>& tensors, bool gradient,
                                         int source_stage, int microbatch) const {
  const char* what = gradient ? "gradient" : "activation";
  auto where = [&] {
    return absl::StrCat("emulated stage ", options_.stage, " replica ", options_.replica,
                        " dp ", options_.data_parallel_index, " iteration ", iteration_,
                        " micro-batch ", microbatch, ": ", what, " from stage ", source_stage);
  };
  if (tensors.size() != 1) {
    return absl::DataLossError(
        absl::StrCat(where(), ": expected 1 tensor, got ", tensors.size()));
  }
  const Tensor& t = tensors[0];
  if (t.buffer.count != options_.activation_elements ||
      t.buffer.dtype != comm::DataType::kFloat32) {
    return absl::DataLossError(absl::StrCat(where(), ": expected ", options_.activation_elements,
                                            " float32 elements, got ", t.buffer.count));
  }
  if (!options_.verify) return absl::OkStatus();
  const float* data = static_cast<const float*>(t.buffer.data);
  for (int64_t i = 0; i < t.buffer.count; ++i) {
    const float expected =
        gradient ? GradientValue(iteration_, options_.data_parallel_index, options_.replica,
                                 source_stage, microbatch, i)
                 : ActivationValue(iteration_, options_.data_parallel_index, options_.replica,
                                   source_stage, microbatch, i);
    if (data[i] != expected) {
      return absl::DataLossError(absl::StrCat(where(), ": element ", i, " is ", data[i],
                                              ", expected ", expected,
                                              " (tensor routed to the wrong place?)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> EmulatedStage::Forward(int microbatch,
                                                           std::vector<Tensor> inputs) {
  if (iteration_ < 0) {
    return absl::FailedPreconditionError("emulated stage: Forward before BeginIteration");
  }
  if (stash_.count(microbatch) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("emulated stage ", options_.stage,
                                                      ": second forward of micro-batch ",
                                                      microbatch));
  }
  if (options_.stage > 0) {
    absl::Status s = CheckTensors(inputs, /*gradient=*/false, options_.stage - 1, microbatch);
    if (!s.ok()) return s;
  }
  absl::Status s = Work(options_.forward_seconds);
  if (!s.ok()) return s;
  stash_[microbatch] = StashState::kForwardDone;
  peak_stash_ = std::max(peak_stash_, static_cast<int>(stash_.size()));
  std::vector<Tensor> outputs;
  if (options_.stage == options_.num_stages - 1) {
    const double scale = 1.0 / (static_cast<double>(options_.num_microbatches) *
                                static_cast<double>(options_.data_parallel));
    iteration_loss_ += LossValue(iteration_, options_.data_parallel_index, microbatch) * scale;
  } else {
    outputs.push_back(MakeTensor(/*gradient=*/false, options_.stage, microbatch));
  }
  return outputs;
}

void EmulatedStage::AccumulateWeightGradient(int microbatch) {
  const float g = WeightGradientValue(iteration_, options_.data_parallel_index, options_.stage,
                                      microbatch);
  for (float& x : gradients_) x += g;
}

absl::StatusOr<std::vector<Tensor>> EmulatedStage::InputGradient(
    int microbatch, const std::vector<Tensor>& output_grads, double seconds) {
  auto it = stash_.find(microbatch);
  if (it == stash_.end() || it->second != StashState::kForwardDone) {
    return absl::FailedPreconditionError(
        absl::StrCat("emulated stage ", options_.stage, ": backward of micro-batch ",
                     microbatch, " without its forward"));
  }
  if (options_.stage < options_.num_stages - 1) {
    absl::Status s = CheckTensors(output_grads, /*gradient=*/true, options_.stage + 1, microbatch);
    if (!s.ok()) return s;
  }
  absl::Status s = Work(seconds);
  if (!s.ok()) return s;
  std::vector<Tensor> input_grads;
  if (options_.stage > 0) {
    input_grads.push_back(MakeTensor(/*gradient=*/true, options_.stage, microbatch));
  }
  return input_grads;
}

absl::StatusOr<std::vector<Tensor>> EmulatedStage::Backward(int microbatch,
                                                            std::vector<Tensor> output_grads) {
  // A full backward costs both halves when the costs are split.
  auto grads =
      InputGradient(microbatch, output_grads, options_.backward_seconds + options_.weight_seconds);
  if (!grads.ok()) return grads.status();
  AccumulateWeightGradient(microbatch);
  stash_.erase(microbatch);
  return grads;
}

absl::StatusOr<std::vector<Tensor>> EmulatedStage::BackwardInput(
    int microbatch, std::vector<Tensor> output_grads) {
  auto grads = InputGradient(microbatch, output_grads, options_.backward_seconds);
  if (!grads.ok()) return grads.status();
  stash_[microbatch] = StashState::kInputGradientDone;
  return grads;
}

absl::Status EmulatedStage::BackwardWeight(int microbatch) {
  auto it = stash_.find(microbatch);
  if (it == stash_.end() || it->second != StashState::kInputGradientDone) {
    return absl::FailedPreconditionError(
        absl::StrCat("emulated stage ", options_.stage, ": weight gradient of micro-batch ",
                     microbatch, " before its input gradient"));
  }
  absl::Status s = Work(options_.weight_seconds);
  if (!s.ok()) return s;
  AccumulateWeightGradient(microbatch);
  stash_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> EmulatedStage::NewTensor(const TensorMeta& meta) {
  if (meta.dtype != comm::DataType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat("emulated stage: only float32 tensors, got ",
                                                   comm::DataTypeName(meta.dtype)));
  }
  const int64_t count = meta.NumElements();
  if (count < 0) return absl::InvalidArgumentError("emulated stage: negative tensor size");
  auto data = Zeros(count);
  Tensor t;
  t.meta = meta;
  t.buffer.data = data->data();
  t.buffer.count = count;
  t.buffer.dtype = comm::DataType::kFloat32;
  t.holder = data;
  return t;
}

std::vector<ParameterView> EmulatedStage::Parameters() {
  ParameterView view;
  view.name = absl::StrCat("stage", options_.stage, ".weight");
  view.value.data = parameters_.data();
  view.value.count = static_cast<int64_t>(parameters_.size());
  view.grad.data = gradients_.data();
  view.grad.count = static_cast<int64_t>(gradients_.size());
  view.shape = {view.value.count};
  return {view};
}

}  // namespace tandem::runtime
