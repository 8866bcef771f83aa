// Llama 3 (and 2) as tandem layers, computing what transformers' LlamaForCausalLM computes (and
// MistralForCausalLM, Qwen2ForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM,
// MixtralForCausalLM, Qwen2MoeForCausalLM, GraniteForCausalLM, GraniteMoeForCausalLM,
// Phi3ForCausalLM, OlmoForCausalLM, OlmoeForCausalLM, Starcoder2ForCausalLM, PhiForCausalLM,
// GPTNeoXForCausalLM, StableLmForCausalLM, GPTJForCausalLM, CohereForCausalLM, GlmForCausalLM,
// FalconForCausalLM, NemotronForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM and
// Olmo2ForCausalLM and Gemma3ForCausalLM, variations of the same computation: see LlamaConfig):
//
//   layer 0          embedding: int64 token ids [b, S] -> embed_tokens(ids) [b, S, hidden]
//   layers 1..L      decoder block: x + o_proj(attention(RMSNorm(x))), then
//                    x + down_proj(silu(gate_proj(n)) * up_proj(n)) with n = RMSNorm(x);
//                    causal attention with rotary position embeddings (rope_theta, optionally
//                    Llama 3's frequency scaling) and grouped-query attention (kv_heads key/value
//                    heads, each shared by heads / kv_heads query heads)
//   layer L + 1      head: final RMSNorm + LM head -> logits [b, S, vocab]
//   loss             cross-entropy of the logits against the next tokens, mean over b * S
//
// Parameter names inside each layer are transformers' (LlamaHfName maps them):
//   layer 0: embed_tokens.weight
//   block:   input_layernorm.weight, self_attn.{q,k,v,o}_proj.weight (and .bias with
//            attention_bias), post_attention_layernorm.weight,
//            mlp.{gate,up,down}_proj.weight (and .bias with mlp_bias); Mixtral's
//            block_sparse_moe.gate.weight and block_sparse_moe.experts.<e>.{w1,w2,w3}.weight
//            instead of mlp; Qwen2-MoE's sparse blocks mlp.gate.weight,
//            mlp.experts.<e>.{gate,up,down}_proj.weight, mlp.shared_expert.{gate,up,down}_proj
//            .weight and mlp.shared_expert_gate.weight; Qwen3's self_attn.q_norm.weight and
//            self_attn.k_norm.weight ([head_dim] each)
//   head:    norm.weight, lm_head.weight
// (Phi's: model.final_layernorm and self_attn.dense in its checkpoints are tandem's norm and
// self_attn.o_proj; its lm_head has a bias. GPT-NeoX's blocks are named as its checkpoints
// name them, inside gpt_neox.layers.<i>: input_layernorm, post_attention_layernorm,
// attention.query_key_value, attention.dense, mlp.dense_h_to_4h and mlp.dense_4h_to_h; its
// gpt_neox.embed_in, gpt_neox.final_layer_norm and embed_out are tandem's embed_tokens, norm and
// lm_head. GPT-J's are named as its checkpoints name them too, inside transformer.h.<i>: ln_1,
// attn.{q,k,v,out}_proj, mlp.fc_in and mlp.fc_out; its transformer.wte and transformer.ln_f are
// tandem's embed_tokens and norm, and its lm_head has a bias. Falcon's are named as its
// checkpoints name them, inside transformer.h.<i>: input_layernorm (and post_attention_layernorm,
// or ln_attn and ln_mlp), self_attention.query_key_value, self_attention.dense,
// mlp.dense_h_to_4h and mlp.dense_4h_to_h; its transformer.word_embeddings and transformer.ln_f
// are tandem's embed_tokens and norm.)
// Weights are stored as transformers stores them ([out, in]), so importing a checkpoint is a
// rename; Phi-3's checkpoints fuse q/k/v_proj into self_attn.qkv_proj and gate/up_proj into
// mlp.gate_up_proj, whose rows tandem's separate products are (LlamaHfRows), and GraniteMoE's
// its experts into block_sparse_moe.input_linear and output_linear (its router is
// block_sparse_moe.router.layer). No dropout: tandem computes what transformers' model
// computes in eval mode (a config's attention_dropout is ignored).
//
// Tied embeddings (tie_word_embeddings): the head holds a copy of the embedding; LlamaTiedWeights
// names the pair and shares it where one process holds both layers (runtime/torch/lm_parts.h).
//
// Initial values as transformers draws them: linear and embedding weights N(0, init_std),
// biases 0, RMSNorm weights 1 (a tied head's copy is drawn apart; a stage holding the head
// without the embedding starts it from the embedding's values, see lm_parts.h).
//
// Tensor parallelism (Megatron-LM): query heads and key/value heads, MLP units and vocabulary
// rows split over the group (heads, kv_heads, intermediate and vocab must divide). Sequence
// parallelism (tensor_parallel.h) as the GPT's: the RMSNorms, residual adds and pipeline
// transfers hold S/t tokens per rank (seq_len must divide); the rotary angles are those of the
// whole sequence, which the split products see gathered.
//
// Mixtral's sparse mixture of experts (transformers' MixtralSparseMoeBlock) replaces the MLP:
// a router (block_sparse_moe.gate, no bias) scores the experts of each token, the softmax of
// the scores in float32 keeps the experts_per_token best, their probabilities renormalised to
// sum to 1, and the token's output is the sum of those experts' MLPs (w2(silu(w1 x) * w3 x)),
// each weighted by its probability; every token reaches its experts (no capacity, nothing
// dropped), the experts in order as transformers adds them. Qwen2-MoE's
// (Qwen2MoeSparseMoeBlock) is the same with its own expert size, the probabilities kept as
// they are unless norm_topk_prob, and a shared expert every token passes through, its output
// scaled by sigmoid(shared_expert_gate x); its blocks may alternate with dense ones
// (decoder_sparse_step, mlp_only_layers). Under tensor parallelism every
// expert's units are split as the MLP's (w1 and w3 column-parallel, w2 row-parallel, one
// all-reduce for the sum of all experts, the shared one's included); the router is whole on every
// rank and sees the whole sequence (under sequence parallelism its scores are gathered), so every
// rank routes alike. With TensorParallel::expert_parallel the experts are placed whole on parts
// of the group instead (a rank holds the others' as empty parameters and skips them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/json_util.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/lm_parts.h"
#include "runtime/torch/model.h"

namespace tandem::runtime::libtorch {

// Rotary frequency scaling (transformers' rope_scaling), of one of three types:
// - "llama3" (Llama 3.1's): wavelengths above original_max_position_embeddings /
//   low_freq_factor are stretched by `factor`, those below original_max_position_embeddings /
//   high_freq_factor are kept, those between are interpolated;
// - "linear": every frequency divided by `factor`;
// - "yarn" (YaRN, as transformers 4.51 computes it: Qwen3's and Qwen2.5's long contexts): the
//   frequencies whose dimensions lie between the correction range of beta_fast and beta_slow
//   rotations over original_max_position_embeddings blended linearly from kept to divided by
//   `factor` (those below kept, those above divided), and cos and sin times attention_factor.
//   When the file gives original_max_position_embeddings, factor is max_position_embeddings
//   over it (transformers ignores the file's factor then); otherwise it is
//   max_position_embeddings. attention_factor, unless given, is 0.1 ln(factor) + 1 (1 for a
//   factor up to 1), or DeepSeek's ratio of that with mscale over that with mscale_all_dim;
//   it is stored resolved.
struct LlamaRopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn
  double beta_fast = 32.0, beta_slow = 1.0;         // yarn
  double attention_factor = 1.0;                    // yarn
  std::string type = "llama3";
};

// Phi-3's LongRoPE (rope_scaling type "longrope", of its 128k-context models and Phi-3.5):
// each rotary frequency divided by its factor, the short factors while the positions a forward
// pass rotates end within original_max_position_embeddings, the long ones past it (as
// transformers chooses at each forward pass by its last position), and cos and sin scaled by
// sqrt(1 + ln(s) / ln(original_max_position_embeddings)) with s = max_position_embeddings /
// original_max_position_embeddings (1 for s <= 1).
struct LlamaLongRope {
  std::vector<double> short_factor;  // head_dim / 2 each
  std::vector<double> long_factor;
  int64_t original_max_position_embeddings = 4096;
};

struct LlamaConfig {
  int64_t vocab = 16;             // vocab_size
  int64_t layers = 4;             // num_hidden_layers (decoder blocks)
  int64_t hidden = 64;            // hidden_size
  int64_t heads = 4;              // num_attention_heads
  int64_t kv_heads = 4;           // num_key_value_heads: divides heads
  int64_t head_dim = 0;           // head_dim; 0: hidden / heads
  int64_t intermediate = 192;     // intermediate_size (SwiGLU units)
  int64_t seq_len = 32;           // tokens per sample (not in config.json): at most
                                  // max_position_embeddings
  int64_t max_position_embeddings = 8192;
  double rope_theta = 500000.0;
  std::optional<LlamaRopeScaling> rope_scaling;  // none: plain rotary embeddings
  std::optional<LlamaLongRope> long_rope;        // Phi-3's; none: plain rotary embeddings
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  bool attention_bias = false;    // biases of q/k/v/o_proj
  bool qkv_bias = false;          // biases of q/k/v_proj only (Qwen2)
  bool mlp_bias = false;          // biases of gate/up/down_proj
  // Sliding-window attention (Mistral's, Gemma 2's, Qwen2's): a token attends to the
  // `sliding_window` tokens up to itself; 0 for none. Mistral's applies to every block and
  // Gemma 2's to every other one (the first, third, ...: WindowOfBlock), and tandem masks them
  // as transformers' eager attention does. Qwen2's is left to full causal attention, which is
  // the same while seq_len <= sliding_window (ValidateLlamaConfig refuses longer sequences).
  int64_t sliding_window = 0;
  // transformers' model family of the same computation: "llama", "mistral", "qwen2", "gemma",
  // "gemma2" or "mixtral" (what an exported config.json says; DescribeLlama's " family="). Gemma's
  // computation differs (Gemma()): each RMSNorm scales by 1 + its weight (zero-initialised)
  // and rounds after the product, and the embedding's output is multiplied by sqrt(hidden) in
  // its type. Gemma 2 (SandwichNorms()) also normalises the attention's and the MLP's outputs
  // (post_attention_layernorm, post_feedforward_layernorm) before their residual adds, the
  // MLP's input by pre_feedforward_layernorm.
  std::string model_type = "llama";
  // The MLP's gate activation: "silu" (Llama), "gelu_pytorch_tanh" or "gelu" (Gemma's
  // hidden_activation), "gelu_new" (Phi's: transformers' NewGELUActivation, the tanh
  // approximation written out).
  std::string hidden_act = "silu";
  // Attention scores are divided by sqrt(query_pre_attn_scalar) (Gemma 2); 0: by
  // sqrt(head_dim).
  double query_pre_attn_scalar = 0;
  // Gemma 3's sliding_window_pattern: every pattern-th block (1-based) attends globally, the
  // others within sliding_window at rope_local_base_freq (rope_local_theta; 0: rope_theta).
  int64_t sliding_window_pattern = 0;
  double rope_local_theta = 0;
  // Gemma 2's soft caps: scores, and the LM head's logits, become c * tanh(x / c); 0: none.
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  std::optional<int64_t> pad_token_id;  // the embedding's padding row (zero, no gradient)
  double init_std = 0.02;         // initializer_range
  // A mixture of experts (model_type "mixtral" or "qwen2_moe"): `experts` MLPs (Mixtral's
  // num_local_experts, Qwen2-MoE's num_experts), experts_per_token of them per token; 0
  // experts: one dense MLP.
  int64_t experts = 0;
  int64_t experts_per_token = 0;
  // Units of each expert (Qwen2-MoE's moe_intermediate_size); 0: `intermediate` (Mixtral's).
  int64_t expert_intermediate = 0;
  // Qwen2-MoE's shared expert, shared_expert_intermediate_size units; 0: none.
  int64_t shared_expert_intermediate = 0;
  // The chosen experts' probabilities renormalised to sum to 1 (Mixtral's always; Qwen2-MoE's
  // norm_topk_prob).
  bool normalize_top_k = true;
  // Qwen2-MoE's sparse blocks: those whose 1-based index decoder_sparse_step divides, except
  // mlp_only_layers (0-based); the others have a dense MLP of `intermediate` units.
  int64_t sparse_step = 1;
  std::vector<int64_t> dense_blocks;
  // Each sparse block's load-balancing loss, times this coefficient, joins the loss's
  // gradients (auxiliary_loss.h; the reported loss is the language model's alone): transformers'
  // load_balancing_loss_func of the block's router, experts x sum over experts of (the share of
  // the block's tokens that chose the expert, over its experts_per_token choices) x (the
  // expert's mean probability). Taken block by block, as Megatron-LM and the Switch Transformer
  // take it (Megatron-LM's is this / experts_per_token); transformers pools the routers of all
  // blocks first, which is the same for one block. 0: none.
  double router_aux_loss_coef = 0;
  // Granite's scalings (GraniteConfig): the embedding's output times embedding_multiplier, the
  // attention's and the MLP's outputs times residual_multiplier before each residual add,
  // attention scores times attention_multiplier instead of divided by sqrt(head_dim), the
  // logits divided by logits_scaling. Other families: 1, and attention_multiplier 0 (none).
  double embedding_multiplier = 1.0;
  double residual_multiplier = 1.0;
  double attention_multiplier = 0.0;
  double logits_scaling = 1.0;
  // OLMo's clip_qkv: the query, key and value products are clamped to [-c, c] before the
  // heads are formed; 0: none.
  double clip_qkv = 0.0;
  // Cohere's logit_scale: the logits are multiplied by it. Other families: 1.
  double logit_scale = 1.0;
  // The share of each head's features that the rotary embeddings rotate (Phi's
  // partial_rotary_factor): the first RotaryDim() of them, at the frequencies of that many
  // features; the others pass unrotated. 1: all.
  double partial_rotary_factor = 1.0;
  // GPT-J's rotary_dim: the features of a head rotated, over partial_rotary_factor; 0: none
  // given.
  int64_t rotary_dims = 0;
  // GPT-NeoX's and StableLM's use_parallel_residual (Falcon's parallel_attn, or its
  // new_decoder_architecture): the attention and the MLP side by side, added to the block's
  // input in one step (ParallelBlock); false: Llama's two residual steps.
  bool parallel_residual = false;
  // Falcon's new_decoder_architecture with num_ln_in_parallel_attn 2 (Falcon-40B's, -180B's):
  // the attention and the MLP side by side, each on its own layer norm (ln_attn, ln_mlp).
  bool branch_norms = false;
  // Cohere's use_qk_norm (Command R+) and StableLM's qk_layernorm (StableLM 2 12B): each query
  // and key head normalised apart before the rotation (the mean subtracted, no bias), times the
  // head's own weights (Cohere's self_attn.q_norm.weight [heads, head_dim] and k_norm
  // [kv_heads, head_dim]; StableLM's self_attn.q_layernorm.norms.<h>.weight and
  // k_layernorm.norms.<h>.weight [head_dim] each).
  bool head_qk_norms = false;
  // (Qwen3's q_norm and k_norm, RMSNorms of each head apart with one weight [head_dim] for all
  // heads, come with its family: Qwen3().)
  GptAttention attention = GptAttention::kAuto;  // not part of DescribeLlama: same numbers

  int64_t HeadDim() const { return head_dim > 0 ? head_dim : hidden / heads; }
  // The features of a head that are rotated: int(head_dim * partial_rotary_factor), as
  // transformers rounds it.
  int64_t RotaryDim() const {
    if (rotary_dims > 0) return rotary_dims;
    return static_cast<int64_t>(static_cast<double>(HeadDim()) * partial_rotary_factor);
  }
  bool QkvBias() const { return attention_bias || qkv_bias; }
  bool Gemma() const { return model_type == "gemma" || model_type == "gemma2" || Gemma3(); }
  bool SandwichNorms() const { return model_type == "gemma2" || Gemma3() || Glm4(); }
  // Gemma 3's (Gemma3ForCausalLM, model_type gemma3_text: Gemma 3 1B, and the text half of the
  // larger ones): Gemma 2's blocks with Gemma's offset RMSNorm of each query and key head apart
  // (q_norm, k_norm, one weight [head_dim] for all heads, as Qwen3's), no soft caps by default,
  // and local blocks (all but every sliding_window_pattern-th) attending within the window at
  // their own rotary base (LocalBlock).
  bool Gemma3() const { return model_type == "gemma3_text" || Gemma3Multimodal(); }
  // Gemma 3 4B's, 12B's and 27B's checkpoints (Gemma3ForConditionalGeneration, model_type
  // gemma3): the language model of its text_config, its tensors under language_model.; the
  // vision tower and projector are read past, and an export writes the text model
  // (Gemma3ForCausalLM).
  bool Gemma3Multimodal() const { return model_type == "gemma3"; }
  // Whether block `block` (0-based) is one of Gemma 3's local (windowed) blocks.
  bool LocalBlock(int64_t block) const {
    return Gemma3() && sliding_window_pattern > 0 && (block + 1) % sliding_window_pattern != 0;
  }
  bool Moe() const { return experts > 0; }
  // Phi-3's checkpoints fuse the query/key/value and the gate/up products (LlamaHfRows).
  bool FusedCheckpoint() const { return model_type == "phi3"; }
  // GLM's (GlmForCausalLM: GLM-4): Llama's with q/k/v biases (attention_bias), the gate and up
  // products fused in its checkpoints as Phi-3's (mlp.gate_up_proj), and the first half of each
  // head rotated by pairs of neighbours (the rotation's head_dim / 2 features, rotary_dims).
  bool Glm() const { return model_type == "glm"; }
  // GLM-4-0414's (Glm4ForCausalLM: GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1): GLM's products and
  // rotation by pairs of neighbours over partial_rotary_factor of an explicit head_dim, with
  // Gemma 2's four norms a block under its own names: post_self_attn_layernorm on the
  // attention's output, post_attention_layernorm on the MLP's input, post_mlp_layernorm on its
  // output (SandwichNorms).
  bool Glm4() const { return model_type == "glm4"; }
  // The gate and up products stored as rows of mlp.gate_up_proj (Phi-3's, GLM's).
  bool FusedGateUp() const { return FusedCheckpoint() || Glm() || Glm4(); }
  // Experts named as Mixtral's (block_sparse_moe.gate, experts.<e>.w1/w2/w3): Mixtral's and
  // GraniteMoE's, whose checkpoints fuse them (FusedExperts).
  bool MixtralExperts() const { return model_type == "mixtral" || model_type == "granitemoe"; }
  bool FusedExperts() const { return model_type == "granitemoe"; }
  // Granite's multipliers apply (GraniteForCausalLM, GraniteMoeForCausalLM).
  bool Granite() const { return model_type == "granite" || model_type == "granitemoe"; }
  // OLMo's norms (OlmoLayerNorm): a layer norm without weight or bias (the mean subtracted,
  // then divided by the deviation, eps 1e-5) in float32; they hold no parameters.
  bool LayerNormWithoutParameters() const { return model_type == "olmo"; }
  // OLMoE's and OLMo 2's q_norm and k_norm: RMSNorms over the whole query and key products
  // (every head together; under tensor parallelism the sums of squares are summed over the
  // group), before OLMoE's clamp.
  bool QkNorms() const { return model_type == "olmoe" || Olmo2(); }
  // OLMo 2's (Olmo2ForCausalLM: OLMo-2 7B, 13B, 32B): Llama's products (attention_bias on every
  // attention product, no MLP biases) with OLMoE's q_norm and k_norm (no clamp) and norms after
  // the attention and the MLP only: x + post_attention_layernorm(attention(x)), then
  // x + post_feedforward_layernorm(mlp(x)); no input_layernorm (PostNormsOnly).
  bool Olmo2() const { return model_type == "olmo2"; }
  bool PostNormsOnly() const { return Olmo2(); }
  // StarCoder 2's (Starcoder2ForCausalLM): layer norms with weight and bias (nn.LayerNorm,
  // epsilon norm_epsilon, held in rms_norm_eps) and a plain MLP, mlp.c_proj(act(mlp.c_fc(x)))
  // without a gate, biases on every product with use_bias.
  bool Starcoder2() const { return model_type == "starcoder2"; }
  // Phi's (PhiForCausalLM: Phi-1, Phi-1.5, Phi-2): one layer norm (input_layernorm, weight and
  // bias, epsilon layer_norm_eps) whose output both the attention and the MLP take, the block
  // adding both to its input (x + attention(n) + mlp(n), n = LN(x): ParallelBlock); a plain MLP
  // (mlp.fc1, mlp.fc2); biases on every product (o_proj is self_attn.dense) and on the LM head;
  // final_layernorm for the head's norm; partial rotary embeddings (partial_rotary_factor).
  bool Phi() const { return model_type == "phi"; }
  // GPT-NeoX's (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B): layer norms with weights and
  // biases (epsilon layer_norm_eps), one query_key_value product whose rows are each head's
  // query, key and value in turn (FusedQkv: split by heads under tensor parallelism, as
  // Megatron-LM's), biases on the attention's products with attention_bias and always on its
  // plain MLP (mlp.dense_h_to_4h, mlp.dense_4h_to_h), partial rotary embeddings (rotary_pct,
  // at rotary_emb_base), and the attention and the MLP side by side with use_parallel_residual,
  // each on its own norm. Multi-head attention only (no key/value groups).
  bool NeoX() const { return model_type == "gpt_neox"; }
  // StableLM's (StableLmForCausalLM: StableLM-3B-4E1T, StableLM 2, StableCode): Llama's
  // computation with layer norms with weights and biases (epsilon layer_norm_eps), partial
  // rotary embeddings (partial_rotary_factor), biases on q/k/v_proj with use_qkv_bias, and with
  // use_parallel_residual the attention and the MLP side by side on the one input_layernorm.
  bool StableLm() const { return model_type == "stablelm"; }
  // GPT-J's (GPTJForCausalLM: GPT-J-6B and its fine-tunes): Phi's block (one layer norm, ln_1,
  // for the attention and the MLP side by side; a plain MLP, mlp.fc_in and mlp.fc_out with
  // biases; the LM head's bias) with q/k/v/out_proj without biases, the first rotary_dim
  // features of each head rotated by pairs of neighbours (InterleavedRotary) at base 10000, and
  // layer norms of epsilon layer_norm_epsilon.
  bool GptJ() const { return model_type == "gptj"; }
  // Cohere's (CohereForCausalLM: Command R, Aya): Llama's products (SwiGLU, no MLP biases,
  // attention biases with attention_bias) side by side on one norm as Phi's, added as
  // (x + attention) + mlp; layer norms with a weight and no bias (CohereLayerNorm: the mean
  // subtracted, epsilon layer_norm_eps); every feature rotated by pairs of neighbours; the
  // logits times logit_scale; tied and with padding row 0 by default.
  bool Cohere() const { return model_type == "cohere"; }
  // Rotary embeddings that rotate each pair of neighbouring features (2i, 2i + 1) by the angle
  // of frequency i (GPT-J's rotate_every_two) instead of the two halves' features i and
  // i + d / 2 (rotate_half).
  // Falcon's (FalconForCausalLM: Falcon-7B, -40B, -180B, Falcon 2): layer norms with weights
  // and biases (epsilon layer_norm_epsilon), one query_key_value product whose rows hold each
  // key/value group's query heads, then its key and its value (FusedQkv: split by groups under
  // tensor parallelism; multi_query is one group, multi-head attention a group per head as
  // GPT-NeoX's), a plain MLP (mlp.dense_h_to_4h, mlp.dense_4h_to_h), biases on every product
  // with `bias`, every feature rotated; the attention and the MLP side by side on one norm
  // (parallel_attn, or new_decoder_architecture with num_ln_in_parallel_attn 1) or on two
  // (branch_norms), or sequential. Tied by default.
  bool Falcon() const { return model_type == "falcon"; }
  // Nemotron's (NemotronForCausalLM: Nemotron-4, Minitron): Llama's blocks with layer norms that
  // scale by 1 + the weight and add a bias (NemotronLayerNorm1P, epsilon norm_eps; the weight
  // starts at 1, as nn.LayerNorm's), a plain MLP without a gate (mlp.up_proj, mlp.down_proj)
  // of squared ReLU (relu2), partial_rotary_factor of each head rotated (0.5 by default),
  // biases with attention_bias and mlp_bias.
  bool Nemotron() const { return model_type == "nemotron"; }
  // Qwen3's (Qwen3ForCausalLM, Qwen3MoeForCausalLM: Qwen3, Qwen3-MoE): Llama's computation with
  // q_norm and k_norm, an RMSNorm of each query and key head apart before the rotation whose
  // weight [head_dim] all heads share (under tensor parallelism held whole on every rank, its
  // gradient summed over the group), attention_bias on every attention product, an explicit
  // head_dim (128 unless given), Qwen2's sliding window (use_sliding_window); Qwen3-MoE's
  // experts are Qwen2-MoE's without the shared expert.
  bool Qwen3() const { return model_type == "qwen3" || model_type == "qwen3_moe"; }
  // A norm of each query and key head apart: Cohere's, StableLM's (head_qk_norms), Qwen3's.
  bool HeadNorms() const { return head_qk_norms || Qwen3() || Gemma3(); }
  // Norms that scale by 1 + their weight: Gemma's RMSNorms, Nemotron's layer norms.
  bool OffsetNorms() const { return Gemma() || Nemotron(); }
  bool InterleavedRotary() const { return GptJ() || Cohere() || Glm() || Glm4(); }
  // One query_key_value product, each key/value group's rows together: GPT-NeoX's and Falcon's.
  bool FusedQkv() const { return NeoX() || Falcon(); }
  bool LayerNormWithBias() const {
    return Starcoder2() || Phi() || NeoX() || StableLm() || GptJ() || Falcon() || Nemotron();
  }
  bool PlainMlp() const {
    return Starcoder2() || Phi() || NeoX() || GptJ() || Falcon() || Nemotron();
  }
  // The attention and the MLP both read the block's input, their outputs added to it at once:
  // Phi's, and StableLM's with use_parallel_residual, on one norm (SharedNorm); GPT-NeoX's with
  // use_parallel_residual on two; Falcon's on one or two (branch_norms).
  bool ParallelResidualFamily() const { return NeoX() || StableLm() || Falcon(); }
  bool ParallelBlock() const {
    return Phi() || GptJ() || Cohere() || (ParallelResidualFamily() && parallel_residual);
  }
  bool SharedNorm() const {
    return Phi() || GptJ() || Cohere() || (StableLm() && parallel_residual) ||
           (Falcon() && parallel_residual && !branch_norms);
  }
  // The families whose heads may be rotated in part (partial_rotary_factor below 1).
  // (Phi-3's since transformers 4.49: Phi-4-mini's partial_rotary_factor 0.75.)
  bool PartialRotation() const {
    return Phi() || NeoX() || StableLm() || GptJ() || Nemotron() || model_type == "phi3" || Glm4();
  }
  bool HeadBias() const { return Phi() || GptJ(); }
  // Whether block `block` (0-based) holds experts.
  bool SparseBlock(int64_t block) const;
  int64_t ExpertUnits() const {
    return expert_intermediate > 0 ? expert_intermediate : intermediate;
  }
  // The window block `block` (0-based) attends within: sliding_window, or 0 for full causal
  // attention.
  int64_t WindowOfBlock(int64_t block) const;
  // The positions a sequence may take: max_position_embeddings, within a window tandem does
  // not mask (Qwen2's).
  int64_t MaxPositions() const;
  // What attention scores are divided by.
  double ScoreDivisor() const;
  // What cos and sin are scaled by (LlamaLongRope; 1 without it).
  double RotaryScale() const;
};

// The transformers model types LlamaConfigFromJson reads, for messages.
inline constexpr char kLlamaModelTypes[] =
    "llama, mistral, qwen2, gemma, gemma2, mixtral, qwen2_moe, granite, granitemoe, phi3, olmo, "
    "olmoe, olmo2, starcoder2, phi, gpt_neox, stablelm, gptj, cohere, glm, glm4, falcon, nemotron, "
    "qwen3, qwen3_moe, gemma3_text and gemma3";
bool IsLlamaModelType(absl::string_view model_type);

// A config from a transformers config.json, with the defaults of the family's config class
// for absent (or null) fields: LlamaConfig's, MistralConfig's (14336 units, 8 key/value heads,
// window 4096), Qwen2Config's, MixtralConfig's (8 experts, 2 a token, rope_theta 1e6, norm
// epsilon 1e-5), Qwen2MoeConfig's (60 experts of 1408 units, 4 a token, unnormalised, a
// shared expert of 5632 units), GemmaConfig's and Gemma2Config's (tied embeddings, head_dim 256,
// pad_token_id 0, gelu_pytorch_tanh, Gemma 2's soft caps 50 and 30, its query_pre_attn_scalar 224
// and window 4096), GraniteConfig's (every multiplier 1), Phi3Config's (32064 tokens, 8192
// units, pad_token_id 32000, norm epsilon 1e-5, no window), GraniteMoeConfig's (8 experts, 2
// a token), Starcoder2Config's (49152 tokens, 12288 units, 2 key/value heads, tied,
// use_bias true for every product, norm_epsilon 1e-5, gelu_pytorch_tanh, no window) and
// PhiConfig's (51200 tokens, 2048 wide, 8192 units, 24 layers, 32 heads, gelu_new,
// layer_norm_eps 1e-5, partial_rotary_factor 0.5, no qk_layernorm) and GPTNeoXConfig's (50432
// tokens, 6144 wide, 24576 units, 44 layers, 64 heads, gelu, rotary_pct 0.25, rotary_emb_base
// 10000, attention_bias and use_parallel_residual true) and StableLmConfig's (50304 tokens,
// 2560 wide, 6912 units, 32 layers, 32 heads, silu, partial_rotary_factor 0.25, no biases, no
// use_parallel_residual) and GPTJConfig's (50400 tokens, n_embd 4096, 28 layers, 16 heads,
// rotary_dim 64, n_inner 4 x n_embd, gelu_new, layer_norm_epsilon 1e-5); GPT-J's config.json
// names its sizes n_embd, n_layer, n_head, n_positions and n_inner; CohereConfig's (256000
// tokens, 8192 wide, 22528 units, 40 layers, 64 heads, logit_scale 0.0625, tied, pad_token_id
// 0) and GlmConfig's (151552 tokens, 4096 wide, 13696 units, 40 layers, 32 heads, 2 key/value
// heads, head_dim 128 for the rotation, rms_norm_eps 1.5625e-7, pad_token_id 151329, q/k/v
// biases) and FalconConfig's (65024 tokens, 4544 wide, ffn_hidden_size 4 x hidden_size, 32
// layers, 71 heads, multi_query, parallel_attn, no biases, gelu, layer_norm_epsilon 1e-5, tied;
// new_decoder_architecture takes num_kv_heads key/value groups and two norms unless
// num_ln_in_parallel_attn is 1) and NemotronConfig's (256000 tokens, 6144 wide, 24576 units, 32
// layers, 48 heads, relu2, partial_rotary_factor 0.5, norm_eps 1e-5) and Qwen3Config's (151936
// tokens, 4096 wide, 22016 units, 32 layers, 32 heads, head_dim 128, rms_norm_eps 1e-6) and
// Qwen3MoeConfig's (2048 wide, 6144 units, 24 layers, 32 heads, 4 key/value heads, head_dim
// hidden / heads unless given, 128 experts of 768 units, 8 a token, unnormalised). seq_len
// is not in the file: it keeps LlamaConfig's default, at most max_position_embeddings (and
// Qwen2's window); set it afterwards.
// Fields that change the computation in ways tandem does not implement are refused with
// InvalidArgument naming the field and value: hidden_act other than "silu" (Gemma: its
// hidden_activation other than gelu_pytorch_tanh and gelu), a rope_scaling type other than
// "llama3" (or "default"; Gemma: any; Phi-3: other than "longrope", or its older names "su"
// and "yarn"), partial_rotary_factor other than 1 (phi, stablelm, and gpt_neox's rotary_pct:
// outside (0, 1]), Phi's qk_layernorm true, a
// model_type other
// than "llama", "mistral" (Llama's computation with an optional sliding window), "qwen2"
// (biases on q/k/v_proj; its sliding window when use_sliding_window), "gemma", "gemma2" (its
// window on every other layer), "mixtral" (Mistral's attention, experts for the MLP),
// "qwen2_moe" (Qwen2's attention, experts and a shared expert), "granite" (Llama's with its
// multipliers), "granitemoe" (Granite's with Mixtral's experts), "phi3" (Mistral's computation,
// fused products in the checkpoint, LongRoPE as its rope_scaling), "olmo", "olmoe" and
// "starcoder2" and "stablelm" (hidden_act gelu_pytorch_tanh, gelu or silu), "phi" and
// "gpt_neox" (hidden_act gelu_new, gelu_pytorch_tanh or gelu), "gptj" (activation_function
// gelu_new, gelu_pytorch_tanh or gelu; a rotary_dim of null, which transformers cannot run
// with more than one head, refused), "falcon" (activation gelu, gelu_new or gelu_pytorch_tanh;
// alibi, and the layouts transformers cannot run, refused), "nemotron" (hidden_act relu2, silu,
// gelu, gelu_new or gelu_pytorch_tanh; a rope_scaling, which transformers' Nemotron ignores,
// refused), "qwen3", "qwen3_moe" and "olmo2" (a rope_scaling other than "llama3" refused, as for
// Llama), "gemma3_text" (any rope_scaling refused);
// output_router_logits
// (transformers then adds a load-balancing loss over every layer's router scores, which tandem does
// not compute) and router_jitter_noise (random scaling of the router's input in training). Ignored:
// attention_dropout, Phi-3's and Phi's resid_pdrop and embd_pdrop, GPT-NeoX's and StableLM's
// hidden_dropout
// and classifier_dropout, StarCoder 2's residual_dropout
// and embedding_dropout (tandem has no dropout: it computes what transformers computes in eval
// mode), router_aux_loss_coef (used only with output_router_logits) and fields that only describe
// (torch_dtype, bos/eos_token_id, use_cache, pretraining_tp: a split of the same products; Gemma's
// hidden_act, which transformers ignores too).
absl::StatusOr<LlamaConfig> LlamaConfigFromJson(const Json& json);

// InvalidArgument naming the field: positive sizes, kv_heads dividing heads, an even head_dim,
// seq_len within max_position_embeddings, rope scaling factors as Llama 3 needs them.
absl::Status ValidateLlamaConfig(const LlamaConfig& config);

// "llama L=2 H=32 A=4 KV=2 I=64 S=8 V=64" (+ " hd=16" for an explicit head_dim, " tied",
// " rope=500000", " llama3-scaling=8/1/4/8192", " attention-bias", " qkv-bias", " mlp-bias",
// " window=4096", " act=gelu_pytorch_tanh", " qscale=224", " attn-softcap=50",
// " final-softcap=30", " experts=8/2", " expert-units=1408", " shared-units=5632",
// " topk=raw" (not renormalised), " sparse-step=2", " dense=0,5", " aux-loss=0.01",
// Phi-3's " longrope=4096/1a2b3c4d" (original_max_position_embeddings and a hash of the
// factors, which the description does not hold: a checkpoint of such a model is exported or
// loaded with its config.json as --hf-config), Granite's " embedding-mult=12",
// " residual-mult=0.22", " attention-mult=0.0078125", " logits-scaling=16", Phi's and
// GPT-NeoX's and StableLM's " rotary=0.4" (partial_rotary_factor) and " parallel-residual"
// (use_parallel_residual), GPT-J's " rotary-dims=64", Cohere's " logit-scale=0.0625",
// Falcon's " branch-norms", Cohere's and StableLM's " qk-norm" (use_qk_norm, qk_layernorm),
// " family=mistral").
std::string DescribeLlama(const LlamaConfig& config);

// The layer-by-layer builder (L + 2 layers). ModelSpec::Build reports an invalid config as
// InvalidArgument.
ModelSpec LlamaModelSpec(const LlamaConfig& config);

// The embedding/head pair of a tied config (none otherwise), see lm_parts.h.
TiedWeights LlamaTiedWeights(const LlamaConfig& config);

// Training FLOPs per token (forward + backward, no recomputation), PaLM's count: 6 * the
// parameters of the matrix products a token passes through (q/k/v/o, the three MLP matrices
// of each expert it reaches and the router, the LM head; not the embedding) + 12 * layers *
// heads * head_dim * seq_len for attention scores and values.
double LlamaTrainingFlopsPerToken(const LlamaConfig& config);

// The parameters of block `block` (0-based) as transformers names them inside
// model.layers.<block>, with their shapes, in the order of a transformers state dict.
std::vector<std::pair<std::string, std::vector<int64_t>>> LlamaBlockParameters(
    const LlamaConfig& config, int64_t block);

// tandem's parameter name ("layers.<i>.<name>", LayeredModel::NamedParameters) to
// transformers' state-dict key: "model.embed_tokens.weight", "model.layers.<i - 1>.<name>",
// "model.norm.weight", "lm_head.weight". InvalidArgument for a name that is not one of the
// model's. (A tied model's checkpoint holds no lm_head.weight: the copy comes from
// model.embed_tokens.weight.)
absl::StatusOr<std::string> LlamaHfName(const LlamaConfig& config, absl::string_view name);
// The reverse: transformers' key to tandem's name (a fused key of Phi-3: its first part's,
// q_proj's or gate_proj's).
absl::StatusOr<std::string> LlamaTandemName(const LlamaConfig& config, absl::string_view key);

// Where a parameter stored fused lies in its key's tensor (Phi-3: q_proj, k_proj and v_proj
// are rows of self_attn.qkv_proj.weight in that order, gate_proj and up_proj of
// mlp.gate_up_proj.weight): its first row and the key's whole shape. nullopt for a parameter
// stored whole (every other family's, and Phi-3's others).
struct LlamaFusedRows {
  int64_t first_row = 0;
  std::vector<int64_t> key_shape;
};
std::optional<LlamaFusedRows> LlamaHfRows(const LlamaConfig& config, absl::string_view name);

}  // namespace tandem::runtime::libtorch
