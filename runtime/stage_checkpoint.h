// Checkpoints of a running pipeline: every stage's parameters and optimizer state, written
// and read by the ranks that hold the stages (runtime/checkpoint.h has the file formats).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "pipeline/plan.h"
#include "runtime/checkpoint.h"
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
  // Loading: start the optimizer afresh instead of requiring its saved state.
  bool reset_optimizer = false;
  // Saving: the manifest's record of the run (CheckpointManifest::run).
  nlohmann::json run = nlohmann::json::object();
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

// One parameter's full training state on the host: value and optimizer state.
struct ParameterState {
  std::string name;
  std::vector<float> value;
  ParameterOptimizerState optimizer;
  // The parameter's dimensions (whole, as ParameterView::shape); empty: unknown. A checkpoint
  // records it with the values (runtime/checkpoint.h).
  std::vector<int64_t> shape;
};

struct CheckpointState {
  int64_t step = 0;  // iterations completed: training resumes at this one
  std::map<std::string, ParameterState> parameters;  // by name
};

// Every parameter (value and optimizer state) of the checkpoint's saved stages that overlap
// layers [first_layer, end_layer) of the step folder `dir`, whatever partition saved it. The
// manifest's model, layer count and optimizer must match (InvalidArgument otherwise). A
// parameter the optimizer has stepped must bring the state the optimizer keeps (AdamW's two
// moments, SGD's momentum buffer when momentum > 0): without it InvalidArgument names the
// tensors, unless `reset_optimizer`, which drops all saved optimizer state (the optimizer
// starts afresh from the saved parameters). Local.
absl::StatusOr<CheckpointState> ReadCheckpointState(const std::string& dir,
                                                    const std::string& model, int num_layers,
                                                    const OptimizerConfig& optimizer,
                                                    int first_layer, int end_layer,
                                                    bool reset_optimizer = false);

// A tensor-parallel shard of a whole parameter's state: element i is whole element index[i]
// (values and the optimizer buffers of the parameter's size).
ParameterState CutShard(const ParameterState& whole, const std::vector<int64_t>& index);

// A shard of `parameters` (values, optimizer buffers, step counts) for `stage`, which holds
// layers [first_layer, end_layer). Every tensor gets a shape: the parameter's (an optimizer
// buffer of the parameter's size shares it), or [count] where the parameter's is unknown.
CheckpointShard ShardOf(int stage, int first_layer, int end_layer,
                        const std::vector<ParameterState>& parameters);
// Writes this rank's `shards` into `dir`, then rank 0 of scope.control writes the manifest over
// every rank's shards (scope.num_stages of them in all, one per stage of scope.plan).
// Collective over scope.control.
absl::Status SaveShards(const std::string& dir, const std::string& model, int64_t step,
                        const CheckpointScope& scope, const std::vector<CheckpointShard>& shards);
// SaveCheckpointStep for shards the caller built (e.g. the elastic layer's, by layer run).
absl::Status SaveShardsStep(const std::string& root, const std::string& model, int64_t step,
                            int keep, const CheckpointScope& scope,
                            const std::vector<CheckpointShard>& shards);

// Loads parameters and optimizer state of every stage from `dir` (a step folder: see
// ResolveCheckpoint for a root); returns the step saved. The manifest's model, layer count
// and optimizer must match, and every parameter's recorded shape its stage's
// (ShapesCompatible: a flat or missing record passes on the element count); its stages may split the layers differently (another world size or
// plan): each stage reads its parameters by name from the saved stages overlapping its layers. Collective; an error on any
// rank fails every rank.
absl::StatusOr<int64_t> LoadStages(const std::string& dir, const std::string& model,
                                   const CheckpointScope& scope,
                                   const std::vector<CheckpointedStage>& stages);

}  // namespace tandem::runtime
