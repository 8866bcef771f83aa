// Process helpers of the live scheduler (cluster/live.h): start a program with posix_spawn in
// its own process group, with output to a file and extra environment; reap it without
// blocking; find the MPI ranks a launch started by an environment tag; tell whether a process
// is still alive. POSIX and Linux's /proc only; no MPI.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cluster::internal {

// Starts argv[0] (looked up in PATH) with `argv`, the caller's environment plus `environment`,
// stdin from /dev/null and stdout and stderr appended to `output`. The child leads a new
// process group. Unavailable when it cannot start.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& environment,
                            const std::string& output);

// Reaps `pid` if it has ended: its exit status (128 + signal for a signal), or -1 while it
// runs.
int ReapIfEnded(pid_t pid);

// The processes whose environment has `tag_name`=`tag_value`, by their value of `key_name`
// (processes without it are left out): e.g. the ranks of one mpirun launch by
// OMPI_COMM_WORLD_RANK. Processes started by a running job (MPI_Comm_spawn: OMPI_PARENT_PORT in
// their environment) are left out too: their key numbers another job's processes. Processes
// this user cannot read are skipped.
std::map<int, pid_t> ProcessesTagged(const std::string& tag_name, const std::string& tag_value,
                                     const std::string& key_name);
// Every live process whose environment has `tag_name`=`tag_value`, started ones included.
std::vector<pid_t> AllProcessesTagged(const std::string& tag_name, const std::string& tag_value);

// False once `pid` has exited (gone, or a zombie waiting for its parent).
bool ProcessAlive(pid_t pid);

// Ties `job` (a process group leader started by Spawn) to this process: a guard process (a
// shell loop, detached) sends SIGTERM to `job`'s process group when this process ends while
// `job` still runs, SIGKILL included, so that a killed scheduler leaves no job running (mpirun
// ends its ranks on SIGTERM). The guard ends by itself within a second of `job`'s end.
absl::Status EndWithThisProcess(pid_t job);

}  // namespace tandem::cluster::internal
