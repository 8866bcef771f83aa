// `tandem cluster run` (cli/cluster_run_command.cc), dispatched by `tandem cluster`
// (cli/cluster_command.cc): real elastic jobs on this machine's slots under a scheduling policy
// (cluster/live.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem::cli {

// Runs the jobs of --jobs under --policy on --slots or --hosts; prints every change, then each
// job's real JCT beside the simulator's prediction. InvalidArgument for bad input.
absl::Status RunLiveClusterCommand();

// Its synopsis and description, for `tandem cluster --help`.
extern const char kClusterRunUsage[];

}  // namespace tandem::cli
