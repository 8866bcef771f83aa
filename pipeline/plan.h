// The plan (plan.json): the seam between the planner, which writes it, and the runtime and
// elastic layer, which read and rewrite it. The runtime never needs the planner's algorithms to
// run a plan.
//
// Ranks form a mesh: `mesh[d][q]` is the global rank at data-parallel replica d and pipeline
// position q (0 <= q < pipeline_parallel). The schedule's placement maps (pipeline replica,
// stage) to a pipeline position, so the rank running stage s of Chimera replica r in
// data-parallel replica d is mesh[d][placement.RankOf(r, s)]. Each stage lists the layers it
// runs ([first_layer, end_layer)) and the ranks that hold a copy of it.
//
// With tensor parallelism of degree t, mesh[d][q] is the first of t consecutive ranks that
// share that pipeline position (world_size = D * p * t).
//
// A plan with an empty mesh is non-uniform: each stage has its own replication (PipeDream) or
// data/tensor-parallel degrees (Piper), listed in its `ranks` (disjoint, together
// [0, world_size)). Such plans describe what a planner predicts; the runtime may reject them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "pipeline/schedule.h"

namespace tandem::pipeline {

struct PlanStage {
  int first_layer = 0;  // [first_layer, end_layer) of the model's ordered layer list
  int end_layer = 0;
  std::vector<int> ranks;           // every rank holding this stage (all replicas)
  int tensor_parallel = 1;          // tensor-parallel degree inside the stage
  std::vector<int> recompute_layers;  // layers whose activations are recomputed in backward
  double predicted_compute_seconds = 0;  // forward+backward of one micro-batch
  double predicted_memory_bytes = 0;     // peak per rank for this stage

  bool operator==(const PlanStage& o) const;
};

struct Plan {
  int format_version = 1;
  std::string model;   // free-form model description ("gpt L=4 H=64 ...")
  int num_layers = 0;  // layers in the model's ordered list
  int world_size = 1;
  int data_parallel = 1;      // D pipelines
  int pipeline_parallel = 1;  // p ranks per pipeline (== schedule.num_ranks)
  int tensor_parallel = 1;
  // Megatron-LM's sequence parallelism inside the tensor-parallel groups (the runtime's
  // --sequence-parallel): chosen by the planner when the profile's variants say they run with
  // it. Needs tensor_parallel >= 2 (or a stage with it).
  bool sequence_parallel = false;
  // Expert parallelism inside the tensor-parallel groups (the runtime's --expert-parallel N):
  // a mixture of experts places its experts whole on N parts of each group. Chosen by the
  // planner from the profile's variants; 1 (every expert split over the group) when absent.
  // Divides every stage's tensor-parallel degree.
  int expert_parallel = 1;
  ScheduleSpec schedule;
  int64_t microbatch_size = 1;  // samples per micro-batch
  std::vector<std::vector<int>> mesh;  // mesh[d][q] = global rank
  std::vector<PlanStage> stages;       // one per pipeline stage (schedule.NumStages())
  // The order of the model's layers that stage ranges (and recompute_layers) index: stage s
  // runs layers layer_order[first_layer], ..., layer_order[end_layer - 1]. Empty means the
  // model's own order, as for every chain model. Only a model whose layers may run in another
  // topological order (a branching model planned by PipeDream, whose stages are contiguous in
  // some such order but not always in the profile's) has one. A reader that runs layers in the
  // model's order can run only plans without one (or with the identity).
  std::vector<int> layer_order;

  // Predictions of the planner.
  double predicted_iteration_seconds = 0;
  std::vector<double> predicted_peak_memory_bytes;  // per global rank
  double bottleneck_seconds = 0;  // PipeDream: slowest stage's time per stage
  double time_per_sample = 0;     // Piper: maximum load per sample

  // Provenance: which algorithm and inputs produced this plan.
  std::string algorithm;
  nlohmann::json inputs = nlohmann::json::object();

  // Whether the ranks form a D x p mesh (see above); false for per-stage replication.
  bool IsUniform() const { return !mesh.empty(); }
  // The model layer at `position` of the plan's layer order.
  int LayerAt(int position) const {
    return layer_order.empty() ? position : layer_order[position];
  }
  int64_t GlobalBatchSize() const {
    return microbatch_size * schedule.num_microbatches * data_parallel;
  }
  // Global rank running (pipeline replica r, stage s) in data-parallel replica d.
  int RankOf(int data_parallel_index, int replica, int stage) const;
  bool operator==(const Plan& o) const;
};

// A plain pipeline plan: D x p ranks (rank = d * p + q), layers split as evenly as possible.
// Useful for tests and for `tandem train --schedule` without the planner.
absl::StatusOr<Plan> MakeUniformPlan(int num_layers, const ScheduleSpec& schedule,
                                     int data_parallel, int64_t microbatch_size);

// The same mesh with the layers split by cost: each pipeline position's load (the costs of
// the stages it holds, a replica's stages weighted by its share of the micro-batches) as even
// as whole layers allow. What matters where one position holds several stages: the wave
// placement of ZB-V and Hanayo gives position 0 both the first and the last stage, Chimera's
// gives it the first stage of one replica and the last of the other. All costs zero: the even
// split. InvalidArgument for a negative or non-finite cost, or what MakeUniformPlan refuses.
absl::StatusOr<Plan> MakeBalancedPlan(const std::vector<double>& layer_costs,
                                      const ScheduleSpec& schedule, int data_parallel,
                                      int64_t microbatch_size);

// The same plan with tensor parallelism of degree `tensor_parallel` inside every stage: each
// position of the mesh becomes `tensor_parallel` consecutive ranks (mesh[d][q] is the first),
// so world_size grows by that factor. InvalidArgument for a degree below 1 or a plan without
// a mesh.
absl::StatusOr<Plan> WithTensorParallel(Plan plan, int tensor_parallel);

// Structural checks: mesh is a permutation of [0, world_size), stages cover [0, num_layers)
// contiguously in order, layer_order (if any) is a permutation of [0, num_layers), counts
// agree with the schedule. `expected_world_size` and
// `expected_num_layers` (-1 to skip) are what the caller runs with; a mismatch names both.
absl::Status ValidatePlan(const Plan& plan, int expected_world_size = -1,
                          int expected_num_layers = -1);

// The placement of (replica, stage) onto pipeline positions that a schedule kind uses: linear
// (GPipe, 1F1B, ZB-H1), looped (interleaved), bidirectional (Chimera) or wave (Hanayo, ZB-V).
Placement PlacementFor(const ScheduleSpec& schedule);

nlohmann::json ToJson(const Plan& plan);
absl::StatusOr<Plan> PlanFromJson(const nlohmann::json& j, absl::string_view where = "plan");
absl::StatusOr<Plan> ReadPlanFile(const std::string& path);
absl::Status WritePlanFile(const Plan& plan, const std::string& path);  // atomic

}  // namespace tandem::pipeline
