#include "runtime/torch/tensor_parallel.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>
#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "runtime/torch/deferred_linear.h"

namespace tandem::runtime::libtorch {
comm::Buffer CommBufferOf(const torch::Tensor& t) {
  comm::Buffer buffer;
  buffer.data = t.data_ptr();
  buffer.count = t.numel();
  switch (t.scalar_type()) {
    case torch::kFloat: buffer.dtype = comm::DataType::kFloat32; break;
    case torch::kDouble: buffer.dtype = comm::DataType::kFloat64; break;
    case torch::kBFloat16: buffer.dtype = comm::DataType::kBFloat16; break;
    case torch::kHalf: buffer.dtype = comm::DataType::kFloat16; break;
    case torch::kLong: buffer.dtype = comm::DataType::kInt64; break;
    default:
      throw std::invalid_argument(absl::StrCat("tensor parallelism: no collective for ",
                                               std::string(c10::toString(t.scalar_type()))));
  }
  buffer.device = t.is_cuda() ? comm::Device::Cuda(t.get_device()) : comm::Device::Cpu();
  return buffer;
}

bool GroupTakes(const TensorParallel& tp, const torch::Tensor& t) {
  if (!t.is_cuda()) return true;
  return tp.group != nullptr && tp.group->backend() == "nccl";
}

void AwaitCollective(const comm::WorkPtr& work, const torch::Tensor& result, const char* what) {
  // The stages compute on LibTorch's default stream, the legacy default stream (nullptr), which
  // is also the stream NCCL's communicators order their operations after.
  const absl::Status status =
      result.is_cuda() ? comm::WaitOnStream(work, /*cuda_stream=*/nullptr) : work->Wait();
  if (!status.ok()) throw std::runtime_error(absl::StrCat(what, ": ", status.ToString()));
}

namespace {
// Reduces `t` over the group in place (a fresh contiguous tensor the caller owns). Throws, as
// LibTorch does: the stage turns exceptions into statuses.
void AllReduceInPlace(torch::Tensor& t, const TensorParallel& tp, comm::ReduceOp op) {
  if (!tp.enabled()) return;
  if (!GroupTakes(tp, t)) {
    torch::Tensor host = t.to(torch::kCPU).contiguous();
    AllReduceInPlace(host, tp, op);
    t.copy_(host);
    return;
  }
  AwaitCollective(tp.group->AllReduce(CommBufferOf(t), op), t, "tensor-parallel all-reduce");
}

torch::Tensor Reduced(const torch::Tensor& x, const TensorParallel& tp) {
  torch::Tensor out = x.contiguous().clone();
  AllReduceInPlace(out, tp, comm::ReduceOp::kSum);
  return out;
}

// The group travels through the autograd context as the address of a TensorParallel that
// outlives the graph (the stage's, or the layer's).
const TensorParallel& GroupOf(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<const TensorParallel*>(ctx->saved_data["tp"].toInt());
}

struct CopyToFunction : public torch::autograd::Function<CopyToFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               int64_t tp) {
    ctx->saved_data["tp"] = tp;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {Reduced(grads[0], GroupOf(ctx)), torch::Tensor()};
  }
};

struct ReduceFromFunction : public torch::autograd::Function<ReduceFromFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               int64_t tp) {
    ctx->saved_data["tp"] = tp;
    return Reduced(x, *reinterpret_cast<const TensorParallel*>(tp));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

int64_t Address(const TensorParallel& tp) { return reinterpret_cast<int64_t>(&tp); }

// The collectives of sequence parallelism work on [S, b, ...] (the sequence outermost, so a
// rank's tokens are one contiguous block) and give back [b, S', ...], contiguous.

torch::Tensor AllGatherSequence(const torch::Tensor& x, const TensorParallel& tp) {
  torch::Tensor local = x.transpose(0, 1).contiguous();
  const bool direct = GroupTakes(tp, local);
  if (!direct) local = local.to(torch::kCPU);
  std::vector<int64_t> shape = local.sizes().vec();
  shape[0] *= tp.size;
  torch::Tensor all = torch::empty(shape, local.options());
  AwaitCollective(tp.group->AllGather(CommBufferOf(local), CommBufferOf(all)), all,
                  "sequence-parallel all-gather");
  if (!direct) all = all.to(x.device());
  return all.transpose(0, 1).contiguous();
}

torch::Tensor ReduceScatterSequence(const torch::Tensor& x, const TensorParallel& tp) {
  if (x.size(1) % tp.size != 0) {
    throw std::invalid_argument(absl::StrCat("sequence parallelism: ", x.size(1),
                                             " tokens do not split over ", tp.size, " ranks"));
  }
  torch::Tensor whole = x.transpose(0, 1).contiguous();
  const bool direct = GroupTakes(tp, whole);
  if (!direct) whole = whole.to(torch::kCPU);
  std::vector<int64_t> shape = whole.sizes().vec();
  shape[0] /= tp.size;
  torch::Tensor mine = torch::empty(shape, whole.options());
  AwaitCollective(
      tp.group->ReduceScatter(CommBufferOf(whole), CommBufferOf(mine), comm::ReduceOp::kSum),
      mine, "sequence-parallel reduce-scatter");
  if (!direct) mine = mine.to(x.device());
  return mine.transpose(0, 1).contiguous();
}

struct GatherSequenceFunction : public torch::autograd::Function<GatherSequenceFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               int64_t tp) {
    ctx->saved_data["tp"] = tp;
    return AllGatherSequence(x, *reinterpret_cast<const TensorParallel*>(tp));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {ReduceScatterSequence(grads[0], GroupOf(ctx)), torch::Tensor()};
  }
};

struct ReduceScatterSequenceFunction
    : public torch::autograd::Function<ReduceScatterSequenceFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               int64_t tp) {
    ctx->saved_data["tp"] = tp;
    return ReduceScatterSequence(x, *reinterpret_cast<const TensorParallel*>(tp));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {AllGatherSequence(grads[0], GroupOf(ctx)), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor GatherFromSequenceParallel(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.sequence_split()) return x;
  return GatherSequenceFunction::apply(x, Address(tp));
}

torch::Tensor ReduceScatterToSequenceParallel(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.sequence_split()) return x;
  return ReduceScatterSequenceFunction::apply(x, Address(tp));
}

namespace {

// LinearOverWhole's makers for a sequence-parallel product; `tp` is the TensorParallel's
// address.
torch::Tensor GatherForProduct(const torch::Tensor& x, int64_t tp) {
  return AllGatherSequence(x, *reinterpret_cast<const TensorParallel*>(tp));
}
torch::Tensor ScatterProductGradient(const torch::Tensor& g, int64_t tp) {
  return ReduceScatterSequence(g, *reinterpret_cast<const TensorParallel*>(tp));
}

}  // namespace

torch::Tensor LinearOverGatheredSequence(const torch::Tensor& x, const torch::Tensor& weight,
                                         const torch::Tensor& bias, const TensorParallel& tp) {
  if (!tp.sequence_split()) return DeferrableLinear(x, weight, bias);
  return LinearOverWhole(x, weight, bias, {GatherForProduct, ScatterProductGradient, Address(tp)});
}

std::vector<torch::Tensor> LinearsOverGatheredSequence(const torch::Tensor& x,
                                                       const std::vector<torch::Tensor>& weights,
                                                       const std::vector<torch::Tensor>& biases,
                                                       const TensorParallel& tp) {
  if (!tp.sequence_split()) {
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < weights.size(); ++i) {
      out.push_back(DeferrableLinear(x, weights[i], biases[i]));
    }
    return out;
  }
  return LinearsOverWhole(x, weights, biases,
                          {GatherForProduct, ScatterProductGradient, Address(tp)});
}

std::vector<torch::Tensor> CopyToTensorParallel(const std::vector<torch::Tensor>& tensors,
                                                const TensorParallel& tp) {
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& t : tensors) {
    if (t.defined()) flat.push_back(t.reshape({-1}));
  }
  if (!tp.enabled() || flat.empty()) return tensors;
  // One tensor through CopyToTensorParallel: its backward sums all the gradients at once.
  const torch::Tensor joined = CopyToTensorParallel(torch::cat(flat), tp);
  std::vector<torch::Tensor> out;
  int64_t at = 0;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined()) {
      out.push_back(t);
      continue;
    }
    out.push_back(joined.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
  return out;
}

std::vector<torch::Tensor> SharedOverTheSequence(const std::vector<torch::Tensor>& parameters,
                                                 const TensorParallel& tp) {
  if (!tp.sequence_split()) return parameters;
  return CopyToTensorParallel(parameters, tp);
}

namespace {

// The rows of `x` exchanged over tp.expert_group (ExchangeExpertRows's forward). A CUDA tensor
// over a host group travels through a host copy, as GroupTakes's collectives do.
torch::Tensor ExchangeRows(const torch::Tensor& x, const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows, const TensorParallel& tp) {
  comm::Communicator& group = *tp.expert_group;
  const int members = group.size(), me = group.rank();
  if (static_cast<int>(send_rows.size()) != members ||
      static_cast<int>(recv_rows.size()) != members) {
    throw std::invalid_argument(absl::StrCat("expert all-to-all: ", send_rows.size(), " and ",
                                             recv_rows.size(), " row counts for ", members,
                                             " replicas"));
  }
  torch::Tensor local = x.contiguous();
  const bool direct = !local.is_cuda() || group.backend() == "nccl";
  if (!direct) local = local.to(torch::kCPU);
  std::vector<int64_t> shape = local.sizes().vec();
  int64_t sent = 0, received = 0;
  for (int m = 0; m < members; ++m) {
    sent += send_rows[m];
    received += recv_rows[m];
  }
  if (sent != shape[0] || send_rows[me] != recv_rows[me]) {
    throw std::invalid_argument(absl::StrCat("expert all-to-all: ", shape[0], " rows, ", sent,
                                             " to send; ", send_rows[me], " kept against ",
                                             recv_rows[me], " expected"));
  }
  shape[0] = received;
  torch::Tensor out = torch::empty(shape, local.options());
  std::vector<comm::PointToPoint> transfers;
  int64_t send_at = 0, recv_at = 0;
  for (int m = 0; m < members; ++m) {
    const torch::Tensor outgoing = local.narrow(0, send_at, send_rows[m]);
    const torch::Tensor incoming = out.narrow(0, recv_at, recv_rows[m]);
    if (m == me) {
      incoming.copy_(outgoing);
    } else {
      if (send_rows[m] > 0) {
        transfers.push_back({comm::PointToPoint::Kind::kSend, CommBufferOf(outgoing), m});
      }
      if (recv_rows[m] > 0) {
        transfers.push_back({comm::PointToPoint::Kind::kRecv, CommBufferOf(incoming), m});
      }
    }
    send_at += send_rows[m];
    recv_at += recv_rows[m];
  }
  if (!transfers.empty()) {
    AwaitCollective(group.SendRecvBatch(transfers), out, "expert all-to-all");
  }
  return direct ? out : out.to(x.device());
}

std::vector<int64_t> RowCounts(const c10::IValue& value) { return value.toIntVector(); }

struct ExchangeRowsFunction : public torch::autograd::Function<ExchangeRowsFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t tp,
                               std::vector<int64_t> send_rows, std::vector<int64_t> recv_rows) {
    ctx->saved_data["tp"] = tp;
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return ExchangeRows(x, send_rows, recv_rows, *reinterpret_cast<const TensorParallel*>(tp));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {ExchangeRows(grads[0], RowCounts(ctx->saved_data["recv"]),
                         RowCounts(ctx->saved_data["send"]), GroupOf(ctx)),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor GatherExpertCounts(const torch::Tensor& local, const torch::Device& device,
                                 const TensorParallel& tp) {
  comm::Communicator& group = *tp.expert_group;
  // NCCL takes device buffers only: the counts travel on the device then.
  torch::Tensor mine = local.to(torch::kLong).contiguous();
  if (group.backend() == "nccl") mine = mine.to(device);
  torch::Tensor all = torch::empty({group.size(), mine.numel()}, mine.options());
  AwaitCollective(group.AllGather(CommBufferOf(mine), CommBufferOf(all)), all,
                  "expert counts all-gather");
  return all.to(torch::kCPU);
}

torch::Tensor ExchangeExpertRows(const torch::Tensor& x, const std::vector<int64_t>& send_rows,
                                 const std::vector<int64_t>& recv_rows, const TensorParallel& tp) {
  return ExchangeRowsFunction::apply(x, Address(tp), send_rows, recv_rows);
}

absl::Status TensorParallel::CheckDivisible(int64_t total, const char* what) const {
  if (size < 1 || total % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallelism of degree ", size,
                                                   " needs ", what, " (", total,
                                                   ") divisible by ", size));
  }
  return absl::OkStatus();
}

torch::Tensor CopyToTensorParallel(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.enabled()) return x;
  return CopyToFunction::apply(x, Address(tp));
}

torch::Tensor ReduceFromTensorParallel(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.enabled()) return x;
  return ReduceFromFunction::apply(x, Address(tp));
}

torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& local_logits,
                                        const torch::Tensor& targets, const TensorParallel& tp) {
  const int64_t local_vocab = local_logits.size(-1);
  const torch::Tensor logits = local_logits.reshape({-1, local_vocab}).to(torch::kFloat);
  const torch::Tensor ids = targets.reshape({-1});
  // The maximum only keeps exp() in range: no gradient flows through it.
  torch::Tensor maximum = std::get<0>(logits.detach().max(/*dim=*/-1)).contiguous();
  AllReduceInPlace(maximum, tp, comm::ReduceOp::kMax);
  const torch::Tensor shifted = logits - maximum.unsqueeze(-1);
  const torch::Tensor sum_exp = ReduceFromTensorParallel(shifted.exp().sum(-1), tp);
  // The target's logit lives on the rank whose shard holds its id; the others add zero.
  const int64_t first = tp.enabled() ? tp.rank * local_vocab : 0;
  const torch::Tensor local_ids = ids - first;
  const torch::Tensor mine = (local_ids >= 0).logical_and(local_ids < local_vocab);
  const torch::Tensor index = local_ids.clamp(0, local_vocab - 1).unsqueeze(-1);
  const torch::Tensor target_logit = ReduceFromTensorParallel(
      shifted.gather(-1, index).squeeze(-1) * mine.to(shifted.scalar_type()), tp);
  return (sum_exp.log() - target_logit).mean();
}

}  // namespace tandem::runtime::libtorch
