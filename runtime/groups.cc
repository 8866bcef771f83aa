#include "runtime/groups.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::runtime {

using comm::Communicator;

absl::Status ValidateMeshLayout(const MeshLayout& layout) {
  const int data_parallel = layout.data_parallel();
  const int pipeline_parallel = layout.pipeline_parallel();
  if (data_parallel == 0 || pipeline_parallel == 0) {
    return absl::InvalidArgumentError("mesh: empty (need at least one replica of one rank)");
  }
  const int world = data_parallel * pipeline_parallel;
  std::vector<bool> seen(world, false);
  for (int d = 0; d < data_parallel; ++d) {
    if (static_cast<int>(layout.mesh[d].size()) != pipeline_parallel) {
      return absl::InvalidArgumentError(absl::StrCat("mesh[", d, "] has ", layout.mesh[d].size(),
                                                     " ranks, mesh[0] has ", pipeline_parallel));
    }
    for (int q = 0; q < pipeline_parallel; ++q) {
      const int rank = layout.mesh[d][q];
      if (rank < 0 || rank >= world || seen[rank]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "mesh[", d, "][", q, "] = ", rank, ": the mesh must be a permutation of [0, ", world,
            ")"));
      }
      seen[rank] = true;
    }
  }
  const pipeline::Placement& placement = layout.placement;
  if (placement.num_ranks != pipeline_parallel) {
    return absl::InvalidArgumentError(absl::StrCat("placement has ", placement.num_ranks,
                                                   " pipeline positions, mesh has ",
                                                   pipeline_parallel));
  }
  if (placement.NumReplicas() == 0) {
    return absl::InvalidArgumentError("placement: no pipeline replica");
  }
  for (int r = 0; r < placement.NumReplicas(); ++r) {
    if (static_cast<int>(placement.stage_to_rank[r].size()) != placement.num_stages) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement replica ", r, " places ", placement.stage_to_rank[r].size(),
                       " stages, expected ", placement.num_stages));
    }
    for (int s = 0; s < placement.num_stages; ++s) {
      const int q = placement.stage_to_rank[r][s];
      if (q < 0 || q >= pipeline_parallel) {
        return absl::InvalidArgumentError(absl::StrCat("placement: stage ", s, " of replica ", r,
                                                       " on position ", q, ", outside [0, ",
                                                       pipeline_parallel, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<MeshPosition> PositionOf(const MeshLayout& layout, int global_rank) {
  for (int d = 0; d < layout.data_parallel(); ++d) {
    for (int q = 0; q < static_cast<int>(layout.mesh[d].size()); ++q) {
      if (layout.mesh[d][q] == global_rank) return MeshPosition{d, q};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("rank ", global_rank, " is not in the mesh"));
}

std::vector<int> GradientGroupRanks(const MeshLayout& layout, int stage) {
  std::vector<int> ranks;
  for (int d = 0; d < layout.data_parallel(); ++d) {
    for (int r = 0; r < layout.num_replicas(); ++r) {
      ranks.push_back(layout.mesh[d][layout.placement.RankOf(r, stage)]);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

std::vector<int> PipelineGroupRanks(const MeshLayout& layout, int data_parallel_index) {
  return layout.mesh[data_parallel_index];
}

std::vector<int> ReplicaPairRanks(const MeshLayout& layout, int data_parallel_index, int stage) {
  std::vector<int> ranks;
  for (int r = 0; r < layout.num_replicas(); ++r) {
    ranks.push_back(layout.mesh[data_parallel_index][layout.placement.RankOf(r, stage)]);
  }
  return ranks;
}

StageNeighbours NeighboursOf(const MeshLayout& layout, int replica, int stage) {
  StageNeighbours neighbours;
  if (stage > 0) neighbours.previous = layout.placement.RankOf(replica, stage - 1);
  if (stage + 1 < layout.num_stages()) neighbours.next = layout.placement.RankOf(replica, stage + 1);
  return neighbours;
}

absl::StatusOr<ProcessGroups> BuildProcessGroups(Communicator& world, const MeshLayout& layout) {
  TANDEM_RETURN_IF_ERROR(ValidateMeshLayout(layout));
  const int world_size = layout.data_parallel() * layout.pipeline_parallel();
  if (world.size() != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("mesh has ", world_size,
                                                   " ranks but the communicator has ",
                                                   world.size()));
  }
  ProcessGroups groups;
  TANDEM_ASSIGN_OR_RETURN(groups.position, PositionOf(layout, world.rank()));
  const int d = groups.position.data_parallel_index;

  TANDEM_ASSIGN_OR_RETURN(
      groups.pipeline, world.Split(/*color=*/d, /*key=*/groups.position.pipeline_index));

  for (int stage = 0; stage < layout.num_stages(); ++stage) {
    const std::vector<int> ranks = GradientGroupRanks(layout, stage);
    const auto it = std::find(ranks.begin(), ranks.end(), world.rank());
    const bool member = it != ranks.end();
    const int key = member ? static_cast<int>(it - ranks.begin()) : 0;
    TANDEM_ASSIGN_OR_RETURN(auto group, world.Split(member ? 0 : -1, key));
    if (member) groups.gradient[stage] = std::move(group);
  }

  if (layout.num_replicas() > 1) {
    for (int stage = 0; stage < layout.num_stages(); ++stage) {
      const std::vector<int> pair = ReplicaPairRanks(layout, d, stage);
      const bool distinct = std::adjacent_find(pair.begin(), pair.end()) == pair.end();
      const auto it = std::find(pair.begin(), pair.end(), world.rank());
      const bool member = distinct && it != pair.end();
      // One colour per data-parallel replica: the pairs of different d are disjoint.
      const int key = member ? static_cast<int>(it - pair.begin()) : 0;
      TANDEM_ASSIGN_OR_RETURN(auto group, world.Split(member ? d : -1, key));
      if (member) groups.replica_pair[stage] = std::move(group);
    }
  }
  return groups;
}

}  // namespace tandem::runtime
