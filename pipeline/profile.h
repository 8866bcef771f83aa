// The profile (profile.json): measured per-layer costs of a model at one micro-batch size.
// Written by the profiler (runtime/torch) and by importers of other tools' formats
// (planner/importers.h); read by the planner. Lives beside the plan because it is a seam, not
// an algorithm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::pipeline {

// Costs of one layer at one tensor-parallel degree.
struct TensorParallelVariant {
  int degree = 1;
  double forward_seconds = 0;
  double backward_seconds = 0;
  double stashed_activation_bytes = 0;
  double parameter_bytes = 0;
  double communication_seconds = 0;  // tensor-parallel collectives per micro-batch (fw+bw)
  // Sequence parallelism: outside the split products the activations are split along the
  // sequence, so what crosses a stage boundary and what a recomputed layer keeps are divided
  // by the degree too (stashed_activation_bytes says the rest).
  bool sequence_parallel = false;
  // Expert parallelism: a mixture of experts places its experts whole on this many parts of
  // the group (the runtime's --expert-parallel N), instead of splitting each over all of it
  // (1). It divides the degree. The memory per rank is the same; the time is what differs.
  int expert_parallel = 1;
  bool operator==(const TensorParallelVariant& o) const;
};

struct LayerProfile {
  std::string name;
  double forward_seconds = 0;
  double backward_seconds = 0;         // total backward (input + weight gradients)
  double backward_input_seconds = 0;   // optional split; both 0 when unknown
  double backward_weight_seconds = 0;
  double output_activation_bytes = 0;  // what crosses a stage boundary after this layer
  double stashed_activation_bytes = 0; // what backward needs, per micro-batch
  double parameter_bytes = 0;
  double optimizer_state_bytes = 0;
  double recompute_seconds = 0;        // added backward time if activations are recomputed
  double recompute_stashed_bytes = 0;  // stash left when recomputed (its input only)
  double optimizer_seconds = 0;        // one optimizer step over its parameters (optional)
  // Indices of layers whose outputs this layer consumes. Empty means "the previous layer"
  // (a chain). Used for DAG models: a stage cut's cost counts every edge crossing it.
  std::vector<int> inputs;
  std::vector<TensorParallelVariant> tensor_parallel;  // optional, degree > 1

  bool operator==(const LayerProfile& o) const;
};

struct Profile {
  std::string model;
  int64_t microbatch_size = 1;
  std::string device;  // "cpu", "cuda:NVIDIA H100", "A100 (imported)"
  std::vector<LayerProfile> layers;

  double TotalForwardSeconds() const;
  double TotalBackwardSeconds() const;
  double TotalParameterBytes() const;
  bool operator==(const Profile& o) const;
};

// Checks ranges (no negative times or sizes, inputs refer to earlier layers: no cycles) and
// names the field: "profile.json: layers[3].forward_seconds: must not be negative".
absl::Status ValidateProfile(const Profile& profile, absl::string_view source = "profile");

nlohmann::json ToJson(const Profile& profile);
absl::StatusOr<Profile> ProfileFromJson(const nlohmann::json& j,
                                        absl::string_view source = "profile");
absl::StatusOr<Profile> ReadProfileFile(const std::string& path);
absl::Status WriteProfileFile(const Profile& profile, const std::string& path);  // atomic

}  // namespace tandem::pipeline
