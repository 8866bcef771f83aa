#include "planner/pipedream.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/units.h"

namespace tandem::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// PipeDream's all-reduce moves each parameter byte four times (push and pull of gradients
// and weights to a parameter server).
constexpr double kAllReduceFactor = 4.0;
// An activation and its gradient both cross a boundary.
constexpr double kActivationTransfers = 2.0;

// How [i, j) on `machines` machines of a level came about: one replicated stage (split < 0),
// or the best plan for [i, split) on `earlier` machines followed by stage [split, j) on
// `replicas` machines.
struct Choice {
  int split = -1;
  int earlier = -1;
  int replicas = 1;
};

// One level's table: best time per stage for layer ranges [i, j) on exactly (or, with
// use_fewer_machines, at most) m+1 machines. Outer levels only need i = 0.
class LevelTable {
 public:
  LevelTable(int num_layers, int machines, bool all_starts)
      : layers_(num_layers), machines_(machines), all_starts_(all_starts) {
    const size_t starts = all_starts ? num_layers + 1 : 1;
    value_.assign(starts * (num_layers + 1) * machines, kInfinity);
    choice_.assign(value_.size(), Choice{});
  }
  double& Value(int i, int j, int m) { return value_[Index(i, j, m)]; }
  double Value(int i, int j, int m) const { return value_[Index(i, j, m)]; }
  Choice& At(int i, int j, int m) { return choice_[Index(i, j, m)]; }
  const Choice& At(int i, int j, int m) const { return choice_[Index(i, j, m)]; }
  int machines() const { return machines_; }

 private:
  size_t Index(int i, int j, int m) const {
    const size_t row = all_starts_ ? static_cast<size_t>(i) : 0;
    return (row * (layers_ + 1) + j) * machines_ + m;
  }
  int layers_, machines_;
  bool all_starts_;
  std::vector<double> value_;
  std::vector<Choice> choice_;
};

class Solver {
 public:
  Solver(const LayerChain& chain, const PipeDreamOptions& options)
      : chain_(chain), options_(options), num_layers_(chain.num_layers()) {}

  absl::StatusOr<PipeDreamResult> Run();

 private:
  // Compute time of [i, j) on one machine of `level`.
  double RangeTime(int level, int i, int j) const {
    if (level == 0) return chain_.ComputeSeconds(i, j) / uniform_speed_;
    return tables_[level - 1].Value(i, j, options_.levels[level - 1].machines - 1);
  }
  double StageStash(int i, int j) const {
    return chain_.StashedBytes(i, j) + chain_.ParameterBytes(i, j) +
           chain_.OptimizerStateBytes(i, j);
  }
  // Time per stage of [i, j) on r replicas at `level`, with `prefix_machines` machines used by
  // this stage and those before it (for PipeDream's memory estimate); infinity when it does
  // not fit.
  double StageTime(int level, int i, int j, int r, int prefix_machines, int device) const;
  void SolveLevel(int level);
  void Collect(int level, int i, int j, int machines, int replica_factor,
               std::vector<PipeDreamStage>* stages) const;

  const LayerChain& chain_;
  const PipeDreamOptions& options_;
  int num_layers_;
  double uniform_speed_ = 1.0;
  bool per_device_speed_ = false;
  std::vector<LevelTable> tables_;
};

double Solver::StageTime(int level, int i, int j, int r, int prefix_machines,
                         int device) const {
  const PipeDreamLevel& lv = options_.levels[level];
  double compute = RangeTime(level, i, j);
  if (!std::isfinite(compute)) return kInfinity;
  if (per_device_speed_) compute = chain_.ComputeSeconds(i, j) / options_.device_speeds[device];
  if (options_.use_memory_constraint) {
    const int later = lv.machines - prefix_machines;
    const double in_flight = std::ceil(static_cast<double>(later) / r);
    if (StageStash(i, j) * in_flight > options_.memory_bytes) return kInfinity;
  }
  const int within = level == 0 ? 1 : options_.levels[level - 1].machines;
  const double all_reduce = kAllReduceFactor * (r - 1) * chain_.ParameterBytes(i, j) /
                            (lv.bandwidth_bytes_per_second * r) / within;
  double time = (compute + all_reduce) / r;
  if (options_.activation_compression_ratio > 0) {
    const double per_byte =
        kActivationTransfers / (lv.bandwidth_bytes_per_second * r) /
        options_.activation_compression_ratio;
    if (i > 0) time = std::max(time, chain_.CutBytes(i) * per_byte);
    if (j < num_layers_) time = std::max(time, chain_.CutBytes(j) * per_byte);
  }
  return time;
}

void Solver::SolveLevel(int level) {
  const int n = options_.levels[level].machines;
  const bool final_level = level + 1 == static_cast<int>(options_.levels.size());
  tables_.emplace_back(num_layers_, n, /*all_starts=*/!final_level);
  LevelTable& table = tables_.back();
  const int max_start = final_level ? 0 : num_layers_ - 1;
  const bool straight = options_.straight;
  const bool fast = options_.use_fewer_machines && !options_.use_memory_constraint && !straight &&
                    !per_device_speed_;
  // Fast path: per (k, j), the smallest r where the earlier stages are no faster than the
  // new one (see below).
  std::vector<int> crossing;
  for (int i = 0; i <= max_start; ++i) {
    if (fast) crossing.assign(static_cast<size_t>(num_layers_ + 1) * (num_layers_ + 1), 1);
    // One stage on m+1 replicas.
    for (int j = i + 1; j <= num_layers_; ++j) {
      const int max_replicas = straight ? 1 : n;
      for (int m = 0; m < max_replicas; ++m) {
        table.Value(i, j, m) = StageTime(level, i, j, m + 1, m + 1, /*device=*/m);
        table.At(i, j, m) = Choice{-1, -1, m + 1};
      }
    }
    for (int m = 1; m < n; ++m) {
      for (int j = i + 1; j <= num_layers_; ++j) {
        double best = table.Value(i, j, m);
        Choice best_choice = table.At(i, j, m);
        if (options_.use_fewer_machines && table.Value(i, j, m - 1) < best) {
          best = table.Value(i, j, m - 1);
          best_choice = table.At(i, j, m - 1);
        }
        for (int k = i + 1; k < j; ++k) {
          if (straight) {
            const double earlier = table.Value(i, k, m - 1);
            if (!(earlier < best)) continue;
            const double candidate =
                std::max(earlier, StageTime(level, k, j, 1, m + 1, /*device=*/m));
            if (candidate < best) {
              best = candidate;
              best_choice = Choice{k, m - 1, 1};
            }
          } else if (fast) {
            // earlier(r) = table(i, k, m - r) rises with r (fewer machines are left for the
            // earlier stages); stage(r), the best over at most r replicas, falls with r. The
            // optimum is at their crossing, which only moves right as m grows: keep it per
            // (k, j) and advance it.
            const double one = StageTime(level, k, j, 1, m + 1, 0);
            auto stage_at_most = [&](int r) {
              return r == 1 ? one : std::min(one, StageTime(level, k, j, r, m + 1, 0));
            };
            int& lo = crossing[static_cast<size_t>(k) * (num_layers_ + 1) + j];
            while (lo < m && table.Value(i, k, m - lo) < stage_at_most(lo)) ++lo;
            for (int r = std::max(1, lo - 1); r <= std::min(lo, m); ++r) {
              const double candidate = std::max(table.Value(i, k, m - r), stage_at_most(r));
              if (candidate < best) {
                best = candidate;
                const double with_r = StageTime(level, k, j, r, m + 1, 0);
                best_choice = Choice{k, m - r, with_r <= one ? r : 1};
              }
            }
          } else {
            // A stage on r replicas takes at least compute / r: below some r nothing beats
            // the best so far.
            const double compute = RangeTime(level, k, j);
            for (int r = m; r >= 1; --r) {
              if (compute / r >= best) break;
              const double earlier = table.Value(i, k, m - r);
              if (!(earlier < best)) continue;
              const double candidate =
                  std::max(earlier, StageTime(level, k, j, r, m + 1, /*device=*/0));
              if (candidate < best) {
                best = candidate;
                best_choice = Choice{k, m - r, r};
              }
            }
          }
        }
        table.Value(i, j, m) = best;
        table.At(i, j, m) = best_choice;
      }
    }
  }
}

void Solver::Collect(int level, int i, int j, int machines, int replica_factor,
                     std::vector<PipeDreamStage>* stages) const {
  const LevelTable& table = tables_[level];
  std::vector<std::pair<std::pair<int, int>, int>> ranges;  // ((first, end), replicas)
  int end = j;
  int m = machines - 1;
  while (true) {
    const Choice& c = table.At(i, end, m);
    if (c.split < 0) {
      ranges.push_back({{i, end}, c.replicas});
      break;
    }
    ranges.push_back({{c.split, end}, c.replicas});
    end = c.split;
    m = c.earlier;
  }
  std::reverse(ranges.begin(), ranges.end());
  for (const auto& [range, replicas] : ranges) {
    if (level == 0) {
      PipeDreamStage stage;
      stage.first_layer = range.first;
      stage.end_layer = range.second;
      stage.replicas = replicas * replica_factor;
      const PipeDreamLevel& inner = options_.levels[0];
      stage.seconds = (chain_.ComputeSeconds(range.first, range.second) / uniform_speed_ +
                       kAllReduceFactor * (replicas - 1) *
                           chain_.ParameterBytes(range.first, range.second) /
                           (inner.bandwidth_bytes_per_second * replicas)) /
                      replicas;
      stages->push_back(stage);
    } else {
      Collect(level - 1, range.first, range.second, options_.levels[level - 1].machines,
              replicas * replica_factor, stages);
    }
  }
}

absl::StatusOr<PipeDreamResult> Solver::Run() {
  if (options_.levels.empty()) {
    return absl::InvalidArgumentError("PipeDream needs at least one network level");
  }
  int64_t devices = 1;
  for (const PipeDreamLevel& level : options_.levels) {
    if (level.machines < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("PipeDream: machines per level must be at least 1, got ", level.machines));
    }
    if (!(level.bandwidth_bytes_per_second > 0)) {
      return absl::InvalidArgumentError("PipeDream: bandwidth must be positive");
    }
    devices *= level.machines;
  }
  if (!options_.device_speeds.empty()) {
    if (static_cast<int64_t>(options_.device_speeds.size()) != devices) {
      return absl::InvalidArgumentError(absl::StrCat("PipeDream: expected ", devices,
                                                     " device speeds, got ",
                                                     options_.device_speeds.size()));
    }
    uniform_speed_ =
        *std::min_element(options_.device_speeds.begin(), options_.device_speeds.end());
    per_device_speed_ = options_.straight && options_.levels.size() == 1;
  }
  if (options_.straight && options_.levels.back().machines > num_layers_ &&
      !options_.use_fewer_machines) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a straight pipeline on ", options_.levels.back().machines, " machines needs at least ",
        options_.levels.back().machines, " layers; the model has ", num_layers_,
        " (use fewer devices or allow unused machines)"));
  }
  for (size_t level = 0; level < options_.levels.size(); ++level) {
    SolveLevel(static_cast<int>(level));
  }
  const int top = static_cast<int>(options_.levels.size()) - 1;
  const int top_machines = options_.levels[top].machines;
  PipeDreamResult result;
  result.bottleneck_seconds = tables_[top].Value(0, num_layers_, top_machines - 1);
  if (!std::isfinite(result.bottleneck_seconds)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no PipeDream partition of ", num_layers_, " layers on ", devices,
                     " devices fits ", FormatBytes(options_.memory_bytes), " per device"));
  }
  Collect(top, 0, num_layers_, top_machines, 1, &result.stages);
  for (const PipeDreamStage& stage : result.stages) result.devices_used += stage.replicas;
  result.single_machine_seconds = chain_.ComputeSeconds(0, num_layers_);
  double data_parallel = result.single_machine_seconds;
  int within = 1;
  for (const PipeDreamLevel& level : options_.levels) {
    const double all_reduce = kAllReduceFactor * (level.machines - 1) *
                              chain_.ParameterBytes(0, num_layers_) /
                              (level.bandwidth_bytes_per_second * level.machines) / within;
    data_parallel = (data_parallel + all_reduce) / level.machines;
    within = level.machines;
  }
  result.data_parallel_seconds = data_parallel;
  return result;
}

}  // namespace

absl::StatusOr<PipeDreamResult> RunPipeDream(const LayerChain& chain,
                                             const PipeDreamOptions& options) {
  Solver solver(chain, options);
  return solver.Run();
}

}  // namespace tandem::planner
