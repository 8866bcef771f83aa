// Helpers of the tests that run `tandem train` as a user does: a command with its output and
// exit status, the JSON log it writes, and the single-process reference losses of the small
// GPT those tests train (test-only; header-only, for torch-linked tests).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/torch/data.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/reference.h"
#include "tests/support/command.h"

namespace tandem::testing {

// One JSON object per line.
inline std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  auto text = tandem::ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return lines;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// The iterations of a --log-json file: its lines without "event" (checkpoints, validation,
// an elastic job's re-formations).
inline std::vector<nlohmann::json> ReadLogIterations(const std::string& path) {
  std::vector<nlohmann::json> iterations;
  for (nlohmann::json& line : ReadJsonLines(path)) {
    if (!line.contains("event")) iterations.push_back(std::move(line));
  }
  return iterations;
}

// The model the train tests pass as flags:
//   --model gpt --layers 2 --hidden 16 --heads 2 --seq-len 8 --optimizer adamw --lr 3e-3
//   --warmup-steps 2 --weight-decay 0.01
inline constexpr char kSmallGptFlags[] =
    " --model gpt --layers 2 --hidden 16 --heads 2 --seq-len 8 --optimizer adamw --lr 3e-3"
    " --warmup-steps 2 --weight-decay 0.01";

// The reference trainer's options for the optimizer and schedule of kSmallGptFlags.
inline tandem::runtime::libtorch::ReferenceOptions SmallModelReferenceOptions(
    int steps, int64_t global_batch) {
  namespace libtorch = tandem::runtime::libtorch;
  libtorch::ReferenceOptions options;
  options.global_batch = global_batch;
  options.steps = steps;
  options.optimizer.kind = libtorch::OptimizerKind::kAdamW;
  options.optimizer.weight_decay = 0.01;
  options.lr.base_lr = 3e-3;
  options.lr.warmup_steps = 2;
  return options;
}

// Its losses, trained by the single-process reference trainer.
// (`heads`: the same model with another head count, --heads.)
inline std::vector<double> SmallGptReferenceLosses(int steps, int64_t global_batch,
                                                   uint64_t seed, int64_t heads = 2) {
  namespace libtorch = tandem::runtime::libtorch;
  libtorch::GptConfig gpt;
  gpt.vocab = 16;
  gpt.layers = 2;
  gpt.hidden = 16;
  gpt.heads = heads;
  gpt.seq_len = 8;
  auto model = libtorch::GptModelSpec(gpt).Build(seed);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  libtorch::SyntheticTaskOptions task;
  task.vocab = gpt.vocab;
  task.seq_len = gpt.seq_len;
  task.seed = seed;
  auto data = libtorch::MakeSyntheticDataset(task);
  EXPECT_TRUE(data.ok());
  if (!data.ok()) return {};
  auto result =
      libtorch::TrainReference(*model, **data, SmallModelReferenceOptions(steps, global_batch));
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->losses : std::vector<double>();
}

}  // namespace tandem::testing
