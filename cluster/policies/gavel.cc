// Gavel (Narayanan et al., OSDI'20): heterogeneity-aware max-min fairness, scheduled in rounds.
//
// Device types are the cluster's distinct NodeView::device_type values. A job's throughput on
// a type is its JobView::device_throughput entry (1 when absent), with its requested GPUs as
// its scale factor. When the set of active jobs changes, the policy solves Gavel's max-min
// fairness LP (cluster/gavel_lp.h) for time shares X[j][k]. Every `round_seconds` it picks who
// runs with Gavel's round-based mechanism (AssignRound) and places each gang on nodes of its
// type; between rounds running jobs keep their GPUs and free GPUs go to waiting jobs the same
// way.
//
// Priorities: Gavel orders jobs by X / (fraction of time received since its last reset) and
// breaks ties by a deficit carried across resets. Here each job keeps, per type, the seconds it
// was entitled to (the integral of X over the time it was active, under the shares then in
// force) and the seconds it ran; its priority is entitled / received, a job that never ran on
// a type coming first. Re-solving then needs no reset, which matters when jobs arrive every
// round.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cluster/gavel_lp.h"
#include "cluster/policies.h"
#include "common/status.h"

namespace tandem::cluster {
namespace {

constexpr double kTimeEpsilon = 1e-6;

class GavelPolicy : public Policy {
 public:
  explicit GavelPolicy(const GavelPolicyOptions& options) : options_(options) {}

  std::string name() const override { return "gavel"; }
  BatchSizeMode batch_size_mode() const override {
    return BatchSizeMode::kFixedReplicasAndBatch;
  }

  absl::StatusOr<Allocations> Optimize(const std::vector<JobView>& jobs,
                                       const ClusterView& cluster, const Allocations& current,
                                       double now_seconds) override {
    // Device types in order of first appearance, and the type of every node.
    std::vector<std::string> types;
    std::vector<int> node_type(cluster.nodes.size());
    std::vector<int> devices;
    for (size_t n = 0; n < cluster.nodes.size(); ++n) {
      const std::string& type = cluster.nodes[n].device_type;
      auto found = std::find(types.begin(), types.end(), type);
      node_type[n] = static_cast<int>(found - types.begin());
      if (found == types.end()) {
        types.push_back(type);
        devices.push_back(0);
      }
      devices[node_type[n]] += cluster.nodes[n].gpus;
    }
    const int num_types = static_cast<int>(types.size());
    const int num_jobs = static_cast<int>(jobs.size());

    Account(jobs, cluster, node_type, current, num_types, now_seconds);

    GavelProblem problem;
    problem.devices_per_type = devices;
    std::vector<std::string> names;
    for (const JobView& job : jobs) {
      names.push_back(job.name);
      std::vector<double> row(num_types, 1.0);
      for (int k = 0; k < num_types; ++k) {
        auto found = job.device_throughput.find(types[k]);
        if (found != job.device_throughput.end()) row[k] = found->second;
      }
      problem.throughput.push_back(std::move(row));
      problem.scale_factor.push_back(std::max(1, job.requested_replicas));
    }
    for (int j = 0; j < num_jobs; ++j) {
      bool fits = false;
      for (int k = 0; k < num_types; ++k) {
        fits = fits || (problem.throughput[j][k] > 0 && problem.scale_factor[j] <= devices[k]);
      }
      if (!fits) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gavel: job ", jobs[j].name, " needs ", problem.scale_factor[j],
            " GPUs of one device type with a positive throughput; no type has that many"));
      }
    }
    if (names != solved_names_ || num_types != solved_types_) {
      TANDEM_ASSIGN_OR_RETURN(time_share_, SolveByClass(problem));
      solved_names_ = names;
      solved_types_ = num_types;
    }
    for (int j = 0; j < num_jobs; ++j) share_[jobs[j].name] = time_share_[j];

    // A new round reassigns everybody; between rounds running jobs stay (pinned) and the
    // others compete for the free GPUs.
    const bool new_round = !round_started_ ||
                           now_seconds - round_start_ >= options_.round_seconds - kTimeEpsilon;
    if (new_round) {
      round_started_ = true;
      round_start_ = now_seconds;
    }
    Allocations next;
    std::vector<int> free_devices = devices;
    std::vector<bool> pinned(num_jobs, false);
    if (!new_round) {
      for (int j = 0; j < num_jobs; ++j) {
        auto found = current.find(jobs[j].name);
        if (found == current.end() || found->second.empty()) continue;
        pinned[j] = true;
        next[jobs[j].name] = found->second;
        for (int node : found->second) --free_devices[node_type[node]];
      }
    }
    // The round's assignment over the unpinned jobs.
    std::vector<int> waiting;
    for (int j = 0; j < num_jobs; ++j) {
      if (!pinned[j]) waiting.push_back(j);
    }
    GavelProblem round;
    GavelSolution shares;
    std::vector<std::vector<double>> rounds_received;
    for (int k = 0; k < num_types; ++k) {
      round.devices_per_type.push_back(std::max(0, free_devices[k]));
    }
    for (int j : waiting) {
      round.throughput.push_back(problem.throughput[j]);
      round.scale_factor.push_back(problem.scale_factor[j]);
      shares.time_share.push_back(time_share_[j]);
      rounds_received.push_back(EffectiveRounds(jobs[j].name, time_share_[j]));
    }
    // AssignRound refuses jobs that fit nowhere; with pinned jobs holding GPUs, those simply
    // wait this round.
    std::vector<int> candidates;
    {
      GavelProblem fitting;
      fitting.devices_per_type = round.devices_per_type;
      GavelSolution fitting_shares;
      std::vector<std::vector<double>> fitting_rounds;
      for (size_t i = 0; i < waiting.size(); ++i) {
        bool fits = false;
        for (int k = 0; k < num_types; ++k) {
          fits = fits || (round.throughput[i][k] > 0 &&
                          round.scale_factor[i] <= round.devices_per_type[k]);
        }
        if (!fits) continue;
        candidates.push_back(waiting[i]);
        fitting.throughput.push_back(round.throughput[i]);
        fitting.scale_factor.push_back(round.scale_factor[i]);
        fitting_shares.time_share.push_back(shares.time_share[i]);
        fitting_rounds.push_back(rounds_received[i]);
      }
      round = std::move(fitting);
      shares = std::move(fitting_shares);
      rounds_received = std::move(fitting_rounds);
    }
    std::vector<int> chosen_type;
    if (!candidates.empty()) {
      TANDEM_ASSIGN_OR_RETURN(chosen_type, AssignRound(round, shares, rounds_received));
    }

    // Placement: a job assigned the type it already runs on keeps its GPUs; the others are
    // packed onto nodes of their type, widest gangs first.
    std::vector<int> free_gpus = FreeGpus(cluster, next);
    std::vector<std::pair<int, int>> to_place;  // (job, type)
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (chosen_type[i] < 0) continue;
      const JobView& job = jobs[candidates[i]];
      auto found = current.find(job.name);
      const bool keep =
          found != current.end() &&
          static_cast<int>(found->second.size()) == round.scale_factor[i] &&
          std::all_of(found->second.begin(), found->second.end(),
                      [&](int node) { return node_type[node] == chosen_type[i]; });
      if (keep) {
        next[job.name] = found->second;
        for (int node : found->second) --free_gpus[node];
      } else {
        to_place.emplace_back(candidates[i], chosen_type[i]);
      }
    }
    std::stable_sort(to_place.begin(), to_place.end(), [&](const auto& a, const auto& b) {
      return problem.scale_factor[a.first] > problem.scale_factor[b.first];
    });
    for (const auto& [j, type] : to_place) {
      TANDEM_ASSIGN_OR_RETURN(next[jobs[j].name],
                              PackOnType(problem.scale_factor[j], type, node_type, &free_gpus));
    }
    return next;
  }

 private:
  struct JobState {
    std::vector<double> entitled_seconds;  // integral of the time share, per type
    std::vector<double> received_seconds;  // time run, per type
  };

  // Charges the time since the last call: what each job was entitled to under the shares in
  // force, and where it ran. Forgets finished jobs.
  void Account(const std::vector<JobView>& jobs, const ClusterView& cluster,
               const std::vector<int>& node_type, const Allocations& current, int num_types,
               double now_seconds) {
    const double elapsed = last_now_.has_value() ? std::max(0.0, now_seconds - *last_now_) : 0.0;
    last_now_ = now_seconds;
    absl::flat_hash_map<std::string, JobState> state;
    absl::flat_hash_map<std::string, std::vector<double>> share;
    for (const JobView& job : jobs) {
      JobState& s = state[job.name];
      auto previous = state_.find(job.name);
      if (previous != state_.end() &&
          static_cast<int>(previous->second.entitled_seconds.size()) == num_types) {
        s = std::move(previous->second);
      } else {
        s.entitled_seconds.assign(num_types, 0.0);
        s.received_seconds.assign(num_types, 0.0);
      }
      auto had_share = share_.find(job.name);
      if (had_share != share_.end() && static_cast<int>(had_share->second.size()) == num_types) {
        for (int k = 0; k < num_types; ++k) {
          s.entitled_seconds[k] += had_share->second[k] * elapsed;
        }
        share[job.name] = had_share->second;
      }
      auto running = current.find(job.name);
      if (running != current.end() && !running->second.empty() &&
          running->second.front() < static_cast<int>(cluster.nodes.size())) {
        s.received_seconds[node_type[running->second.front()]] += elapsed;
      }
    }
    state_ = std::move(state);
    share_ = std::move(share);
  }

  // The LP over classes of identical jobs (same throughputs and scale factor; see
  // GavelProblem::job_count), its time shares handed back per job. At scale most jobs share a
  // class (Philly's have only their GPU count), so the LP stays small.
  absl::StatusOr<std::vector<std::vector<double>>> SolveByClass(const GavelProblem& problem) {
    GavelProblem classes;
    classes.devices_per_type = problem.devices_per_type;
    std::map<std::pair<std::vector<double>, int>, int> class_of;
    std::vector<int> job_class;
    for (size_t j = 0; j < problem.throughput.size(); ++j) {
      auto [it, added] = class_of.emplace(
          std::make_pair(problem.throughput[j], problem.scale_factor[j]),
          static_cast<int>(classes.throughput.size()));
      if (added) {
        classes.throughput.push_back(problem.throughput[j]);
        classes.scale_factor.push_back(problem.scale_factor[j]);
        classes.job_count.push_back(0);
      }
      ++classes.job_count[it->second];
      job_class.push_back(it->second);
    }
    GavelOptions lp_options;
    lp_options.water_filling = options_.water_filling;
    TANDEM_ASSIGN_OR_RETURN(GavelSolution solution, SolveMaxMinFairness(classes, lp_options));
    std::vector<std::vector<double>> time_share;
    for (int c : job_class) time_share.push_back(solution.time_share[c]);
    return time_share;
  }

  // rounds_received for AssignRound such that its priority share / rounds equals
  // entitled / received (with the coming round counted as entitled), and 0 (never ran) where
  // the job has not run on the type.
  std::vector<double> EffectiveRounds(const std::string& name,
                                      const std::vector<double>& share) const {
    const JobState& s = state_.at(name);
    std::vector<double> rounds(share.size(), 0.0);
    for (size_t k = 0; k < share.size(); ++k) {
      const double received = s.received_seconds[k];
      if (received <= 0) continue;
      const double entitled = s.entitled_seconds[k] + share[k] * options_.round_seconds;
      rounds[k] = received * share[k] / std::max(entitled, 1e-12);
      if (!std::isfinite(rounds[k])) rounds[k] = 1e12;
    }
    return rounds;
  }

  // `gpus` GPUs on nodes of `type`: the fullest node that holds them all, else from the nodes
  // of that type with most free GPUs.
  static absl::StatusOr<Allocation> PackOnType(int gpus, int type,
                                               const std::vector<int>& node_type,
                                               std::vector<int>* free) {
    int best = -1;
    for (size_t n = 0; n < free->size(); ++n) {
      if (node_type[n] != type || (*free)[n] < gpus) continue;
      if (best < 0 || (*free)[n] < (*free)[best]) best = static_cast<int>(n);
    }
    if (best >= 0) {
      (*free)[best] -= gpus;
      return Allocation(gpus, best);
    }
    // Other types' nodes are hidden from the spread.
    std::vector<int> of_type(free->size(), 0);
    for (size_t n = 0; n < free->size(); ++n) {
      if (node_type[n] == type) of_type[n] = (*free)[n];
    }
    absl::StatusOr<Allocation> allocation = TakeFromMostFree(gpus, &of_type);
    if (!allocation.ok()) {
      return absl::InternalError(absl::StrCat("gavel: placing a gang of ", gpus,
                                              " GPUs on its device type: ",
                                              allocation.status().message()));
    }
    for (int node : *allocation) --(*free)[node];
    return allocation;
  }

  GavelPolicyOptions options_;
  absl::flat_hash_map<std::string, JobState> state_;
  absl::flat_hash_map<std::string, std::vector<double>> share_;  // time shares in force
  std::vector<std::vector<double>> time_share_;  // per job of solved_names_, per type
  std::vector<std::string> solved_names_;
  int solved_types_ = 0;
  std::optional<double> last_now_;
  bool round_started_ = false;
  double round_start_ = 0;
};

}  // namespace

bool GavelPolicyAvailable() { return true; }

absl::StatusOr<std::unique_ptr<Policy>> MakeGavelPolicy(const GavelPolicyOptions& options) {
  if (!(options.round_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gavel: round_seconds must be positive, got ", options.round_seconds));
  }
  return std::make_unique<GavelPolicy>(options);
}

}  // namespace tandem::cluster
