// Tensor parallelism (Megatron-LM style) for LibTorch layers: the communication primitives as
// autograd functions, and vocabulary-parallel cross-entropy.
//
// A tensor-parallel group of t ranks runs the same stage on the same micro-batch; each holds
// 1/t of the stage's large weight matrices. Between the sharded matrix products the
// activations are replicated (every rank of the group holds the same tensor), so the pipeline
// transfers and the layers without weights to split (layer norms, biases after a reduction)
// are unchanged. Two conjugate operations move between the two worlds (Megatron's f and g):
//
//   CopyToTensorParallel     forward: identity          backward: all-reduce (sum)
//   ReduceFromTensorParallel forward: all-reduce (sum)  backward: identity
//
// A column-parallel linear (output features split) takes CopyToTensorParallel(x); a
// row-parallel linear (input features split) ends with ReduceFromTensorParallel of its
// partial products, then adds its (replicated) bias. The all-reduces run on the group's
// communicator, on the stage's thread: every rank of the group executes the same stage
// program, so they issue them in the same order. With a GPU per rank the group is NCCL's: a
// collective runs on NCCL's stream after the work queued on LibTorch's default stream, and
// that stream waits for it on the device (AwaitCollective), so the host keeps launching. CUDA
// stages over an MPI group reduce host copies (GroupTakes), the fallback for ranks that share
// a GPU.
//
// Vocabulary parallelism: each rank holds rows [first, first + vocab / t) of the token
// embedding and of the LM head. The embedding looks up the ids in its range (zero elsewhere)
// and reduces; the loss is computed from the local logits with three reductions (maximum,
// sum of exponentials, target logit), never gathering the full [tokens, vocab] logits.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "absl/status/status.h"
#include "comm/communicator.h"

namespace tandem::runtime::libtorch {

struct TensorParallel {
  int size = 1;  // t
  int rank = 0;  // this rank's index in the group
  comm::Communicator* group = nullptr;  // the t ranks sharing the stage (rank() == rank)
  // Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large
  // Transformer Models", 2022): outside the split matrix products the activations are split
  // along the sequence (dimension 1 of [b, S, h]) instead of replicated, so layer norms,
  // residual adds and pipeline transfers handle S/t tokens per rank. A model that supports it
  // reads this; others run as without it.
  bool sequence_parallel = false;
  // Expert parallelism inside the group (Megatron-LM's expert_model_parallel_size with
  // expert_tensor_parallel_size = t / expert_parallel, its all-gather token dispatcher): a
  // mixture of experts places its experts whole on `expert_parallel` parts of the group (t /
  // expert_parallel consecutive ranks each, which split their experts' units as tensor
  // parallelism does); a rank keeps empty parameters of the experts other parts hold. Every
  // rank routes the whole sequence, as with the experts split; only the experts' placement
  // changes. Must divide `size`; 1: every expert split over the whole group. Models without
  // experts ignore it.
  int expert_parallel = 1;
  // Expert parallelism across data-parallel replicas (Megatron-LM's expert parallelism over
  // data-parallel ranks with its all-to-all token dispatcher, as DeepSpeed-MoE's): the experts
  // this rank's part of the group would hold are spread further over `expert_replicas`
  // data-parallel replicas, each holding 1 / expert_replicas of them (a run of consecutive
  // experts, replica j the j-th). Each replica routes its own tokens; the (token, expert) pairs
  // for another replica's experts travel there and their outputs back by all-to-all over
  // `expert_group`: this rank's counterparts (same stage, same index in the group) on those
  // replicas, in replica order (expert_group->rank() == expert_replica). An expert's gradient
  // then sums every replica's tokens on the replica holding it. 1: every replica holds every
  // expert. Models without experts ignore it.
  int expert_replicas = 1;
  int expert_replica = 0;
  comm::Communicator* expert_group = nullptr;

  bool enabled() const { return size > 1; }
  bool experts_over_replicas() const { return expert_replicas > 1; }
  bool sequence_split() const { return size > 1 && sequence_parallel; }
  // [first, end) of `total` split in `size` equal parts (InvalidArgument naming `what` when
  // `total` is not divisible).
  absl::Status CheckDivisible(int64_t total, const char* what) const;
  int64_t ShardSize(int64_t total) const { return total / size; }
  int64_t ShardBegin(int64_t total) const { return rank * (total / size); }
};

// A contiguous tensor's memory as a communication buffer (float32/64, bfloat16, float16 or
// int64; std::invalid_argument otherwise, as LibTorch throws).
comm::Buffer CommBufferOf(const torch::Tensor& t);

// Whether the group's collectives take `t` where it lies. A CUDA tensor over a host group (MPI,
// the engine's tensor-parallel groups) does not: the collectives then run on a host copy made
// after the work queued on the tensor (Tensor::to waits for it) and copy the result back.
bool GroupTakes(const TensorParallel& tp, const torch::Tensor& t);

// Completes a collective of the group whose result is `result`: a CUDA tensor (an NCCL
// group, a GPU per rank) is ordered on the stages' compute stream (LibTorch's default stream)
// after it, on the device, without blocking the host; anything else is waited for on the host. Throws
// std::runtime_error naming `what` on failure, as LibTorch does.
void AwaitCollective(const comm::WorkPtr& work, const torch::Tensor& result, const char* what);

// Megatron's f: identity forward, all-reduce of the gradient backward.
torch::Tensor CopyToTensorParallel(const torch::Tensor& x, const TensorParallel& tp);
// The same for several tensors (undefined ones passed through): their gradients are summed with
// one all-reduce for all of them.
std::vector<torch::Tensor> CopyToTensorParallel(const std::vector<torch::Tensor>& tensors,
                                                const TensorParallel& tp);
// Expert parallelism across replicas (TensorParallel::expert_replicas):
//   GatherExpertCounts   every member's `local` (int64 [n]): [members, n], on the CPU, by
//                        all-gather over tp.expert_group (on `device` where the group is
//                        NCCL's)
//   ExchangeExpertRows   all-to-all of rows over tp.expert_group: x's first send_rows[0] rows
//                        go to member 0, the next send_rows[1] to member 1, and so on; returns
//                        the rows received, recv_rows[s] from member s, in member order (what
//                        member s sent this rank). Backward: the gradient's rows go back the
//                        same way reversed.
torch::Tensor GatherExpertCounts(const torch::Tensor& local, const torch::Device& device,
                                 const TensorParallel& tp);
torch::Tensor ExchangeExpertRows(const torch::Tensor& x, const std::vector<int64_t>& send_rows,
                                 const std::vector<int64_t>& recv_rows, const TensorParallel& tp);

// Megatron's g: all-reduce forward, identity backward.
torch::Tensor ReduceFromTensorParallel(const torch::Tensor& x, const TensorParallel& tp);

// Sequence parallelism's conjugates on dimension 1 (S must divide by t):
//   GatherFromSequenceParallel       forward: all-gather [b, S/t, ...] -> [b, S, ...]
//                                    backward: reduce-scatter (sum) back to this rank's S/t
//   ReduceScatterToSequenceParallel  forward: reduce-scatter (sum) [b, S, ...] -> [b, S/t, ...]
//                                    backward: all-gather
// The first replaces CopyToTensorParallel before a column-parallel product, the second
// ReduceFromTensorParallel after a row-parallel one.
torch::Tensor GatherFromSequenceParallel(const torch::Tensor& x, const TensorParallel& tp);
torch::Tensor ReduceScatterToSequenceParallel(const torch::Tensor& x, const TensorParallel& tp);

// DeferrableLinear(GatherFromSequenceParallel(x, tp), weight, bias) that keeps only this
// rank's S/t tokens of the input for the backward, which gathers them again for the weight
// gradient (Megatron-LM's sequence parallelism keeps its products' inputs so): a column-parallel
// product under sequence parallelism then holds S/t tokens of its input between forward and
// backward instead of S. Without sequence parallelism, DeferrableLinear(x, weight, bias).
torch::Tensor LinearOverGatheredSequence(const torch::Tensor& x, const torch::Tensor& weight,
                                         const torch::Tensor& bias, const TensorParallel& tp);
// The same for several products of one input (Llama's q, k and v; gate and up), gathered once
// each way: biases[i] undefined where product i has none.
std::vector<torch::Tensor> LinearsOverGatheredSequence(const torch::Tensor& x,
                                                       const std::vector<torch::Tensor>& weights,
                                                       const std::vector<torch::Tensor>& biases,
                                                       const TensorParallel& tp);

// Parameters every rank of the group holds whole but applies to its own S/t tokens only (layer
// norms, biases, position embeddings under sequence parallelism): returned as used in the
// forward pass, and in the backward pass their gradients are summed over the group (one
// all-reduce for all of them), so every rank applies the same whole-sequence gradient. Without
// sequence parallelism, the parameters themselves.
std::vector<torch::Tensor> SharedOverTheSequence(const std::vector<torch::Tensor>& parameters,
                                                 const TensorParallel& tp);

// Mean cross-entropy over all tokens of `local_logits` ([..., vocab / t], this rank's
// vocabulary shard) against `targets` (int64 [...], global ids), equal to the cross-entropy
// of the gathered logits.
torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& local_logits,
                                        const torch::Tensor& targets, const TensorParallel& tp);

}  // namespace tandem::runtime::libtorch
