// Process groups from a plan's device mesh.
//
// A plan (pipeline/plan.h) places ranks on a mesh: mesh[d][q] is the global rank at
// data-parallel replica d and pipeline position q; the schedule's placement maps
// (pipeline replica r, stage s) to a pipeline position q. From these:
//   * the gradient group of stage s: every rank holding a copy of s — all data-parallel
//     replicas and, for Chimera, both pipeline replicas (the two copies' gradients are summed
//     by the same all-reduce, which keeps them equal);
//   * the pipeline group of replica d: mesh[d] in pipeline order (rank in it == q), over which
//     activations and gradients travel; the neighbours of (r, s) are the positions of s-1, s+1;
//   * Chimera's replica pair of stage s in replica d: the two positions holding its copies.
// The pure functions below compute rank lists (testable without MPI); BuildProcessGroups
// splits them from a world communicator.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "pipeline/schedule.h"

namespace tandem::runtime {

// What group building needs from a plan: its mesh and the schedule's placement.
struct MeshLayout {
  std::vector<std::vector<int>> mesh;  // mesh[d][q] = global rank
  pipeline::Placement placement;       // (replica, stage) -> pipeline position q

  int data_parallel() const { return static_cast<int>(mesh.size()); }
  int pipeline_parallel() const { return mesh.empty() ? 0 : static_cast<int>(mesh[0].size()); }
  int num_stages() const { return placement.num_stages; }
  int num_replicas() const { return placement.NumReplicas(); }
};

// Checks that the mesh is rectangular, a permutation of [0, D*p), and that the placement has
// p positions and names only positions in [0, p). InvalidArgument names the entry.
absl::Status ValidateMeshLayout(const MeshLayout& layout);

struct MeshPosition {
  int data_parallel_index = 0;  // d
  int pipeline_index = 0;       // q
};
absl::StatusOr<MeshPosition> PositionOf(const MeshLayout& layout, int global_rank);

// Sorted global ranks holding stage `stage` (gradient group).
std::vector<int> GradientGroupRanks(const MeshLayout& layout, int stage);
// Global ranks of pipeline replica d, in pipeline order (mesh[d]).
std::vector<int> PipelineGroupRanks(const MeshLayout& layout, int data_parallel_index);
// Global ranks holding the copies of `stage` within data-parallel replica d, by pipeline
// replica (Chimera: two, possibly equal if both copies sit on one rank; otherwise one).
std::vector<int> ReplicaPairRanks(const MeshLayout& layout, int data_parallel_index, int stage);

// Pipeline positions (ranks in the pipeline group) of the previous and next stage of
// (replica, stage); -1 at the ends.
struct StageNeighbours {
  int previous = -1;
  int next = -1;
};
StageNeighbours NeighboursOf(const MeshLayout& layout, int replica, int stage);

// This rank's communicators.
struct ProcessGroups {
  MeshPosition position;
  // mesh[d] for this rank's d; its rank() equals this rank's pipeline position q.
  std::unique_ptr<comm::Communicator> pipeline;
  // stage -> gradient group, for every stage this rank holds (ranked in sorted global order).
  std::map<int, std::unique_ptr<comm::Communicator>> gradient;
  // Chimera only: stage -> the replica pair within this rank's d, for stages whose two
  // copies sit on different ranks.
  std::map<int, std::unique_ptr<comm::Communicator>> replica_pair;
};

// Splits `world` (all ranks of the mesh, rank == global rank) into this rank's groups.
// Collective over `world`: every rank calls it with the same layout. It performs one Split for
// the pipeline groups, one per stage for the gradient groups and, with two replicas, one per
// stage for the replica pairs.
absl::StatusOr<ProcessGroups> BuildProcessGroups(comm::Communicator& world,
                                                 const MeshLayout& layout);

}  // namespace tandem::runtime
