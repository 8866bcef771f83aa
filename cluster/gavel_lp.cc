#include "cluster/gavel_lp.h"

#include <glpk.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem::cluster {
namespace {

// A fixed job's level is imposed with this relative slack, so that a level the solver just
// reached stays feasible despite its own tolerances (GLPK's are about 1e-7).
constexpr double kLevelSlack = 1e-7;
// A link row (s[j] >= t) whose dual value exceeds this is taken to bind in every optimum. The
// duals of the unfixed jobs' link rows sum to 1, so the largest is at least 1 / jobs.
constexpr double kBottleneckDual = 1e-9;
// Time shares at or below this are treated as zero by AssignRound.
constexpr double kShareEpsilon = 1e-9;

bool CanRun(const GavelProblem& problem, int job, int type) {
  return problem.throughput[job][type] > 0 &&
         problem.scale_factor[job] <= problem.devices_per_type[type];
}

double Weight(const GavelProblem& problem, int job) {
  return problem.priority_weight.empty() ? 1.0 : problem.priority_weight[job];
}

int Count(const GavelProblem& problem, int job) {
  return problem.job_count.empty() ? 1 : problem.job_count[job];
}

// Throughput of each job in its equal share (see the header).
std::vector<double> EqualShareThroughput(const GavelProblem& problem) {
  const int jobs = static_cast<int>(problem.throughput.size());
  const int types = static_cast<int>(problem.devices_per_type.size());
  double total_devices = 0;
  for (int devices : problem.devices_per_type) total_devices += devices;
  double total_jobs = 0;
  for (int j = 0; j < jobs; ++j) total_jobs += Count(problem, j);
  std::vector<double> equal_share(jobs, 0.0);
  for (int j = 0; j < jobs; ++j) {
    for (int k = 0; k < types; ++k) {
      if (!CanRun(problem, j, k)) continue;
      const double devices = problem.devices_per_type[k];
      const double share = std::min(devices / total_devices,
                                    devices / (total_jobs * problem.scale_factor[j]));
      equal_share[j] += problem.throughput[j][k] * share;
    }
  }
  return equal_share;
}

std::string SimplexCodeName(int code) {
  switch (code) {
    case GLP_EBADB: return "invalid basis";
    case GLP_ESING: return "singular basis matrix";
    case GLP_ECOND: return "ill-conditioned basis matrix";
    case GLP_EBOUND: return "invalid bounds";
    case GLP_EFAIL: return "solver failed";
    case GLP_EOBJLL: return "objective lower limit reached";
    case GLP_EOBJUL: return "objective upper limit reached";
    case GLP_EITLIM: return "iteration limit exceeded";
    case GLP_ETMLIM: return "time limit exceeded";
    case GLP_ENOPFS: return "no primal feasible solution";
    case GLP_ENODFS: return "no dual feasible solution";
    default: return "unknown";
  }
}

std::string StatusName(int status) {
  switch (status) {
    case GLP_UNDEF: return "undefined";
    case GLP_FEAS: return "feasible";
    case GLP_INFEAS: return "infeasible";
    case GLP_NOFEAS: return "no feasible solution";
    case GLP_OPT: return "optimal";
    case GLP_UNBND: return "unbounded";
    default: return "unknown";
  }
}

// Silences GLPK's terminal output for its lifetime and restores the previous setting (GLPK's
// environment is per thread in Debian's build).
class QuietGlpk {
 public:
  QuietGlpk() : previous_(glp_term_out(GLP_OFF)) {}
  ~QuietGlpk() { glp_term_out(previous_); }
  QuietGlpk(const QuietGlpk&) = delete;
  QuietGlpk& operator=(const QuietGlpk&) = delete;

 private:
  int previous_;
};

// The max-min LP as one GLPK problem, changed in place between the levels of water-filling so
// that each solve starts from the previous optimal basis.
//
// Columns: X[j][k], then one level column s[j] per job, then t. Rows, per job: fairness
// sum_k a[j][k] X[j][k] - s[j] >= 0, link s[j] - t >= 0, time sum_k X[j][k] <= 1; per type:
// capacity. Fixing job j only changes bounds (s[j] fixed at its level, its link row free), so
// the previous basis stays valid.
class FairnessLp {
 public:
  FairnessLp(const GavelProblem& problem, const std::vector<double>& equal_share)
      : problem_(problem),
        jobs_(static_cast<int>(problem.throughput.size())),
        types_(static_cast<int>(problem.devices_per_type.size())),
        lp_(glp_create_prob()) {
    coefficient_.assign(jobs_, std::vector<double>(types_, 0.0));
    for (int j = 0; j < jobs_; ++j) {
      for (int k = 0; k < types_; ++k) {
        if (CanRun(problem, j, k)) {
          coefficient_[j][k] = problem.throughput[j][k] / (Weight(problem, j) * equal_share[j]);
        }
      }
    }
    Build();
  }

  // Maximise t over the jobs not yet fixed.
  absl::Status MaximizeLevel(double* level) {
    if (absl::Status status = Solve(); !status.ok()) return status;
    *level = glp_get_obj_val(lp_.get());
    return absl::OkStatus();
  }

  // After MaximizeLevel: the dual value of job j's link row s[j] >= t (0 when it does not
  // bind). The duals of the unfixed jobs' link rows sum to 1.
  double LinkDual(int j) const { return std::fabs(glp_get_row_dual(lp_.get(), LinkRow(j))); }

  // Job j keeps at least `level` from now on, independently of t.
  void Fix(int j, double level) {
    glp_set_col_bnds(lp_.get(), LevelColumn(j), GLP_FX, level * (1 - kLevelSlack), 0.0);
    glp_set_row_bnds(lp_.get(), LinkRow(j), GLP_FR, 0.0, 0.0);
  }

  std::vector<std::vector<double>> TimeShare() const {
    std::vector<std::vector<double>> share(jobs_, std::vector<double>(types_, 0.0));
    for (int j = 0; j < jobs_; ++j) {
      for (int k = 0; k < types_; ++k) {
        share[j][k] = std::clamp(glp_get_col_prim(lp_.get(), XColumn(j, k)), 0.0, 1.0);
      }
    }
    return share;
  }

 private:
  struct Deleter {
    void operator()(glp_prob* lp) const { glp_delete_prob(lp); }
  };

  int XColumn(int j, int k) const { return 1 + j * types_ + k; }
  int LevelColumn(int j) const { return 1 + jobs_ * types_ + j; }
  int TColumn() const { return 1 + jobs_ * types_ + jobs_; }
  int FairnessRow(int j) const { return 1 + j; }
  int LinkRow(int j) const { return 1 + jobs_ + j; }
  int TimeRow(int j) const { return 1 + 2 * jobs_ + j; }
  int CapacityRow(int k) const { return 1 + 3 * jobs_ + k; }

  void Build() {
    glp_prob* lp = lp_.get();
    glp_set_obj_dir(lp, GLP_MAX);
    glp_add_cols(lp, jobs_ * types_ + jobs_ + 1);
    for (int j = 0; j < jobs_; ++j) {
      for (int k = 0; k < types_; ++k) {
        if (coefficient_[j][k] > 0) {
          glp_set_col_bnds(lp, XColumn(j, k), GLP_DB, 0.0, 1.0);
        } else {
          glp_set_col_bnds(lp, XColumn(j, k), GLP_FX, 0.0, 0.0);
        }
      }
    }
    for (int j = 0; j < jobs_; ++j) glp_set_col_bnds(lp, LevelColumn(j), GLP_LO, 0.0, 0.0);
    glp_set_col_bnds(lp, TColumn(), GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(lp, TColumn(), 1.0);

    glp_add_rows(lp, 3 * jobs_ + types_);
    std::vector<int> row(1), column(1);  // 1-based triplets
    std::vector<double> value(1);
    auto add = [&](int r, int c, double v) {
      row.push_back(r);
      column.push_back(c);
      value.push_back(v);
    };
    for (int j = 0; j < jobs_; ++j) {
      glp_set_row_bnds(lp, FairnessRow(j), GLP_LO, 0.0, 0.0);
      glp_set_row_bnds(lp, LinkRow(j), GLP_LO, 0.0, 0.0);
      glp_set_row_bnds(lp, TimeRow(j), GLP_UP, 0.0, 1.0);
      for (int k = 0; k < types_; ++k) {
        if (coefficient_[j][k] <= 0) continue;
        add(FairnessRow(j), XColumn(j, k), coefficient_[j][k]);
        add(TimeRow(j), XColumn(j, k), 1.0);
        add(CapacityRow(k), XColumn(j, k),
            static_cast<double>(problem_.scale_factor[j]) * Count(problem_, j));
      }
      add(FairnessRow(j), LevelColumn(j), -1.0);
      add(LinkRow(j), LevelColumn(j), 1.0);
      add(LinkRow(j), TColumn(), -1.0);
    }
    for (int k = 0; k < types_; ++k) {
      glp_set_row_bnds(lp, CapacityRow(k), GLP_UP, 0.0, problem_.devices_per_type[k]);
    }
    glp_load_matrix(lp, static_cast<int>(row.size()) - 1, row.data(), column.data(),
                    value.data());
  }

  // The first solve presolves; later ones start from the previous optimal basis and fall back
  // to presolving from scratch if that fails.
  absl::Status Solve() {
    glp_smcp parameters;
    glp_init_smcp(&parameters);
    parameters.msg_lev = GLP_MSG_OFF;
    parameters.presolve = solved_once_ ? GLP_OFF : GLP_ON;
    // Fixing a job keeps the previous basis primal feasible (its level column is fixed where it
    // stood, its link row freed), so the primal simplex continues from it in a few pivots.
    parameters.meth = GLP_PRIMAL;
    int code = glp_simplex(lp_.get(), &parameters);
    if (code != 0 && solved_once_) {
      parameters.presolve = GLP_ON;
      code = glp_simplex(lp_.get(), &parameters);
    }
    ++solves_;
    if (code != 0) {
      return absl::InternalError(absl::StrFormat(
          "GLPK glp_simplex returned %d (%s) in LP %d of the max-min fairness problem (%d jobs, "
          "%d device types)",
          code, SimplexCodeName(code), solves_, jobs_, types_));
    }
    const int status = glp_get_status(lp_.get());
    if (status != GLP_OPT) {
      return absl::InternalError(absl::StrFormat(
          "GLPK glp_simplex ended with status %d (%s) in LP %d of the max-min fairness problem "
          "(%d jobs, %d device types)",
          status, StatusName(status), solves_, jobs_, types_));
    }
    solved_once_ = true;
    return absl::OkStatus();
  }

  const GavelProblem& problem_;
  const int jobs_;
  const int types_;
  std::vector<std::vector<double>> coefficient_;  // throughput / (weight * equal share)
  std::unique_ptr<glp_prob, Deleter> lp_;
  bool solved_once_ = false;
  int solves_ = 0;
};

}  // namespace

absl::Status ValidateGavelProblem(const GavelProblem& problem) {
  const size_t jobs = problem.throughput.size();
  const size_t types = problem.devices_per_type.size();
  if (types == 0 && jobs > 0) {
    return absl::InvalidArgumentError("devices_per_type is empty: no device types");
  }
  for (size_t k = 0; k < types; ++k) {
    if (problem.devices_per_type[k] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "device type %d: devices_per_type is %d, must be >= 0", k, problem.devices_per_type[k]));
    }
  }
  if (problem.scale_factor.size() != jobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "scale_factor has %d entries for %d jobs", problem.scale_factor.size(), jobs));
  }
  if (!problem.job_count.empty() && problem.job_count.size() != jobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "job_count has %d entries for %d rows (leave it empty for one job per row)",
        problem.job_count.size(), jobs));
  }
  if (!problem.priority_weight.empty() && problem.priority_weight.size() != jobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "priority_weight has %d entries for %d jobs (leave it empty for all 1)",
        problem.priority_weight.size(), jobs));
  }
  for (size_t j = 0; j < jobs; ++j) {
    const std::vector<double>& row = problem.throughput[j];
    if (row.size() != types) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job %d: throughput row has %d entries, expected %d (one per device type)", j,
          row.size(), types));
    }
    for (size_t k = 0; k < types; ++k) {
      if (!std::isfinite(row[k]) || row[k] < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "job %d: throughput on device type %d is %g, must be finite and >= 0", j, k, row[k]));
      }
    }
    if (!problem.job_count.empty() && problem.job_count[j] < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("job %d: job_count is %d, must be >= 1", j, problem.job_count[j]));
    }
    if (problem.scale_factor[j] < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job %d: scale_factor is %d, must be >= 1", j, problem.scale_factor[j]));
    }
    const double weight = Weight(problem, static_cast<int>(j));
    if (!std::isfinite(weight) || weight <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job %d: priority_weight is %g, must be finite and > 0", j, weight));
    }
    bool runs_somewhere = false;
    for (size_t k = 0; k < types; ++k) {
      runs_somewhere = runs_somewhere || CanRun(problem, static_cast<int>(j), static_cast<int>(k));
    }
    if (!runs_somewhere) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job %d can run on no device type: it needs a positive throughput on a type with at "
          "least scale_factor = %d devices",
          j, problem.scale_factor[j]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GavelSolution> SolveMaxMinFairness(const GavelProblem& problem,
                                                  const GavelOptions& options) {
  if (absl::Status status = ValidateGavelProblem(problem); !status.ok()) return status;
  GavelSolution solution;
  const int jobs = static_cast<int>(problem.throughput.size());
  if (jobs == 0) return solution;

  QuietGlpk quiet;
  solution.equal_share_throughput = EqualShareThroughput(problem);
  FairnessLp lp(problem, solution.equal_share_throughput);

  std::vector<int> unfixed(jobs);
  for (int j = 0; j < jobs; ++j) unfixed[j] = j;
  bool first = true;
  while (!unfixed.empty()) {
    double level = 0;
    if (absl::Status status = lp.MaximizeLevel(&level); !status.ok()) return status;
    solution.time_share = lp.TimeShare();
    if (first) solution.objective = level;
    first = false;
    if (!options.water_filling) break;

    // A job whose link row s[j] >= t has a positive dual value cannot exceed `level` in any
    // optimum (strict complementarity), so it is fixed there. Bottlenecked jobs whose dual happens to
    // be zero in this basis stay unfixed; the next solve returns the same level and fixes them.
    std::vector<int> still_unfixed;
    for (int j : unfixed) {
      if (lp.LinkDual(j) > kBottleneckDual) {
        lp.Fix(j, level);
      } else {
        still_unfixed.push_back(j);
      }
    }
    // The duals sum to 1, so this cannot happen unless the solver misbehaves; keep the current
    // level's allocation rather than loop.
    if (still_unfixed.size() == unfixed.size()) break;
    unfixed = std::move(still_unfixed);
  }

  const int types = static_cast<int>(problem.devices_per_type.size());
  solution.normalized_throughput.assign(jobs, 0.0);
  for (int j = 0; j < jobs; ++j) {
    double throughput = 0;
    for (int k = 0; k < types; ++k) {
      if (CanRun(problem, j, k)) throughput += problem.throughput[j][k] * solution.time_share[j][k];
    }
    solution.normalized_throughput[j] = throughput / solution.equal_share_throughput[j];
  }
  return solution;
}

absl::StatusOr<std::vector<int>> AssignRound(
    const GavelProblem& problem, const GavelSolution& solution,
    const std::vector<std::vector<double>>& rounds_received) {
  if (absl::Status status = ValidateGavelProblem(problem); !status.ok()) return status;
  const int jobs = static_cast<int>(problem.throughput.size());
  const int types = static_cast<int>(problem.devices_per_type.size());
  for (int j = 0; j < jobs; ++j) {
    if (Count(problem, j) != 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "AssignRound takes one row per job; row %d has job_count %d", j, Count(problem, j)));
    }
  }
  if (static_cast<int>(solution.time_share.size()) != jobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "solution has time shares for %d jobs, the problem has %d", solution.time_share.size(),
        jobs));
  }
  if (static_cast<int>(rounds_received.size()) != jobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rounds_received has %d rows, the problem has %d jobs", rounds_received.size(), jobs));
  }
  for (int j = 0; j < jobs; ++j) {
    if (static_cast<int>(solution.time_share[j].size()) != types) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job %d: solution has %d time shares, expected %d (one per device type)", j,
          solution.time_share[j].size(), types));
    }
    if (static_cast<int>(rounds_received[j].size()) != types) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "job %d: rounds_received has %d entries, expected %d (one per device type)", j,
          rounds_received[j].size(), types));
    }
    for (int k = 0; k < types; ++k) {
      if (!std::isfinite(rounds_received[j][k]) || rounds_received[j][k] < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "job %d: rounds_received on device type %d is %g, must be finite and >= 0", j, k,
            rounds_received[j][k]));
      }
    }
  }

  struct Entry {
    int job;
    int type;
    bool never_run;  // no rounds there yet: ahead of every job that has some
    double priority;  // share / rounds when !never_run; for leftovers, speed relative to best
    double share;
  };
  std::vector<Entry> allocated, leftover;
  for (int j = 0; j < jobs; ++j) {
    const double fastest =
        *std::max_element(problem.throughput[j].begin(), problem.throughput[j].end());
    for (int k = 0; k < types; ++k) {
      if (!CanRun(problem, j, k)) continue;
      const double share = solution.time_share[j][k];
      const double rounds = rounds_received[j][k];
      if (share > kShareEpsilon) {
        allocated.push_back({j, k, rounds == 0, rounds == 0 ? share : share / rounds, share});
      } else {
        leftover.push_back({j, k, false, problem.throughput[j][k] / fastest, 0.0});
      }
    }
  }
  auto before = [](const Entry& a, const Entry& b) {
    if (a.never_run != b.never_run) return a.never_run;
    if (a.priority != b.priority) return a.priority > b.priority;
    if (a.share != b.share) return a.share > b.share;
    if (a.job != b.job) return a.job < b.job;
    return a.type < b.type;
  };
  std::sort(allocated.begin(), allocated.end(), before);
  std::sort(leftover.begin(), leftover.end(), before);

  std::vector<int> placement(jobs, -1);
  std::vector<int> free_devices = problem.devices_per_type;
  for (const std::vector<Entry>* queue : {&allocated, &leftover}) {
    for (const Entry& entry : *queue) {
      if (placement[entry.job] != -1) continue;
      const int needed = problem.scale_factor[entry.job];
      if (free_devices[entry.type] < needed) continue;
      free_devices[entry.type] -= needed;
      placement[entry.job] = entry.type;
    }
  }
  return placement;
}

}  // namespace tandem::cluster
