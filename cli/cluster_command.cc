// `tandem cluster simulate`: run a workload of training jobs through a scheduling policy on a
// simulated GPU cluster (cluster/simulator.h) and print job completion times, makespan,
// utilisation and finish-time fairness.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/cluster_run.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cluster/application.h"
#include "cluster/cluster_file.h"
#include "cluster/metrics.h"
#include "cluster/policies.h"
#include "cluster/simulator.h"
#include "cluster/workload.h"
#include "common/file_util.h"
#include "common/status.h"

ABSL_FLAG(std::string, workload, "",
          "workload CSV: Pollux (name,time,application,num_replicas,batch_size), Philly "
          "(timestamp,duration,num_gpus,gpu_time,cluster) or Tiresias "
          "(job_id,num_gpu,submit_time,...)");
ABSL_FLAG(std::string, policy, "", "scheduling policy (fifo, tiresias, optimus, gavel, ...)");
ABSL_FLAG(int, gpus, 64, "GPUs in the cluster");
ABSL_FLAG(int, gpus_per_node, 4, "GPUs per node");
ABSL_FLAG(std::string, cluster_spec, "",
          "Tiresias cluster spec CSV (num_switch,num_node_p_switch,num_gpu_p_node,...); "
          "replaces --gpus and --gpus-per-node");
ABSL_FLAG(double, interval, 60, "scheduling round, seconds");
ABSL_FLAG(double, restart_seconds, 30, "pause of a job after each reallocation, seconds");
ABSL_FLAG(std::string, apps, "",
          "Pollux application traces (one folder per application); default: apps/ beside the "
          "workload's folder");
ABSL_FLAG(int, max_jobs, 0, "Philly traces: simulate only the first N jobs (0: all)");
ABSL_FLAG(int, max_rounds, 100000,
          "give up this many rounds after the last submission if jobs are still unfinished");
ABSL_DECLARE_FLAG(std::string, svg);      // defined with `tandem schedule`
ABSL_DECLARE_FLAG(std::string, cluster);  // defined with `tandem plan`

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<cluster::ApplicationCatalog> LoadApplications(const std::string& workload_path) {
  std::string apps = absl::GetFlag(FLAGS_apps);
  if (apps.empty()) {
    const fs::path beside = fs::path(workload_path).parent_path().parent_path() / "apps";
    std::error_code error;
    if (!fs::is_directory(beside, error)) {
      return absl::InvalidArgumentError(absl::StrCat(
          workload_path, " runs Pollux applications: give --apps DIR, the folder of their "
                         "traces (e.g. tests/data/cluster/pollux/apps)"));
    }
    apps = beside.string();
  }
  return cluster::LoadPolluxApplications(apps);
}

// The cluster: --cluster (heterogeneous, with device speeds), --cluster-spec (Tiresias's), or
// --gpus and --gpus-per-node.
absl::StatusOr<cluster::ClusterDescription> ClusterFromFlags() {
  const std::string file = absl::GetFlag(FLAGS_cluster);
  const std::string spec = absl::GetFlag(FLAGS_cluster_spec);
  if (!file.empty() && !spec.empty()) {
    return absl::InvalidArgumentError("give --cluster or --cluster-spec, not both");
  }
  // A cluster file says how many GPUs there are: --gpus beside it would be ignored.
  for (const char* flag : {"gpus", "gpus_per_node"}) {
    if ((!file.empty() || !spec.empty()) && FlagGivenOnCommandLine(flag)) {
      const std::string name = CommandLineFlag(flag);
      return absl::InvalidArgumentError(
          absl::StrCat(name, " and ", file.empty() ? "--cluster-spec " : "--cluster ",
                       file.empty() ? spec : file, " both give the cluster's GPUs: leave ", name,
                       " out (the file's are used)"));
    }
  }
  if (!file.empty()) return cluster::ReadClusterDescription(file);
  auto homogeneous = [](int nodes, int gpus_per_node) {
    cluster::ClusterDescription description;
    description.device_types.push_back(
        {cluster::kDefaultDeviceType, nodes, gpus_per_node, /*speed=*/1.0});
    return description;
  };
  if (!spec.empty()) {
    TANDEM_ASSIGN_OR_RETURN(cluster::ClusterView view, cluster::ReadTiresiasClusterSpec(spec));
    return homogeneous(static_cast<int>(view.nodes.size()), view.max_gpus_per_node());
  }
  const int gpus = absl::GetFlag(FLAGS_gpus);
  const int per_node = absl::GetFlag(FLAGS_gpus_per_node);
  if (gpus < 1 || per_node < 1) {
    return absl::InvalidArgumentError("--gpus and --gpus-per-node must be at least 1");
  }
  if (gpus % per_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--gpus (", gpus,
                                                   ") must be a multiple of --gpus-per-node (",
                                                   per_node, ")"));
  }
  return homogeneous(gpus / per_node, per_node);
}

// A progress line on a terminal, redrawn at most every 0.2 s.
class ProgressLine {
 public:
  ProgressLine() : enabled_(isatty(STDERR_FILENO) == 1) {}
  ~ProgressLine() {
    if (drawn_) std::fprintf(stderr, "\r%*s\r", 78, "");
  }
  void Update(const cluster::SimulationProgress& p) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    drawn_ = true;
    const int width = 30;
    const int done = p.total_jobs > 0 ? width * p.finished_jobs / p.total_jobs : width;
    std::fprintf(stderr, "\r[%s%s] %d/%d jobs, %.1f h simulated, %d GPUs busy ",
                 std::string(done, '#').c_str(), std::string(width - done, '.').c_str(),
                 p.finished_jobs, p.total_jobs, p.now_seconds / 3600, p.allocated_gpus);
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_;
};

absl::Status SimulateOrError() {
  const std::string path = absl::GetFlag(FLAGS_workload);
  if (path.empty()) return absl::InvalidArgumentError("missing --workload FILE");
  const std::string policy_name = absl::GetFlag(FLAGS_policy);
  if (policy_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "missing --policy NAME (", absl::StrJoin(cluster::PolicyNames(), ", "), ")"));
  }
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be text or json, got '", format, "'"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<cluster::Policy> policy,
                          cluster::MakePolicy(policy_name));
  TANDEM_ASSIGN_OR_RETURN(cluster::ClusterDescription description, ClusterFromFlags());
  const cluster::ClusterView view = description.View();
  cluster::PhillyOptions philly;
  philly.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  if (philly.max_jobs < 0) return absl::InvalidArgumentError("--max-jobs must not be negative");
  TANDEM_ASSIGN_OR_RETURN(cluster::Workload workload, cluster::ReadWorkload(path, philly));
  cluster::ApplyDeviceSpeeds(description, &workload);
  cluster::ApplicationCatalog apps;
  if (cluster::NeedsApplications(workload)) {
    TANDEM_ASSIGN_OR_RETURN(apps, LoadApplications(path));
  }
  cluster::SimulationOptions options;
  options.interval_seconds = absl::GetFlag(FLAGS_interval);
  options.restart_seconds = absl::GetFlag(FLAGS_restart_seconds);
  options.max_rounds = absl::GetFlag(FLAGS_max_rounds);
  if (!(options.interval_seconds > 0)) {
    return absl::InvalidArgumentError("--interval must be positive");
  }
  if (!(options.restart_seconds >= 0)) {
    return absl::InvalidArgumentError("--restart-seconds must not be negative");
  }
  if (options.max_rounds < 1) return absl::InvalidArgumentError("--max-rounds must be at least 1");
  const std::string svg = absl::GetFlag(FLAGS_svg);
  options.record_timeline = !svg.empty();
  absl::StatusOr<cluster::SimulationResult> result;
  {
    ProgressLine progress;
    options.on_round = [&progress](const cluster::SimulationProgress& p) { progress.Update(p); };
    result = cluster::Simulate(workload, apps, view, *policy, options);
  }
  if (!result.ok()) return result.status();
  const cluster::ClusterMetrics metrics = cluster::ComputeMetrics(*result);
  if (!svg.empty()) TANDEM_RETURN_IF_ERROR(WriteFileAtomically(svg, cluster::AllocationSvg(*result)));
  if (format == "json") {
    std::cout << cluster::MetricsToJson(*result, metrics).dump(2) << "\n";
  } else {
    std::cout << cluster::FormatMetrics(*result, metrics);
  }
  return absl::OkStatus();
}

int RunCluster(const std::vector<std::string>& args) {
  if (args.empty()) {
    return ReportError("cluster", absl::InvalidArgumentError(
                                      "missing subcommand: tandem cluster simulate|run ..."));
  }
  if (args[0] != "simulate" && args[0] != "run") {
    return ReportError("cluster",
                       absl::InvalidArgumentError(absl::StrCat(
                           "unknown subcommand '", args[0], "' (known: simulate, run)")));
  }
  if (args.size() > 1) {
    return ReportError("cluster", absl::InvalidArgumentError(
                                      absl::StrCat("unexpected argument '", args[1], "'")));
  }
  const absl::Status status = args[0] == "run" ? RunLiveClusterCommand() : SimulateOrError();
  if (!status.ok()) return ReportError("cluster", status);
  return kExitOk;
}

const CommandRegistrar registrar({
    .name = "cluster",
    .summary = "simulate a GPU cluster shared by training jobs under a scheduling policy",
    .usage =
        "tandem cluster simulate --workload FILE --policy NAME [--gpus 64]\n"
        "    [--gpus-per-node 4] [--cluster FILE | --cluster-spec FILE] [--interval 60]\n"
        "    [--restart-seconds 30]"
        " [--apps DIR] [--max-jobs N] [--max-rounds N] [--format text|json]\n"
        "    [--svg FILE]\n\n"
        "Replays a workload on a simulated cluster the way Pollux's simulator does: every\n"
        "--interval seconds jobs advance at the goodput measured for their placement and the\n"
        "policy reallocates GPUs; a job pauses --restart-seconds after each reallocation.\n"
        "Policies: fifo (first come first served, gangs, no preemption), tiresias (2D-LAS\n"
        "with discretised queues), optimus (greedy marginal gain with an oracle), pollux\n"
        "(goodput-driven genetic search with adaptive batch sizes), gavel\n"
        "(heterogeneity-aware max-min fairness in rounds; needs GLPK), tandem (goodput\n"
        "with adaptive batch sizes, GPU counts chosen exactly, node-aware placement; uses the\n"
        "planner's throughput for planned jobs), tandem-elastic (the same, knowing that the\n"
        "elastic layer shrinks a job live in about 2 s instead of a 30 s restart).\n"
        "--cluster FILE describes a heterogeneous cluster in JSON: {\"device_types\": [{\"name\":\n"
        "\"v100\", \"nodes\": 4, \"gpus_per_node\": 4, \"speed\": 1.0}, ...],\n"
        "\"application_speeds\": {\"cifar10\": {\"k80\": 0.1}}}; a job runs at its type's speed\n"
        "(the slowest type it spans). See tests/data/cluster/gavel/.\n"
        "Workloads: Pollux's (jobs of measured applications; their traces from --apps, by\n"
        "default apps/ beside the workload's folder), Philly's and Tiresias's traces\n"
        "(fixed-duration jobs that scale linearly up to their requested GPUs).\n"
        "Prints average, median and p99 job completion time, makespan, utilisation and\n"
        "finish-time fairness (docs/cluster.md); --format json adds every job's JCT; --svg\n"
        "draws each job's GPUs over time. A progress line appears on a terminal.\n\n"
        "Example:\n"
        "  tandem cluster simulate --workload tests/data/cluster/pollux/workloads/workload-1.csv \\\n"
        "      --policy tiresias\n\n" +
        std::string(kClusterRunUsage),
    .flags = {"workload", "policy", "gpus", "gpus_per_node", "cluster", "cluster_spec", "interval",
              "restart_seconds", "apps", "max_jobs", "max_rounds", "format", "svg",
              // tandem cluster run (cli/cluster_run_command.cc)
              "jobs", "hosts", "slots", "log_json", "work_dir", "deadline",
              "grow_through_checkpoint"},
    .run = RunCluster});

}  // namespace
}  // namespace tandem::cli
