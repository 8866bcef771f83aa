// The live scheduler: `tandem cluster run` runs real elastic training jobs on a machine's (or a
// host list's) slots as a scheduling policy decides, through the same Policy interface the
// simulator uses (cluster/policy.h).
//
// Every `interval_seconds` the controller hands the policy the submitted, unfinished jobs and
// their current allocations and takes the new allocations as targets. It then moves each job
// towards its target, one change at a time per job:
//   start   `mpirun --enable-recovery -np N tandem train --elastic ...` (from the job's latest
//           checkpoint with --resume when it ran before);
//   shrink  live: the ranks to remove (the highest job ranks on the nodes that lose slots) are
//           SIGKILLed; the elastic layer re-forms the job on the survivors, and the shrink is
//           complete when the job's log shows the recovery event;
//   grow    live on one host (LiveOptions::live_grow): SIGUSR2 to mpirun asks the job for one
//           more rank at its next commit; the elastic layer starts it (MPI_Comm_spawn), hands
//           it its layers' state and goes on, and the grow is complete when the job's log
//           shows the growth event; repeated, one rank at a time, up to the target;
//   move    (a grow across hosts, preemption, a shrink whose ranks are not this launch's own
//           processes) through a checkpoint: SIGUSR1 to mpirun asks the job to stop at its
//           next commit with a checkpoint (ElasticOptions::stop_requested); once it has exited
//           the job is started again on its target with --resume.
// A job is started, or restarted, only on slots free in the controller's own accounting
// (every rank of a running launch counts until its process has exited), so slots are never
// oversubscribed by the controller; a target below the job's min_ranks leaves it waiting.
//
// Each launch writes its own log (the elastic layer's --log-json); the controller reads them as
// they grow for iterations, recovery and finished events, records every change and each job's
// JCT (submission to the finished event), and checks that every iteration appears exactly once
// across the job's launches.
//
// The controller is single-threaded; it is not safe to run two RunLiveCluster calls in one
// process at the same time (they share the process's children).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/policy.h"
#include "cluster/simulator.h"
#include "nlohmann/json.hpp"

namespace tandem::cluster {

// One row of the jobs file.
struct LiveJobSpec {
  std::string name;
  double submission_seconds = 0;  // after the controller starts
  int64_t steps = 0;              // iterations in all
  int64_t global_batch = 0;       // samples, kept on every rank count
  int min_ranks = 1;
  int max_ranks = 1;
  // Further `tandem train` flags (the model, optimizer, micro-batch size, elastic options),
  // split at spaces.
  std::vector<std::string> train_flags;
};

// Reads the jobs CSV (header `name,submission_seconds,steps,global_batch,min_ranks,max_ranks,
// train_flags`; blank lines and lines starting with '#' skipped). InvalidArgument naming the
// file and line for a malformed row, a duplicate or unusable name, min_ranks > max_ranks, a job
// wider than `total_slots`, or train_flags that set what the controller sets (--steps,
// --global-batch, --resume, --checkpoint-dir, --log-json, --elastic, -np).
absl::StatusOr<std::vector<LiveJobSpec>> ReadLiveJobs(const std::string& path, int total_slots);

// The hosts: an Open MPI hostfile ("NAME slots=N" per line, '#' comments). One node per host.
struct LiveHost {
  std::string name;
  int slots = 0;
};
absl::StatusOr<std::vector<LiveHost>> ReadHostFile(const std::string& path);

struct LiveOptions {
  // Empty: one node, this machine, with `slots` slots (mpirun gets no --host).
  std::vector<LiveHost> hosts;
  int slots = 0;
  double interval_seconds = 60;
  std::string tandem_program;  // the `tandem` binary the jobs run (`tandem train --elastic`)
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_flags;  // added to every launch (e.g. --allow-run-as-root)
  std::string work_dir;                   // per job: checkpoints, each launch's log and output
  // Give up (DeadlineExceeded; every job stopped) this long after the last submission.
  double deadline_seconds = 3600;
  // Called with each line of the controller's event log as it happens (may be empty).
  std::function<void(const std::string&)> on_event;
  // Set (e.g. from a SIGINT handler) to stop: every job is killed and the run ends Cancelled.
  const std::atomic<bool>* cancel = nullptr;
  // Grow running jobs live (one host only: the started ranks land on the launch's host);
  // false: every grow goes through a checkpoint and a resume.
  bool live_grow = true;
  // A live grow not seen in the job's log this long after the request goes through a
  // checkpoint instead.
  double live_grow_timeout_seconds = 120;
};

// A change the controller made or saw, at seconds since its start.
struct LiveEvent {
  double seconds = 0;
  std::string job;
  // submit, start, shrink, recovered, grow, grown, stop, stopped, finished, failed
  std::string kind;
  int from_ranks = 0;
  int to_ranks = 0;
  std::string detail;
};

struct LiveJobResult {
  std::string name;
  double submission_seconds = 0;
  double completion_seconds = -1;  // the finished event, seconds since the controller started
  double jct_seconds = -1;         // completion - submission; -1 unless finished
  bool finished = false;
  std::string error;  // why it failed
  int launches = 0;
  int live_shrinks = 0;              // recovery events after the controller's kills
  int live_grows = 0;                // growth events after the controller's requests
  int grows = 0;                     // restarts on more ranks than the previous launch
  int restarts = 0;                  // launches after the first
  int64_t iterations_logged = 0;     // distinct iterations across launches
  int64_t duplicate_iterations = 0;  // iterations logged twice (0 expected)
  int64_t missing_iterations = 0;    // of [0, steps) never logged (0 for a finished job)
  // Measured: per rank count, seconds per iteration (median of the logged iterations).
  std::map<int, double> seconds_per_iteration;
  // Seconds from each launch's mpirun start to its first logged iteration (start-up, profiling,
  // a resume's checkpoint read).
  std::vector<double> launch_overheads;
};

struct LiveResult {
  std::string policy;
  int total_slots = 0;
  double interval_seconds = 0;
  std::vector<LiveJobResult> jobs;  // jobs-file order
  std::vector<LiveEvent> events;
  int rounds = 0;
  int max_slots_used = 0;        // the controller's accounting, sampled every step of its loop
  int oversubscribed_steps = 0;  // steps where some node had more ranks than slots (0 expected)
  double makespan_seconds = 0;
};

// Runs the jobs to the end under `policy`. FailedPrecondition for an unusable setup (no tandem
// program, no slots); jobs that fail are reported in the result, not as an error.
absl::StatusOr<LiveResult> RunLiveCluster(const std::vector<LiveJobSpec>& jobs, Policy& policy,
                                          const LiveOptions& options);

// The simulator's prediction of the same trace: each job a fixed-duration job on max_ranks
// slots whose duration is steps x its measured seconds per iteration, scaled linearly from the
// rank counts it ran on (rank-seconds per iteration, averaged over the rank counts measured),
// restart_seconds the mean measured launch overhead, the same interval and policy.
struct LivePrediction {
  double restart_seconds = 0;
  std::map<std::string, double> duration_seconds;  // on max_ranks
  SimulationResult simulation;
};
absl::StatusOr<LivePrediction> PredictLiveRun(const std::vector<LiveJobSpec>& jobs,
                                              const LiveResult& live, Policy& policy,
                                              const ClusterView& cluster);

ClusterView LiveClusterView(const LiveOptions& options);

// A table: each job's real JCT beside the prediction, its launches, live shrinks and grows;
// then averages, makespans and the slot accounting.
std::string FormatLiveResult(const LiveResult& live, const LivePrediction* prediction);
nlohmann::json LiveResultToJson(const LiveResult& live, const LivePrediction* prediction);

}  // namespace tandem::cluster
