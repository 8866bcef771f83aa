// Model, data and device flags shared by the LibTorch commands (`tandem profile`,
// `tandem train`): each is defined once, in model_flags.cc. A command lists kModelFlagNames
// (and any of the others it uses) in its CommandInfo::flags.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "cli/cpu_binding.h"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/model.h"

ABSL_DECLARE_FLAG(std::string, model);     // "gpt"
ABSL_DECLARE_FLAG(int, layers);            // transformer blocks
ABSL_DECLARE_FLAG(int, hidden);
ABSL_DECLARE_FLAG(int, heads);
ABSL_DECLARE_FLAG(int, seq_len);
ABSL_DECLARE_FLAG(int, vocab);             // 0: the data's (16 synthetic, 256 bytes)
ABSL_DECLARE_FLAG(std::string, data);      // "" (synthetic task) or a text file (bytes)
ABSL_DECLARE_FLAG(int, microbatch_size);   // samples per micro-batch (profile)
ABSL_DECLARE_FLAG(std::string, optimizer); // "sgd" or "adamw"
ABSL_DECLARE_FLAG(std::string, device);    // "cpu", "cuda", "cuda:N"
ABSL_DECLARE_FLAG(std::string, attention); // "auto", "explicit", "fused"

namespace tandem::cli {

// The model-describing flags: --model --layers --hidden --heads --seq-len --vocab --data.
const std::vector<std::string>& ModelFlagNames();

// A model and its data set as the flags describe them. The synthetic task uses `data_seed`.
struct ModelAndData {
  runtime::libtorch::ModelSpec spec;
  std::shared_ptr<runtime::libtorch::Dataset> data;
  runtime::libtorch::GptConfig gpt;  // when --model gpt
};

// InvalidArgument naming the flag for an unknown model or bad sizes; NotFound for a missing
// --data file.
absl::StatusOr<ModelAndData> ModelAndDataFromFlags(uint64_t data_seed);

// --device as a LibTorch device. FailedPrecondition when CUDA is asked for but absent.
absl::StatusOr<torch::Device> DeviceFromFlags();

// Sets LibTorch's CPU threads for this rank when OMP_NUM_THREADS does not: the host's cores
// shared by the job's ranks on it (one each at the least), so that ranks on one host do not
// oversubscribe it, and no more than the cores this rank is bound to. Returns how many, and
// where that came from, for the start-up line (with a hint when the binding left cores idle).
std::string SetHostThreads();

}  // namespace tandem::cli
