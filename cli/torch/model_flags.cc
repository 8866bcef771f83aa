#include "cli/torch/model_flags.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

ABSL_FLAG(std::string, model, "gpt", "model: gpt (decoder-only transformer)");
ABSL_FLAG(int, layers, 4, "GPT: transformer blocks (the model has layers + 2 pipeline layers)");
ABSL_FLAG(int, hidden, 64, "GPT: hidden size");
ABSL_FLAG(int, heads, 4, "GPT: attention heads (must divide --hidden)");
ABSL_FLAG(int, seq_len, 32, "GPT: sequence length in tokens");
ABSL_FLAG(int, vocab, 0,
          "GPT: vocabulary size (0: the data's, 16 for the synthetic task, 256 for --data)");
ABSL_FLAG(std::string, data, "",
          "training text file, read as bytes (vocabulary 256); empty: the embedded synthetic "
          "arithmetic-sequence task");
ABSL_FLAG(int, microbatch_size, 1, "samples per micro-batch");
ABSL_FLAG(std::string, optimizer, "adamw", "optimizer: sgd (with momentum) or adamw");
ABSL_FLAG(std::string, device, "cpu", "device: cpu, cuda or cuda:N");
ABSL_FLAG(std::string, attention, "auto",
          "GPT: attention form: fused (scaled_dot_product_attention), explicit (softmax of "
          "QK^T), or auto (fused where LibTorch >= 2.0)");

namespace tandem::cli {

using runtime::libtorch::GptConfig;

constexpr int64_t kSyntheticVocabulary = 16;

const std::vector<std::string>& ModelFlagNames() {
  static const std::vector<std::string> names = {"model", "layers", "hidden",   "heads",
                                                 "seq_len", "vocab", "data", "attention"};
  return names;
}

absl::StatusOr<ModelAndData> ModelAndDataFromFlags(uint64_t data_seed) {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model != "gpt") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model: unknown model '", model, "' (known: gpt)"));
  }
  ModelAndData result;
  GptConfig& gpt = result.gpt;
  gpt.layers = absl::GetFlag(FLAGS_layers);
  gpt.hidden = absl::GetFlag(FLAGS_hidden);
  gpt.heads = absl::GetFlag(FLAGS_heads);
  gpt.seq_len = absl::GetFlag(FLAGS_seq_len);
  auto attention = runtime::libtorch::ParseGptAttention(absl::GetFlag(FLAGS_attention));
  if (!attention.ok()) return Annotate(attention.status(), "--attention");
  gpt.attention = *attention;
  const std::string text = absl::GetFlag(FLAGS_data);
  const int vocab = absl::GetFlag(FLAGS_vocab);
  if (vocab < 0) return absl::InvalidArgumentError(absl::StrCat("--vocab: negative: ", vocab));
  if (!text.empty()) {
    if (vocab != 0 && vocab < runtime::libtorch::kByteVocabulary) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--vocab ", vocab, " is too small for byte data (--data needs at least ",
          runtime::libtorch::kByteVocabulary, ")"));
    }
    gpt.vocab = vocab == 0 ? runtime::libtorch::kByteVocabulary : vocab;
  } else {
    gpt.vocab = vocab == 0 ? kSyntheticVocabulary : vocab;
  }
  if (absl::Status valid = runtime::libtorch::ValidateGptConfig(gpt); !valid.ok()) {
    // "gpt: hidden ..." -> "--hidden ..." style context for the command line.
    return absl::InvalidArgumentError(absl::StrCat("model flags: ", valid.message()));
  }
  if (text.empty()) {
    runtime::libtorch::SyntheticTaskOptions task;
    task.vocab = gpt.vocab;
    task.seq_len = gpt.seq_len;
    task.seed = data_seed;
    TANDEM_ASSIGN_OR_RETURN(result.data, runtime::libtorch::MakeSyntheticDataset(task));
  } else {
    TANDEM_ASSIGN_OR_RETURN(result.data,
                            runtime::libtorch::MakeByteTextDataset(text, gpt.seq_len, data_seed));
  }
  result.spec = runtime::libtorch::GptModelSpec(gpt);
  return result;
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
