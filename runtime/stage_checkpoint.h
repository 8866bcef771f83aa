// Checkpoints of a running pipeline: every stage's parameters and optimizer state, written
// and read by the ranks that hold the stages (runtime/checkpoint.h has the file formats).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "pipeline/plan.h"
#include "runtime/device_ops.h"
#include "runtime/grad_sync.h"
#include "runtime/optimizer.h"
#include "runtime/stage.h"

namespace tandem::runtime {

// One local stage as a checkpoint sees it.
struct CheckpointedStage {
  int stage = 0;
  int first_layer = 0;
  int end_layer = 0;
  comm::Communicator* group = nullptr;  // every copy of the stage: its rank 0 writes the shard
  GradientSync* sync = nullptr;         // parameters current (flushed) before a save
  DeviceOps* ops = nullptr;
  const std::vector<ParameterView>* parameters = nullptr;  // on the stage's device
};

// What every rank's checkpoint calls share.
struct CheckpointScope {
  comm::Communicator* control = nullptr;  // the world (rank 0 writes the manifest)
  const pipeline::Plan* plan = nullptr;
  int num_stages = 0;
  OptimizerConfig optimizer;
};

// Writes every stage into `dir` (created if needed) at `step`: shards by the lowest rank of
// each stage's group, then the manifest by rank 0. Collective over scope.control and, for
// DeAR's sharded state, over each stage's group.
absl::Status SaveStages(const std::string& dir, const std::string& model, int64_t step,
                        const CheckpointScope& scope,
                        const std::vector<CheckpointedStage>& stages);

// Saves step `step` as a new step folder of the checkpoint root `root` (runtime/checkpoint.h:
// a partial folder first, published with `latest` switched last), keeping the newest `keep`
// step folders (<= 0: all). Leftovers of interrupted saves are removed first. Collective.
absl::Status SaveCheckpointStep(const std::string& root, const std::string& model, int64_t step,
                                int keep, const CheckpointScope& scope,
                                const std::vector<CheckpointedStage>& stages);

// Loads parameters and optimizer state of every stage from `dir` (a step folder: see
// ResolveCheckpoint for a root); returns the step saved. The
// manifest's model, stage layer ranges and optimizer must match. Collective; an error on any
// rank fails every rank.
absl::StatusOr<int64_t> LoadStages(const std::string& dir, const std::string& model,
                                   const CheckpointScope& scope,
                                   const std::vector<CheckpointedStage>& stages);

}  // namespace tandem::runtime
