#include "cluster/policy.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tandem::cluster {

ClusterView ClusterView::Homogeneous(int num_nodes, int gpus_per_node,
                                     const std::string& device_type) {
  ClusterView cluster;
  cluster.nodes.assign(num_nodes, NodeView{gpus_per_node, device_type});
  return cluster;
}

int ClusterView::total_gpus() const {
  int total = 0;
  for (const NodeView& node : nodes) total += node.gpus;
  return total;
}

int ClusterView::max_gpus_per_node() const {
  int most = 0;
  for (const NodeView& node : nodes) most = std::max(most, node.gpus);
  return most;
}

bool ReallocationCosts::IsShrink(const Allocation& before, const Allocation& after) {
  if (after.empty() || after.size() >= before.size()) return false;
  std::map<int, int> held;
  for (int node : before) ++held[node];
  for (int node : after) {
    if (--held[node] < 0) return false;
  }
  return true;
}

bool ReallocationCosts::IsGrow(const Allocation& before, const Allocation& after) {
  return !before.empty() && after.size() > before.size() && IsShrink(after, before);
}

double ReallocationCosts::Seconds(const Allocation& before, const Allocation& after) const {
  if (after.empty() || before == after) return 0;
  if (before.empty()) return start_seconds;
  if (IsShrink(before, after)) return shrink_seconds;
  return IsGrow(before, after) ? grow_seconds : move_seconds;
}

std::vector<int> FreeGpus(const ClusterView& cluster, const Allocations& allocations) {
  std::vector<int> free(cluster.nodes.size());
  for (size_t i = 0; i < free.size(); ++i) free[i] = cluster.nodes[i].gpus;
  for (const auto& [job, allocation] : allocations) {
    for (int node : allocation) {
      if (node >= 0 && node < static_cast<int>(free.size())) --free[node];
    }
  }
  return free;
}

absl::StatusOr<Allocation> TakeFromMostFree(int gpus, std::vector<int>* free) {
  Allocation allocation;
  while (static_cast<int>(allocation.size()) < gpus) {
    int best = -1;
    for (size_t i = 0; i < free->size(); ++i) {
      if ((*free)[i] > 0 && (best < 0 || (*free)[i] > (*free)[best])) best = static_cast<int>(i);
    }
    if (best < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("placing ", gpus, " GPUs: only ", allocation.size(), " free"));
    }
    const int take = std::min((*free)[best], gpus - static_cast<int>(allocation.size()));
    allocation.insert(allocation.end(), take, best);
    (*free)[best] -= take;
  }
  return allocation;
}

std::vector<int> PlacementOf(const Allocation& allocation) {
  std::vector<int> placement;
  for (size_t i = 0; i < allocation.size(); ++i) {
    if (i == 0 || allocation[i] != allocation[i - 1]) {
      placement.push_back(1);
    } else {
      ++placement.back();
    }
  }
  return placement;
}

absl::Status ValidateAllocations(const Allocations& allocations,
                                 const std::vector<JobView>& jobs, const ClusterView& cluster,
                                 const std::string& policy) {
  absl::flat_hash_set<std::string> known;
  for (const JobView& job : jobs) known.insert(job.name);
  std::vector<int> used(cluster.nodes.size(), 0);
  for (const auto& [name, allocation] : allocations) {
    if (!known.contains(name)) {
      return absl::InternalError(
          absl::StrCat("policy ", policy, " allocated GPUs to unknown or finished job ", name));
    }
    for (int node : allocation) {
      if (node < 0 || node >= static_cast<int>(cluster.nodes.size())) {
        return absl::InternalError(absl::StrCat("policy ", policy, " placed job ", name,
                                                " on node ", node, " of ",
                                                cluster.nodes.size()));
      }
      ++used[node];
    }
  }
  for (size_t node = 0; node < used.size(); ++node) {
    if (used[node] > cluster.nodes[node].gpus) {
      return absl::InternalError(absl::StrCat("policy ", policy, " put ", used[node],
                                              " GPUs on node ", node, ", which has ",
                                              cluster.nodes[node].gpus));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::cluster
