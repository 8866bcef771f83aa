#include "cluster/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cluster/goodput.h"
#include "common/status.h"

namespace tandem::cluster {
namespace {

constexpr double kEps = 1e-8;

int CeilInt(double x) { return static_cast<int>(std::ceil(x - kEps)); }

// Python's round(): half to even (the default floating-point rounding mode).
double RoundHalfEven(double x) { return std::nearbyint(x); }

int Sum(const std::vector<int>& values) {
  int total = 0;
  for (int v : values) total += v;
  return total;
}

// `replicas` GPUs packed `per_node` to a node: {4, 4, 1} for 9 on 4-GPU nodes.
std::vector<int> PackedPlacement(int replicas, int per_node) {
  std::vector<int> placement;
  while (Sum(placement) < replicas) {
    placement.push_back(std::min(replicas - Sum(placement), per_node));
  }
  return placement;
}

// The fixed-batch split Pollux's simulator uses: local batch = ceil(batch / replicas), split
// into micro-batches of at most max_local_bsz.
struct FixedSplit {
  int atomic_bsz = 0;
  int accum_steps = 0;
};

FixedSplit SplitBatch(const Application& app, int batch_size, int replicas,
                      bool single_replica_accumulates) {
  FixedSplit split;
  const int local = CeilInt(static_cast<double>(batch_size) / replicas);
  split.accum_steps = CeilInt(static_cast<double>(local) / app.max_local_bsz()) - 1;
  if (replicas == 1 && single_replica_accumulates) split.accum_steps = std::max(1, split.accum_steps);
  split.atomic_bsz = CeilInt(static_cast<double>(local) / (split.accum_steps + 1));
  const int count = replicas * (split.accum_steps + 1);
  split.atomic_bsz = std::min(split.atomic_bsz, static_cast<int>(app.max_batch_size() / count));
  return split;
}

// One job as the simulator runs it (Pollux simulator's Job).
class SimJob {
 public:
  SimJob(const WorkloadJob& spec, std::shared_ptr<const Application> app, BatchSizeMode mode,
         const SimulationOptions& options)
      : spec_(spec), app_(std::move(app)) {
    if (app_ == nullptr) return;
    switch (mode) {
      case BatchSizeMode::kFixedReplicasAndBatch:
        target_replicas_ = spec.num_replicas;
        target_batch_ = spec.batch_size;
        break;
      case BatchSizeMode::kFixedBatch:
        target_batch_ = spec.batch_size;
        break;
      case BatchSizeMode::kAdaptive: {
        auto fixed = options.adaptive_fixed_batch.find(app_->name());
        if (fixed != options.adaptive_fixed_batch.end()) target_batch_ = fixed->second;
        break;
      }
    }
  }

  const WorkloadJob& spec() const { return spec_; }
  const Application* app() const { return app_.get(); }
  bool completed() const { return completion_.has_value(); }
  double completion() const { return *completion_; }
  double attained() const { return attained_; }
  int restarts() const { return std::max(restarts_, 0); }
  int epoch() const { return epoch_; }
  std::optional<int> target_batch() const { return target_batch_; }
  std::optional<int> target_replicas() const { return target_replicas_; }
  double current_time() const { return current_time_; }
  int max_profiled_replicas() const {
    int most = 0;
    for (const auto& [key, times] : profile_) most = std::max(most, std::get<1>(key));
    return most;
  }
  double remaining_work() const { return spec_.duration_seconds - work_done_; }

  void Step(double seconds, double interference) {
    if (placement_.empty()) {
      current_time_ += seconds;
      return;
    }
    const int gpus = Sum(placement_);
    const double delay = std::min(rescale_time_, seconds);
    current_time_ += delay;
    attained_ += delay * gpus;
    rescale_time_ -= delay;
    seconds -= delay;
    while (seconds > 0 && !completion_.has_value()) {
      if (app_ == nullptr) {
        StepFixedDuration(&seconds, interference, gpus);
        continue;
      }
      const int num_replicas = gpus;
      const int num_nodes = static_cast<int>(placement_.size());
      const double batch_size =
          static_cast<double>(num_replicas) * atomic_bsz_ * (accum_steps_ + 1);
      const double scale = batch_size / app_->init_batch_size();
      const StepTimes times = app_->Throughput(placement_, atomic_bsz_);
      const double accum_time = times.step_seconds - times.sync_seconds;
      const GradientStats grad = app_->GradStats(batch_size, epoch_);
      const double gain = (grad.var + grad.sqr) / (grad.var / scale + grad.sqr);
      UpdateParams(num_nodes, num_replicas, atomic_bsz_, times, grad);
      const double total_time = times.step_seconds + accum_time * accum_steps_;
      const double goodput = gain / total_time * (1.0 - interference) * device_scale_;
      const double next_progress = app_->Progress(epoch_ + 1);
      if (progress_ + goodput * seconds < next_progress) {
        progress_ += goodput * seconds;
        current_time_ += seconds;
        attained_ += seconds * gpus;
        seconds = 0;
      } else {
        ++epoch_;
        const double delta =
            std::min(RoundHalfEven((next_progress - progress_) / goodput), seconds);
        if (epoch_ > app_->CompletionEpoch(batch_size)) completion_ = current_time_ + delta;
        progress_ = next_progress;
        current_time_ += delta;
        attained_ += delta * gpus;
        seconds -= delta;
      }
      UpdateLocalBatch();
    }
    current_time_ += seconds;
  }

  // `delay_seconds`: the reallocation's cost (ReallocationCosts), spent holding the new GPUs.
  void Reallocate(const Allocation& allocation, double delay_seconds) {
    if (!allocation.empty()) {
      allocation_ = allocation;
      placement_ = PlacementOf(allocation);
      UpdateLocalBatch();
      rescale_time_ = delay_seconds;
      ++restarts_;
    } else {
      allocation_.clear();
      placement_.clear();
      atomic_bsz_ = 0;
    }
  }

  void SetDeviceScale(double scale) { device_scale_ = scale; }

  // Pollux's speedup function of this job now (linear before any profile).
  std::function<double(int, int)> Speedup() {
    if (app_ == nullptr) {
      const int requested = spec_.num_replicas;
      return [requested](int nodes, int replicas) {
        return nodes > 0 ? static_cast<double>(std::min(replicas, requested)) : 0.0;
      };
    }
    if (profile_.empty()) {
      return [](int nodes, int replicas) { return nodes > 0 ? static_cast<double>(replicas) : 0.0; };
    }
    struct Lazy {
      absl::Mutex mutex;
      SimJob* job;
      std::unique_ptr<SpeedupFunction> function;
    };
    auto lazy = std::make_shared<Lazy>();
    lazy->job = this;
    return [lazy](int nodes, int replicas) {
      absl::MutexLock lock(&lazy->mutex);
      if (lazy->function == nullptr) {
        const Application& app = *lazy->job->app_;
        lazy->function = std::make_unique<SpeedupFunction>(lazy->job->Goodput(), app.max_batch_size(),
                                                           app.min_local_bsz(), app.max_local_bsz(),
                                                           /*accumulation=*/true);
      }
      return (*lazy->function)(nodes, replicas);
    };
  }

  // Optimus's oracle: seconds per iteration with `replicas` packed GPUs at the target batch.
  double IterationSeconds(int replicas, int gpus_per_node) const {
    if (app_ == nullptr) {
      const int nodes = (replicas + gpus_per_node - 1) / gpus_per_node;
      const double rate = FixedDurationRate(nodes, replicas);
      return rate > 0 ? 1.0 / rate : std::numeric_limits<double>::infinity();
    }
    const FixedSplit split =
        SplitBatch(*app_, *target_batch_, replicas, /*single_replica_accumulates=*/true);
    const StepTimes times = app_->Throughput(PackedPlacement(replicas, gpus_per_node),
                                             split.atomic_bsz);
    return times.step_seconds + (times.step_seconds - times.sync_seconds) * split.accum_steps;
  }

  double RemainingIterations() const {
    if (app_ == nullptr) return remaining_work();
    const int completion_epoch = app_->CompletionEpoch(*target_batch_);
    if (completion_epoch <= epoch_) return 1;
    return app_->Iteration(*target_batch_, completion_epoch) -
           app_->Iteration(*target_batch_, epoch_);
  }

 private:
  // Relative rate of a fixed-duration job on `gpus` GPUs over `nodes` nodes: linear up to the
  // requested GPUs, or the plan's throughput relative to the requested GPUs packed.
  double FixedDurationRate(int nodes, int gpus) const {
    if (spec_.planned == nullptr) {
      return static_cast<double>(std::min(gpus, spec_.num_replicas)) / spec_.num_replicas;
    }
    const PlannedThroughput& plan = *spec_.planned;
    const int per_node = std::max(1, plan.gpus_per_node);
    const double reference =
        plan.SamplesPerSecond((spec_.num_replicas + per_node - 1) / per_node, spec_.num_replicas);
    return plan.SamplesPerSecond(nodes, gpus) / reference;
  }

  void StepFixedDuration(double* seconds, double interference, int gpus) {
    const double rate = FixedDurationRate(static_cast<int>(placement_.size()), gpus) *
                        (1.0 - interference) * device_scale_;
    if (!(rate > 0)) {  // no plan fits this placement: the job holds its GPUs without progress
      current_time_ += *seconds;
      attained_ += *seconds * gpus;
      *seconds = 0;
      return;
    }
    const double remaining = spec_.duration_seconds - work_done_;
    if (rate * *seconds < remaining) {
      work_done_ += rate * *seconds;
      current_time_ += *seconds;
      attained_ += *seconds * gpus;
      *seconds = 0;
      return;
    }
    const double delta = std::min(RoundHalfEven(remaining / rate), *seconds);
    work_done_ = spec_.duration_seconds;
    completion_ = current_time_ + delta;
    current_time_ += delta;
    attained_ += delta * gpus;
    *seconds -= delta;
  }

  void UpdateParams(int num_nodes, int num_replicas, int atomic_bsz, const StepTimes& times,
                    const GradientStats& grad) {
    grad_ = {grad.sqr, grad.var};
    const auto key = std::make_tuple(num_nodes, num_replicas, atomic_bsz);
    if (profile_.count(key) > 0) return;
    profile_[key] = times;
    if (perf_.has_value()) previous_perf_ = perf_;
    perf_.reset();
  }

  GoodputFunction Goodput() {
    if (!perf_.has_value()) {
      std::vector<ThroughputSample> samples;
      for (const auto& [key, times] : profile_) {
        samples.push_back({std::get<0>(key), std::get<1>(key),
                           static_cast<double>(std::get<2>(key)),
                           times.step_seconds - times.sync_seconds, times.step_seconds});
      }
      // Refit on every new (nodes, replicas, local batch), as Pollux's simulator does, warm
      // from the previous fit.
      perf_ = FitPerfParams(samples, previous_perf_.has_value() ? &*previous_perf_ : nullptr);
    }
    return GoodputFunction(*perf_, grad_, app_->init_batch_size());
  }

  void UpdateLocalBatch() {
    if (app_ == nullptr || placement_.empty()) return;
    const int num_nodes = static_cast<int>(placement_.size());
    const int num_replicas = Sum(placement_);
    std::optional<int> batch_size = target_batch_;
    if (!batch_size.has_value() && profile_.empty()) {
      batch_size = std::max(app_->init_batch_size(), app_->min_local_bsz() * num_replicas);
    }
    if (!batch_size.has_value()) {
      const BatchConfig best =
          Goodput().Optimize(num_nodes, num_replicas, app_->max_batch_size(),
                             app_->min_local_bsz(), app_->max_local_bsz(), /*accumulation=*/true);
      atomic_bsz_ = best.atomic_bsz;
      accum_steps_ = best.accum_steps;
    } else {
      const int local = CeilInt(static_cast<double>(*batch_size) / num_replicas);
      accum_steps_ = CeilInt(static_cast<double>(local) / app_->max_local_bsz()) - 1;
      if (num_replicas == 1 && *batch_size > app_->init_batch_size()) {
        accum_steps_ = std::max(1, accum_steps_);
      }
      atomic_bsz_ = CeilInt(static_cast<double>(local) / (accum_steps_ + 1));
    }
    const int count = num_replicas * (accum_steps_ + 1);
    atomic_bsz_ = std::min(atomic_bsz_, static_cast<int>(app_->max_batch_size() / count));
  }

  const WorkloadJob& spec_;
  std::shared_ptr<const Application> app_;
  std::optional<int> target_replicas_;
  std::optional<int> target_batch_;
  double current_time_ = 0;
  double rescale_time_ = 0;
  Allocation allocation_;
  std::vector<int> placement_;
  int atomic_bsz_ = 0;
  int accum_steps_ = 0;
  std::map<std::tuple<int, int, int>, StepTimes> profile_;
  std::optional<PerfParams> perf_;           // the fit of profile_ (none: refit when asked)
  std::optional<PerfParams> previous_perf_;  // the last fit, a warm start for the next
  GradParams grad_;
  double progress_ = 0;
  int epoch_ = 0;
  double attained_ = 0;
  double work_done_ = 0;
  double device_scale_ = 1.0;
  std::optional<double> completion_;
  int restarts_ = -1;  // the first allocation is not a restart
};

double DeviceScale(const WorkloadJob& spec, const ClusterView& cluster,
                   const Allocation& allocation) {
  double scale = 1.0;
  bool any = false;
  for (int node : allocation) {
    auto found = spec.device_throughput.find(cluster.nodes[node].device_type);
    const double s = found == spec.device_throughput.end() ? 1.0 : found->second;
    scale = any ? std::min(scale, s) : s;
    any = true;
  }
  return scale;
}

JobView MakeView(SimJob& job, BatchSizeMode mode, double now, const ClusterView& cluster,
                 const SimulationOptions& options) {
  const WorkloadJob& spec = job.spec();
  JobView view;
  view.name = spec.name;
  view.application = spec.application;
  view.submission_seconds = spec.submission_seconds;
  view.age_seconds = now - spec.submission_seconds;
  view.attained_service_gpu_seconds = job.attained();
  view.restarts = job.restarts();
  view.requested_replicas = spec.num_replicas;
  view.requested_batch_size = spec.batch_size;
  view.device_throughput = spec.device_throughput;
  view.speedup = job.Speedup();
  const Application* app = job.app();
  switch (mode) {
    case BatchSizeMode::kFixedReplicasAndBatch:
      view.max_replicas = spec.num_replicas;
      break;
    case BatchSizeMode::kFixedBatch:
      view.max_replicas = app == nullptr ? spec.num_replicas
                                         : std::max(1, *job.target_batch() / app->min_local_bsz());
      if (app != nullptr && app->name() == "ncf") view.max_replicas = 1;
      break;
    case BatchSizeMode::kAdaptive:
      if (spec.planned != nullptr) {
        view.max_replicas = std::min(options.adaptive_max_replicas, cluster.total_gpus());
      } else if (app == nullptr) {
        view.max_replicas = spec.num_replicas;
      } else {
        view.max_replicas = std::min({std::max(2 * job.max_profiled_replicas(), 1),
                                      options.adaptive_max_replicas,
                                      app->max_batch_size() / app->min_local_bsz()});
        if (app->name() == "ncf") view.max_replicas = 1;
      }
      break;
  }
  if (spec.planned != nullptr) {
    std::shared_ptr<const PlannedThroughput> plan = spec.planned;
    view.planned_throughput = [plan](int nodes, int replicas) {
      return plan->SamplesPerSecond(nodes, replicas);
    };
    view.min_replicas = std::min(plan->MinReplicas(), spec.num_replicas);
  }
  if (mode == BatchSizeMode::kFixedBatch || app == nullptr) {
    const int per_node = std::max(1, cluster.max_gpus_per_node());
    SimJob* raw = &job;
    view.iteration_seconds = [raw, per_node](int replicas) {
      return raw->IterationSeconds(std::max(replicas, 1), per_node);
    };
    view.remaining_iterations = job.RemainingIterations();
  }
  return view;
}

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const Workload& workload,
                                          const ApplicationCatalog& applications,
                                          const ClusterView& cluster, Policy& policy,
                                          const SimulationOptions& options) {
  TANDEM_RETURN_IF_ERROR(ValidateWorkload(workload, applications, cluster));
  if (!(options.interval_seconds > 0) || options.restart_seconds < 0 ||
      options.interference < 0 || options.interference >= 1 || options.max_rounds < 1) {
    return absl::InvalidArgumentError(
        "simulation options: need interval > 0, restart >= 0, 0 <= interference < 1, "
        "max_rounds >= 1");
  }
  const BatchSizeMode mode = policy.batch_size_mode();
  const ReallocationCosts costs =
      policy.reallocation_costs().value_or(ReallocationCosts::Uniform(options.restart_seconds));
  if (costs.start_seconds < 0 || costs.grow_seconds < 0 || costs.shrink_seconds < 0 ||
      costs.move_seconds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy ", policy.name(), ": reallocation costs must be >= 0"));
  }
  std::vector<std::unique_ptr<SimJob>> jobs;
  for (const WorkloadJob& spec : workload.jobs) {
    std::shared_ptr<const Application> app;
    if (!spec.application.empty()) app = applications.at(spec.application);
    jobs.push_back(std::make_unique<SimJob>(spec, std::move(app), mode, options));
  }
  SimulationResult result;
  result.policy = policy.name();
  result.workload = workload.source;
  result.total_gpus = cluster.total_gpus();
  result.interval_seconds = options.interval_seconds;

  double last_submission = 0;
  for (const WorkloadJob& spec : workload.jobs) {
    last_submission = std::max(last_submission, spec.submission_seconds);
  }
  const double round_limit =
      std::ceil(last_submission / options.interval_seconds) + options.max_rounds;
  Allocations allocations;
  double now = 0;
  int finished = 0;
  const int total = static_cast<int>(jobs.size());
  while (finished < total) {
    if (result.rounds >= round_limit) {
      std::vector<std::string> left;
      for (const auto& job : jobs) {
        if (!job->completed() && left.size() < 5) left.push_back(job->spec().name);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "simulation of ", workload.source, " under ", policy.name(), " did not finish in ",
          options.max_rounds, " rounds after the last submission (", now, " s); ",total - finished,
          " jobs unfinished, e.g. ", absl::StrJoin(left, ", ")));
    }
    ++result.rounds;
    // Interference: multi-node jobs sharing a node with another multi-node job slow down.
    absl::flat_hash_set<int> interfering_nodes;
    if (options.interference > 0) {
      std::map<int, int> multi_node_jobs;
      for (const auto& [name, allocation] : allocations) {
        std::set<int> nodes(allocation.begin(), allocation.end());
        if (nodes.size() > 1) {
          for (int node : nodes) ++multi_node_jobs[node];
        }
      }
      for (const auto& [node, count] : multi_node_jobs) {
        if (count > 1) interfering_nodes.insert(node);
      }
    }
    for (auto& job : jobs) {
      double interference = 0;
      auto found = allocations.find(job->spec().name);
      if (found != allocations.end() && !job->completed()) {
        std::set<int> nodes(found->second.begin(), found->second.end());
        if (nodes.size() > 1) {
          for (int node : nodes) {
            if (interfering_nodes.contains(node)) interference = options.interference;
          }
        }
      }
      job->Step(options.interval_seconds, interference);
    }
    now += options.interval_seconds;

    std::vector<JobView> views;
    std::vector<SimJob*> active;
    finished = 0;
    for (auto& job : jobs) {
      if (job->completed()) {
        ++finished;
      } else if (now >= job->spec().submission_seconds) {
        active.push_back(job.get());
      }
    }
    if (!active.empty()) {
      Allocations current;
      for (SimJob* job : active) {
        views.push_back(MakeView(*job, mode, now, cluster, options));
        auto found = allocations.find(job->spec().name);
        if (found != allocations.end()) current[found->first] = found->second;
      }
      absl::StatusOr<Allocations> next = policy.Optimize(views, cluster, current, now);
      if (!next.ok()) {
        return Annotate(next.status(), absl::StrCat("policy ", policy.name(), " at ", now, " s"));
      }
      for (auto it = next->begin(); it != next->end();) {
        it = it->second.empty() ? next->erase(it) : std::next(it);
      }
      TANDEM_RETURN_IF_ERROR(ValidateAllocations(*next, views, cluster, policy.name()));
      for (SimJob* job : active) {
        const std::string& name = job->spec().name;
        auto before = current.find(name);
        auto after = next->find(name);
        const bool had = before != current.end(), has = after != next->end();
        if (had != has || (had && before->second != after->second)) {
          const Allocation& old_allocation = had ? before->second : Allocation{};
          const Allocation& new_allocation = has ? after->second : Allocation{};
          job->Reallocate(new_allocation, costs.Seconds(old_allocation, new_allocation));
          if (has) job->SetDeviceScale(DeviceScale(job->spec(), cluster, after->second));
        }
      }
      allocations = std::move(*next);
    } else {
      allocations.clear();
    }
    int running = 0, allocated = 0;
    TimelineEntry entry;
    entry.start_seconds = now;
    for (size_t i = 0; i < jobs.size(); ++i) {
      auto found = allocations.find(jobs[i]->spec().name);
      if (found == allocations.end()) continue;
      ++running;
      allocated += static_cast<int>(found->second.size());
      entry.gpus.emplace_back(static_cast<int>(i), static_cast<int>(found->second.size()));
    }
    if (options.record_timeline && !entry.gpus.empty()) result.timeline.push_back(std::move(entry));
    if (options.on_round) {
      options.on_round({result.rounds, now, finished, total, running, allocated});
    }
  }

  const int per_node = std::max(1, cluster.max_gpus_per_node());
  for (const auto& job : jobs) {
    const WorkloadJob& spec = job->spec();
    JobOutcome outcome;
    outcome.name = spec.name;
    outcome.application = spec.application;
    outcome.submission_seconds = spec.submission_seconds;
    outcome.completion_seconds = job->completion();
    outcome.jct_seconds = job->completion() - spec.submission_seconds;
    outcome.restarts = job->restarts();
    outcome.gpu_seconds = job->attained();
    outcome.requested_gpus = spec.num_replicas;
    TANDEM_ASSIGN_OR_RETURN(outcome.isolated_seconds,
                            IsolatedRunSeconds(spec, applications, per_node));
    result.jobs.push_back(std::move(outcome));
  }
  return result;
}

absl::StatusOr<double> IsolatedRunSeconds(const WorkloadJob& job,
                                          const ApplicationCatalog& applications,
                                          int gpus_per_node) {
  if (job.application.empty()) return job.duration_seconds;
  auto found = applications.find(job.application);
  if (found == applications.end()) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job.name, ": unknown application ",
                                                   job.application));
  }
  WorkloadJob alone = job;
  alone.submission_seconds = 0;
  alone.device_throughput.clear();
  SimulationOptions options;
  options.restart_seconds = 0;
  SimJob sim(alone, found->second, BatchSizeMode::kFixedReplicasAndBatch, options);
  Allocation allocation;
  const std::vector<int> placement = PackedPlacement(job.num_replicas, gpus_per_node);
  for (size_t node = 0; node < placement.size(); ++node) {
    allocation.insert(allocation.end(), placement[node], static_cast<int>(node));
  }
  sim.Reallocate(allocation, /*delay_seconds=*/0);
  constexpr double kChunk = 1e6;
  for (int i = 0; i < 1000 && !sim.completed(); ++i) sim.Step(kChunk, 0.0);
  if (!sim.completed()) {
    return absl::InternalError(absl::StrCat("job ", job.name, " never completes alone"));
  }
  return sim.completion();
}

}  // namespace tandem::cluster
