// `tandem cluster run`: the live scheduler's command line (cluster/live.h). The flags it adds
// to `tandem cluster` are defined here; --policy and --interval are shared with
// `tandem cluster simulate`.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/cluster_run.h"
#include "cluster/live.h"
#include "cluster/policies.h"
#include "common/config.h"
#include "common/file_util.h"
#include "common/status.h"

ABSL_FLAG(std::string, jobs, "",
          "cluster run: jobs CSV (name,submission_seconds,steps,global_batch,min_ranks,"
          "max_ranks,train_flags)");
ABSL_FLAG(std::string, hosts, "",
          "cluster run: Open MPI hostfile ('HOST slots=N' per line), one node per host");
ABSL_FLAG(int, slots, 0, "cluster run: slots on this machine (instead of --hosts)");
ABSL_FLAG(std::string, log_json, "",
          "cluster run: write every job's real and predicted JCT and every event here (JSON)");
ABSL_FLAG(std::string, work_dir, "",
          "cluster run: per job checkpoints, logs and output (default: a new folder under the "
          "temporary directory)");
ABSL_FLAG(bool, grow_through_checkpoint, false,
          "cluster run: grow jobs through a checkpoint and a resume even on one host (where "
          "they grow live by default)");
ABSL_FLAG(double, deadline, 3600,
          "cluster run: stop every job and fail this many seconds after the last submission");
ABSL_DECLARE_FLAG(std::string, policy);  // cli/cluster_command.cc
ABSL_DECLARE_FLAG(double, interval);     // cli/cluster_command.cc

namespace tandem::cli {

namespace fs = std::filesystem;

const char kClusterRunUsage[] =
    "tandem cluster run --jobs FILE (--slots N | --hosts FILE) [--policy optimus]\n"
    "    [--interval 60] [--log-json FILE] [--work-dir DIR] [--deadline 3600]\n"
    "    [--grow-through-checkpoint]\n\n"
    "Runs real jobs, `mpirun --enable-recovery ... tandem train --elastic`, on the slots as\n"
    "the policy decides every --interval seconds: a shrink is live (the removed ranks are\n"
    "SIGKILLed and the elastic layer continues on the others); with --slots a grow is live\n"
    "too (SIGUSR2 asks the job for one more rank at a time, which it starts itself); a grow\n"
    "across --hosts, a move or a preemption goes through a checkpoint (SIGUSR1 asks the job\n"
    "to stop at its next commit, then it is started again with --resume). The jobs file is\n"
    "a CSV with the header\n"
    "name,submission_seconds,steps,global_batch,min_ranks,max_ranks,train_flags; train_flags\n"
    "are the model's and other `tandem train` flags, separated by spaces. Prints every change\n"
    "as it happens, then each job's real JCT beside the simulator's prediction of the same\n"
    "trace (docs/cluster.md, \"Live scheduler\"); exit 1 when a job failed.";

namespace {

// SIGINT or SIGTERM: the controller kills its jobs (they run in their own process groups, out
// of reach of a terminal's Ctrl-C) and ends.
std::atomic<bool> interrupted{false};
extern "C" void OnInterrupt(int) { interrupted.store(true); }

// The `tandem` program itself (the jobs run `tandem train --elastic`).
std::string ThisProgram() {
  char self[4096];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return "";
  self[length] = '\0';
  return self;
}

}  // namespace

absl::Status RunLiveClusterCommand() {
  const std::string jobs_path = absl::GetFlag(FLAGS_jobs);
  if (jobs_path.empty()) return absl::InvalidArgumentError("missing --jobs FILE");
  std::string policy_name = absl::GetFlag(FLAGS_policy);
  if (policy_name.empty()) policy_name = "optimus";
  cluster::LiveOptions options;
  const std::string hosts = absl::GetFlag(FLAGS_hosts);
  options.slots = absl::GetFlag(FLAGS_slots);
  if (!hosts.empty() && options.slots != 0) {
    return absl::InvalidArgumentError("give --hosts FILE or --slots N, not both");
  }
  if (!hosts.empty()) {
    TANDEM_ASSIGN_OR_RETURN(options.hosts, cluster::ReadHostFile(hosts));
  } else if (options.slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slots must be at least 1 (or give --hosts FILE), got ", options.slots));
  }
  const cluster::ClusterView view = cluster::LiveClusterView(options);
  TANDEM_ASSIGN_OR_RETURN(std::vector<cluster::LiveJobSpec> jobs,
                          cluster::ReadLiveJobs(jobs_path, view.total_gpus()));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<cluster::Policy> policy,
                          cluster::MakePolicy(policy_name));
  options.live_grow = !absl::GetFlag(FLAGS_grow_through_checkpoint);
  options.interval_seconds = absl::GetFlag(FLAGS_interval);
  if (!(options.interval_seconds > 0)) {
    return absl::InvalidArgumentError("--interval must be positive");
  }
  options.deadline_seconds = absl::GetFlag(FLAGS_deadline);
  if (!(options.deadline_seconds > 0)) {
    return absl::InvalidArgumentError("--deadline must be positive");
  }
  options.tandem_program = ThisProgram();
  options.mpirun = TANDEM_MPIEXEC[0] != '\0' ? TANDEM_MPIEXEC : "mpirun";
  if (::geteuid() == 0) options.mpirun_flags.push_back("--allow-run-as-root");
  options.work_dir = absl::GetFlag(FLAGS_work_dir);
  if (options.work_dir.empty()) {
    options.work_dir =
        (fs::temp_directory_path() / absl::StrCat("tandem-cluster-", ::getpid())).string();
  }
  // Outputs are checked before any job starts, not after the last one ends.
  TANDEM_RETURN_IF_ERROR(CheckOutputFolder(options.work_dir, "--work-dir"));
  if (const std::string log = absl::GetFlag(FLAGS_log_json); !log.empty()) {
    TANDEM_RETURN_IF_ERROR(CheckOutputFile(log, "--log-json"));
  }
  options.on_event = [](const std::string& line) { std::cout << line << std::endl; };
  options.cancel = &interrupted;
  std::signal(SIGINT, OnInterrupt);
  std::signal(SIGTERM, OnInterrupt);
  std::cout << "tandem cluster run: " << jobs.size() << " job(s) on " << view.total_gpus()
            << " slot(s), policy " << policy->name() << ", a round every "
            << options.interval_seconds << " s; logs in " << options.work_dir << std::endl;
  TANDEM_ASSIGN_OR_RETURN(cluster::LiveResult live,
                          cluster::RunLiveCluster(jobs, *policy, options));
  // The prediction: the same trace through the simulator with a fresh policy.
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<cluster::Policy> simulated,
                          cluster::MakePolicy(policy_name));
  absl::StatusOr<cluster::LivePrediction> prediction =
      cluster::PredictLiveRun(jobs, live, *simulated, view);
  if (!prediction.ok()) {
    std::cout << "no simulator prediction: " << prediction.status().message() << std::endl;
  }
  const cluster::LivePrediction* predicted = prediction.ok() ? &*prediction : nullptr;
  std::cout << cluster::FormatLiveResult(live, predicted);
  const std::string log = absl::GetFlag(FLAGS_log_json);
  if (!log.empty()) {
    TANDEM_RETURN_IF_ERROR(
        WriteFileAtomically(log, cluster::LiveResultToJson(live, predicted).dump(2) + "\n"));
  }
  for (const cluster::LiveJobResult& r : live.jobs) {
    if (!r.finished) {
      return absl::InternalError(absl::StrCat("job '", r.name, "' failed: ", r.error));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::cli
