#include "cli/torch/model_flags.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <cstdlib>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/torch/hf_models.h"
#include "cli/torch/model_registry.h"
#include "common/status.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/token_data.h"

ABSL_FLAG(std::string, model, "gpt",
          "model: gpt (decoder-only transformer), or one the program registered");
ABSL_FLAG(int, layers, 4, "GPT: transformer blocks (the model has layers + 2 pipeline layers)");
ABSL_FLAG(int, hidden, 64, "GPT: hidden size");
ABSL_FLAG(int, heads, 4, "GPT: attention heads (must divide --hidden)");
ABSL_FLAG(int, seq_len, 32, "GPT: sequence length in tokens");
ABSL_FLAG(int, vocab, 0,
          "GPT: vocabulary size (0: the data's, 16 for the synthetic task, 256 for --data)");
ABSL_FLAG(std::string, data, "",
          "training data: token shards (llm.c, nanoGPT or Megatron-LM .bin files, a folder of "
          "them or a glob; several separated by commas; scripts/prepare_data.py writes them), "
          "or a text file read as bytes (vocabulary 256); empty: the embedded synthetic "
          "arithmetic-sequence task");
ABSL_FLAG(std::string, data_format, "auto",
          "--data's format: auto (a folder, a glob or a .bin file is token shards of the format "
          "their headers say, anything else text), llmc, nanogpt, megatron, or text");
ABSL_FLAG(std::string, valid_data, "",
          "validation data for `train --eval-every`: token shards (as --data; a folder "
          "scripts/prepare_data.py wrote gives its validation split) or a text file; empty: "
          "the validation split of such a --data folder, or held-out samples of the synthetic "
          "task");
ABSL_DECLARE_FLAG(int, eval_every);  // cli/torch/train_options.cc
ABSL_DECLARE_FLAG(int, expert_parallel);           // cli/torch/train_options.cc
ABSL_DECLARE_FLAG(int, expert_parallel_replicas);  // cli/torch/train_options.cc
ABSL_FLAG(int, microbatch_size, 1, "samples per micro-batch");
ABSL_FLAG(std::string, optimizer, "adamw", "optimizer: sgd (with momentum) or adamw");
ABSL_FLAG(std::string, device, "cpu", "device: cpu, cuda or cuda:N");
ABSL_FLAG(std::string, attention, "auto",
          "GPT: attention form: fused (scaled_dot_product_attention), explicit (softmax of "
          "QK^T), or auto (fused where LibTorch >= 2.0)");

namespace tandem::cli {

using runtime::libtorch::GptConfig;

constexpr int64_t kSyntheticVocabulary = 16;

absl::StatusOr<std::optional<runtime::libtorch::TokenShardOptions>> TokenShardsFromFlags() {
  const std::string data = absl::GetFlag(FLAGS_data);
  const std::string format = absl::GetFlag(FLAGS_data_format);
  if (data.empty() || format == "text") return std::nullopt;
  runtime::libtorch::TokenShardOptions options;
  std::vector<std::string> sources = absl::StrSplit(data, ',', absl::SkipEmpty());
  if (format == "auto") {
    bool shards = false;
    for (const std::string& source : sources) {
      shards = shards || runtime::libtorch::LooksLikeTokenShards(source);
    }
    if (!shards) return std::nullopt;
  } else {
    auto parsed = data::ParseTokenFileFormat(format);
    if (!parsed.ok() || *parsed == data::TokenFileFormat::kAuto) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data-format: '", format, "' is not auto, llmc, nanogpt, megatron or text"));
    }
    options.format = *parsed;
  }
  // A folder scripts/prepare_data.py wrote: its training shards.
  TANDEM_ASSIGN_OR_RETURN(options.sources,
                          runtime::libtorch::PreparedSplitShards(sources, "train"));
  return options;
}

absl::StatusOr<int64_t> VocabularyFromFlags(int64_t fixed) {
  const int64_t flag = absl::GetFlag(FLAGS_vocab);
  if (flag < 0) return absl::InvalidArgumentError(absl::StrCat("--vocab: negative: ", flag));
  if (fixed > 0 && flag != 0 && flag != fixed) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab ", flag, " differs from --hf-config's "
                                                   "vocab_size ", fixed, " (leave it at 0)"));
  }
  const int64_t asked = fixed > 0 ? fixed : flag;
  TANDEM_ASSIGN_OR_RETURN(std::optional<runtime::libtorch::TokenShardOptions> shards,
                          TokenShardsFromFlags());
  if (shards.has_value()) {
    if (asked > 0) return asked;  // every token is checked against it when the shards open
    TANDEM_ASSIGN_OR_RETURN(const int64_t recorded,
                            runtime::libtorch::RecordedVocabularySize(shards->sources));
    if (recorded == 0) {
      return absl::InvalidArgumentError(
          "--vocab: token shards without a dataset.json beside them (scripts/prepare_data.py "
          "writes one) need the vocabulary size");
    }
    return recorded;
  }
  if (!absl::GetFlag(FLAGS_data).empty()) {
    if (asked != 0 && asked < runtime::libtorch::kByteVocabulary) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--vocab ", asked, " is too small for byte data (--data needs at least ",
          runtime::libtorch::kByteVocabulary, ")"));
    }
    return asked == 0 ? runtime::libtorch::kByteVocabulary : asked;
  }
  return asked == 0 ? kSyntheticVocabulary : asked;
}

absl::StatusOr<std::shared_ptr<runtime::libtorch::Dataset>> DataFromFlags(int64_t vocab,
                                                                          int64_t seq_len,
                                                                          uint64_t seed) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<runtime::libtorch::TokenShardOptions> shards,
                          TokenShardsFromFlags());
  if (shards.has_value()) {
    shards->seq_len = seq_len;
    shards->vocab = vocab;
    shards->seed = seed;
    return runtime::libtorch::MakeTokenShardDataset(*shards);
  }
  const std::string text = absl::GetFlag(FLAGS_data);
  if (!text.empty()) return runtime::libtorch::MakeByteTextDataset(text, seq_len, seed);
  runtime::libtorch::SyntheticTaskOptions task;
  task.vocab = vocab;
  task.seq_len = seq_len;
  task.seed = seed;
  return runtime::libtorch::MakeSyntheticDataset(task);
}

absl::StatusOr<std::shared_ptr<runtime::libtorch::Dataset>> ValidationDataFromFlags(
    int64_t vocab, int64_t seq_len, uint64_t seed) {
  const std::string valid = absl::GetFlag(FLAGS_valid_data);
  if (valid.empty() && absl::GetFlag(FLAGS_eval_every) == 0) return nullptr;
  // Other samples than training draws (the seed only orders the shards' windows).
  const uint64_t valid_seed = runtime::libtorch::MixSeed(seed, 0x76616c6964, 0);
  std::vector<std::string> sources;
  data::TokenFileFormat format = data::TokenFileFormat::kAuto;
  if (!valid.empty()) {
    const std::string format_flag = absl::GetFlag(FLAGS_data_format);
    std::vector<std::string> given = absl::StrSplit(valid, ',', absl::SkipEmpty());
    bool shards = false;
    for (const std::string& source : given) {
      shards = shards || runtime::libtorch::LooksLikeTokenShards(source);
    }
    if (format_flag != "auto" && format_flag != "text") {
      TANDEM_ASSIGN_OR_RETURN(format, data::ParseTokenFileFormat(format_flag));
      shards = true;
    }
    if (!shards || format_flag == "text") {
      auto text = runtime::libtorch::MakeByteTextDataset(valid, seq_len, valid_seed);
      if (!text.ok()) return Annotate(text.status(), "--valid-data");
      return text;
    }
    auto split = runtime::libtorch::PreparedSplitShards(given, "valid");
    if (!split.ok()) return Annotate(split.status(), "--valid-data");
    sources = *std::move(split);
  } else {
    TANDEM_ASSIGN_OR_RETURN(std::optional<runtime::libtorch::TokenShardOptions> training,
                            TokenShardsFromFlags());
    if (!training.has_value()) {
      if (!absl::GetFlag(FLAGS_data).empty()) return nullptr;  // a text file: none held out
      runtime::libtorch::SyntheticTaskOptions task;
      task.vocab = vocab;
      task.seq_len = seq_len;
      task.seed = valid_seed;
      return runtime::libtorch::MakeSyntheticDataset(task);
    }
    // The validation split of the folders --data names, if scripts/prepare_data.py wrote one.
    std::vector<std::string> given = absl::StrSplit(absl::GetFlag(FLAGS_data), ',',
                                                    absl::SkipEmpty());
    auto split = runtime::libtorch::PreparedSplitShards(given, "valid");
    if (!split.ok() || *split == given) return nullptr;
    sources = *std::move(split);
    format = training->format;
  }
  runtime::libtorch::TokenShardOptions options;
  options.sources = std::move(sources);
  options.format = format;
  options.seq_len = seq_len;
  options.vocab = vocab;
  options.seed = valid_seed;
  auto made = runtime::libtorch::MakeTokenShardDataset(options);
  if (!made.ok()) return Annotate(made.status(), "validation data");
  return made;
}

namespace {

absl::StatusOr<ModelAndData> MakeGpt(const ModelRequest& request) {
  const uint64_t data_seed = request.seed;
  ModelAndData result;
  GptConfig gpt;
  gpt.layers = absl::GetFlag(FLAGS_layers);
  gpt.hidden = absl::GetFlag(FLAGS_hidden);
  gpt.heads = absl::GetFlag(FLAGS_heads);
  gpt.seq_len = absl::GetFlag(FLAGS_seq_len);
  if (absl::GetFlag(FLAGS_expert_parallel) != 1 ||
      absl::GetFlag(FLAGS_expert_parallel_replicas) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(absl::GetFlag(FLAGS_expert_parallel) != 1
                                                       ? "--expert-parallel places"
                                                       : "--expert-parallel-replicas spreads",
                                                   " experts: gpt has none"));
  }
  auto attention = runtime::libtorch::ParseGptAttention(absl::GetFlag(FLAGS_attention));
  if (!attention.ok()) return Annotate(attention.status(), "--attention");
  gpt.attention = *attention;
  TANDEM_ASSIGN_OR_RETURN(gpt.vocab, VocabularyFromFlags(/*fixed=*/0));
  if (absl::Status valid = runtime::libtorch::ValidateGptConfig(gpt); !valid.ok()) {
    // "gpt: hidden ..." -> "--hidden ..." style context for the command line.
    return absl::InvalidArgumentError(absl::StrCat("model flags: ", valid.message()));
  }
  TANDEM_ASSIGN_OR_RETURN(result.data, DataFromFlags(gpt.vocab, gpt.seq_len, data_seed));
  TANDEM_ASSIGN_OR_RETURN(result.validation,
                          ValidationDataFromFlags(gpt.vocab, gpt.seq_len, data_seed));
  result.spec = runtime::libtorch::GptModelSpec(gpt);
  result.description = runtime::libtorch::DescribeGpt(gpt);
  result.tokens_per_sample = gpt.seq_len;
  result.training_flops_per_token = runtime::libtorch::GptTrainingFlopsPerToken(gpt);
  // float32: 8 tensors of [b, s, h] and two of the attention scores per block, three of the
  // logits on the last stage.
  result.minimum_activation_bytes = [gpt](int64_t microbatch_size, int layers, bool last) {
    const double b = static_cast<double>(microbatch_size);
    const double s = static_cast<double>(gpt.seq_len);
    const double per_layer = 4 * b * s * (8.0 * gpt.hidden + 2.0 * gpt.heads * s);
    const double logits = 4 * 3 * b * s * gpt.vocab;
    return per_layer * layers + (last ? logits : 0);
  };
  return result;
}

}  // namespace

void RegisterBuiltInModels() {
  static const bool registered = [] {
    absl::Status status = RegisterModel(
        {.name = "gpt",
         .summary = "decoder-only transformer (learned positions, pre-norm blocks)",
         .flags = {"layers", "hidden", "heads", "seq_len", "vocab", "data", "data_format",
                   "valid_data", "attention"},
         .make = MakeGpt});
    RegisterHuggingFaceModels();
    return status.ok();
  }();
  (void)registered;
}

absl::StatusOr<torch::Device> DeviceFromFlags() {
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cpu") return torch::Device(torch::kCPU);
  int index = 0;
  if (device != "cuda" &&
      !(absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &index) &&
        index >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", device, "' is not cpu, cuda or cuda:N"));
  }
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", device, ": no CUDA device is available to this LibTorch"));
  }
  if (index >= static_cast<int>(torch::cuda::device_count())) {
    return absl::InvalidArgumentError(absl::StrCat("--device ", device, ": only ",
                                                   torch::cuda::device_count(),
                                                   " CUDA device(s)"));
  }
  return torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(index));
}

std::string SetHostThreads() {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int ranks = LocalRanks();
  const int share = std::max(1, cores / ranks);
  // `tandem` widened Open MPI's default binding before it started this program (then LibTorch's
  // OpenMP and BLAS saw the wide mask at start-up); this program started directly does it here.
  int widened_from = 0;
  if (const char* text = std::getenv(kWidenedBindingVariable)) {
    if (!absl::SimpleAtoi(text, &widened_from)) widened_from = 0;
  } else {
    widened_from = WidenDefaultMpiBinding();
  }
  const int usable = UsableCores();
  std::string widened;
  if (widened_from > 0) {
    widened = absl::StrCat("; Open MPI's default binding (", widened_from,
                           " core per rank) widened to this rank's share (mpirun --bind-to "
                           "keeps a binding)");
  }
  const char* set = std::getenv("OMP_NUM_THREADS");
  if (set != nullptr && *set != '\0') {
    const int threads = torch::get_num_threads();
    std::string line =
        absl::StrFormat("%d CPU thread(s) per rank (OMP_NUM_THREADS)%s", threads, widened);
    if (threads > usable) {
      absl::StrAppend(&line, "; more than the ", usable,
                      " core(s) this rank may run on (mpirun's binding: see --bind-to)");
    }
    return line;
  }
  // Never more threads than the cores the rank may run on.
  const int threads = std::min(share, usable);
  torch::set_num_threads(threads);
  std::string line = absl::StrFormat(
      "%d CPU thread(s) per rank (%d cores, %d rank(s) on this host; OMP_NUM_THREADS sets it)%s",
      threads, cores, ranks, widened);
  if (usable < share) {
    absl::StrAppend(&line, "; mpirun bound this rank to ", usable, " core(s) of its share of ",
                    share, ": launch with `mpirun --bind-to none` (or `--map-by slot:PE=",
                    share, "`) to use them");
  }
  return line;
}

}  // namespace tandem::cli
