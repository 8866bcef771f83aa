// GPT: a decoder-only transformer as an ordered list of layers for the runtime.
//
//   layer 0          embedding: int64 token ids [b, S] -> token + position embeddings [b, S, H]
//   layers 1..N      transformer block: x + attn(LN(x)), then x + MLP(LN(x)); causal
//                    multi-head self-attention (fused q/k/v projection without bias: a key
//                    bias has an exactly zero gradient, which float rounding turns into
//                    AdamW updates of pure noise), MLP H -> 4H -> H with GELU
//   layer N + 1      head: final LayerNorm + linear LM head (no bias) -> logits [b, S, vocab]
//   loss             cross-entropy of the logits against the next tokens, mean over b * S
//
// No dropout: forward is deterministic, so recomputation reproduces the stash exactly.
// Initial values: linear and embedding weights N(0, init_std), biases 0, LayerNorm (1, 0);
// the residual output projections use init_std / sqrt(2 N) (GPT-2). The LM head is not tied to
// the token embedding, because the two usually live on different pipeline stages.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/torch/model.h"

namespace tandem::runtime::libtorch {

// How a block computes causal self-attention. kFused: scaled_dot_product_attention (flash,
// cuDNN or memory-efficient kernels on GPUs; LibTorch 1.13 has only its experimental math
// version, at::_scaled_dot_product_attention). kExplicit: softmax(QK^T / sqrt(d) + mask) V as
// separate operations. kAuto: kFused where LibTorch >= 2.0, else kExplicit. The forms agree
// within float rounding (tested).
enum class GptAttention { kAuto, kExplicit, kFused };
const char* GptAttentionName(GptAttention attention);  // "auto", "explicit", "fused"
absl::StatusOr<GptAttention> ParseGptAttention(absl::string_view name);
// Whether kAuto resolves to the fused form in this build.
bool FusedAttentionByDefault();

struct GptConfig {
  int64_t vocab = 16;
  int64_t layers = 4;  // transformer blocks, N
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t seq_len = 32;
  double init_std = 0.02;
  GptAttention attention = GptAttention::kAuto;  // not part of DescribeGpt: same numbers
};

// Training FLOPs per token (forward + backward, no recomputation), as PaLM's appendix B counts
// them: 6 * parameters in the matrix multiplications (embeddings excluded, the LM head
// included) + 12 * layers * hidden * seq_len for attention scores and values.
double GptTrainingFlopsPerToken(const GptConfig& config);

// InvalidArgument naming the field: positive sizes, hidden divisible by heads.
absl::Status ValidateGptConfig(const GptConfig& config);

// "gpt L=4 H=64 A=4 S=32 V=16".
std::string DescribeGpt(const GptConfig& config);
// The config a DescribeGpt text stands for (a " seed=N" token, as checkpoints record it, is
// ignored; init_std keeps its default); InvalidArgument naming what it cannot read.
absl::StatusOr<GptConfig> GptConfigFromDescription(absl::string_view description);

// A builder of the GPT above (N + 2 layers). ModelSpec::Build reports an invalid config as
// InvalidArgument.
ModelSpec GptModelSpec(const GptConfig& config);

}  // namespace tandem::runtime::libtorch
