#include "cluster/workload.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "cluster/internal/csv.h"
#include "common/printable.h"
#include "common/status.h"

namespace tandem::cluster {
namespace {

using internal::CsvTable;

void SortBySubmission(Workload* workload) {
  std::stable_sort(workload->jobs.begin(), workload->jobs.end(),
                   [](const WorkloadJob& a, const WorkloadJob& b) {
                     return a.submission_seconds < b.submission_seconds;
                   });
}

absl::Status PositiveGpus(const CsvTable& table, int row, long long gpus) {
  if (gpus < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(table.Where(row), "a job needs at least one GPU, got ", gpus));
  }
  return absl::OkStatus();
}

absl::StatusOr<Workload> PolluxFromTable(const CsvTable& table) {
  TANDEM_ASSIGN_OR_RETURN(
      std::vector<int> col,
      table.Columns({"name", "time", "application", "num_replicas", "batch_size"}));
  Workload workload;
  workload.source = table.path();
  for (int r = 0; r < table.rows(); ++r) {
    WorkloadJob job;
    job.name = table.Field(r, col[0]);
    if (job.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(table.Where(r), "empty job name"));
    }
    TANDEM_ASSIGN_OR_RETURN(job.submission_seconds, table.Number(r, col[1]));
    if (job.submission_seconds < 0) {
      return absl::InvalidArgumentError(absl::StrCat(table.Where(r), "negative time"));
    }
    job.application = table.Field(r, col[2]);
    if (job.application.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(table.Where(r), "empty application"));
    }
    TANDEM_ASSIGN_OR_RETURN(long long replicas, table.Integer(r, col[3]));
    TANDEM_RETURN_IF_ERROR(PositiveGpus(table, r, replicas));
    TANDEM_ASSIGN_OR_RETURN(long long batch, table.Integer(r, col[4]));
    if (batch < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(table.Where(r), "batch_size must be positive, got ", batch));
    }
    job.num_replicas = static_cast<int>(replicas);
    job.batch_size = static_cast<int>(batch);
    workload.jobs.push_back(std::move(job));
  }
  SortBySubmission(&workload);
  return workload;
}

absl::StatusOr<Workload> PhillyFromTable(const CsvTable& table, const PhillyOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<int> col,
                          table.Columns({"timestamp", "duration", "num_gpus", "cluster"}));
  Workload workload;
  workload.source = table.path();
  std::vector<std::pair<absl::Time, WorkloadJob>> jobs;
  for (int r = 0; r < table.rows(); ++r) {
    absl::Time time;
    std::string error;
    if (!absl::ParseTime("%Y-%m-%d %H:%M:%S", table.Field(r, col[0]), absl::UTCTimeZone(), &time,
                         &error)) {
      return absl::InvalidArgumentError(absl::StrCat(table.Where(r), "timestamp '",
                                                     table.Field(r, col[0]),
                                                     "': expected YYYY-MM-DD HH:MM:SS"));
    }
    WorkloadJob job;
    TANDEM_ASSIGN_OR_RETURN(job.duration_seconds, table.Number(r, col[1]));
    TANDEM_ASSIGN_OR_RETURN(long long gpus, table.Integer(r, col[2]));
    TANDEM_RETURN_IF_ERROR(PositiveGpus(table, r, gpus));
    if (job.duration_seconds < options.min_duration_seconds) continue;
    if (!options.cluster.empty() && table.Field(r, col[3]) != options.cluster) continue;
    job.num_replicas = static_cast<int>(gpus);
    job.name = absl::StrCat("philly-", table.Line(r));
    jobs.emplace_back(time, std::move(job));
  }
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  if (options.max_jobs > 0 && static_cast<int>(jobs.size()) > options.max_jobs) {
    jobs.resize(options.max_jobs);
  }
  for (auto& [time, job] : jobs) {
    job.submission_seconds = absl::ToDoubleSeconds(time - jobs.front().first);
    workload.jobs.push_back(std::move(job));
  }
  return workload;
}

absl::StatusOr<Workload> TiresiasFromTable(const CsvTable& table) {
  TANDEM_ASSIGN_OR_RETURN(
      std::vector<int> col,
      table.Columns({"job_id", "num_gpu", "submit_time", "model_name", "duration"}));
  Workload workload;
  workload.source = table.path();
  for (int r = 0; r < table.rows(); ++r) {
    WorkloadJob job;
    job.name = absl::StrCat(table.Field(r, col[3]), "-", table.Field(r, col[0]));
    TANDEM_ASSIGN_OR_RETURN(long long gpus, table.Integer(r, col[1]));
    TANDEM_RETURN_IF_ERROR(PositiveGpus(table, r, gpus));
    job.num_replicas = static_cast<int>(gpus);
    TANDEM_ASSIGN_OR_RETURN(job.submission_seconds, table.Number(r, col[2]));
    TANDEM_ASSIGN_OR_RETURN(job.duration_seconds, table.Number(r, col[4]));
    if (job.submission_seconds < 0 || job.duration_seconds <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          table.Where(r), "submit_time must be >= 0 and duration positive"));
    }
    workload.jobs.push_back(std::move(job));
  }
  SortBySubmission(&workload);
  return workload;
}

bool HasColumns(const CsvTable& table, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (!table.Column(name).ok()) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<Workload> ReadPolluxWorkload(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(CsvTable table, CsvTable::Read(path));
  return PolluxFromTable(table);
}

absl::StatusOr<Workload> ReadPhillyTrace(const std::string& path, const PhillyOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(CsvTable table, CsvTable::Read(path));
  return PhillyFromTable(table, options);
}

absl::StatusOr<Workload> ReadTiresiasTrace(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(CsvTable table, CsvTable::Read(path));
  return TiresiasFromTable(table);
}

absl::StatusOr<Workload> ReadWorkload(const std::string& path, const PhillyOptions& philly) {
  TANDEM_ASSIGN_OR_RETURN(CsvTable table, CsvTable::Read(path));
  if (HasColumns(table, {"application", "num_replicas", "batch_size"})) {
    return PolluxFromTable(table);
  }
  if (HasColumns(table, {"timestamp", "num_gpus", "gpu_time"})) return PhillyFromTable(table, philly);
  if (HasColumns(table, {"job_id", "num_gpu", "submit_time"})) return TiresiasFromTable(table);
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": unknown workload format (header ", Printable(absl::StrJoin(table.header(), ","), 200),
      "); expected Pollux (name,time,application,num_replicas,batch_size), Philly "
      "(timestamp,duration,num_gpus,gpu_time,cluster) or Tiresias "
      "(job_id,num_gpu,submit_time,iterations,model_name,duration,interval)"));
}

absl::StatusOr<ClusterView> ReadTiresiasClusterSpec(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(CsvTable table, CsvTable::Read(path));
  TANDEM_ASSIGN_OR_RETURN(std::vector<int> col,
                          table.Columns({"num_switch", "num_node_p_switch", "num_gpu_p_node"}));
  if (table.rows() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected one row, got ", table.rows()));
  }
  TANDEM_ASSIGN_OR_RETURN(long long switches, table.Integer(0, col[0]));
  TANDEM_ASSIGN_OR_RETURN(long long nodes, table.Integer(0, col[1]));
  TANDEM_ASSIGN_OR_RETURN(long long gpus, table.Integer(0, col[2]));
  if (switches < 1 || nodes < 1 || gpus < 1 || switches * nodes > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat(table.Where(0), "switches, nodes and GPUs must be positive"));
  }
  return ClusterView::Homogeneous(static_cast<int>(switches * nodes), static_cast<int>(gpus));
}

bool NeedsApplications(const Workload& workload) {
  for (const WorkloadJob& job : workload.jobs) {
    if (!job.application.empty()) return true;
  }
  return false;
}

absl::Status ValidateWorkload(const Workload& workload, const ApplicationCatalog& applications,
                              const ClusterView& cluster) {
  if (workload.jobs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(workload.source, ": no jobs"));
  }
  const int total = cluster.total_gpus();
  absl::flat_hash_set<std::string> names;
  for (const WorkloadJob& job : workload.jobs) {
    const std::string where = absl::StrCat(workload.source, ": job ", job.name, ": ");
    if (!names.insert(job.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "duplicate job name"));
    }
    if (job.num_replicas < 1) {
      return absl::InvalidArgumentError(absl::StrCat(where, "needs at least one GPU"));
    }
    if (job.num_replicas > total) {
      return absl::InvalidArgumentError(absl::StrCat(where, "asks for ", job.num_replicas,
                                                     " GPUs but the cluster has ", total));
    }
    if (job.application.empty()) {
      if (!(job.duration_seconds > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(where, "needs a positive duration"));
      }
      if (job.planned != nullptr) {
        const int per_node = std::max(1, job.planned->gpus_per_node);
        const int nodes = (job.num_replicas + per_node - 1) / per_node;
        if (!(job.planned->SamplesPerSecond(nodes, job.num_replicas) > 0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, "the plan has no throughput on its ", job.num_replicas, " GPUs"));
        }
      }
      continue;
    }
    auto found = applications.find(job.application);
    if (found == applications.end()) {
      std::vector<std::string> known;
      for (const auto& [name, app] : applications) known.push_back(name);
      return absl::InvalidArgumentError(absl::StrCat(where, "unknown application '",
                                                     job.application, "' (known: ",
                                                     absl::StrJoin(known, ", "), ")"));
    }
    const Application& app = *found->second;
    if (job.batch_size < app.init_batch_size() || job.batch_size > app.max_batch_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "batch size ", job.batch_size, " outside ", app.name(), "'s validated range [",
          app.init_batch_size(), ", ", app.max_batch_size(), "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::cluster
