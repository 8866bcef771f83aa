// EmulatedStage: a runtime::Stage whose compute takes a given time and whose tensors carry a
// data-flow checksum, so the engine's scheduling, routing and overhead can be measured and
// checked on a few CPU cores without a model.
//
// Timing. Each action sleeps for its profiled time rather than spinning: sleeping ranks leave
// the cores to the ranks that communicate, so 4 or more ranks on 2 cores run the schedule as
// it would run on 4 devices, and the measured iteration time can be compared with the
// simulator's makespan. With the real clock the last 0.5 ms are spent yielding (a woken thread
// starts late on a busy machine; the tail absorbs that), with timer slack at its minimum; an
// injected clock sleeps exactly. `busy_wait` spins instead (one core per rank needed).
//
// Data-flow checksum. Element i of the activation that stage s sends for micro-batch m in
// iteration t (pipeline replica r, data-parallel replica d) is ActivationValue(t, d, r, s, m, i);
// the gradient of stage s's input is GradientValue(t, d, r, s, m, i). Every stage checks what it
// receives against these formulas, so a tensor routed to the wrong stage, micro-batch, replica
// or iteration fails with DataLoss naming both. Parameter gradients accumulate
// WeightGradientValue(t, d, s, m) per micro-batch (independent of the Chimera replica, so the
// summed gradient of a stage is the same whichever replica ran each micro-batch). The last
// stage's loss for micro-batch m is LossValue(t, d, m) / (microbatches * data_parallel), so the
// engine's global mean loss is the mean of LossValue over the global batch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "runtime/stage.h"

namespace tandem::runtime {

struct EmulatedStageOptions {
  int stage = 0;
  int num_stages = 1;
  int replica = 0;                // pipeline replica (Chimera: 0 or 1)
  int data_parallel_index = 0;
  int data_parallel = 1;          // D, for loss scaling
  int num_microbatches = 1;       // per pipeline and iteration, for loss scaling

  double forward_seconds = 0;
  double backward_seconds = 0;    // full backward, or its input-gradient part when split
  double weight_seconds = 0;      // weight-gradient part (BackwardWeight); 0 = not split
  int64_t activation_elements = 1;  // float32 elements of the output (and its gradient)
  int64_t parameter_elements = 1;   // float32 parameters (all set to 1 initially)

  bool busy_wait = false;  // spin instead of sleeping
  bool verify = true;      // check the data-flow checksum of every input
  Clock* clock = nullptr;  // null: RealClock
};

struct StageSpec;  // runtime/engine.h

// The stage's place in the job from the engine's request (stage, pipeline replica,
// data-parallel index and degree, micro-batches); costs and sizes keep their defaults.
EmulatedStageOptions EmulatedStageOptionsFor(const StageSpec& spec);

class EmulatedStage : public Stage {
 public:
  explicit EmulatedStage(EmulatedStageOptions options);

  absl::Status BeginIteration(int64_t iteration) override;
  absl::StatusOr<std::vector<Tensor>> Forward(int microbatch, std::vector<Tensor> inputs) override;
  absl::StatusOr<std::vector<Tensor>> Backward(int microbatch,
                                               std::vector<Tensor> output_grads) override;
  absl::StatusOr<std::vector<Tensor>> BackwardInput(int microbatch,
                                                    std::vector<Tensor> output_grads) override;
  absl::Status BackwardWeight(int microbatch) override;
  absl::StatusOr<Tensor> NewTensor(const TensorMeta& meta) override;
  double IterationLoss() const override { return iteration_loss_; }
  std::vector<ParameterView> Parameters() override;
  comm::Device device() const override { return comm::Device::Cpu(); }

  // Micro-batches whose forward ran and whose stash is not yet freed.
  int stashed_microbatches() const { return static_cast<int>(stash_.size()); }
  int peak_stashed_microbatches() const { return peak_stash_; }
  const std::vector<float>& parameters() const { return parameters_; }
  const std::vector<float>& gradients() const { return gradients_; }

  // The formulas of the data-flow checksum (see the file comment). Small exact floats.
  static float ActivationValue(int64_t iteration, int dp, int replica, int stage, int microbatch,
                               int64_t element);
  static float GradientValue(int64_t iteration, int dp, int replica, int stage, int microbatch,
                             int64_t element);
  static float WeightGradientValue(int64_t iteration, int dp, int stage, int microbatch);
  static double LossValue(int64_t iteration, int dp, int microbatch);

 private:
  enum class StashState { kForwardDone, kInputGradientDone };
  absl::Status Work(double seconds);
  absl::Status CheckTensors(const std::vector<Tensor>& tensors, bool gradient, int source_stage,
                            int microbatch) const;
  Tensor MakeTensor(bool gradient, int stage, int microbatch) const;
  void AccumulateWeightGradient(int microbatch);
  absl::StatusOr<std::vector<Tensor>> InputGradient(int microbatch,
                                                    const std::vector<Tensor>& output_grads,
                                                    double seconds);

  EmulatedStageOptions options_;
  Clock* clock_;
  int64_t iteration_ = -1;
  double iteration_loss_ = 0;
  std::vector<float> parameters_;
  std::vector<float> gradients_;
  std::map<int, StashState> stash_;  // micro-batch -> state
  int peak_stash_ = 0;
};

}  // namespace tandem::runtime
