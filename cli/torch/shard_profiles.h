// Measured tensor-parallel shards: a model's layers profiled split over the first T ranks of
// the world (their collectives timed with them), and those measurements as the layers'
// tensor-parallel variants of a profile (pipeline/profile.h), which the planner weighs against
// pipelines and replicas. `tandem train` measures them for a planned run (--tensor-parallel 0,
// or --expert-parallel 0 with a given degree); `tandem profile --tensor-parallel` writes them
// into the profile file.
#ifndef TANDEM_CLI_TORCH_SHARD_PROFILES_H_
#define TANDEM_CLI_TORCH_SHARD_PROFILES_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "pipeline/profile.h"
#include "runtime/torch/profiler.h"

namespace tandem::cli {

// A measured shard profile: the model split over `degree` ranks, with or without sequence
// parallelism, a mixture's experts on `expert_parallel` parts of the group.
struct ShardProfile {
  int degree = 2;
  bool sequence_parallel = false;
  int expert_parallel = 1;
  pipeline::Profile profile;
};

// How a shard profile is named in the lines a command prints: "tensor parallelism 2 with
// sequence parallelism (experts on 2 parts)".
std::string ShardName(int degree, bool sequence_parallel, int expert_parallel);

// The numbers of parts a group of `degree` ranks places the experts on, as --expert-parallel
// asks: 0, every divisor of the degree (a model whose experts do not divide leaves those out);
// N, N where it divides the degree.
std::vector<int> ExpertPartsToMeasure(int expert_parallel, int degree);

// What to measure: the degrees (those that do not divide the world are skipped), without
// and/or with sequence parallelism, the experts' parts as --expert-parallel gives them.
struct ShardMeasurements {
  std::vector<int> degrees;
  std::vector<bool> sequence_parallel = {false};
  int expert_parallel = 1;
};

// Profiles the model's shards, each degree T by the first T ranks together, with `base`'s
// micro-batch, repeats, device and optimizer. A variant the model cannot split into (heads,
// vocabulary, a sequence for sequence parallelism, experts) is left out with a line naming
// why. Collective over `world` (every rank calls it); rank 0 gets the shard profiles, the
// others an empty list. Progress lines go to `out` on rank 0.
absl::StatusOr<std::vector<ShardProfile>> ProfileShards(
    comm::Communicator& world, const runtime::libtorch::ProfilerOptions& base,
    const runtime::libtorch::LayeredModel& model, const runtime::libtorch::Dataset& data,
    const ShardMeasurements& measure, std::ostream& out);

// Adds each shard's layers to `profile`'s layers as their tensor-parallel variants (times
// include the collectives) and prints one line per shard to `out`: its time and stashed bytes
// against the whole model's. InternalError where a shard has another number of layers.
absl::Status AddShardVariants(const std::vector<ShardProfile>& shards, pipeline::Profile* profile,
                              std::ostream& out);

}  // namespace tandem::cli

#endif  // TANDEM_CLI_TORCH_SHARD_PROFILES_H_
