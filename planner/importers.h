// Importers of other tools' profile formats, and conversions between the tandem profile
// (pipeline/profile.h) and a Piper problem (planner/piper.h).
//
// DAG models are linearized in one topological order that places every node as late as its
// consumers allow (sources such as input tensors and masks land right before their first
// consumer), ties broken by the order of the file. The linearized profile keeps the edges in
// `inputs`, so cut costs count every tensor crossing a stage boundary.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "pipeline/profile.h"
#include "planner/pipedream.h"
#include "planner/piper.h"

namespace tandem::planner {

// A topological order of `num_nodes` nodes with edges (from, to): each node as late as
// possible; among nodes ready together the higher `priority` goes later. InvalidArgument
// naming nodes (`names`) on a cycle.
absl::StatusOr<std::vector<int>> LateTopologicalOrder(
    int num_nodes, const std::vector<std::pair<int, int>>& edges,
    const std::vector<int64_t>& priority, const std::vector<std::string>& names,
    absl::string_view source);

// PipeDream's profile (profiler/*/graph.txt): node lines
//   nodeN -- Description -- forward_compute_time=MS, backward_compute_time=MS,
//   activation_size=BYTES, parameter_size=BYTES
// (activation sizes of several outputs written "[a; b]" are summed), then tab-indented edge
// lines "nodeA -- nodeB". As PipeDream's optimizer does, source nodes whose description starts
// with "Input" carry no work and "__getitem__" sinks are dropped. Times become seconds; a
// layer's stashed activation is its activation size (PipeDream's model). With `graph`, also
// the DAG as PipeDream's optimizer partitions it (planner/pipedream.h: input nodes ignored,
// the first source of the file where its states start), one entry per profile layer.
absl::StatusOr<pipeline::Profile> ImportPipeDreamGraph(absl::string_view text,
                                                       absl::string_view source,
                                                       PipeDreamGraph* graph = nullptr);
absl::StatusOr<pipeline::Profile> ReadPipeDreamGraphFile(const std::string& path,
                                                         PipeDreamGraph* graph = nullptr);

// Piper's input JSON (maxDevices, maxMemoryPerDevice, bandwidth, mbsInBatch, nodes with TMPCs
// per tensor-parallel degree, edges with communicationCost). Nodes are renumbered in the
// linearized order.
absl::StatusOr<PiperInstance> ImportPiperJson(const nlohmann::json& j, absl::string_view source);
absl::StatusOr<PiperInstance> ReadPiperFile(const std::string& path);

// Settings of a Piper problem that a tandem profile does not carry.
struct PiperProblemSettings {
  int max_devices = 1;
  double memory_per_device_bytes = 0;
  double bandwidth_bytes_per_second = 0;
  int microbatches_per_batch = 1;
};

// A Piper problem from a tandem profile: per layer and tensor-parallel degree a "vanilla"
// configuration (time = forward + backward (+ tensor-parallel communication), A = stashed
// activation, B = 2 * parameters (weights and gradients) + optimizer state) and, when
// recomputation saves memory, an "activation recomp" one (time + recompute_seconds, A =
// recompute_stashed_bytes). Edges carry the producer's output bytes.
PiperInstance PiperFromProfile(const pipeline::Profile& profile,
                               const PiperProblemSettings& settings);

// A tandem profile from a Piper problem (tensor-parallel degree 1 configurations as the layer,
// higher degrees as variants). Piper gives forward plus backward only; the split is taken as
// one third forward, two thirds backward. Layer names get the node index appended
// ("ParallelTransformerLayer_5") so that they are unique.
absl::StatusOr<pipeline::Profile> ProfileFromPiper(const PiperInstance& instance,
                                                   absl::string_view model);

// Metis' profile samples (SamsungLabs/Metis profile_data_samples/*.json): per layer compute
// time (forward + backward, ms), memory (MB) and parameter bytes. Memory is read as weights,
// gradients and mixed-precision Adam state (8 bytes per fp16 weight byte) plus the stashed
// activations of one micro-batch; forward is taken as a third of the compute time.
absl::StatusOr<pipeline::Profile> ImportMetisJson(const nlohmann::json& j,
                                                  absl::string_view source);

// Reads a profile in `format`: "tandem", "pipedream", "piper", "metis", or "builtin" where
// `path` names a computed profile: "gpt3-175b" (planner/gpt_profile.h, A100) or
// "gpt3-175b-split" (attention and MLP as separate layers) or "gpt3-175b-sp" (tensor-parallel
// variants with sequence parallelism).
absl::StatusOr<pipeline::Profile> ReadProfileAs(const std::string& path,
                                                absl::string_view format);

}  // namespace tandem::planner
