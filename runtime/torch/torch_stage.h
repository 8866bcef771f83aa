// TorchStage: the LibTorch implementation of runtime::Stage. It owns a deep copy of layers
// [first_layer, end_layer) of a LayeredModel, so several TorchStages on one rank (interleaved
// chunks, Chimera's two pipeline replicas) each have their own parameters.
//
// Data. The first stage reads its inputs and the last stage its targets from the Dataset with
// the batch rule of runtime/torch/data.h: at BeginIteration(i) a stage of data-parallel replica
// d takes samples [d * M * b, (d + 1) * M * b) of iteration i and micro-batch m (the global
// index 0..M-1 of the schedule, whichever pipeline replica runs it) is the m-th slice of b
// samples. Tensors between stages cross as runtime::Tensor (memory of a torch tensor kept
// alive by `holder`); a received input is copied, so the caller may reuse its buffer.
//
// Loss scaling. The last stage multiplies each micro-batch's (mean) loss by
// 1 / (M * D), the number of micro-batches over all data-parallel replicas, before backward,
// so the gradients summed over micro-batches and all-reduced (summed) over replicas equal the
// gradient of the global-batch mean loss. IterationLoss() is the sum of the scaled losses, so
// its sum over replicas is the global-batch mean loss.
//
// Stash and recomputation. The layers are grouped into segments: maximal runs of consecutive
// layers with the same recompute flag (recompute_layers). Forward keeps, per micro-batch,
// each segment's input; a normal segment also keeps its autograd graph, a recomputed segment
// runs without a graph and is run again (with one) in backward. Results are identical with and
// without recomputation (the forward must be deterministic: no dropout).
//
// Backward. Backward(m) runs autograd segment by segment from the output gradients (the last
// stage from its scaled loss) and adds parameter gradients into the preallocated .grad
// tensors. The zero-bubble split: BackwardInput(m) walks the graph once, like Backward, but
// the linear layers built with DeferrableLinear (runtime/torch/deferred_linear.h; the GPT's
// and the marked tensor-parallel ones) keep their input and output gradient instead of
// computing their weight gradients; the graph is freed. BackwardWeight(m) later computes those
// weight gradients, one product per layer, and frees the stash. Other parameters (layer norms,
// embeddings, plain torch::nn::Linear layers) get their gradients in BackwardInput.
//
// Parameters. Every parameter must be a contiguous float32 tensor. At creation the values and
// the gradients are moved into two flat arenas on the stage's device, laid out in backward
// order (the reverse of named_parameters()), so ParameterView addresses stay fixed for the
// stage's lifetime and the gradient synchroniser's buckets are contiguous: its collectives run
// on the arenas in place, without packing. A parameter's first gradient of an iteration is
// written over the old one (no zero fill of the arena, no addition to zeros; the linear layers
// write their products straight into the arena), later ones are added; FinishGradients zeroes
// the gradients of parameters that got none, so the gradients are complete after it. The
// engine's optimizer updates values in place between iterations (no stash is alive then).
//
// Tied weights. A stage holding both ends of a tied pair (an LM head that is the token
// embedding) shares one tensor; a stage holding one end keeps its own, the copy starting as the
// owner's values, and reports the pair in its ParameterViews (tied_owner, tied_layers), so that
// the engine sums the two gradients each step.
//
// Device operations. A CUDA stage brings TorchDeviceOps (runtime/torch/device_ops.h) for the
// gradient passes and the optimizer, so training state never leaves the GPU; a CPU stage uses
// the runtime's CPU loops unless options.libtorch_device_ops asks for the LibTorch ones (the
// GPU code path, run on the CPU in tests).
//
// Threading: one thread drives a TorchStage (the Stage contract). Device: CPU or one CUDA
// device; LibTorch's current stream is used.
#pragma once

#include <map>
#include <set>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/nn/modules/container/any.h>

#include "runtime/stage.h"
#include "runtime/torch/data.h"
#include "runtime/torch/device_ops.h"
#include "runtime/torch/deferred_linear.h"
#include "runtime/torch/model.h"
#include "runtime/torch/precision.h"

namespace tandem::runtime::libtorch {

struct TorchStageOptions {
  int first_layer = 0;  // [first_layer, end_layer) of the model
  int end_layer = 0;
  std::vector<int> recompute_layers;  // model layer indices; those outside the range are ignored
  int data_parallel_index = 0;        // d
  int data_parallel = 1;              // D
  int microbatches = 1;               // M: micro-batches per replica per iteration
  int64_t microbatch_size = 1;        // b
  // Pipelines of different micro-batch counts (the elastic layer): first sample of this
  // replica's share (-1: d * M * b) and micro-batches of the global batch (0: M * D).
  int64_t sample_offset = -1;
  int loss_microbatches = 0;
  // Validation batches for BeginEvaluation (first and last stage; null: none), sliced as the
  // training data is.
  std::shared_ptr<const Dataset> validation_data;
  torch::Device device = torch::kCPU;
  // CPU stages: LibTorch tensor operations for the gradient passes and the optimizer instead
  // of the runtime's CPU loops (CUDA stages always use them).
  bool libtorch_device_ops = false;
  // Arithmetic of the forward computation (runtime/torch/precision.h); parameters, gradients
  // and the loss stay float32.
  Precision precision = Precision::kFloat32;
  bool fused_adamw = true;  // at::_fused_adamw_ where LibTorch has it
  // Tensor parallelism: the stage holds this rank's shards (the model's
  // shard_for_tensor_parallel) and the last stage computes tensor_parallel_loss.
  TensorParallel tensor_parallel;
};

class TorchStage final : public Stage, private GradientWriter {
 public:
  // Clones the stage's layers from `model` onto options.device. InvalidArgument for a bad
  // range or counts (or no data set on a first or last stage), FailedPrecondition for a
  // non-clonable layer or a parameter that is not contiguous float32.
  static absl::StatusOr<std::unique_ptr<TorchStage>> Create(const LayeredModel& model,
                                                            std::shared_ptr<const Dataset> data,
                                                            const TorchStageOptions& options);

  absl::Status BeginIteration(int64_t iteration) override;
  absl::Status BeginEvaluation(int64_t batch) override;
  absl::StatusOr<std::vector<Tensor>> Forward(int microbatch, std::vector<Tensor> inputs) override;
  absl::StatusOr<std::vector<Tensor>> Backward(int microbatch,
                                               std::vector<Tensor> output_grads) override;
  absl::StatusOr<std::vector<Tensor>> BackwardInput(int microbatch,
                                                    std::vector<Tensor> output_grads) override;
  absl::Status BackwardWeight(int microbatch) override;
  absl::Status FinishGradients() override;
  absl::StatusOr<Tensor> NewTensor(const TensorMeta& meta) override;
  double IterationLoss() const override;  // waits for the last forward on the device
  absl::Status StartReadingIterationLoss() override;
  std::vector<ParameterView> Parameters() override;
  comm::Device device() const override;
  DeviceOps* device_ops() override { return device_ops_.get(); }

  bool is_first() const { return options_.first_layer == 0; }
  bool is_last() const { return is_last_; }
  const TorchStageOptions& options() const { return options_; }
  // Parameters as torch tensors, named as in LayeredModel::NamedParameters.
  const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters() const {
    return parameters_;
  }
  // Unscaled mean loss of each micro-batch forwarded this iteration (last stage), by index.
  std::map<int, double> microbatch_losses() const;
  // Micro-batches whose stash is held (forwarded, backward not finished).
  int stashed_microbatches() const { return static_cast<int>(stash_.size()); }
  // Segments as [first, end) model layer ranges with their recompute flag (for tests and logs).
  std::vector<std::pair<std::pair<int, int>, bool>> segments() const;

 private:
  // A run of consecutive layers [begin, end) (indices into layers_) with one recompute flag.
  struct Segment {
    int begin = 0;
    int end = 0;
    bool recompute = false;
    bool computes_loss = false;  // last segment of the last stage: output is the scaled loss
  };
  // What one micro-batch keeps between forward and backward, per segment.
  struct SegmentStash {
    torch::Tensor input;   // detached; requires grad unless it is integer (token ids)
    torch::Tensor output;  // with graph (normal segments, or after recomputation)
  };
  struct MicrobatchStash {
    std::vector<SegmentStash> segments;
    torch::Tensor targets;  // last stage
    bool input_grads_done = false;
    DeferredWeightGrads deferred;  // kept by BackwardInput for BackwardWeight
  };
  // Backward through every segment from `grad` (the output's gradient), freeing the graphs;
  // parameter gradients are accumulated (but for deferred linear layers, when `deferred` is
  // given). Returns the input's gradient (undefined for token ids).
  torch::Tensor RunBackward(MicrobatchStash& stash, torch::Tensor grad,
                            DeferredWeightGrads* deferred);
  // GradientWriter: true once per parameter and iteration, for its first gradient.
  bool TakeFirst(const torch::Tensor& parameter) override;

  TorchStage(const LayeredModel& model, std::shared_ptr<const Dataset> data,
             TorchStageOptions options, std::vector<torch::nn::AnyModule> layers);

  // Moves the parameters' values and gradients into the arenas.
  void BuildArenas();
  // This replica's samples of batch `iteration` of `data` (first and last stage), on the
  // device; the loss of the previous batch forgotten.
  absl::Status SelectBatch(const Dataset& data, int64_t iteration);
  // Replaces `layers` by this rank's tensor-parallel shards; the names of the parameters that
  // stay whole.
  struct TensorParallelLayout {
    std::set<std::string> replicated;
    // Experts spread over data-parallel replicas (ParameterView::placed_over_replicas).
    std::set<std::string> placed;
    // Split parameters: for each element of this rank's shard, its index in the whole one.
    std::map<std::string, std::vector<int64_t>> index;
    std::map<std::string, int64_t> whole_count;
    std::map<std::string, std::vector<int64_t>> whole_shape;
  };
  static absl::StatusOr<TensorParallelLayout> ShardForTensorParallel(
      const LayeredModel& model, const TorchStageOptions& options,
      std::vector<torch::nn::AnyModule>& layers);
  std::string Where(int microbatch) const;  // "stage [2, 4) replica 0 iteration 5 micro-batch 3"
  torch::Tensor RunSegment(const Segment& segment, torch::Tensor input,
                           const torch::Tensor& targets) const;
  // Recomputes `segment`'s output with a graph if it was not kept.
  void EnsureGraph(const Segment& segment, SegmentStash& stash,
                   const torch::Tensor& targets) const;
  void AccumulateGrads(const std::vector<torch::Tensor>& parameters,
                       const std::vector<torch::Tensor>& grads);
  // The gradient entering the last segment: ones for the loss, else the received gradient.
  absl::StatusOr<torch::Tensor> StartGradient(int microbatch, MicrobatchStash& stash,
                                              const std::vector<Tensor>& output_grads) const;
  absl::StatusOr<MicrobatchStash*> FindStash(int microbatch);
  Tensor ToRuntime(torch::Tensor tensor) const;
  absl::StatusOr<torch::Tensor> FromRuntime(const Tensor& tensor) const;

  TorchStageOptions options_;
  bool is_last_ = false;
  std::shared_ptr<const Dataset> data_;
  LossFunction loss_;
  bool loss_takes_compute_type_ = false;
  std::vector<torch::nn::AnyModule> layers_;
  // Tensor parallelism: which parameters are whole, and where each shard's elements sit.
  TensorParallelLayout tensor_parallel_;
  // Parameters tied to another stage's (SplitTiedPairs): name -> the pair, as Parameters()
  // reports them (ParameterView::tied_owner).
  std::map<std::string, TiedParameter> tied_;
  std::vector<Segment> segments_;
  std::vector<std::vector<torch::Tensor>> segment_parameters_;
  std::vector<std::pair<std::string, torch::Tensor>> parameters_;
  torch::Tensor value_arena_;  // every parameter's values, backward order
  torch::Tensor grad_arena_;   // and gradients
  // Parameters (by index in parameters_, found by their values' address) whose gradient has
  // not been written this iteration: the buffer holds an old one.
  std::vector<char> unwritten_;
  std::unordered_map<const void*, int> parameter_index_;
  std::unique_ptr<DeviceOps> device_ops_;
  double loss_scale_ = 1.0;

  int64_t iteration_ = -1;
  bool evaluating_ = false;  // since BeginEvaluation: forward only, without gradients
  Batch replica_batch_;  // this replica's M * b samples of the current iteration
  std::map<int, MicrobatchStash> stash_;
  std::map<int, torch::Tensor> microbatch_losses_;  // scaled, float64, on the device
  torch::Tensor iteration_loss_;                      // their sum (undefined: none yet)
  mutable HostScalar loss_on_its_way_;  // iteration_loss_ after StartReadingIterationLoss
};

// Conversions between LibTorch and runtime element types.
absl::StatusOr<comm::DataType> ToCommType(torch::ScalarType type);
absl::StatusOr<torch::ScalarType> ToTorchType(comm::DataType type);

}  // namespace tandem::runtime::libtorch
