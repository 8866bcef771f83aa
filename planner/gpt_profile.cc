#include "planner/gpt_profile.h"

#include "absl/strings/str_cat.h"

namespace tandem::planner {
namespace {

constexpr double kBytesPerValue = 2.0;           // fp16 / bf16
constexpr double kOptimizerBytesPerParameter = 12.0;  // fp32 master weights + two moments
constexpr double kBackwardPerForward = 2.0;
// Activation bytes per s*b*h element group (Korthikanti et al. 2022), split between the
// attention block (with its layer norm) and the MLP block (with its layer norm).
constexpr double kAttentionActivationShared = 5.0;   // not split by tensor parallelism
constexpr double kAttentionActivationSplit = 8.0;    // split by t
constexpr double kMlpActivationShared = 5.0;
constexpr double kMlpActivationSplit = 16.0;
constexpr double kScoreActivationPerElement = 5.0;   // 5 a s^2 b
// Tensor-parallel all-reduces of the block output: one forward and one backward per
// attention or MLP block (four per transformer layer).
constexpr int kAllReducesPerBlock = 2;
// Logits in fp16 plus the fp32 softmax kept for the loss.
constexpr double kLogitBytesPerValue = 6.0;

struct BlockCosts {
  double forward_flops = 0;
  double parameters = 0;
  double activation_shared = 0;  // bytes, independent of t
  double activation_split = 0;   // bytes, divided by t
  int all_reduces = 0;           // tensor-parallel all-reduces of 2 s b h bytes (fw + bw)
};

pipeline::LayerProfile Layer(const std::string& name, const BlockCosts& block,
                             const GptShape& shape, const DeviceFigures& device) {
  const double effective_flops = device.peak_flops * device.efficiency;
  const double boundary_bytes =
      kBytesPerValue * shape.sequence * shape.microbatch_size * double(shape.hidden);
  pipeline::LayerProfile layer;
  layer.name = name;
  layer.forward_seconds = block.forward_flops / effective_flops;
  layer.backward_seconds = kBackwardPerForward * layer.forward_seconds;
  layer.backward_input_seconds = layer.backward_seconds / 2;
  layer.backward_weight_seconds = layer.backward_seconds / 2;
  layer.output_activation_bytes = boundary_bytes;
  layer.stashed_activation_bytes = block.activation_shared + block.activation_split;
  layer.parameter_bytes = kBytesPerValue * block.parameters;
  layer.optimizer_state_bytes = kOptimizerBytesPerParameter * block.parameters;
  layer.recompute_seconds = layer.forward_seconds;
  layer.recompute_stashed_bytes = std::min(boundary_bytes, layer.stashed_activation_bytes);
  for (int t : shape.tensor_parallel_degrees) {
    if (t < 2) continue;
    pipeline::TensorParallelVariant variant;
    variant.degree = t;
    variant.forward_seconds = layer.forward_seconds / t;
    variant.backward_seconds = layer.backward_seconds / t;
    variant.stashed_activation_bytes =
        shape.sequence_parallel ? (block.activation_shared + block.activation_split) / t
                                : block.activation_shared + block.activation_split / t;
    // An all-gather and a reduce-scatter move the bytes of the all-reduce they replace.
    variant.sequence_parallel = shape.sequence_parallel;
    variant.parameter_bytes = layer.parameter_bytes / t;
    // Ring all-reduce of the block output, forward and backward.
    const double ring_bytes = 2.0 * (t - 1) / t * boundary_bytes;
    variant.communication_seconds =
        block.all_reduces * ring_bytes / device.tensor_parallel_bandwidth_bytes_per_second;
    layer.tensor_parallel.push_back(variant);
  }
  return layer;
}

}  // namespace

GptShape Gpt3Shape() { return GptShape{}; }
DeviceFigures A100Figures() { return DeviceFigures{}; }

pipeline::Profile MakeGptProfile(const GptShape& shape, const DeviceFigures& device) {
  const double s = shape.sequence, b = shape.microbatch_size, h = shape.hidden;
  const double a = shape.heads, v = shape.vocabulary;
  const double sbh = s * b * h;
  pipeline::Profile profile;
  profile.model = absl::StrCat(shape.name, " L=", shape.layers, " h=", shape.hidden,
                               " s=", shape.sequence, shape.split_blocks ? " (split blocks)" : "",
                               shape.sequence_parallel ? " (sequence parallel)" : "");
  profile.microbatch_size = shape.microbatch_size;
  profile.device = absl::StrCat(device.name, " (computed from shapes, ", device.efficiency * 100,
                                "% of peak)");

  BlockCosts embedding;
  embedding.parameters = v * h + s * h;  // token and position embeddings
  embedding.forward_flops = 0;
  embedding.activation_shared = kBytesPerValue * sbh;
  profile.layers.push_back(Layer("embedding", embedding, shape, device));
  profile.layers.back().forward_seconds = profile.layers.back().backward_seconds = 0;
  profile.layers.back().backward_input_seconds = profile.layers.back().backward_weight_seconds = 0;
  profile.layers.back().recompute_seconds = 0;

  BlockCosts attention;
  attention.forward_flops = 8 * b * s * h * h + 4 * b * s * s * h;
  attention.parameters = 4 * h * h + 4 * h + 2 * h;  // QKV + output projection, layer norm
  attention.activation_shared = kAttentionActivationShared * sbh;
  attention.activation_split =
      kAttentionActivationSplit * sbh + kScoreActivationPerElement * a * s * s * b;
  attention.all_reduces = kAllReducesPerBlock;
  BlockCosts mlp;
  mlp.forward_flops = 16 * b * s * h * h;
  mlp.parameters = 8 * h * h + 5 * h + 2 * h;  // two projections, layer norm
  mlp.activation_shared = kMlpActivationShared * sbh;
  mlp.activation_split = kMlpActivationSplit * sbh;
  mlp.all_reduces = kAllReducesPerBlock;
  BlockCosts whole;
  whole.forward_flops = attention.forward_flops + mlp.forward_flops;
  whole.parameters = attention.parameters + mlp.parameters;
  whole.activation_shared = attention.activation_shared + mlp.activation_shared;
  whole.activation_split = attention.activation_split + mlp.activation_split;
  whole.all_reduces = attention.all_reduces + mlp.all_reduces;
  for (int i = 0; i < shape.layers; ++i) {
    if (shape.split_blocks) {
      profile.layers.push_back(Layer(absl::StrCat("layer", i, ".attention"), attention, shape,
                                     device));
      profile.layers.push_back(Layer(absl::StrCat("layer", i, ".mlp"), mlp, shape, device));
    } else {
      profile.layers.push_back(Layer(absl::StrCat("layer", i), whole, shape, device));
    }
  }

  BlockCosts head;
  head.forward_flops = 2 * b * s * h * v;
  head.parameters = v * h + 2 * h;  // output projection (untied) and final layer norm
  head.activation_split = kLogitBytesPerValue * s * b * v;  // vocabulary-parallel logits
  profile.layers.push_back(Layer("head", head, shape, device));
  return profile;
}

}  // namespace tandem::planner
