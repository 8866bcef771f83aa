// Model, data and device flags shared by the LibTorch commands (`tandem profile`,
// `tandem train`): each is defined once, in model_flags.cc. A command lists ModelFlagNames()
// (cli/torch/model_registry.h: --model and every registered model's flags) and any of the
// others it uses in its CommandInfo::flags.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "cli/cpu_binding.h"
#include "runtime/torch/data.h"
#include "runtime/torch/model.h"
#include "runtime/torch/token_data.h"

ABSL_DECLARE_FLAG(std::string, model);     // a registered model: "gpt", ...
ABSL_DECLARE_FLAG(int, layers);            // transformer blocks
ABSL_DECLARE_FLAG(int, hidden);
ABSL_DECLARE_FLAG(int, heads);
ABSL_DECLARE_FLAG(int, seq_len);
ABSL_DECLARE_FLAG(int, vocab);             // 0: the data's (16 synthetic, 256 bytes)
ABSL_DECLARE_FLAG(std::string, data);      // "" (synthetic task), token shards or a text file
ABSL_DECLARE_FLAG(std::string, data_format);  // auto, llmc, nanogpt, megatron, text
ABSL_DECLARE_FLAG(std::string, valid_data);   // validation data ("": --data's split)
ABSL_DECLARE_FLAG(int, microbatch_size);   // samples per micro-batch (profile)
ABSL_DECLARE_FLAG(std::string, optimizer); // "sgd" or "adamw"
ABSL_DECLARE_FLAG(std::string, device);    // "cpu", "cuda", "cuda:N"
ABSL_DECLARE_FLAG(std::string, attention); // "auto", "explicit", "fused"

namespace tandem::cli {

// --data and --data-format as token shards (their sources resolved: a folder
// scripts/prepare_data.py wrote gives its training shards; sizes and seed left for the model),
// or nothing when --data is empty or a text file.
absl::StatusOr<std::optional<runtime::libtorch::TokenShardOptions>> TokenShardsFromFlags();

// The vocabulary of a model on the data the flags name: `fixed` (a config file's) when
// non-zero, which --vocab may only repeat and the data must fit in; else --vocab, else the
// data's (the dataset.json of token shards, 256 for a text file, 16 for the synthetic task).
absl::StatusOr<int64_t> VocabularyFromFlags(int64_t fixed);

// The data set the flags name for a model of `vocab` tokens and `seq_len` tokens a sample:
// token shards, a text file's bytes or the synthetic task, seeded with `seed`.
absl::StatusOr<std::shared_ptr<runtime::libtorch::Dataset>> DataFromFlags(int64_t vocab,
                                                                          int64_t seq_len,
                                                                          uint64_t seed);

// The validation data the flags name for `train --eval-every` (cli/torch/train_options.h):
// --valid-data (token shards, a prepared folder's validation split, or a text file), else the
// validation split of the folder --data names, else held-out samples of the synthetic task;
// null when there is none, or neither --valid-data nor --eval-every is given.
absl::StatusOr<std::shared_ptr<runtime::libtorch::Dataset>> ValidationDataFromFlags(
    int64_t vocab, int64_t seq_len, uint64_t seed);

// Registers the models `tandem-torch` has built in (gpt, llama, gpt2;
// cli/torch/model_registry.h), once; later calls do nothing.
void RegisterBuiltInModels();

// --device as a LibTorch device. FailedPrecondition when CUDA is asked for but absent.
absl::StatusOr<torch::Device> DeviceFromFlags();

// Sets LibTorch's CPU threads for this rank when OMP_NUM_THREADS does not: the host's cores
// shared by the job's ranks on it (one each at the least), so that ranks on one host do not
// oversubscribe it, and no more than the cores this rank is bound to. Returns how many, and
// where that came from, for the start-up line (with a hint when the binding left cores idle).
std::string SetHostThreads();

}  // namespace tandem::cli
