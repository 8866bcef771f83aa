#include "runtime/torch/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/json_util.h"
#include "common/status.h"
#include "runtime/checkpoint.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/gpt2.h"
#include "runtime/torch/hf_weights.h"
#include "runtime/torch/kv_cache.h"
#include "runtime/torch/llama.h"

namespace tandem::runtime::libtorch {
namespace {

constexpr char kParameterPrefix[] = "param:";  // stage_checkpoint.cc's parameter tensors
constexpr uint64_t kBuildSeed = 0;  // the initial values, all overwritten

// A model's spec and figures before it is built.
struct Blueprint {
  ModelSpec spec;
  std::string description;
  int64_t vocab = 0;
  int64_t max_positions = 0;
};

Blueprint OfGpt(const GptConfig& config) {
  return {GptModelSpec(config), DescribeGpt(config), config.vocab, config.seq_len};
}
Blueprint OfGpt2(const Gpt2Config& config) {
  return {Gpt2ModelSpec(config), DescribeGpt2(config), config.vocab, config.positions};
}
Blueprint OfLlama(const LlamaConfig& config) {
  // A sliding window tandem does not mask (Qwen2's) bounds the positions.
  return {LlamaModelSpec(config), DescribeLlama(config), config.vocab, config.MaxPositions()};
}

// The blueprint of a checkpoint's model `description`, sized by `file` where given
// (HfConfigOfCheckpoint).
absl::StatusOr<Blueprint> BlueprintOfDescription(const std::string& description,
                                                 const std::optional<CheckpointHfConfig>& file) {
  const std::string family = description.substr(0, description.find(' '));
  if (family == "gpt") {
    if (file) {
      return absl::InvalidArgumentError(
          "--hf-config sizes llama and gpt2 models; the checkpoint holds a gpt");
    }
    TANDEM_ASSIGN_OR_RETURN(const GptConfig config, GptConfigFromDescription(description));
    return OfGpt(config);
  }
  if (family != "llama" && family != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint holds model '", description,
        "'; generate runs the decoder models gpt, gpt2 and llama"));
  }
  const bool llama = family == "llama";
  if (!file) {
    if (llama) {
      TANDEM_ASSIGN_OR_RETURN(const LlamaConfig config, LlamaConfigFromDescription(description));
      return OfLlama(config);
    }
    TANDEM_ASSIGN_OR_RETURN(const Gpt2Config config, Gpt2ConfigFromDescription(description));
    return OfGpt2(config);
  }
  const int64_t seq_len = DescribedSequenceLength(description);
  Blueprint blueprint;
  if (llama) {
    auto config = LlamaConfigFromJson(file->config);
    if (!config.ok()) return Annotate(config.status(), file->source);
    if (seq_len > 0) config->seq_len = seq_len;
    blueprint = OfLlama(*config);
  } else {
    auto config = Gpt2ConfigFromJson(file->config);
    if (!config.ok()) return Annotate(config.status(), file->source);
    if (seq_len > 0) config->seq_len = seq_len;
    blueprint = OfGpt2(*config);
  }
  if (blueprint.description != WithoutSeed(description)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file->source, " describes '", blueprint.description,
                     "', the checkpoint holds '", WithoutSeed(description), "'"));
  }
  return blueprint;
}

// Every layer of `blueprint` built on the CPU (`before_share`, if given, runs on them first),
// moved to `device`, its tied weights shared, frozen.
absl::StatusOr<GenerationModel> Assemble(
    Blueprint blueprint, torch::Device device, std::string source,
    const std::function<absl::Status(LayeredModel&)>& before_share) {
  GenerationModel out;
  TANDEM_ASSIGN_OR_RETURN(out.model, blueprint.spec.BuildLayers(kBuildSeed, 0, -1));
  if (before_share) TANDEM_RETURN_IF_ERROR(before_share(out.model));
  TANDEM_RETURN_IF_ERROR(CatchTorchErrors(absl::StrCat("moving ", out.model.name, " to ",
                                                       device.str()),
                                          [&] {
                                            for (torch::nn::AnyModule& layer : out.model.layers) {
                                              layer.ptr()->to(device);
                                              layer.ptr()->eval();
                                            }
                                          }));
  if (out.model.tied_weights.share) {
    TANDEM_RETURN_IF_ERROR(out.model.tied_weights.share(out.model.layers, 0));
  }
  for (torch::nn::AnyModule& layer : out.model.layers) {
    for (torch::Tensor& parameter : layer.ptr()->parameters()) parameter.requires_grad_(false);
  }
  out.description = std::move(blueprint.description);
  out.source = std::move(source);
  out.vocab = blueprint.vocab;
  out.max_positions = blueprint.max_positions;
  return out;
}

// Copies the checkpoint's parameters (`saved`, by tandem name) into `model`'s. A tied copy the
// checkpoint does not hold (a single stage saved the shared tensor once) takes its owner's.
absl::Status LoadParameters(const std::map<std::string, ShardTensor>& saved,
                            const std::string& where, LayeredModel& model) {
  std::map<std::string, std::string> owner_of;
  for (const TiedParameter& tied : model.tied_weights.parameters) {
    owner_of[tied.copy] = tied.owner;
  }
  std::set<std::string> used;
  torch::NoGradGuard no_grad;
  for (auto& [name, parameter] : model.NamedParameters(0, model.num_layers())) {
    auto it = saved.find(name);
    if (it == saved.end() && owner_of.count(name) > 0) it = saved.find(owner_of[name]);
    if (it == saved.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": holds no parameter '", name, "'"));
    }
    const ShardTensor& t = it->second;
    const std::vector<int64_t> shape = parameter.sizes().vec();
    if (t.dtype != comm::DataType::kFloat32 || t.count != parameter.numel() ||
        !ShapesCompatible(t.shape, shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": parameter '", it->first, "' is ", ShapeString(t.shape),
          t.dtype != comm::DataType::kFloat32 ? " (not float32)" : "", ", the model's '", name,
          "' is ", ShapeString(shape)));
    }
    torch::Tensor values = torch::empty(shape, torch::kFloat);
    std::memcpy(values.data_ptr<float>(), t.bytes.data(), t.bytes.size());
    parameter.copy_(values);
    used.insert(it->first);
  }
  std::vector<std::string> extra;
  for (const auto& [name, tensor] : saved) {
    if (used.count(name) == 0 && owner_of.count(name) == 0) extra.push_back(name);
  }
  if (!extra.empty()) {
    if (extra.size() > 4) extra.resize(4);
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": holds parameter(s) the model has not: ", absl::StrJoin(extra, ", ")));
  }
  return absl::OkStatus();
}

// The next token from the last position's logits (float32 on the CPU).
int64_t Choose(const torch::Tensor& logits, const GenerateOptions& options,
               at::Generator& generator) {
  if (options.temperature == 0) return logits.argmax().item<int64_t>();
  torch::Tensor scores = logits / options.temperature;
  if (options.top_k > 0 && options.top_k < scores.size(0)) {
    const torch::Tensor kth = std::get<0>(scores.topk(options.top_k)).select(0, options.top_k - 1);
    scores = scores.masked_fill(scores < kth, -std::numeric_limits<float>::infinity());
  }
  const torch::Tensor probabilities = torch::softmax(scores, /*dim=*/-1);
  return torch::multinomial(probabilities, /*num_samples=*/1, /*replacement=*/false, generator)
      .item<int64_t>();
}

// The eos_token_id of a config.json or generation_config.json: none (absent or null), an id,
// or a list of ids. InvalidArgument naming the file for anything else.
absl::StatusOr<std::vector<int64_t>> EndTokensOf(const Json& json, const std::string& path) {
  std::vector<int64_t> ids;
  if (!json.is_object() || !json.contains("eos_token_id") || json.at("eos_token_id").is_null()) {
    return ids;
  }
  const Json& value = json.at("eos_token_id");
  const auto add = [&](const Json& id) -> absl::Status {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": eos_token_id must be a token id or a list of them, got ", value.dump()));
    }
    ids.push_back(id.get<int64_t>());
    return absl::OkStatus();
  };
  if (value.is_array()) {
    for (const Json& id : value) TANDEM_RETURN_IF_ERROR(add(id));
  } else {
    TANDEM_RETURN_IF_ERROR(add(value));
  }
  return ids;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::StatusOr<GenerationModel> ModelFromCheckpoint(const std::string& checkpoint,
                                                    const std::string& hf_config,
                                                    torch::Device device) {
  TANDEM_ASSIGN_OR_RETURN(const std::string folder, ResolveCheckpoint(checkpoint));
  TANDEM_ASSIGN_OR_RETURN(const CheckpointManifest manifest, ReadManifest(folder));
  TANDEM_ASSIGN_OR_RETURN(const std::optional<CheckpointHfConfig> file,
                          HfConfigOfCheckpoint(manifest.model, manifest.run, hf_config));
  auto blueprint = BlueprintOfDescription(manifest.model, file);
  if (!blueprint.ok()) return Annotate(blueprint.status(), folder);
  std::map<std::string, ShardTensor> parameters;
  for (const ShardRecord& record : manifest.shards) {
    TANDEM_ASSIGN_OR_RETURN(CheckpointShard shard, ReadShard(folder, record));
    for (ShardTensor& t : shard.tensors) {
      if (!absl::StartsWith(t.name, kParameterPrefix)) continue;
      std::string name = t.name.substr(sizeof(kParameterPrefix) - 1);
      if (parameters.count(name) > 0) {
        return absl::DataLossError(
            absl::StrCat(folder, ": parameter '", name, "' is in more than one shard"));
      }
      parameters.emplace(std::move(name), std::move(t));
    }
  }
  const std::string where = absl::StrCat(folder, " (", blueprint->description, ")");
  std::vector<int64_t> end_tokens;
  if (file) {
    TANDEM_ASSIGN_OR_RETURN(end_tokens, EndTokensOf(file->config, file->source));
  }
  TANDEM_ASSIGN_OR_RETURN(
      GenerationModel out,
      Assemble(*std::move(blueprint), device,
               absl::StrCat("checkpoint ", folder, " (step ", manifest.step, ")"),
               [&](LayeredModel& model) { return LoadParameters(parameters, where, model); }));
  out.end_tokens = std::move(end_tokens);
  if (!out.end_tokens.empty()) out.end_tokens_source = file->source;
  return out;
}

absl::StatusOr<GenerationModel> ModelFromHfFolder(const std::string& folder,
                                                  torch::Device device) {
  const std::string config_path = absl::StrCat(folder, "/config.json");
  TANDEM_ASSIGN_OR_RETURN(const Json json, ReadJsonFile(config_path));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": expected a JSON object"));
  }
  TANDEM_ASSIGN_OR_RETURN(const std::string model_type,
                          GetStringOr(json, "model_type", "", config_path));
  Blueprint blueprint;
  HfLayout layout;
  if (IsLlamaModelType(model_type)) {
    auto config = LlamaConfigFromJson(json);
    if (!config.ok()) return Annotate(config.status(), folder);
    // The positions the model takes (Qwen2's sliding window bounds them).
    config->seq_len = config->MaxPositions();
    blueprint = OfLlama(*config);
    layout = LlamaHfLayout(*config);
  } else if (model_type == "gpt2") {
    auto config = Gpt2ConfigFromJson(json);
    if (!config.ok()) return Annotate(config.status(), folder);
    config->seq_len = config->positions;
    blueprint = OfGpt2(*config);
    layout = Gpt2HfLayout(*config);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": model_type \"", model_type,
                                                   "\": generate reads gpt2 folders and llama's (",
                                                   kLlamaModelTypes, ")"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<const HfWeights> weights,
                          HfWeights::Open(folder, std::move(layout)));
  InitializeFromHfWeights(std::move(weights), &blueprint.spec);
  // The end-of-text tokens transformers' generate stops at: generation_config.json's where
  // the folder has one (from_pretrained then reads that file alone), else config.json's.
  const std::string generation_path = absl::StrCat(folder, "/generation_config.json");
  std::error_code exists_error;
  const bool has_generation_config = std::filesystem::exists(generation_path, exists_error);
  const std::string end_source = has_generation_config ? generation_path : config_path;
  std::vector<int64_t> end_tokens;
  if (has_generation_config) {
    TANDEM_ASSIGN_OR_RETURN(const Json generation, ReadJsonFile(generation_path));
    TANDEM_ASSIGN_OR_RETURN(end_tokens, EndTokensOf(generation, generation_path));
  } else {
    TANDEM_ASSIGN_OR_RETURN(end_tokens, EndTokensOf(json, config_path));
  }
  TANDEM_ASSIGN_OR_RETURN(
      GenerationModel out,
      Assemble(std::move(blueprint), device, absl::StrCat("Hugging Face folder ", folder),
               /*before_share=*/{}));
  out.end_tokens = std::move(end_tokens);
  if (!out.end_tokens.empty()) out.end_tokens_source = end_source;
  return out;
}

absl::StatusOr<Generation> Generate(GenerationModel& model, absl::Span<const int64_t> prompt,
                                    const GenerateOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= model.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", prompt[i],
                                                     ", outside the model's vocabulary [0, ",
                                                     model.vocab, ")"));
    }
  }
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens is negative: ", options.max_new_tokens));
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  if (total > model.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt's ", prompt.size(), " tokens and ", options.max_new_tokens,
        " new ones exceed the ", model.max_positions, " positions of ", model.description));
  }
  if (!(options.temperature >= 0) || std::isinf(options.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the temperature must be 0 (greedy) or positive, got ", options.temperature));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k is negative: ", options.top_k));
  }
  const int layers = model.model.num_layers();
  std::vector<IncrementalLayer*> incremental(layers, nullptr);
  if (options.use_cache) {
    for (int layer = 0; layer < layers; ++layer) {
      incremental[layer] = AsIncremental(model.model.layers[layer]);
      if (incremental[layer] == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "layer ", layer, " (", model.model.layer_names[layer], ") of ", model.description,
            " has no incremental form for the key/value cache; generate without it"));
      }
    }
  }

  Generation out;
  const auto started = std::chrono::steady_clock::now();
  absl::Status ran = CatchTorchErrors(absl::StrCat("generating with ", model.description), [&] {
    torch::NoGradGuard no_grad;
    torch::Device device(torch::kCPU);  // where the parameters are
    for (const torch::nn::AnyModule& layer : model.model.layers) {
      const std::vector<torch::Tensor> parameters = layer.ptr()->parameters();
      if (!parameters.empty()) {
        device = parameters.front().device();
        break;
      }
    }
    const auto ids = [&](const std::vector<int64_t>& values) {
      return torch::tensor(values, torch::kLong).view({1, -1}).to(device);
    };
    at::Generator generator = at::detail::createCPUGenerator(options.seed);
    std::vector<int64_t> sequence(prompt.begin(), prompt.end());
    std::vector<KeyValueCache> caches(layers);
    for (KeyValueCache& cache : caches) cache.capacity = total;
    torch::Tensor input = ids(sequence);  // the positions not yet run: the prompt first
    int64_t start = 0;
    for (int64_t step = 0; step < options.max_new_tokens; ++step) {
      torch::Tensor x;
      if (options.use_cache) {
        x = input;
        for (int layer = 0; layer < layers; ++layer) {
          x = incremental[layer]->ForwardIncremental(x, start, caches[layer]);
        }
        start += input.size(1);
      } else {
        x = model.model.Forward(ids(sequence), 0, layers);
      }
      const torch::Tensor logits = x.select(1, x.size(1) - 1).select(0, 0).to(torch::kCPU,
                                                                             torch::kFloat);
      const int64_t next = Choose(logits, options, generator);
      if (step == 0) out.first_token_seconds = SecondsSince(started);
      out.tokens.push_back(next);
      sequence.push_back(next);
      if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) !=
          options.stop_tokens.end()) {
        break;
      }
      input = ids({next});
    }
  });
  out.seconds = SecondsSince(started);
  if (!ran.ok()) return ran;
  return out;
}

}  // namespace tandem::runtime::libtorch
