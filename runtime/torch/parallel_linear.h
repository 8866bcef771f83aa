// Linear layers a model marks for tensor parallelism (runtime/torch/tensor_parallel.h), for
// models other than the built-in GPT. Without a tensor-parallel group they are ordinary linear
// layers (parameters "weight" [out, in] and "bias" [out], torch::nn::Linear's initialisation),
// so the same model runs, and trains in the reference trainer, unsharded.
//
//   ColumnParallelLinear(in, out)  output features split: takes the whole input, gives this
//                                  rank's features (or, with gather_output, all of them)
//   RowParallelLinear(in, out)     input features split: takes this rank's features (the
//                                  output of a column-parallel layer), sums the partial
//                                  products over the group, then adds its whole bias
//
// A column-parallel layer followed by an element-wise function and a row-parallel layer is
// Megatron's MLP: one all-reduce forward, one backward. EnableTensorParallelism(model) lets a
// model run with tensor_parallel > 1 by sharding every marked layer it contains (at any depth
// of a layer's modules); its loss then sees whole outputs, so a model whose last layer is
// column-parallel gives it gather_output.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include "absl/status/status.h"
#include "runtime/torch/model.h"
#include "runtime/torch/tensor_parallel.h"

namespace tandem::runtime::libtorch {

class ColumnParallelLinearImpl : public torch::nn::Cloneable<ColumnParallelLinearImpl> {
 public:
  ColumnParallelLinearImpl(int64_t in, int64_t out, bool bias = true, bool gather_output = false);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  // Keeps this rank's rows of the weight and bias (InvalidArgument unless `out` divides).
  absl::Status ShardForTensorParallel(const TensorParallel& tp);

  torch::Tensor weight, bias;

 private:
  int64_t in_, out_;
  bool has_bias_, gather_output_;
  TensorParallel tp_;
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinearImpl : public torch::nn::Cloneable<RowParallelLinearImpl> {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, bool bias = true);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  // Keeps this rank's columns of the weight; the bias stays whole.
  absl::Status ShardForTensorParallel(const TensorParallel& tp);

  torch::Tensor weight, bias;

 private:
  int64_t in_, out_;
  bool has_bias_;
  TensorParallel tp_;
};
TORCH_MODULE(RowParallelLinear);

// Replaces a parameter's data by `length` entries of dimension `dim` from `begin` (a copy; the
// same tensor object, so the module keeps it). `length` may be 0.
void KeepSlice(torch::Tensor& parameter, int64_t dim, int64_t begin, int64_t length);

// Megatron's all-gather of a split last dimension: forward gathers this rank's [..., n] into
// [..., t * n] (rank order), backward keeps this rank's part of the gradient.
torch::Tensor GatherFromTensorParallel(const torch::Tensor& x, const TensorParallel& tp);

// Shards every ColumnParallelLinear and RowParallelLinear inside `layers` (the signature of
// LayeredModel::shard_for_tensor_parallel).
absl::Status ShardMarkedLayers(std::vector<torch::nn::AnyModule>& layers, int first,
                               const TensorParallel& tp);

// Sets model.shard_for_tensor_parallel to ShardMarkedLayers and model.tensor_parallel_loss to
// the model's own loss (whole outputs).
void EnableTensorParallelism(LayeredModel& model);

}  // namespace tandem::runtime::libtorch
