// `tandem generate`: continue a prompt with a trained model on one rank (runtime/torch/
// generate.h): a tandem checkpoint (--checkpoint) or a Hugging Face folder (--init-from), a
// prompt of token ids or of text through a tokenizer.json (data/tokenizer.h), greedy or
// sampled, with a key/value cache.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/torch/commands.h"
#include "cli/torch/model_flags.h"
#include "cli/torch_commands.h"
#include "common/status.h"
#include "data/tokenizer.h"
#include "runtime/torch/generate.h"

ABSL_DECLARE_FLAG(std::string, hf_config);  // cli/torch/hf_models.cc
ABSL_DECLARE_FLAG(std::string, init_from);  // cli/torch/hf_models.cc

ABSL_FLAG(std::string, checkpoint, "",
          "generate: a tandem checkpoint (a root, whose latest step is read, or a step folder) "
          "of a gpt, gpt2 or llama model");
ABSL_FLAG(std::string, prompt_tokens, "", "generate: the prompt as token ids: 1,2,3");
ABSL_FLAG(std::string, prompt, "", "generate: the prompt as text (needs --tokenizer)");
ABSL_FLAG(std::string, tokenizer, "",
          "generate: a Hugging Face tokenizer.json (BPE: GPT-2's, Llama 2's or 3's, Qwen2's, "
          "Gemma's, or "
          "the one scripts/prepare_data.py writes beside its shards) for --prompt and to print "
          "the text; default: an --init-from folder's own");
ABSL_FLAG(int, max_new_tokens, 32, "generate: tokens to add to the prompt");
ABSL_FLAG(double, temperature, 0,
          "generate: 0 takes the most likely token (greedy); above 0 samples from the softmax "
          "of the logits divided by it");
ABSL_FLAG(int, top_k, 0, "generate: sample among the k most likely tokens only; 0: all");
ABSL_FLAG(std::string, stop_token, "",
          "generate: stop after any of these token ids (1,2,3), or 'none' to never stop; "
          "empty: the model's end-of-text tokens where its files name them (a Hugging Face "
          "folder's generation_config.json or config.json eos_token_id, a checkpoint's "
          "--hf-config), as transformers' generate stops");
ABSL_FLAG(bool, kv_cache, true,
          "generate: keep the keys and values of earlier positions (each step runs one "
          "position); false runs the whole sequence every step");

namespace tandem::cli {
namespace {

constexpr char kName[] = "generate";

absl::StatusOr<std::vector<int64_t>> ParseTokenList(const std::string& text) {
  std::vector<int64_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    int64_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-tokens: '", piece, "' is not a token id (expected 1,2,3)"));
    }
    ids.push_back(id);
  }
  return ids;
}

// --stop-token: the ids given, none ("none"), or nullopt for the model's end-of-text tokens.
absl::StatusOr<std::optional<std::vector<int64_t>>> StopTokensFromFlag() {
  const std::string text = absl::GetFlag(FLAGS_stop_token);
  if (text.empty()) return std::nullopt;
  if (text == "none") return std::vector<int64_t>{};
  std::vector<int64_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(piece), &id) || id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stop-token: '", piece, "' is not a token id (expected 1,2,3 or none)"));
    }
    ids.push_back(id);
  }
  return ids;
}

// The flags' options, checked before anything is loaded.
absl::StatusOr<runtime::libtorch::GenerateOptions> OptionsFromFlags() {
  runtime::libtorch::GenerateOptions options;
  options.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  options.temperature = absl::GetFlag(FLAGS_temperature);
  options.top_k = absl::GetFlag(FLAGS_top_k);
  options.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  options.use_cache = absl::GetFlag(FLAGS_kv_cache);
  if (options.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-new-tokens must be positive, got ", options.max_new_tokens));
  }
  if (!(options.temperature >= 0) || std::isinf(options.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--temperature must be 0 (greedy) or positive, got ", options.temperature));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-k must not be negative, got ", options.top_k));
  }
  if (options.top_k > 0 && options.temperature == 0) {
    // Greedy decoding takes the most likely token: a top-k would change nothing.
    return absl::InvalidArgumentError(
        absl::StrCat("--top-k ", options.top_k,
                     " applies to sampling (--temperature above 0); this run is "
                     "greedy (--temperature 0)"));
  }
  return options;
}

absl::Status Generate() {
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  const std::string init_from = absl::GetFlag(FLAGS_init_from);
  if (checkpoint.empty() == init_from.empty()) {
    return absl::InvalidArgumentError(
        "give the model as --checkpoint DIR (a tandem checkpoint) or --init-from FOLDER (a "
        "Hugging Face folder), one of them");
  }
  if (!init_from.empty() && !absl::GetFlag(FLAGS_hf_config).empty()) {
    return absl::InvalidArgumentError(
        "--hf-config goes with --checkpoint; --init-from takes its folder's config.json");
  }
  const std::string prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const std::string prompt_text = absl::GetFlag(FLAGS_prompt);
  std::string tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  if (prompt_tokens.empty() == prompt_text.empty()) {
    return absl::InvalidArgumentError(
        "give the prompt as --prompt-tokens 1,2,3 or as --prompt TEXT with --tokenizer FILE, "
        "one of them");
  }
  if (!prompt_text.empty() && tokenizer_path.empty()) {
    // A Hugging Face folder usually carries its tokenizer.
    const std::string beside = init_from.empty() ? "" : init_from + "/tokenizer.json";
    std::error_code error;
    if (beside.empty() || !std::filesystem::is_regular_file(beside, error)) {
      return absl::InvalidArgumentError(
          "--prompt TEXT needs --tokenizer FILE (a tokenizer.json; an --init-from folder's own "
          "tokenizer.json is taken when it has one)");
    }
    tokenizer_path = beside;
  }
  TANDEM_ASSIGN_OR_RETURN(runtime::libtorch::GenerateOptions options, OptionsFromFlags());
  TANDEM_ASSIGN_OR_RETURN(const std::optional<std::vector<int64_t>> stop_tokens,
                          StopTokensFromFlag());
  std::optional<data::Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) {
    auto read = data::Tokenizer::FromFile(tokenizer_path);
    if (!read.ok()) return Annotate(read.status(), "--tokenizer");
    tokenizer = *std::move(read);
  }
  std::vector<int64_t> prompt;
  if (!prompt_tokens.empty()) {
    TANDEM_ASSIGN_OR_RETURN(prompt, ParseTokenList(prompt_tokens));
  } else {
    // With the tokenizer's template (a Llama's beginning-of-text token first), as
    // transformers' tokenizer(text) gives the prompt.
    auto encoded = tokenizer->Encode(prompt_text, /*add_special_tokens=*/true);
    if (!encoded.ok()) return Annotate(encoded.status(), "--prompt");
    prompt = *std::move(encoded);
    if (prompt.empty()) return absl::InvalidArgumentError("--prompt: the text gives no tokens");
  }

  TANDEM_ASSIGN_OR_RETURN(const torch::Device device, DeviceFromFlags());
  auto loaded = checkpoint.empty()
                    ? runtime::libtorch::ModelFromHfFolder(init_from, device)
                    : runtime::libtorch::ModelFromCheckpoint(
                          checkpoint, absl::GetFlag(FLAGS_hf_config), device);
  if (!loaded.ok()) {
    return Annotate(loaded.status(), checkpoint.empty() ? "--init-from" : "--checkpoint");
  }
  runtime::libtorch::GenerationModel& model = *loaded;
  if (tokenizer.has_value() && tokenizer->vocab_size() > model.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer ", tokenizer_path, " has ", tokenizer->vocab_size(),
        " tokens, more than the model's vocabulary of ", model.vocab));
  }
  // As transformers' generate: the model's end-of-text tokens unless told otherwise.
  options.stop_tokens = stop_tokens.value_or(model.end_tokens);
  auto generated = runtime::libtorch::Generate(model, prompt, options);
  if (!generated.ok()) return generated.status();
  std::cout << "model: " << model.description << " from " << model.source << " on "
            << device.str() << "\n";
  if (!options.stop_tokens.empty()) {
    std::cout << "stops after: " << absl::StrJoin(options.stop_tokens, ",") << " ("
              << (stop_tokens.has_value() ? std::string("--stop-token")
                                          : absl::StrCat(model.end_tokens_source, " eos_token_id"))
              << ")\n";
  }
  if (tokenizer.has_value()) std::cout << "tokenizer: " << tokenizer_path << "\n";
  std::cout << "prompt: " << prompt.size() << " token(s)\n";
  std::cout << "tokens: " << absl::StrJoin(generated->tokens, ",") << "\n";
  if (tokenizer.has_value()) {
    std::vector<int64_t> all = prompt;
    all.insert(all.end(), generated->tokens.begin(), generated->tokens.end());
    std::cout << "text: " << tokenizer->Decode(all, /*skip_special_tokens=*/true) << "\n";
  }
  const double count = static_cast<double>(generated->tokens.size());
  std::cout << absl::StrFormat(
      "generated %d token(s) in %.3f s: %.1f tokens/s (first after %.3f s; %s, %s)\n",
      generated->tokens.size(), generated->seconds,
      generated->seconds > 0 ? count / generated->seconds : 0.0, generated->first_token_seconds,
      options.temperature == 0
          ? std::string("greedy")
          : absl::StrCat("sampled at temperature ", options.temperature,
                         options.top_k > 0 ? absl::StrCat(", top-k ", options.top_k) : "",
                         ", seed ", options.seed),
      options.use_cache ? "key/value cache" : "no cache");
  return absl::OkStatus();
}

int RunGenerate(const std::vector<std::string>& args) {
  if (!args.empty()) {
    return ReportError(kName, absl::InvalidArgumentError(
                                  absl::StrCat("unexpected argument '", args[0], "'")));
  }
  const absl::Status status = Generate();
  return status.ok() ? kExitOk : ReportError(kName, status);
}

}  // namespace

CommandInfo GenerateCommand() {
  return {
    .name = kName,
    .summary = kGenerateSummary,
    .usage =
        "tandem generate --checkpoint DIR | --init-from HF_FOLDER\n"
        "    --prompt-tokens 1,2,3 | --prompt TEXT --tokenizer tokenizer.json\n"
        "    [--max-new-tokens 32] [--temperature 0] [--top-k 0] [--seed S]\n"
        "    [--stop-token IDS|none] [--kv-cache=false] [--device cpu|cuda|cuda:N]\n"
        "    [--hf-config config.json]\n\n"
        "Loads a gpt, gpt2 or llama (mistral, qwen2, gemma, gemma2, mixtral, qwen2_moe, granite,\n"
        "granitemoe, phi3, olmo, olmoe, starcoder2, phi, gpt_neox, stablelm, gptj, cohere, glm,\n"
        "glm4, falcon, nemotron, qwen3, qwen3_moe, olmo2, gemma3_text, gemma3)\n"
        "model whole on one device: a checkpoint `tandem train` wrote (its manifest names the\n"
        "model, and the config.json a llama or gpt2 was trained from, for what the name lacks;\n"
        "--hf-config gives it for older checkpoints) or a Hugging Face folder (config.json and\n"
        "safetensors; its tokenizer.json serves --prompt without --tokenizer).\n"
        "Continues the prompt by --max-new-tokens tokens: greedy at --temperature 0 (the tokens\n"
        "transformers' generate gives), else sampled from the softmax of logits / temperature\n"
        "over the --top-k most likely tokens, seeded with --seed (the same seed, the same\n"
        "tokens); stops after an end-of-text token, as transformers' generate does: the model's\n"
        "(a folder's generation_config.json or config.json eos_token_id) or --stop-token's.\n"
        "The prompt and new tokens must fit the model's positions. --prompt TEXT is encoded as\n"
        "transformers' tokenizer(TEXT) encodes it (a Llama tokenizer's beginning-of-text token\n"
        "first). Prints the new token ids (`tokens: ...`), the whole text without special\n"
        "tokens when there is a tokenizer (a BPE tokenizer.json: GPT-2's, Llama 2's or 3's,\n"
        "Qwen2's, Gemma's, or the one scripts/prepare_data.py writes beside its shards), and\n"
        "tokens/s.\n"
        "Exit 2 for bad input (a missing checkpoint, a token outside the vocabulary, an\n"
        "unsupported tokenizer), with one line on stderr.",
    .flags = {"checkpoint", "init_from", "hf_config", "prompt_tokens", "prompt", "tokenizer",
              "max_new_tokens", "temperature", "top_k", "seed", "stop_token", "kv_cache",
              "device"},
    .run = RunGenerate};
}

}  // namespace tandem::cli
