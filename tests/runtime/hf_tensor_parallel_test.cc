// Tensor-parallel shards of Llama and GPT-2 (runtime/torch/llama.h, gpt2.h) under mpirun: a
// whole-model TorchStage sharded over the world (query and key/value heads, MLP units,
// vocabulary rows), with and without sequence parallelism, gives the loss of the unsharded
// stage, and every shard's parameters and gradients are the elements of the whole ones that the
// stage's index map names.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt2.h"
#include "runtime/torch/llama.h"
#include "runtime/torch/profiler.h"
#include "runtime/torch/torch_stage.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr double kRelativeTolerance = 1e-5;

// Grouped-query attention where the degree allows it (2 key/value heads for 4 query heads).
LlamaConfig SmallLlama(int degree, bool tied) {
  LlamaConfig config;
  config.vocab = 16;
  config.layers = 2;
  config.hidden = 32;
  config.heads = 4;
  config.kv_heads = std::max(2, degree);
  config.intermediate = 64;
  config.seq_len = 8;
  config.max_position_embeddings = 8;
  config.tie_word_embeddings = tied;
  config.attention = GptAttention::kExplicit;
  return config;
}

struct StageRun {
  std::unique_ptr<TorchStage> stage;
  double loss = 0;
};

// One iteration of 2 micro-batches of 2 samples through a whole-model stage (replica
// `replica` of `replicas`: its share of the global batch, its loss scaled by 1 / replicas).
StageRun RunStage(const LayeredModel& model, std::shared_ptr<const Dataset> data,
                  const TensorParallel& tp, int replica = 0, int replicas = 1) {
  TorchStageOptions options;
  options.data_parallel_index = replica;
  options.data_parallel = replicas;
  options.device = torch::kCPU;
  options.first_layer = 0;
  options.end_layer = model.num_layers();
  options.microbatches = 2;
  options.microbatch_size = 2;
  options.tensor_parallel = tp;
  auto stage = TorchStage::Create(model, data, options);
  EXPECT_TRUE(stage.ok()) << stage.status();
  StageRun run;
  if (!stage.ok()) return run;
  run.stage = *std::move(stage);
  EXPECT_TRUE(run.stage->BeginIteration(1).ok());
  for (int m = 0; m < 2; ++m) {
    auto out = run.stage->Forward(m, {});
    EXPECT_TRUE(out.ok()) << out.status();
    auto in = run.stage->Backward(m, {});
    EXPECT_TRUE(in.ok()) << in.status();
  }
  run.loss = run.stage->IterationLoss();
  return run;
}

double RelativeError(const torch::Tensor& actual, const torch::Tensor& expected) {
  // Another rank's expert (expert parallelism): empty here.
  if (expected.numel() == 0) return actual.numel() == 0 ? 0.0 : 1e300;
  const double scale = std::max(expected.abs().max().item<double>(), 1e-12);
  return (actual - expected).abs().max().item<double>() / scale;
}

Gpt2Config SmallGpt2(bool tied) {
  Gpt2Config config;
  config.vocab = 16;
  config.layers = 2;
  config.hidden = 32;
  config.heads = 4;
  config.seq_len = 8;
  config.positions = 8;
  config.tie_word_embeddings = tied;
  config.attention = GptAttention::kExplicit;
  return config;
}

// The synthetic task (seed 5) of the small models' vocabulary and sequence (GPT-2's are
// Llama's).
absl::StatusOr<std::shared_ptr<const Dataset>> SmallTask(const LlamaConfig& llama) {
  SyntheticTaskOptions task;
  task.vocab = llama.vocab;
  task.seq_len = llama.seq_len;
  task.seed = 5;
  return MakeSyntheticDataset(task);
}

struct Case {
  bool gpt2 = false;
  bool tied = false;
  bool sequence_parallel = false;
  bool qkv_bias = false;  // Llama: biases on q/k/v_proj only, as Qwen2's
  bool gemma2 = false;    // Llama as Gemma 2: soft caps, sandwich norms, offset norms
  bool mixtral = false;   // Llama as Mixtral: 4 experts, 2 a token, instead of the MLP
  bool qwen2_moe = false;  // Llama as Qwen2-MoE: experts and a shared expert, block 1 dense
  bool olmoe = false;  // Llama as OLMoE: q_norm and k_norm over every head, clamped q/k/v, experts
  bool starcoder2 = false;  // Llama as StarCoder 2: layer norms with biases, a plain MLP, biases
  bool phi = false;  // Llama as Phi: attention and MLP side by side, partial rotation, head bias
  bool neox = false;  // Llama as GPT-NeoX: per-head fused q/k/v rows, partial rotation, two norms
  bool sequential = false;  // GPT-NeoX, StableLM or Falcon without use_parallel_residual
  bool stablelm = false;    // Llama as StableLM: layer norms with biases, partial rotation
  bool gptj = false;        // Llama as GPT-J: Phi's block, pairs of neighbours rotated, head bias
  bool cohere = false;      // Llama as Cohere: weight-only norms side by side, scaled logits
  bool head_norms = false;  // Cohere's use_qk_norm, StableLM's qk_layernorm: each head apart
  bool glm = false;         // Llama as GLM: half of each head rotated by pairs of neighbours
  bool falcon = false;      // Llama as Falcon: grouped fused q/k/v rows, side by side, biases
  bool branch_norms = false;  // Falcon's ln_attn and ln_mlp
  bool nemotron = false;      // Llama as Nemotron: offset layer norms with biases, relu2, biases
  bool qwen3 = false;  // Llama as Qwen3: an RMSNorm of each query and key head, one weight for all
  bool qwen3_moe = false;  // with Qwen3-MoE's experts (no shared expert)
  bool olmo2 = false;  // Llama as OLMo 2: q/k norms over every head, norms after each branch only
  bool gemma3 = false;  // Llama as Gemma 3: a local block and a global one, offset q/k head norms
  bool glm4 = false;    // Llama as GLM-4-0414: GLM's rotation over part of each head, four norms
  int expert_parallel = 1;  // the experts placed whole on this many parts of the group
  // Key/value heads other than SmallLlama's (0: its own), and 6 query heads in place of 4.
  int kv_heads = 0;
  bool six_heads = false;
};

void ExpectShardsGiveTheWholeLossAndGradients(const Case& c) {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const int t = (*world)->size();
  const int me = (*world)->rank();
  LlamaConfig llama = SmallLlama(t, c.tied);
  llama.qkv_bias = c.qkv_bias;
  if (c.six_heads) {
    llama.heads = 6;
    llama.hidden = 48;
  }
  if (c.kv_heads > 0) llama.kv_heads = c.kv_heads;
  if (c.gemma2) {
    llama.model_type = "gemma2";
    llama.hidden_act = "gelu_pytorch_tanh";
    llama.query_pre_attn_scalar = 12;
    llama.attn_logit_softcapping = 1.0;
    llama.final_logit_softcapping = 2.0;
  }
  if (c.mixtral) {
    llama.model_type = "mixtral";
    llama.experts = 4;
    llama.experts_per_token = 2;
    llama.router_aux_loss_coef = 0.5;  // counted once over the group
  }
  if (c.qwen2_moe) {
    llama.model_type = "qwen2_moe";
    llama.qkv_bias = true;
    llama.experts = c.expert_parallel > 1 ? 4 : 3;
    llama.experts_per_token = 2;
    llama.expert_intermediate = 16;
    llama.shared_expert_intermediate = 32;
    llama.normalize_top_k = false;
    llama.dense_blocks = {1};
  }
  if (c.olmoe) {
    llama.model_type = "olmoe";
    llama.experts = 4;
    llama.experts_per_token = 2;
    llama.normalize_top_k = false;
    llama.clip_qkv = 0.5;
  }
  if (c.starcoder2) {
    llama.model_type = "starcoder2";
    llama.hidden_act = "gelu_pytorch_tanh";
    llama.attention_bias = true;
    llama.mlp_bias = true;
  }
  if (c.phi) {
    llama.model_type = "phi";
    llama.hidden_act = "gelu_new";
    llama.attention_bias = true;
    llama.mlp_bias = true;
    llama.partial_rotary_factor = 0.5;
  }
  if (c.neox) {
    llama.model_type = "gpt_neox";
    llama.kv_heads = llama.heads;
    llama.hidden_act = "gelu";
    llama.attention_bias = true;
    llama.mlp_bias = true;
    llama.partial_rotary_factor = 0.25;
    llama.parallel_residual = !c.sequential;
  }
  if (c.gptj) {
    llama.model_type = "gptj";
    llama.kv_heads = llama.heads;
    llama.hidden_act = "gelu_new";
    llama.mlp_bias = true;
    llama.rotary_dims = 4;
  }
  if (c.falcon) {
    llama.model_type = "falcon";
    llama.hidden_act = "gelu";
    llama.attention_bias = true;
    llama.mlp_bias = true;
    llama.parallel_residual = !c.sequential;
    llama.branch_norms = c.branch_norms;
    if (c.sequential) llama.kv_heads = llama.heads;  // Falcon's sequential blocks: one per head
  }
  if (c.nemotron) {
    llama.model_type = "nemotron";
    llama.hidden_act = "relu2";
    llama.attention_bias = true;
    llama.mlp_bias = true;
    llama.partial_rotary_factor = 0.5;
  }
  if (c.glm) {
    llama.model_type = "glm";
    llama.qkv_bias = true;
    llama.rotary_dims = 4;
  }
  if (c.cohere) {
    llama.model_type = "cohere";
    llama.attention_bias = true;
    llama.logit_scale = 0.25;
    llama.head_qk_norms = c.head_norms;
  }
  if (c.qwen3) {
    llama.model_type = c.qwen3_moe ? "qwen3_moe" : "qwen3";
    llama.head_dim = 16;  // not hidden / heads
    llama.attention_bias = true;
    if (c.qwen3_moe) {
      llama.experts = 4;
      llama.experts_per_token = 2;
      llama.expert_intermediate = 16;
      llama.normalize_top_k = false;
      llama.router_aux_loss_coef = 0.5;
    }
  }
  if (c.gemma3) {
    llama.model_type = "gemma3_text";
    llama.hidden_act = "gelu_pytorch_tanh";
    llama.head_dim = 16;
    llama.query_pre_attn_scalar = 12;
    llama.sliding_window = 4;  // block 0 local, within 4 of the 8 positions; block 1 global
    llama.sliding_window_pattern = 2;
    llama.rope_local_theta = 100;
  }
  if (c.glm4) {
    llama.model_type = "glm4";
    llama.qkv_bias = true;
    llama.head_dim = 16;
    llama.partial_rotary_factor = 0.5;
  }
  if (c.olmo2) {
    llama.model_type = "olmo2";
    llama.attention_bias = true;
  }
  if (c.stablelm) {
    llama.model_type = "stablelm";
    llama.qkv_bias = true;
    llama.partial_rotary_factor = 0.25;
    llama.parallel_residual = !c.sequential;
    llama.head_qk_norms = c.head_norms;
  }
  const Gpt2Config gpt2 = SmallGpt2(c.tied);
  if (llama.heads % t != 0 || llama.vocab % t != 0 || llama.seq_len % t != 0) {
    GTEST_SKIP() << t << " ranks";
  }
  auto model = c.gpt2 ? Gpt2ModelSpec(gpt2).Build(/*seed=*/7)
                      : LlamaModelSpec(llama).Build(/*seed=*/7);
  ASSERT_TRUE(model.ok()) << model.status();
  auto data = SmallTask(llama);
  ASSERT_TRUE(data.ok()) << data.status();

  TensorParallel tp{t, me, world->get()};
  tp.sequence_parallel = c.sequence_parallel;
  tp.expert_parallel = c.expert_parallel;
  if (t % c.expert_parallel != 0) GTEST_SKIP() << t << " ranks";
  const StageRun whole = RunStage(*model, *data, TensorParallel{});
  const StageRun shard = RunStage(*model, *data, tp);
  ASSERT_NE(whole.stage, nullptr);
  ASSERT_NE(shard.stage, nullptr);
  EXPECT_NEAR(shard.loss, whole.loss, kRelativeTolerance * std::abs(whole.loss));

  std::map<std::string, torch::Tensor> full_value, full_grad;
  for (const auto& [name, p] : whole.stage->named_parameters()) {
    full_value[name] = p.detach().clone();
    full_grad[name] = p.grad().clone();
  }
  std::map<std::string, const std::vector<int64_t>*> index;
  for (const ParameterView& v : shard.stage->Parameters()) index[v.name] = v.tensor_parallel_index;
  int split = 0;
  for (const auto& [name, p] : shard.stage->named_parameters()) {
    ASSERT_EQ(full_value.count(name), 1u) << name;
    torch::Tensor want_value = full_value[name], want_grad = full_grad[name];
    if (index[name] != nullptr) {
      ++split;
      const torch::Tensor picked = torch::tensor(*index[name]);
      want_value = want_value.reshape({-1}).index_select(0, picked).view(p.sizes());
      want_grad = want_grad.reshape({-1}).index_select(0, picked).view(p.sizes());
    }
    ASSERT_EQ(p.sizes(), want_value.sizes()) << name;
    EXPECT_TRUE(torch::equal(p.detach(), want_value)) << name;
    EXPECT_LT(RelativeError(p.grad(), want_grad), kRelativeTolerance)
        << name << " on rank " << me;
  }
  if (t > 1 && !c.gpt2) {
    // Per block q, k, v, o, gate, up, down (Mixtral: w1, w2 and w3 of each expert, the
    // router whole); the embedding and the LM head (a tied head uses the embedding's shard:
    // one parameter). With q/k/v biases, those three per block too.
    // Qwen2-MoE: block 0's experts and shared expert, block 1's MLP. OLMoE: every block's
    // experts, and its q_norm and k_norm weights (each rank's heads' features).
    const int feedforward = c.mixtral || c.olmoe || c.qwen3_moe
                                ? 3 * static_cast<int>(llama.experts * llama.layers)
                            : c.qwen2_moe ? 3 * static_cast<int>(llama.experts) + 3 + 3
                                          : 3 * static_cast<int>(llama.layers);
    // GPT-NeoX's and Falcon's query_key_value (weight and bias) and dense. Key/value heads
    // that the degree does not divide: k_proj and v_proj (and Cohere's k_norm) whole.
    const bool whole_kv = llama.kv_heads % t != 0;
    const int attention =
        c.neox || c.falcon
            ? 3
            : (llama.QkvBias() ? 7 : 4) +
                  (c.olmoe || c.olmo2 || (c.cohere && c.head_norms) ? 2 : 0) -
                  (whole_kv ? (llama.QkvBias() ? 4 : 2) + (c.cohere && c.head_norms ? 1 : 0) : 0);
    // Phi's LM head bias is split by vocabulary rows too.
    EXPECT_EQ(split, attention * llama.layers + feedforward + (c.tied ? 1 : 2) +
                         (c.phi || c.gptj ? 1 : 0));
    if (c.phi) {
      EXPECT_NE(index.at("layers.1.mlp.fc1.bias"), nullptr);
      EXPECT_EQ(index.at("layers.1.mlp.fc2.bias"), nullptr);
      EXPECT_NE(index.at("layers.3.lm_head.bias"), nullptr);
      EXPECT_EQ(index.count("layers.1.post_attention_layernorm.weight"), 0u);
    }
    if (c.nemotron) {
      // up_proj's weight and bias split, down_proj's bias and the norms' weights and biases
      // whole.
      EXPECT_NE(index.at("layers.1.mlp.up_proj.bias"), nullptr);
      EXPECT_EQ(index.at("layers.1.mlp.down_proj.bias"), nullptr);
      EXPECT_EQ(index.at("layers.1.post_attention_layernorm.bias"), nullptr);
      EXPECT_EQ(index.at("layers.3.norm.weight"), nullptr);
    }
    if (c.starcoder2) {
      // c_fc's weight and bias split, c_proj's bias and the norms' biases whole.
      EXPECT_NE(index.at("layers.1.mlp.c_fc.bias"), nullptr);
      EXPECT_EQ(index.at("layers.1.mlp.c_proj.bias"), nullptr);
      EXPECT_EQ(index.at("layers.1.self_attn.o_proj.bias"), nullptr);
      EXPECT_EQ(index.at("layers.1.input_layernorm.bias"), nullptr);
      EXPECT_EQ(index.at("layers.3.norm.bias"), nullptr);
    }
    if (c.olmoe || c.olmo2 || (c.cohere && c.head_norms)) {
      EXPECT_NE(index.at("layers.1.self_attn.q_norm.weight"), nullptr);
      EXPECT_EQ(index.at("layers.2.self_attn.k_norm.weight") == nullptr, whole_kv);
    }
    if (whole_kv) {
      EXPECT_EQ(index.at("layers.1.self_attn.k_proj.weight"), nullptr);
      EXPECT_EQ(index.at("layers.2.self_attn.v_proj.weight"), nullptr);
      EXPECT_NE(index.at("layers.2.self_attn.q_proj.weight"), nullptr);
      if (llama.QkvBias()) EXPECT_EQ(index.at("layers.1.self_attn.v_proj.bias"), nullptr);
    }
    if (c.qwen3 || c.gemma3) {
      // One weight for every head, whole on every rank, its gradient summed over the group.
      EXPECT_EQ(index.at("layers.1.self_attn.q_norm.weight"), nullptr);
      EXPECT_EQ(index.at("layers.2.self_attn.k_norm.weight"), nullptr);
    }
    if (c.stablelm && c.head_norms) {
      // Every head's weights whole on every rank, their gradients summed over the group.
      EXPECT_EQ(index.at("layers.1.self_attn.q_layernorm.norms.3.weight"), nullptr);
      EXPECT_EQ(index.at("layers.2.self_attn.k_layernorm.norms.0.weight"), nullptr);
    }
    if (c.qwen2_moe) {
      EXPECT_EQ(index.at("layers.1.mlp.shared_expert_gate.weight"), nullptr);
      EXPECT_NE(index.at("layers.1.mlp.shared_expert.down_proj.weight"), nullptr);
      EXPECT_NE(index.at("layers.2.mlp.down_proj.weight"), nullptr);
    }
    if (c.mixtral) {
      EXPECT_EQ(index.at("layers.1.block_sparse_moe.gate.weight"), nullptr);
      EXPECT_NE(index.at("layers.2.block_sparse_moe.experts.3.w2.weight"), nullptr);
    }
    if (c.mixtral || c.qwen2_moe || c.olmoe || c.qwen3_moe) {
      // Expert e is on part e / (experts / ep) of the group, its units split over the part's
      // t / ep ranks; the other ranks hold it empty.
      const int64_t ep = c.expert_parallel, across = t / ep;
      const std::string prefix =
          c.mixtral ? "layers.1.block_sparse_moe.experts." : "layers.1.mlp.experts.";
      const std::string down = c.mixtral ? ".w2.weight" : ".down_proj.weight";
      std::map<std::string, torch::Tensor> held;
      for (const auto& [name, p] : shard.stage->named_parameters()) held[name] = p;
      int64_t units = 0;
      for (int64_t e = 0; e < llama.experts; ++e) {
        const bool mine = e / (llama.experts / ep) == me / across;
        const torch::Tensor& weight = held.at(absl::StrCat(prefix, e, down));
        EXPECT_EQ(weight.size(1), mine ? llama.ExpertUnits() / across : 0) << e << " on " << me;
        // A shard even where whole: the other ranks hold it empty.
        EXPECT_NE(index.at(absl::StrCat(prefix, e, down)), nullptr) << e << " on " << me;
        units += weight.size(1);
      }
      EXPECT_EQ(units, llama.experts * llama.ExpertUnits() / t);
    }
    if (c.gptj) {
      EXPECT_NE(index.at("layers.1.attn.k_proj.weight"), nullptr);
      EXPECT_EQ(index.at("layers.1.ln_1.bias"), nullptr);
      EXPECT_NE(index.at("layers.3.lm_head.bias"), nullptr);
      EXPECT_EQ(index.at("layers.2.mlp.fc_out.bias"), nullptr);
      return;
    }
    if (c.falcon) {
      EXPECT_NE(index.at("layers.1.self_attention.query_key_value.bias"), nullptr);
      EXPECT_EQ(index.at("layers.2.self_attention.dense.bias"), nullptr);
      EXPECT_EQ(index.at("layers.1.mlp.dense_4h_to_h.bias"), nullptr);
      EXPECT_EQ(index.count("layers.1.ln_mlp.bias"), c.branch_norms ? 1u : 0u);
      return;
    }
    if (c.neox) {
      EXPECT_NE(index.at("layers.1.attention.query_key_value.bias"), nullptr);
      EXPECT_EQ(index.at("layers.2.attention.dense.bias"), nullptr);
      EXPECT_EQ(index.at("layers.1.post_attention_layernorm.bias"), nullptr);
      return;
    }
    EXPECT_EQ(index.at("layers.1.self_attn.k_proj.weight") == nullptr, whole_kv);
    if (c.olmo2) {
      // No input norm; the norms after each branch whole.
      EXPECT_EQ(index.count("layers.1.input_layernorm.weight"), 0u);
      EXPECT_EQ(index.at("layers.1.post_feedforward_layernorm.weight"), nullptr);
      return;
    }
    EXPECT_EQ(index.at("layers.1.input_layernorm.weight"), nullptr);
    EXPECT_EQ(index.count("layers.1.self_attn.v_proj.bias"), llama.QkvBias() ? 1u : 0u);
    EXPECT_EQ(index.count("layers.1.self_attn.o_proj.bias"), llama.attention_bias ? 1u : 0u);
    // Gemma 2's and Gemma 3's extra norms stay whole.
    const bool sandwich = c.gemma2 || c.gemma3;
    EXPECT_EQ(index.count("layers.1.pre_feedforward_layernorm.weight"), sandwich ? 1u : 0u);
    if (sandwich) EXPECT_EQ(index.at("layers.2.post_feedforward_layernorm.weight"), nullptr);
    if (c.glm4) {
      // Its four norms whole; gate_up_proj's rows split as GLM's.
      EXPECT_EQ(index.at("layers.1.post_self_attn_layernorm.weight"), nullptr);
      EXPECT_EQ(index.at("layers.2.post_mlp_layernorm.weight"), nullptr);
      EXPECT_NE(index.at("layers.1.mlp.up_proj.weight"), nullptr);
    }
  }
  if (t > 1 && c.gpt2) {
    // Per block c_attn (weight, bias), attn.c_proj.weight, c_fc (weight, bias),
    // mlp.c_proj.weight; wte, and an untied head's lm_head. wpe, the layer norms and the
    // row-parallel biases stay whole.
    EXPECT_EQ(split, 6 * gpt2.layers + (c.tied ? 1 : 2));
    EXPECT_NE(index.at("layers.1.attn.c_attn.bias"), nullptr);
    EXPECT_EQ(index.at("layers.1.attn.c_proj.bias"), nullptr);
    EXPECT_EQ(index.at("layers.0.wpe.weight"), nullptr);
  }
}

// `c` as given, then tied with sequence parallelism (the norms' weights and the whole biases
// shared over the group): the two layouts every family's test starts with. `c` is left in the
// second layout for the cases a test adds.
void ExpectShardsAloneAndTiedWithSequenceParallelism(Case& c) {
  ExpectShardsGiveTheWholeLossAndGradients(c);
  c.sequence_parallel = true;
  c.tied = true;
  ExpectShardsGiveTheWholeLossAndGradients(c);
}

TEST(LlamaTensorParallelTest, ShardsGiveTheWholeLossAndGradients) {
  ExpectShardsGiveTheWholeLossAndGradients({});
}

// A tied model in a stage holding both ends shares one tensor, split by vocabulary rows: the
// head computes with this rank's rows of the embedding, and their gradients are summed by
// autograd, as the whole stage's are.
TEST(LlamaTensorParallelTest, TiedCopiesAreShardedLikeTheEmbedding) {
  ExpectShardsGiveTheWholeLossAndGradients({/*gpt2=*/false, /*tied=*/true});
}

// Sequence parallelism: the RMSNorms' gradients are summed over the ranks' tokens; an untied
// head gathers the tokens in its product.
TEST(LlamaTensorParallelTest, SequenceParallelShardsGiveTheWholeLossAndGradients) {
  ExpectShardsGiveTheWholeLossAndGradients({/*gpt2=*/false, /*tied=*/true, /*sequence_parallel=*/true});
  ExpectShardsGiveTheWholeLossAndGradients(
      {/*gpt2=*/false, /*tied=*/false, /*sequence_parallel=*/true});
}

// Qwen2's q/k/v biases are split with their heads (o_proj has none), with and without
// sequence parallelism.
TEST(LlamaTensorParallelTest, QueryKeyValueBiasesAreShardedWithTheirHeads) {
  ExpectShardsGiveTheWholeLossAndGradients(
      {/*gpt2=*/false, /*tied=*/true, /*sequence_parallel=*/false, /*qkv_bias=*/true});
  ExpectShardsGiveTheWholeLossAndGradients(
      {/*gpt2=*/false, /*tied=*/false, /*sequence_parallel=*/true, /*qkv_bias=*/true});
}

// Gemma 2: the soft-capped logits are capped row by row on each rank's vocabulary rows, and
// under sequence parallelism its four norms per block see this rank's tokens (their gradients
// summed over the group).
TEST(LlamaTensorParallelTest, Gemma2ShardsGiveTheWholeLossAndGradients) {
  Case gemma2;
  gemma2.tied = true;
  gemma2.gemma2 = true;
  ExpectShardsGiveTheWholeLossAndGradients(gemma2);
  gemma2.sequence_parallel = true;
  ExpectShardsGiveTheWholeLossAndGradients(gemma2);
}

// Mixtral: each expert's units split as the MLP's, the router whole on every rank (its
// gradient, to which each rank's experts contribute a part, summed over the group), with and
// without sequence parallelism (the router's scores gathered).
TEST(LlamaTensorParallelTest, MixtralExpertShardsGiveTheWholeLossAndGradients) {
  Case mixtral;
  mixtral.mixtral = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(mixtral);
}

// Qwen2-MoE: the shared expert split as the experts, its gate whole (its gradient summed over
// the group as the router's), a dense block beside a sparse one.
TEST(LlamaTensorParallelTest, Qwen2MoeExpertShardsGiveTheWholeLossAndGradients) {
  Case qwen2_moe;
  qwen2_moe.qwen2_moe = true;
  ExpectShardsGiveTheWholeLossAndGradients(qwen2_moe);
  qwen2_moe.sequence_parallel = true;
  ExpectShardsGiveTheWholeLossAndGradients(qwen2_moe);
}

// OLMoE: its q_norm and k_norm normalise every head's query and key together, so each rank
// normalises its heads' features by the group's sum of squares (all-reduced forward and
// backward), with its slice of their weights; with and without sequence parallelism, and
// with the experts placed whole on each rank.
TEST(LlamaTensorParallelTest, OlmoeQueryKeyNormShardsGiveTheWholeLossAndGradients) {
  Case olmoe;
  olmoe.olmoe = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(olmoe);
  olmoe.expert_parallel = 2;
  ExpectShardsGiveTheWholeLossAndGradients(olmoe);
}

// StarCoder 2: c_fc split with its bias, c_proj's bias whole; under sequence parallelism the
// layer norms' weights and biases see this rank's tokens (their gradients summed over the
// group), the final norm's too.
TEST(LlamaTensorParallelTest, Starcoder2ShardsGiveTheWholeLossAndGradients) {
  Case starcoder2;
  starcoder2.starcoder2 = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(starcoder2);
}

// Phi: the attention and the MLP both take the one norm's output and add their reduced (or,
// under sequence parallelism, reduce-scattered) outputs to the block's input; the LM head's
// bias split by vocabulary rows, tied or not.
TEST(LlamaTensorParallelTest, PhiShardsGiveTheWholeLossAndGradients) {
  Case phi;
  phi.phi = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(phi);
}

// GPT-NeoX: query_key_value split by heads (each head's query, key and value rows together),
// dense's bias whole; side by side on two norms, or sequential; the norms' weights and biases
// shared under sequence parallelism.
TEST(LlamaTensorParallelTest, GptNeoxShardsGiveTheWholeLossAndGradients) {
  Case neox;
  neox.neox = true;
  ExpectShardsGiveTheWholeLossAndGradients(neox);
  neox.sequence_parallel = true;
  ExpectShardsGiveTheWholeLossAndGradients(neox);
  neox.sequential = true;
  neox.tied = true;
  ExpectShardsGiveTheWholeLossAndGradients(neox);
}

// GPT-J: Phi's block with no attention biases, pairs of neighbours rotated, the LM head's bias
// split by vocabulary rows.
TEST(LlamaTensorParallelTest, GptJShardsGiveTheWholeLossAndGradients) {
  Case gptj;
  gptj.gptj = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(gptj);
}

// Cohere: side by side on one weight-only norm, pairs of neighbours rotated, each rank's logits
// scaled.
TEST(LlamaTensorParallelTest, CohereShardsGiveTheWholeLossAndGradients) {
  Case cohere;
  cohere.cohere = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(cohere);
  // Command R+'s norm of each query and key head: a rank keeps its heads' rows.
  cohere.head_norms = true;
  ExpectShardsGiveTheWholeLossAndGradients(cohere);
  cohere.sequence_parallel = false;
  ExpectShardsGiveTheWholeLossAndGradients(cohere);
}

// GLM: the rotation by pairs of neighbours over half of each head, which stays whole on its
// rank.
TEST(LlamaTensorParallelTest, GlmShardsGiveTheWholeLossAndGradients) {
  Case glm;
  glm.glm = true;
  ExpectShardsGiveTheWholeLossAndGradients(glm);
  glm.sequence_parallel = true;
  ExpectShardsGiveTheWholeLossAndGradients(glm);
}

// Falcon: query_key_value split by key/value groups (each group's query, key and value rows
// together: 2 groups of 2 heads on 1 and 2 ranks, one per head on 4), dense's bias whole; side by
// side on one norm or two, or sequential; the norms' weights and biases shared under sequence
// parallelism.
TEST(LlamaTensorParallelTest, FalconShardsGiveTheWholeLossAndGradients) {
  Case falcon;
  falcon.falcon = true;
  ExpectShardsGiveTheWholeLossAndGradients(falcon);
  falcon.sequence_parallel = true;
  falcon.branch_norms = true;
  ExpectShardsGiveTheWholeLossAndGradients(falcon);
  falcon.branch_norms = false;
  falcon.sequential = true;
  falcon.tied = true;
  ExpectShardsGiveTheWholeLossAndGradients(falcon);
}

// Nemotron: split as StarCoder 2 (up_proj with its bias, down_proj's bias whole), its offset
// layer norms' weights and biases shared under sequence parallelism.
TEST(LlamaTensorParallelTest, NemotronShardsGiveTheWholeLossAndGradients) {
  Case nemotron;
  nemotron.nemotron = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(nemotron);
}

// StableLM: side by side on one norm, or sequential on two, the norms' weights and biases
// shared under sequence parallelism.
TEST(LlamaTensorParallelTest, StableLmShardsGiveTheWholeLossAndGradients) {
  Case stablelm;
  stablelm.stablelm = true;
  ExpectShardsGiveTheWholeLossAndGradients(stablelm);
  stablelm.sequence_parallel = true;
  ExpectShardsGiveTheWholeLossAndGradients(stablelm);
  stablelm.sequential = true;
  stablelm.tied = true;
  ExpectShardsGiveTheWholeLossAndGradients(stablelm);
  // StableLM 2 12B's norm of each query and key head: each rank normalises its heads with
  // weights every rank holds whole.
  stablelm.head_norms = true;
  ExpectShardsGiveTheWholeLossAndGradients(stablelm);
  stablelm.sequence_parallel = false;
  stablelm.sequential = false;
  ExpectShardsGiveTheWholeLossAndGradients(stablelm);
}

// Qwen3: each rank normalises its query and key heads with the one weight every rank holds,
// whose gradient is summed over the group; with sequence parallelism, tied, with key/value
// heads held whole, and Qwen3-MoE's experts split or placed on parts of the group.
TEST(LlamaTensorParallelTest, Qwen3ShardsGiveTheWholeLossAndGradients) {
  Case qwen3;
  qwen3.qwen3 = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(qwen3);
  qwen3.kv_heads = 1;
  ExpectShardsGiveTheWholeLossAndGradients(qwen3);
  Case moe;
  moe.qwen3 = true;
  moe.qwen3_moe = true;
  ExpectShardsGiveTheWholeLossAndGradients(moe);
  moe.expert_parallel = 2;
  moe.sequence_parallel = true;
  ExpectShardsGiveTheWholeLossAndGradients(moe);
}

// Gemma 3: a local block (window 4 of 8 positions, its own rotary base) and a global one, each
// rank normalising its query and key heads with the one offset weight every rank holds; Gemma
// 2's sandwich norms shared under sequence parallelism.
TEST(LlamaTensorParallelTest, Gemma3ShardsGiveTheWholeLossAndGradients) {
  Case gemma3;
  gemma3.gemma3 = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(gemma3);
  gemma3.kv_heads = 1;
  ExpectShardsGiveTheWholeLossAndGradients(gemma3);
}

// GLM-4-0414: GLM's products and rotation within each rank's heads, Gemma 2's four norms under
// GLM's names (shared under sequence parallelism).
TEST(LlamaTensorParallelTest, Glm4ShardsGiveTheWholeLossAndGradients) {
  Case glm4;
  glm4.glm4 = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(glm4);
}

// OLMo 2: norms after the attention and the MLP only (shared under sequence parallelism),
// OLMoE's q_norm and k_norm over every head (each rank's heads' features, the sums of squares
// summed over the group), biases on every attention product.
TEST(LlamaTensorParallelTest, Olmo2ShardsGiveTheWholeLossAndGradients) {
  Case olmo2;
  olmo2.olmo2 = true;
  ExpectShardsAloneAndTiedWithSequenceParallelism(olmo2);
}

// Fewer key/value heads than ranks (multi-query attention: one for 4 query heads; 2 on 4
// ranks), or a number the degree does not divide (3 for 6 query heads on 2 ranks, the second
// head read by both): k_proj and v_proj, with their biases and Cohere's and StableLM's key
// norms, are whole on every rank, which computes the heads its query heads read; their
// gradients are summed over the group. With and without sequence parallelism.
TEST(LlamaTensorParallelTest, WholeKeyValueHeadsGiveTheWholeLossAndGradients) {
  for (const int kv : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(kv, " key/value heads"));
    Case whole;
    whole.kv_heads = kv;
    ExpectShardsGiveTheWholeLossAndGradients(whole);
    whole.qkv_bias = true;
    whole.sequence_parallel = true;
    ExpectShardsGiveTheWholeLossAndGradients(whole);
  }
  Case straddled;
  straddled.six_heads = true;
  straddled.kv_heads = 3;
  ExpectShardsGiveTheWholeLossAndGradients(straddled);
  straddled.sequence_parallel = true;
  straddled.tied = true;
  ExpectShardsGiveTheWholeLossAndGradients(straddled);
  Case cohere;
  cohere.cohere = true;
  cohere.head_norms = true;
  cohere.kv_heads = 1;
  ExpectShardsGiveTheWholeLossAndGradients(cohere);
  Case stablelm;
  stablelm.stablelm = true;
  stablelm.head_norms = true;
  stablelm.kv_heads = 1;
  stablelm.sequence_parallel = true;
  ExpectShardsGiveTheWholeLossAndGradients(stablelm);
}

// Expert parallelism: each expert whole on one rank (one part per rank), or on a part of two
// ranks that split its units (4 ranks, 2 parts); the router and the rest as without it, with
// and without sequence parallelism, the load-balancing loss included.
TEST(LlamaTensorParallelTest, ExpertsPlacedOnPartsOfTheGroupGiveTheWholeLossAndGradients) {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const int t = (*world)->size();
  for (int ep : {2, 4}) {
    if (ep > t) continue;
    SCOPED_TRACE(absl::StrCat("expert parallelism ", ep, " of ", t));
    Case mixtral;
    mixtral.mixtral = true;
    mixtral.expert_parallel = ep;
    ExpectShardsGiveTheWholeLossAndGradients(mixtral);
    mixtral.sequence_parallel = true;
    mixtral.tied = true;
    ExpectShardsGiveTheWholeLossAndGradients(mixtral);
    Case qwen2_moe;
    qwen2_moe.qwen2_moe = true;
    qwen2_moe.expert_parallel = ep;
    ExpectShardsGiveTheWholeLossAndGradients(qwen2_moe);
  }
}

// Experts spread over data-parallel replicas (all-to-all of the routed tokens): every
// replica's loss is the whole model's on its own share of the batch, the parameters outside
// the experts get the whole model's gradient of that share, and each replica holds 1 / E of
// the experts (of its part of the tensor-parallel group), whose gradients are the whole
// model's summed over the replicas' shares. World W: W replicas (T = 1); on 4 ranks also
// 2 replicas x T = 2, with the experts split over the group's ranks or placed on its 2 parts,
// with sequence parallelism.
struct ReplicaCase {
  int tensor_parallel = 1;
  int expert_parallel = 1;
  bool sequence_parallel = false;
  bool qwen2_moe = false;
};

void ExpectExpertsOverReplicasGiveTheWholeLossAndGradients(const ReplicaCase& c) {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const int size = (*world)->size(), me = (*world)->rank();
  const int t = c.tensor_parallel, replicas = size / t;
  if (size % t != 0 || replicas < 2) GTEST_SKIP() << size << " ranks";
  const int replica = me / t, lane = me % t;
  LlamaConfig llama = SmallLlama(t, /*tied=*/false);
  if (c.qwen2_moe) {
    llama.model_type = "qwen2_moe";
    llama.qkv_bias = true;
    llama.expert_intermediate = 16;
    llama.shared_expert_intermediate = 32;
    llama.normalize_top_k = false;
    llama.dense_blocks = {1};
  } else {
    llama.model_type = "mixtral";
    llama.router_aux_loss_coef = 0.5;
  }
  llama.experts = 8;
  llama.experts_per_token = 2;
  auto model = LlamaModelSpec(llama).Build(/*seed=*/7);
  ASSERT_TRUE(model.ok()) << model.status();
  auto data = SmallTask(llama);
  ASSERT_TRUE(data.ok()) << data.status();
  auto group = (*world)->Split(replica, lane);
  ASSERT_TRUE(group.ok()) << group.status();
  auto experts = (*world)->Split(lane, replica);
  ASSERT_TRUE(experts.ok()) << experts.status();
  TensorParallel tp{t, lane, group->get()};
  tp.sequence_parallel = c.sequence_parallel;
  tp.expert_parallel = c.expert_parallel;
  tp.expert_replicas = replicas;
  tp.expert_replica = replica;
  tp.expert_group = experts->get();

  const StageRun whole = RunStage(*model, *data, TensorParallel{}, replica, replicas);
  const StageRun shard = RunStage(*model, *data, tp, replica, replicas);
  ASSERT_NE(whole.stage, nullptr);
  ASSERT_NE(shard.stage, nullptr);
  EXPECT_NEAR(shard.loss, whole.loss, kRelativeTolerance * std::abs(whole.loss));

  // The whole model's gradients of this replica's share, and summed over the replicas.
  std::map<std::string, torch::Tensor> value, grad, summed;
  for (const auto& [name, p] : whole.stage->named_parameters()) {
    value[name] = p.detach().clone();
    grad[name] = p.grad().clone();
    summed[name] = p.grad().clone();
    ASSERT_TRUE((*experts)->AllReduce(CommBufferOf(summed[name]))->Wait().ok());
  }
  std::map<std::string, const ParameterView*> views;
  const std::vector<ParameterView> parameters = shard.stage->Parameters();
  for (const ParameterView& v : parameters) views[v.name] = &v;
  int placed = 0;
  int64_t held_units = 0;
  for (const auto& [name, p] : shard.stage->named_parameters()) {
    ASSERT_EQ(value.count(name), 1u) << name;
    const ParameterView& view = *views.at(name);
    const bool expert = name.find(".experts.") != std::string::npos;
    EXPECT_EQ(view.placed_over_replicas, expert) << name;
    torch::Tensor want_value = value[name], want_grad = expert ? summed[name] : grad[name];
    if (view.tensor_parallel_index != nullptr) {
      const torch::Tensor picked = torch::tensor(*view.tensor_parallel_index);
      want_value = want_value.reshape({-1}).index_select(0, picked).view(p.sizes());
      want_grad = want_grad.reshape({-1}).index_select(0, picked).view(p.sizes());
    }
    ASSERT_EQ(p.sizes(), want_value.sizes()) << name;
    EXPECT_TRUE(torch::equal(p.detach(), want_value)) << name;
    EXPECT_LT(RelativeError(p.grad(), want_grad), kRelativeTolerance) << name << " on " << me;
    if (expert) {
      ++placed;
      const bool down =
          name.find(".w2.") != std::string::npos || name.find(".down_proj.") != std::string::npos;
      if (down && name.find("layers.1.") == 0) held_units += p.size(1);
    }
  }
  // Every expert's three matrices of every sparse block are placed; this rank holds
  // 1 / (parts x replicas) of block 1's experts, each split over its part's t / parts ranks.
  const int sparse_blocks = c.qwen2_moe ? 1 : static_cast<int>(llama.layers);
  EXPECT_EQ(placed, 3 * static_cast<int>(llama.experts) * sparse_blocks);
  EXPECT_EQ(held_units, llama.experts / (c.expert_parallel * replicas) * llama.ExpertUnits() /
                            (t / c.expert_parallel));
  // Not a copy of the whole: the experts' gradients differ from this replica's own.
  if (c.tensor_parallel == 1) {
    const std::string name = c.qwen2_moe ? "layers.1.mlp.experts.0.up_proj.weight"
                                         : "layers.1.block_sparse_moe.experts.0.w3.weight";
    EXPECT_GT(RelativeError(summed[name], grad[name]), 100 * kRelativeTolerance);
  }
}

TEST(LlamaTensorParallelTest, ExpertsOverReplicasGiveTheWholeLossAndGradients) {
  ExpectExpertsOverReplicasGiveTheWholeLossAndGradients({});
  ReplicaCase qwen2_moe;
  qwen2_moe.qwen2_moe = true;
  ExpectExpertsOverReplicasGiveTheWholeLossAndGradients(qwen2_moe);
}

TEST(LlamaTensorParallelTest, ExpertsOverReplicasWithTensorParallelism) {
  for (int parts : {1, 2}) {
    for (bool sequence_parallel : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat("experts on ", parts, " parts, sequence parallel ", sequence_parallel));
      ReplicaCase c;
      c.tensor_parallel = 2;
      c.expert_parallel = parts;
      c.sequence_parallel = sequence_parallel;
      ExpectExpertsOverReplicasGiveTheWholeLossAndGradients(c);
    }
  }
}

// The experts' load-balancing loss in a stage is scaled as the stage's loss is: the stage's
// gradients (2 micro-batches of 2 samples) are the mean over the micro-batches of the
// gradients of each micro-batch's loss plus its balancing loss, computed outside any stage.
TEST(LlamaTensorParallelTest, BalancingLossIsScaledAsTheLoss) {
  LlamaConfig llama = SmallLlama(/*degree=*/1, /*tied=*/false);
  llama.model_type = "mixtral";
  llama.experts = 4;
  llama.experts_per_token = 2;
  llama.router_aux_loss_coef = 0.5;
  auto model = LlamaModelSpec(llama).Build(/*seed=*/7);
  ASSERT_TRUE(model.ok()) << model.status();
  auto data = SmallTask(llama);
  ASSERT_TRUE(data.ok()) << data.status();
  const StageRun stage = RunStage(*model, *data, TensorParallel{});
  ASSERT_NE(stage.stage, nullptr);

  auto reference = LlamaModelSpec(llama).Build(/*seed=*/7);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto batch = (*data)->Samples(/*iteration=*/1, /*first=*/0, /*count=*/4);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const int end = reference->num_layers();
  std::map<std::string, torch::Tensor> mean;
  for (int m = 0; m < 2; ++m) {
    for (auto& [name, p] : reference->NamedParameters(0, end)) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    const torch::Tensor output = reference->Forward(batch->inputs.narrow(0, 2 * m, 2), 0, end);
    reference->loss(output, batch->targets.narrow(0, 2 * m, 2)).backward();
    for (auto& [name, p] : reference->NamedParameters(0, end)) {
      const torch::Tensor half = p.grad() / 2;
      mean[name] = mean.count(name) > 0 ? mean[name] + half : half;
    }
  }
  for (const auto& [name, p] : stage.stage->named_parameters()) {
    ASSERT_EQ(mean.count(name), 1u) << name;
    EXPECT_LT(RelativeError(p.grad(), mean[name]), kRelativeTolerance) << name;
  }
  // The router's gradient is the balancing loss's to a large part: without it, far off.
  LlamaConfig unbalanced = llama;
  unbalanced.router_aux_loss_coef = 0;
  auto plain_model = LlamaModelSpec(unbalanced).Build(/*seed=*/7);
  ASSERT_TRUE(plain_model.ok()) << plain_model.status();
  const StageRun plain = RunStage(*plain_model, *data, TensorParallel{});
  ASSERT_NE(plain.stage, nullptr);
  for (const auto& [name, p] : plain.stage->named_parameters()) {
    if (name != "layers.1.block_sparse_moe.gate.weight") continue;
    EXPECT_GT(RelativeError(p.grad(), mean[name]), 100 * kRelativeTolerance);
  }
}

// Under sequence parallelism the column-parallel products (Llama's q, k, v and gate, up;
// GPT-2's c_attn and c_fc) gather this rank's tokens themselves and keep only these for the
// backward, as Megatron-LM does: measured by the profiler, each block of the
// sequence-parallel shard stashes at least 2 (S - S/t) b h floats less than the shard without
// it (the two inputs of those products).
void ExpectSequenceParallelBlocksKeepOnlyTheirTokens(bool gpt2) {
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  ASSERT_TRUE(world.ok()) << world.status();
  const int t = (*world)->size();
  const LlamaConfig llama = SmallLlama(t, /*tied=*/false);
  if (t < 2 || llama.heads % t != 0 || llama.vocab % t != 0 || llama.seq_len % t != 0) {
    GTEST_SKIP() << t << " ranks";
  }
  auto model = gpt2 ? Gpt2ModelSpec(SmallGpt2(false)).Build(/*seed=*/7)
                    : LlamaModelSpec(llama).Build(/*seed=*/7);
  ASSERT_TRUE(model.ok()) << model.status();
  auto data = SmallTask(llama);
  ASSERT_TRUE(data.ok()) << data.status();
  ProfilerOptions options;
  options.microbatch_size = 4;
  options.warmup = 1;
  options.repeats = 1;
  options.tensor_parallel = TensorParallel{t, (*world)->rank(), world->get()};
  auto plain = ProfileModel(*model, **data, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  options.tensor_parallel.sequence_parallel = true;
  auto split = ProfileModel(*model, **data, options);
  ASSERT_TRUE(split.ok()) << split.status();
  const double s = llama.seq_len, b = 4, h = llama.hidden;  // the same shape for GPT-2
  const double inputs = 2 * (s - s / t) * b * h * sizeof(float);
  for (int l = 1; l <= llama.layers; ++l) {
    EXPECT_LE(split->layers[l].stashed_activation_bytes,
              plain->layers[l].stashed_activation_bytes - inputs)
        << (gpt2 ? "gpt2" : "llama") << " block " << l << ": sequence parallel "
        << split->layers[l].stashed_activation_bytes << " B, without "
        << plain->layers[l].stashed_activation_bytes << " B";
  }
}

TEST(LlamaTensorParallelTest, SequenceParallelBlocksKeepOnlyTheirTokens) {
  ExpectSequenceParallelBlocksKeepOnlyTheirTokens(/*gpt2=*/false);
}

// GPT-2: c_attn's query, key and value thirds split by heads, biases of the row-parallel
// products added once after the sum.
TEST(Gpt2TensorParallelTest, ShardsGiveTheWholeLossAndGradients) {
  ExpectShardsGiveTheWholeLossAndGradients({/*gpt2=*/true, /*tied=*/true});
  ExpectShardsGiveTheWholeLossAndGradients({/*gpt2=*/true, /*tied=*/false});
}

// Sequence parallelism: wpe, the layer norms and the row-parallel biases summed over tokens.
TEST(Gpt2TensorParallelTest, SequenceParallelShardsGiveTheWholeLossAndGradients) {
  ExpectShardsGiveTheWholeLossAndGradients(
      {/*gpt2=*/true, /*tied=*/true, /*sequence_parallel=*/true});
  ExpectShardsGiveTheWholeLossAndGradients(
      {/*gpt2=*/true, /*tied=*/false, /*sequence_parallel=*/true});
}

TEST(Gpt2TensorParallelTest, SequenceParallelBlocksKeepOnlyTheirTokens) {
  ExpectSequenceParallelBlocksKeepOnlyTheirTokens(/*gpt2=*/true);
}

}  // namespace
}  // namespace tandem::runtime::libtorch
