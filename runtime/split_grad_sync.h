// Gradient synchronisation of a stage whose parameters are shared by two groups: the experts
// spread over data-parallel replicas (ParameterView::placed_over_replicas) are held alike only
// by the replicas holding the same experts, the rest by every replica.
//
// SplitGradientSync is a GradientSync (runtime/grad_sync.h) made of two: one over `group` (the
// stage's gradient group) for the parameters every replica holds, one over `expert_group`
// (the members of `group` holding the same experts) for the placed ones. Parameter and bucket
// indices are the stage's: a parameter's calls go to the synchroniser holding it, and the
// buckets are the first's, then the second's. Each synchroniser sums, shards and steps its own
// parameters over its own group; the norm is the sum of both shares (each element counted
// once over its group, and the expert groups hold different experts).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "runtime/grad_sync.h"

namespace tandem::runtime {

// `parameters` in backward order; `placed[i]` says which group parameter i is synchronised
// over. Both groups must outlive the synchroniser. Collective over both groups (each
// synchroniser checks its members' parameters).
absl::StatusOr<std::unique_ptr<GradientSync>> CreateSplitGradientSync(
    comm::Communicator& group, comm::Communicator& expert_group,
    std::vector<SyncParameter> parameters, const std::vector<bool>& placed,
    const GradSyncOptions& options);

}  // namespace tandem::runtime
