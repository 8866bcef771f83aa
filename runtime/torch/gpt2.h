// GPT-2 as tandem layers, computing what transformers' GPT2LMHeadModel computes:
//
//   layer 0          embedding: int64 token ids [b, S] -> wte(ids) + wpe(positions)
//   layers 1..L      block: x + attn.c_proj(attention(ln_1(x))), then
//                    x + mlp.c_proj(act(mlp.c_fc(ln_2(x)))); causal multi-head attention with
//                    one fused q/k/v product (attn.c_attn) with bias
//   layer L + 1      head: ln_f + LM head (tied to wte unless tie_word_embeddings is false)
//   loss             cross-entropy of the logits against the next tokens, mean over b * S
//
// Parameter names inside each layer are transformers' (Gpt2HfName maps them):
//   layer 0: wte.weight, wpe.weight
//   block:   ln_1.{weight,bias}, attn.c_attn.{weight,bias}, attn.c_proj.{weight,bias},
//            ln_2.{weight,bias}, mlp.c_fc.{weight,bias}, mlp.c_proj.{weight,bias}
//   head:    ln_f.{weight,bias}, lm_head.weight
// The products are transformers' Conv1D: weight [in, out] (transposed from torch::nn::Linear),
// y = x W + b, stored as in a checkpoint so that importing one is a rename. Their weight
// gradients are autograd's (not deferred to a zero-bubble W pass).
//
// No dropout: tandem computes what transformers' model computes in eval mode (a config's
// attn_pdrop, resid_pdrop and embd_pdrop are ignored).
//
// Tied embeddings: the head holds a copy of wte; Gpt2TiedWeights names the pair and shares it
// where one process holds both layers (runtime/torch/lm_parts.h).
//
// Initial values as transformers draws them: weights N(0, init_std), the residual projections
// (attn.c_proj, mlp.c_proj) N(0, init_std / sqrt(2 L)), biases 0, layer norms (1, 0).
//
// Tensor parallelism (Megatron-LM): heads (the query, key and value thirds of c_attn and the
// rows of attn.c_proj), MLP units (columns of c_fc, rows of mlp.c_proj) and vocabulary rows
// (wte, lm_head) split over the group; n_head, n_inner and vocab_size must divide. Sequence
// parallelism as the GPT's (tensor_parallel.h): layer norms, residual adds, the position
// embedding and pipeline transfers hold S/t tokens per rank. Under either the partial products
// are summed before the whole bias is added, so results equal transformers' within rounding,
// not bit for bit.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/json_util.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/lm_parts.h"
#include "runtime/torch/model.h"

namespace tandem::runtime::libtorch {

struct Gpt2Config {
  int64_t vocab = 16;         // vocab_size
  int64_t layers = 4;         // n_layer
  int64_t hidden = 64;        // n_embd
  int64_t heads = 4;          // n_head
  int64_t inner = 0;          // n_inner: the MLP's units; 0: 4 * hidden
  int64_t positions = 1024;   // n_positions: rows of wpe
  int64_t seq_len = 32;       // tokens per sample (not in config.json): at most positions
  double layer_norm_epsilon = 1e-5;
  // activation_function: "gelu_new" (GPT-2's tanh approximation, as transformers writes it),
  // "gelu_pytorch_tanh", "gelu_fast", "gelu" (exact), "relu", "silu" or "swish".
  std::string activation = "gelu_new";
  bool scale_attn_weights = true;                // divide the scores by sqrt(head_dim)
  bool scale_attn_by_inverse_layer_idx = false;  // and by the block's index + 1
  bool tie_word_embeddings = true;
  double init_std = 0.02;     // initializer_range
  GptAttention attention = GptAttention::kAuto;  // not part of DescribeGpt2: same numbers

  int64_t Inner() const { return inner > 0 ? inner : 4 * hidden; }
};

// A config from a transformers config.json, with transformers' GPT2Config defaults for absent
// (or null) fields. seq_len is not in the file: it keeps Gpt2Config's default, at most
// n_positions; set it afterwards. Refused with InvalidArgument naming the field: a model_type
// other than "gpt2", an activation_function not listed above, add_cross_attention true.
// Ignored: the dropout probabilities, reorder_and_upcast_attn (the same products in float32),
// n_ctx and the summary_* fields (sequence classification heads).
absl::StatusOr<Gpt2Config> Gpt2ConfigFromJson(const Json& json);

// InvalidArgument naming the field: positive sizes, n_embd divisible by n_head, seq_len within
// n_positions, a known activation.
absl::Status ValidateGpt2Config(const Gpt2Config& config);

// "gpt2 L=2 H=32 A=4 S=8 V=64" (+ " I=..." for an explicit n_inner, " act=..." for another
// activation, " untied", " no-scale", " scale-by-layer").
std::string DescribeGpt2(const Gpt2Config& config);

// The layer-by-layer builder (L + 2 layers).
ModelSpec Gpt2ModelSpec(const Gpt2Config& config);

// The wte/lm_head pair of a tied config (none otherwise), see lm_parts.h.
TiedWeights Gpt2TiedWeights(const Gpt2Config& config);

// Training FLOPs per token (PaLM's count, as GptTrainingFlopsPerToken): 6 * the parameters of
// the products (c_attn, c_proj, c_fc, mlp c_proj, the LM head) + 12 * layers * hidden * seq_len.
double Gpt2TrainingFlopsPerToken(const Gpt2Config& config);

// tandem's parameter name ("layers.<i>.<name>") to transformers' state-dict key:
// "transformer.wte.weight", "transformer.wpe.weight", "transformer.h.<i - 1>.<name>",
// "transformer.ln_f.weight", "lm_head.weight". InvalidArgument for a name that is not one of
// the model's. (A tied model's checkpoint holds no lm_head.weight: the copy comes from wte.)
absl::StatusOr<std::string> Gpt2HfName(const Gpt2Config& config, absl::string_view name);
// The reverse; also takes the keys of checkpoints saved without the "transformer." prefix
// (OpenAI's converted gpt2: "h.0.attn.c_attn.weight"). Their attention-mask buffers
// ("h.0.attn.bias", "h.0.attn.masked_bias") are not parameters: InvalidArgument, like any
// other key that is not one.
absl::StatusOr<std::string> Gpt2TandemName(const Gpt2Config& config, absl::string_view key);

}  // namespace tandem::runtime::libtorch
