#include "pipeline/plan.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"

namespace tandem::pipeline {
namespace {

constexpr int kPlanFormatVersion = 1;
// Bounds that keep a corrupt file from allocating absurd amounts of memory.
constexpr int64_t kMaxWorldSize = int64_t{1} << 22;
constexpr int64_t kMaxLayers = int64_t{1} << 22;
// Samples per micro-batch (a bound on the format; the runtime checks memory against it).
constexpr int64_t kMaxMicrobatchSize = int64_t{1} << 24;

absl::Status Invalid(absl::string_view where, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", problem));
}

// Narrows a JSON integer into [low, high] or names the field.
absl::StatusOr<int> GetIntIn(const nlohmann::json& j, absl::string_view field, int64_t low,
                             int64_t high, absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(int64_t value, GetInt(j, field, where));
  if (value < low || value > high) {
    return Invalid(absl::StrCat(where, ".", field),
                   absl::StrCat("must be in [", low, ", ", high, "], got ", value));
  }
  return static_cast<int>(value);
}

absl::StatusOr<std::vector<int>> GetRankArray(const nlohmann::json& j, absl::string_view field,
                                              absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<int64_t> values, GetIntArray(j, field, where));
  std::vector<int> out;
  out.reserve(values.size());
  for (int64_t v : values) {
    if (v < 0 || v >= kMaxWorldSize) {
      return Invalid(absl::StrCat(where, ".", field),
                     absl::StrCat("rank ", v, " is out of range [0, ", kMaxWorldSize, ")"));
    }
    out.push_back(static_cast<int>(v));
  }
  return out;
}

absl::StatusOr<std::vector<double>> GetNumberArray(const nlohmann::json& j,
                                                   absl::string_view field,
                                                   absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* array, GetArray(j, field, where));
  std::vector<double> out;
  out.reserve(array->size());
  for (const nlohmann::json& v : *array) {
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      return Invalid(absl::StrCat(where, ".", field), "expected an array of numbers");
    }
    out.push_back(v.get<double>());
  }
  return out;
}

// Ranks stage `stage` runs on in a uniform plan, in (data-parallel replica, pipeline replica,
// tensor-parallel rank) order.
std::vector<int> UniformStageRanks(const Plan& plan, const Placement& placement, int stage) {
  std::vector<int> ranks;
  for (int d = 0; d < plan.data_parallel; ++d) {
    for (int r = 0; r < placement.NumReplicas(); ++r) {
      const int first = plan.mesh[d][placement.RankOf(r, stage)];
      for (int t = 0; t < plan.tensor_parallel; ++t) ranks.push_back(first + t);
    }
  }
  return ranks;
}

absl::Status ValidateUniformRanks(const Plan& plan) {
  const int t = plan.tensor_parallel;
  if (static_cast<int>(plan.mesh.size()) != plan.data_parallel) {
    return Invalid("plan.mesh", absl::StrCat("expected ", plan.data_parallel,
                                             " rows (data_parallel), got ", plan.mesh.size()));
  }
  std::vector<bool> seen(plan.world_size, false);
  for (int d = 0; d < plan.data_parallel; ++d) {
    const std::vector<int>& row = plan.mesh[d];
    if (static_cast<int>(row.size()) != plan.pipeline_parallel) {
      return Invalid(absl::StrCat("plan.mesh[", d, "]"),
                     absl::StrCat("expected ", plan.pipeline_parallel,
                                  " ranks (pipeline_parallel), got ", row.size()));
    }
    for (int q = 0; q < plan.pipeline_parallel; ++q) {
      const int first = row[q];
      const std::string where = absl::StrCat("plan.mesh[", d, "][", q, "]");
      if (first < 0 || first + t > plan.world_size) {
        return Invalid(where, absl::StrCat("rank ", first, " (with tensor_parallel ", t,
                                           ") is outside [0, ", plan.world_size, ")"));
      }
      if (first % t != 0) {
        return Invalid(where, absl::StrCat("rank ", first, " is not a multiple of tensor_parallel ",
                                           t));
      }
      for (int k = 0; k < t; ++k) {
        if (seen[first + k]) {
          return Invalid(where, absl::StrCat("rank ", first + k, " appears twice in the mesh"));
        }
        seen[first + k] = true;
      }
    }
  }
  // The mesh covers D * p * t distinct ranks in [0, world_size): it is a permutation.
  const Placement placement = PlacementFor(plan.schedule);
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    std::vector<int> expected = UniformStageRanks(plan, placement, static_cast<int>(s));
    std::vector<int> got = plan.stages[s].ranks;
    std::sort(expected.begin(), expected.end());
    std::sort(got.begin(), got.end());
    if (expected != got) {
      return Invalid(absl::StrCat("plan.stages[", s, "].ranks"),
                     absl::StrCat("expected the mesh's ranks [", absl::StrJoin(expected, ","),
                                  "], got [", absl::StrJoin(got, ","), "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateNonUniformRanks(const Plan& plan) {
  if (plan.schedule.NumReplicas() != 1 || plan.schedule.ChunksPerRank() != 1) {
    return Invalid("plan.schedule",
                   absl::StrCat("a plan without a mesh needs one stage per pipeline position; '",
                                ScheduleKindName(plan.schedule.kind), "' with ",
                                plan.schedule.NumStages(), " stages on ", plan.schedule.num_ranks,
                                " positions needs a mesh"));
  }
  std::vector<bool> seen(plan.world_size, false);
  int covered = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& stage = plan.stages[s];
    const std::string where = absl::StrCat("plan.stages[", s, "].ranks");
    if (stage.ranks.empty()) return Invalid(where, "a stage needs at least one rank");
    if (stage.ranks.size() % stage.tensor_parallel != 0) {
      return Invalid(where, absl::StrCat(stage.ranks.size(),
                                         " ranks are not a multiple of its tensor_parallel ",
                                         stage.tensor_parallel));
    }
    for (int rank : stage.ranks) {
      if (rank < 0 || rank >= plan.world_size) {
        return Invalid(where, absl::StrCat("rank ", rank, " is outside [0, ", plan.world_size,
                                           ")"));
      }
      if (seen[rank]) return Invalid(where, absl::StrCat("rank ", rank, " is used twice"));
      seen[rank] = true;
      ++covered;
    }
  }
  if (covered != plan.world_size) {
    return Invalid("plan.stages", absl::StrCat("stages use ", covered, " ranks but world_size is ",
                                               plan.world_size));
  }
  return absl::OkStatus();
}

nlohmann::json StageToJson(const PlanStage& stage) {
  return {{"first_layer", stage.first_layer},
          {"end_layer", stage.end_layer},
          {"ranks", stage.ranks},
          {"tensor_parallel", stage.tensor_parallel},
          {"recompute_layers", stage.recompute_layers},
          {"predicted_compute_seconds", stage.predicted_compute_seconds},
          {"predicted_memory_bytes", stage.predicted_memory_bytes}};
}

absl::StatusOr<PlanStage> StageFromJson(const nlohmann::json& j, absl::string_view where) {
  PlanStage stage;
  TANDEM_ASSIGN_OR_RETURN(stage.first_layer, GetIntIn(j, "first_layer", 0, kMaxLayers, where));
  TANDEM_ASSIGN_OR_RETURN(stage.end_layer, GetIntIn(j, "end_layer", 0, kMaxLayers, where));
  TANDEM_ASSIGN_OR_RETURN(stage.ranks, GetRankArray(j, "ranks", where));
  TANDEM_ASSIGN_OR_RETURN(int64_t tp, GetIntOr(j, "tensor_parallel", 1, where));
  if (tp < 1 || tp > kMaxWorldSize) {
    return Invalid(absl::StrCat(where, ".tensor_parallel"),
                   absl::StrCat("must be in [1, ", kMaxWorldSize, "], got ", tp));
  }
  stage.tensor_parallel = static_cast<int>(tp);
  if (j.contains("recompute_layers")) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<int64_t> layers,
                            GetIntArray(j, "recompute_layers", where));
    for (int64_t layer : layers) {
      if (layer < 0 || layer >= kMaxLayers) {
        return Invalid(absl::StrCat(where, ".recompute_layers"),
                       absl::StrCat("layer ", layer, " is out of range"));
      }
      stage.recompute_layers.push_back(static_cast<int>(layer));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(stage.predicted_compute_seconds,
                          GetNumberOr(j, "predicted_compute_seconds", 0, where));
  TANDEM_ASSIGN_OR_RETURN(stage.predicted_memory_bytes,
                          GetNumberOr(j, "predicted_memory_bytes", 0, where));
  return stage;
}

// Per pipeline position, the cost of its stages (a replica's stages weighted by the share of
// the micro-batches it runs) for stage boundaries `bounds` (stage s: [bounds[s], bounds[s+1])).
std::vector<double> PositionLoads(const std::vector<double>& prefix,
                                  const std::vector<int>& bounds, const Placement& placement) {
  std::vector<double> loads(placement.num_ranks, 0.0);
  const double share = 1.0 / placement.NumReplicas();
  for (int r = 0; r < placement.NumReplicas(); ++r) {
    for (int s = 0; s < placement.num_stages; ++s) {
      loads[placement.RankOf(r, s)] += share * (prefix[bounds[s + 1]] - prefix[bounds[s]]);
    }
  }
  return loads;
}

// What balancing minimises: the busiest position first, then the spread of the positions'
// loads, then that of the stages' costs (stages that share a position even out too, which
// also leaves their boundaries room to move).
std::tuple<double, double, double> Imbalance(const std::vector<double>& prefix,
                                             const std::vector<int>& bounds,
                                             const Placement& placement) {
  double most = 0, squares = 0, stage_squares = 0;
  for (double l : PositionLoads(prefix, bounds, placement)) {
    most = std::max(most, l);
    squares += l * l;
  }
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const double c = prefix[bounds[s + 1]] - prefix[bounds[s]];
    stage_squares += c * c;
  }
  return {most, squares, stage_squares};
}

// Boundaries that give stage s about targets[s] / sum(targets) of the total cost, each stage
// at least one layer.
std::vector<int> CutAt(const std::vector<double>& prefix, const std::vector<double>& targets) {
  const int n = static_cast<int>(prefix.size()) - 1;
  const int stages = static_cast<int>(targets.size());
  double sum = 0;
  for (double t : targets) sum += t;
  std::vector<int> bounds(stages + 1, 0);
  bounds[stages] = n;
  double want = 0;
  for (int s = 1; s < stages; ++s) {
    want += targets[s - 1] / sum * prefix[n];
    const int lo = bounds[s - 1] + 1, hi = n - (stages - s);
    int cut = std::min(
        n, static_cast<int>(std::lower_bound(prefix.begin(), prefix.end(), want) - prefix.begin()));
    // The nearer of the two boundaries around `want`.
    if (cut > 0 && want - prefix[cut - 1] < prefix[cut] - want) --cut;
    bounds[s] = std::clamp(cut, lo, hi);
  }
  return bounds;
}

// From `best`, local search: each boundary to its best place between its neighbours, and any
// two boundaries one layer each way at once (a position holding both ends of a wave trades
// layers through two boundaries), until nothing improves.
std::vector<int> Improve(const std::vector<double>& prefix, const Placement& placement,
                         std::vector<int> best) {
  const int stages = placement.num_stages;
  auto best_score = Imbalance(prefix, best, placement);
  const auto try_bounds = [&](const std::vector<int>& bounds) {
    for (int s = 0; s < stages; ++s) {
      if (bounds[s] >= bounds[s + 1]) return false;
    }
    const auto score = Imbalance(prefix, bounds, placement);
    if (!(score < best_score)) return false;
    best = bounds;
    best_score = score;
    return true;
  };
  for (bool improved = true; improved;) {
    improved = false;
    for (int s = 1; s < stages; ++s) {
      for (int cut = best[s - 1] + 1; cut < best[s + 1]; ++cut) {
        std::vector<int> bounds = best;
        bounds[s] = cut;
        if (try_bounds(bounds)) improved = true;
      }
    }
    for (int s = 1; s < stages; ++s) {
      for (int t = s + 1; t < stages; ++t) {
        for (int ds : {-1, 1}) {
          for (int dt : {-1, 1}) {
            std::vector<int> bounds = best;
            bounds[s] += ds;
            bounds[t] += dt;
            if (try_bounds(bounds)) improved = true;
          }
        }
      }
    }
  }
  return best;
}

// Stage boundaries over layers with `costs` that even out the positions' loads: local search
// (Improve) from the best few starts, the best result kept. The starts: the even split by
// count, the split proportional to cost, and that split re-aimed round by round at the
// positions' loads.
std::vector<int> BalancedBounds(const std::vector<double>& costs, const Placement& placement) {
  const int n = static_cast<int>(costs.size());
  const int stages = placement.num_stages;
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  std::set<std::vector<int>> starts;
  std::vector<int> even(stages + 1, 0);
  for (int s = 0; s < stages; ++s) even[s + 1] = even[s] + n / stages + (s < n % stages ? 1 : 0);
  starts.insert(even);
  std::vector<double> targets(stages, 1.0);
  for (int round = 0; round < 16; ++round) {
    const std::vector<int> bounds = CutAt(prefix, targets);
    starts.insert(bounds);
    const std::vector<double> loads = PositionLoads(prefix, bounds, placement);
    double mean = 0;
    for (double l : loads) mean += l / loads.size();
    for (int s = 0; s < stages; ++s) {
      double load = 0;
      for (int r = 0; r < placement.NumReplicas(); ++r) load += loads[placement.RankOf(r, s)];
      load /= placement.NumReplicas();
      if (load > 0) targets[s] *= std::sqrt(mean / load);
    }
  }
  // Local search from the three best starts (it is the costly part: seconds at 256 stages).
  std::vector<std::pair<std::tuple<double, double, double>, std::vector<int>>> ranked;
  for (const std::vector<int>& start : starts) {
    ranked.emplace_back(Imbalance(prefix, start, placement), start);
  }
  std::sort(ranked.begin(), ranked.end());
  ranked.resize(std::min<size_t>(ranked.size(), 3));
  std::vector<int> best = even;
  auto best_score = Imbalance(prefix, best, placement);
  for (const auto& [score_before, start] : ranked) {
    std::vector<int> bounds = Improve(prefix, placement, start);
    const auto score = Imbalance(prefix, bounds, placement);
    if (score < best_score) {
      best = std::move(bounds);
      best_score = score;
    }
  }
  return best;
}

}  // namespace

bool PlanStage::operator==(const PlanStage& o) const {
  return first_layer == o.first_layer && end_layer == o.end_layer && ranks == o.ranks &&
         tensor_parallel == o.tensor_parallel && recompute_layers == o.recompute_layers &&
         predicted_compute_seconds == o.predicted_compute_seconds &&
         predicted_memory_bytes == o.predicted_memory_bytes;
}

bool Plan::operator==(const Plan& o) const {
  return format_version == o.format_version && model == o.model && num_layers == o.num_layers &&
         world_size == o.world_size && data_parallel == o.data_parallel &&
         pipeline_parallel == o.pipeline_parallel && tensor_parallel == o.tensor_parallel &&
         sequence_parallel == o.sequence_parallel && expert_parallel == o.expert_parallel &&
         schedule == o.schedule && microbatch_size == o.microbatch_size && mesh == o.mesh &&
         stages == o.stages && predicted_iteration_seconds == o.predicted_iteration_seconds &&
         predicted_peak_memory_bytes == o.predicted_peak_memory_bytes &&
         bottleneck_seconds == o.bottleneck_seconds && time_per_sample == o.time_per_sample &&
         algorithm == o.algorithm && inputs == o.inputs && layer_order == o.layer_order;
}

int Plan::RankOf(int data_parallel_index, int replica, int stage) const {
  if (!IsUniform()) {
    // One pipeline position per stage; replica d of the stage is its d-th rank group.
    return stages[stage].ranks[data_parallel_index * stages[stage].tensor_parallel];
  }
  return mesh[data_parallel_index][PlacementFor(schedule).RankOf(replica, stage)];
}

Placement PlacementFor(const ScheduleSpec& schedule) {
  switch (schedule.kind) {
    case ScheduleKind::kInterleaved:
      return Placement::Looped(schedule.num_ranks, schedule.chunks);
    case ScheduleKind::kChimera:
      return Placement::Bidirectional(schedule.num_ranks);
    case ScheduleKind::kHanayo:
      return Placement::Wave(schedule.num_ranks, schedule.waves);
    case ScheduleKind::kZBV:
    case ScheduleKind::kDualPipeV:
      return Placement::Wave(schedule.num_ranks, /*waves=*/1);
    case ScheduleKind::kDualPipe:
      return Placement::Bidirectional(schedule.num_ranks);
    case ScheduleKind::kCustom:
      return schedule.wave_placement ? Placement::Wave(schedule.num_ranks, schedule.chunks / 2)
                                     : Placement::Looped(schedule.num_ranks, schedule.chunks);
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B:
    case ScheduleKind::kZBH1:
      break;
  }
  return Placement::Linear(schedule.num_ranks);
}

absl::StatusOr<Plan> MakeUniformPlan(int num_layers, const ScheduleSpec& schedule,
                                     int data_parallel, int64_t microbatch_size) {
  TANDEM_RETURN_IF_ERROR(CheckScheduleSpec(schedule));
  const int num_stages = schedule.NumStages();
  if (num_layers < num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", ScheduleKindName(schedule.kind), " pipeline with ", num_stages,
                     " stages needs at least ", num_stages, " layers, the model has ",
                     num_layers));
  }
  if (data_parallel < 1 || int64_t{data_parallel} * schedule.num_ranks > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_parallel must be in [1, ", kMaxWorldSize / schedule.num_ranks, "], got ",
        data_parallel));
  }
  if (microbatch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatch_size must be at least 1, got ", microbatch_size));
  }
  Plan plan;
  plan.model = "uniform";
  plan.num_layers = num_layers;
  plan.pipeline_parallel = schedule.num_ranks;
  plan.data_parallel = data_parallel;
  plan.world_size = data_parallel * schedule.num_ranks;
  plan.schedule = schedule;
  plan.microbatch_size = microbatch_size;
  plan.algorithm = "uniform";
  for (int d = 0; d < data_parallel; ++d) {
    std::vector<int> row(schedule.num_ranks);
    for (int q = 0; q < schedule.num_ranks; ++q) row[q] = d * schedule.num_ranks + q;
    plan.mesh.push_back(std::move(row));
  }
  // The first (num_layers % num_stages) stages take one extra layer.
  const int base = num_layers / num_stages;
  const int extra = num_layers % num_stages;
  const Placement placement = PlacementFor(schedule);
  int first = 0;
  for (int s = 0; s < num_stages; ++s) {
    PlanStage stage;
    stage.first_layer = first;
    stage.end_layer = first + base + (s < extra ? 1 : 0);
    first = stage.end_layer;
    stage.ranks = UniformStageRanks(plan, placement, s);
    plan.stages.push_back(std::move(stage));
  }
  return plan;
}

absl::StatusOr<Plan> MakeBalancedPlan(const std::vector<double>& layer_costs,
                                      const ScheduleSpec& schedule, int data_parallel,
                                      int64_t microbatch_size) {
  const int n = static_cast<int>(layer_costs.size());
  TANDEM_ASSIGN_OR_RETURN(Plan plan,
                          MakeUniformPlan(n, schedule, data_parallel, microbatch_size));
  double total = 0;
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(layer_costs[i]) || layer_costs[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer cost ", i, " must be finite and not negative, got ", layer_costs[i]));
    }
    total += layer_costs[i];
  }
  if (!(total > 0)) return plan;  // nothing to balance: the even split
  const std::vector<int> bounds = BalancedBounds(layer_costs, PlacementFor(schedule));
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    plan.stages[s].first_layer = bounds[s];
    plan.stages[s].end_layer = bounds[s + 1];
  }
  plan.algorithm = "balanced";
  return plan;
}

absl::StatusOr<Plan> WithTensorParallel(Plan plan, int tensor_parallel) {
  if (tensor_parallel < 1 || tensor_parallel > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel must be in [1, ",
                                                   kMaxWorldSize, "], got ", tensor_parallel));
  }
  if (!plan.IsUniform() || plan.tensor_parallel != 1) {
    return absl::InvalidArgumentError(
        "tensor parallelism is added to a mesh plan without it (uniform, tensor_parallel 1)");
  }
  if (int64_t{plan.world_size} * tensor_parallel > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(plan.world_size, " x tensor_parallel ",
                                                   tensor_parallel, " ranks exceed ",
                                                   kMaxWorldSize));
  }
  plan.tensor_parallel = tensor_parallel;
  plan.world_size *= tensor_parallel;
  for (auto& row : plan.mesh) {
    for (int& rank : row) rank *= tensor_parallel;
  }
  for (PlanStage& stage : plan.stages) {
    std::vector<int> ranks;
    for (int rank : stage.ranks) {
      for (int t = 0; t < tensor_parallel; ++t) ranks.push_back(rank * tensor_parallel + t);
    }
    stage.ranks = std::move(ranks);
    stage.tensor_parallel = tensor_parallel;
  }
  std::vector<double> memory;
  for (double bytes : plan.predicted_peak_memory_bytes) {
    memory.insert(memory.end(), tensor_parallel, bytes);
  }
  plan.predicted_peak_memory_bytes = std::move(memory);
  return plan;
}

absl::Status ValidatePlan(const Plan& plan, int expected_world_size, int expected_num_layers) {
  if (plan.format_version != kPlanFormatVersion) {
    return Invalid("plan.format_version", absl::StrCat("unsupported version ", plan.format_version,
                                                       " (this build reads ", kPlanFormatVersion,
                                                       ")"));
  }
  if (plan.num_layers < 1) {
    return Invalid("plan.num_layers", absl::StrCat("must be at least 1, got ", plan.num_layers));
  }
  if (plan.world_size < 1 || plan.world_size > kMaxWorldSize) {
    return Invalid("plan.world_size",
                   absl::StrCat("must be in [1, ", kMaxWorldSize, "], got ", plan.world_size));
  }
  if (plan.microbatch_size < 1 || plan.microbatch_size > kMaxMicrobatchSize) {
    return Invalid("plan.microbatch_size", absl::StrCat("must be in [1, ", kMaxMicrobatchSize,
                                                        "], got ", plan.microbatch_size));
  }
  if (plan.tensor_parallel < 1) {
    return Invalid("plan.tensor_parallel",
                   absl::StrCat("must be at least 1, got ", plan.tensor_parallel));
  }
  if (plan.data_parallel < 1) {
    return Invalid("plan.data_parallel",
                   absl::StrCat("must be at least 1, got ", plan.data_parallel));
  }
  if (plan.sequence_parallel && plan.tensor_parallel < 2 &&
      std::none_of(plan.stages.begin(), plan.stages.end(),
                   [](const PlanStage& stage) { return stage.tensor_parallel >= 2; })) {
    return Invalid("plan.sequence_parallel",
                   "splits the sequence over tensor-parallel groups: it needs tensor_parallel 2 "
                   "or more");
  }
  if (plan.expert_parallel < 1 || plan.tensor_parallel % plan.expert_parallel != 0 ||
      std::any_of(plan.stages.begin(), plan.stages.end(), [&](const PlanStage& stage) {
        return stage.tensor_parallel % plan.expert_parallel != 0;
      })) {
    return Invalid("plan.expert_parallel",
                   absl::StrCat("places the experts on parts of tensor-parallel groups: it must "
                                "divide every group's degree (tensor_parallel ",
                                plan.tensor_parallel, "), got ", plan.expert_parallel));
  }
  TANDEM_RETURN_IF_ERROR(Annotate(CheckScheduleSpec(plan.schedule), "plan.schedule"));
  if (plan.pipeline_parallel != plan.schedule.num_ranks) {
    return Invalid("plan.pipeline_parallel",
                   absl::StrCat(plan.pipeline_parallel, " differs from schedule.num_ranks ",
                                plan.schedule.num_ranks));
  }
  const int num_stages = plan.schedule.NumStages();
  if (static_cast<int>(plan.stages.size()) != num_stages) {
    return Invalid("plan.stages", absl::StrCat("the schedule has ", num_stages,
                                               " stages, the plan lists ", plan.stages.size()));
  }
  int next_layer = 0;
  for (int s = 0; s < num_stages; ++s) {
    const PlanStage& stage = plan.stages[s];
    const std::string where = absl::StrCat("plan.stages[", s, "]");
    if (stage.first_layer != next_layer) {
      return Invalid(absl::StrCat(where, ".first_layer"),
                     absl::StrCat("expected ", next_layer, " (stages cover the layers in order), "
                                  "got ", stage.first_layer));
    }
    if (stage.end_layer <= stage.first_layer) {
      return Invalid(absl::StrCat(where, ".end_layer"),
                     absl::StrCat("must be greater than first_layer ", stage.first_layer,
                                  ", got ", stage.end_layer));
    }
    if (stage.tensor_parallel < 1) {
      return Invalid(absl::StrCat(where, ".tensor_parallel"),
                     absl::StrCat("must be at least 1, got ", stage.tensor_parallel));
    }
    for (int layer : stage.recompute_layers) {
      if (layer < stage.first_layer || layer >= stage.end_layer) {
        return Invalid(absl::StrCat(where, ".recompute_layers"),
                       absl::StrCat("layer ", layer, " is outside the stage's [",
                                    stage.first_layer, ", ", stage.end_layer, ")"));
      }
    }
    next_layer = stage.end_layer;
  }
  if (next_layer != plan.num_layers) {
    return Invalid("plan.stages", absl::StrCat("stages end at layer ", next_layer,
                                               " but the model has ", plan.num_layers,
                                               " layers"));
  }
  if (!plan.layer_order.empty()) {
    if (static_cast<int>(plan.layer_order.size()) != plan.num_layers) {
      return Invalid("plan.layer_order", absl::StrCat("lists ", plan.layer_order.size(),
                                                      " layers but the model has ",
                                                      plan.num_layers));
    }
    std::vector<bool> listed(plan.num_layers, false);
    for (int layer : plan.layer_order) {
      if (layer < 0 || layer >= plan.num_layers || listed[layer]) {
        return Invalid("plan.layer_order",
                       absl::StrCat("must list every layer of [0, ", plan.num_layers,
                                    ") once; layer ", layer, " is ",
                                    layer < 0 || layer >= plan.num_layers ? "out of range"
                                                                          : "listed twice"));
      }
      listed[layer] = true;
    }
  }
  if (plan.IsUniform()) {
    const int64_t mesh_ranks =
        int64_t{plan.data_parallel} * plan.pipeline_parallel * plan.tensor_parallel;
    if (mesh_ranks != plan.world_size) {
      return Invalid("plan.world_size",
                     absl::StrCat("data_parallel ", plan.data_parallel, " x pipeline_parallel ",
                                  plan.pipeline_parallel, " x tensor_parallel ",
                                  plan.tensor_parallel, " = ", mesh_ranks, ", not ",
                                  plan.world_size));
    }
    for (int s = 0; s < num_stages; ++s) {
      if (plan.stages[s].tensor_parallel != plan.tensor_parallel) {
        return Invalid(absl::StrCat("plan.stages[", s, "].tensor_parallel"),
                       absl::StrCat("a mesh plan has one tensor_parallel degree (",
                                    plan.tensor_parallel, "), got ",
                                    plan.stages[s].tensor_parallel));
      }
    }
    TANDEM_RETURN_IF_ERROR(ValidateUniformRanks(plan));
  } else {
    TANDEM_RETURN_IF_ERROR(ValidateNonUniformRanks(plan));
  }
  // Predictions are numbers a reader can take back: JSON has no infinity, and a cost profile
  // whose times overflow a double would otherwise be written as null.
  const auto finite = [](double value) { return std::isfinite(value) && value >= 0; };
  const auto not_finite = [](absl::string_view field, double value) {
    return Invalid(field, absl::StrCat("must be a finite number >= 0, got ", value,
                                       " (do the profile's costs overflow?)"));
  };
  for (int s = 0; s < num_stages; ++s) {
    const PlanStage& stage = plan.stages[s];
    if (!finite(stage.predicted_compute_seconds)) {
      return not_finite(absl::StrCat("plan.stages[", s, "].predicted_compute_seconds"),
                        stage.predicted_compute_seconds);
    }
    if (!finite(stage.predicted_memory_bytes)) {
      return not_finite(absl::StrCat("plan.stages[", s, "].predicted_memory_bytes"),
                        stage.predicted_memory_bytes);
    }
  }
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"plan.predicted_iteration_seconds",
                                       plan.predicted_iteration_seconds},
        {"plan.bottleneck_seconds", plan.bottleneck_seconds},
        {"plan.time_per_sample", plan.time_per_sample}}) {
    if (!finite(value)) return not_finite(field, value);
  }
  for (double bytes : plan.predicted_peak_memory_bytes) {
    if (!finite(bytes)) return not_finite("plan.predicted_peak_memory_bytes", bytes);
  }
  if (!plan.predicted_peak_memory_bytes.empty() &&
      static_cast<int>(plan.predicted_peak_memory_bytes.size()) != plan.world_size) {
    return Invalid("plan.predicted_peak_memory_bytes",
                   absl::StrCat("expected one value per rank (", plan.world_size, "), got ",
                                plan.predicted_peak_memory_bytes.size()));
  }
  if (expected_world_size >= 0 && expected_world_size != plan.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan is for ", plan.world_size, " ranks but this run has ",
                     expected_world_size));
  }
  if (expected_num_layers >= 0 && expected_num_layers != plan.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan is for a model of ", plan.num_layers,
                     " layers but this model has ", expected_num_layers));
  }
  return absl::OkStatus();
}

nlohmann::json ToJson(const Plan& plan) {
  nlohmann::json stages = nlohmann::json::array();
  for (const PlanStage& stage : plan.stages) stages.push_back(StageToJson(stage));
  nlohmann::json j = {{"format_version", plan.format_version},
          {"model", plan.model},
          {"num_layers", plan.num_layers},
          {"world_size", plan.world_size},
          {"data_parallel", plan.data_parallel},
          {"pipeline_parallel", plan.pipeline_parallel},
          {"tensor_parallel", plan.tensor_parallel},
          {"schedule", ToJson(plan.schedule)},
          {"microbatch_size", plan.microbatch_size},
          {"global_batch_size", plan.GlobalBatchSize()},
          {"mesh", plan.mesh},
          {"stages", std::move(stages)},
          {"predicted_iteration_seconds", plan.predicted_iteration_seconds},
          {"predicted_peak_memory_bytes", plan.predicted_peak_memory_bytes},
          {"bottleneck_seconds", plan.bottleneck_seconds},
          {"time_per_sample", plan.time_per_sample},
          {"algorithm", plan.algorithm},
          {"inputs", plan.inputs}};
  // Written only when it is not the identity, so plans of chain models read as before.
  if (!plan.layer_order.empty()) j["layer_order"] = plan.layer_order;
  if (plan.sequence_parallel) j["sequence_parallel"] = true;
  if (plan.expert_parallel != 1) j["expert_parallel"] = plan.expert_parallel;
  return j;
}

absl::StatusOr<Plan> PlanFromJson(const nlohmann::json& j, absl::string_view where) {
  if (!j.is_object()) return Invalid(where, "expected a JSON object");
  // Field paths read "plan.json: plan.stages[2].ranks".
  const std::string top = absl::StrCat(where, ": plan");
  Plan plan;
  TANDEM_ASSIGN_OR_RETURN(int64_t version,
                          GetIntOr(j, "format_version", kPlanFormatVersion, top));
  if (version != kPlanFormatVersion) {
    return Invalid(absl::StrCat(top, ".format_version"),
                   absl::StrCat("unsupported version ", version, " (this build reads ",
                                kPlanFormatVersion, ")"));
  }
  TANDEM_ASSIGN_OR_RETURN(plan.model, GetStringOr(j, "model", "", top));
  TANDEM_ASSIGN_OR_RETURN(plan.num_layers, GetIntIn(j, "num_layers", 1, kMaxLayers, top));
  TANDEM_ASSIGN_OR_RETURN(plan.world_size, GetIntIn(j, "world_size", 1, kMaxWorldSize, top));
  TANDEM_ASSIGN_OR_RETURN(plan.data_parallel,
                          GetIntIn(j, "data_parallel", 1, kMaxWorldSize, top));
  TANDEM_ASSIGN_OR_RETURN(plan.pipeline_parallel,
                          GetIntIn(j, "pipeline_parallel", 1, kMaxRanks, top));
  if (j.contains("tensor_parallel")) {
    TANDEM_ASSIGN_OR_RETURN(plan.tensor_parallel,
                            GetIntIn(j, "tensor_parallel", 1, kMaxWorldSize, top));
  }
  if (j.contains("sequence_parallel")) {
    TANDEM_ASSIGN_OR_RETURN(plan.sequence_parallel, GetBool(j, "sequence_parallel", top));
  }
  if (j.contains("expert_parallel")) {
    TANDEM_ASSIGN_OR_RETURN(plan.expert_parallel,
                            GetIntIn(j, "expert_parallel", 1, kMaxWorldSize, top));
  }
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* schedule, GetObject(j, "schedule", top));
  TANDEM_ASSIGN_OR_RETURN(plan.schedule,
                          ScheduleSpecFromJson(*schedule, absl::StrCat(top, ".schedule")));
  TANDEM_ASSIGN_OR_RETURN(plan.microbatch_size, GetInt(j, "microbatch_size", top));
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* mesh, GetArray(j, "mesh", top));
  for (size_t d = 0; d < mesh->size(); ++d) {
    const std::string row_where = absl::StrCat(top, ".mesh[", d, "]");
    if (!(*mesh)[d].is_array()) return Invalid(row_where, "expected an array of ranks");
    std::vector<int> row;
    for (const nlohmann::json& rank : (*mesh)[d]) {
      if (!rank.is_number_integer() || rank.get<int64_t>() < 0 ||
          rank.get<int64_t>() >= kMaxWorldSize) {
        return Invalid(row_where, absl::StrCat("expected ranks in [0, ", kMaxWorldSize,
                                               "), got ", rank.dump()));
      }
      row.push_back(rank.get<int>());
    }
    plan.mesh.push_back(std::move(row));
  }
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* stages, GetArray(j, "stages", top));
  for (size_t s = 0; s < stages->size(); ++s) {
    TANDEM_ASSIGN_OR_RETURN(PlanStage stage,
                            StageFromJson((*stages)[s], absl::StrCat(top, ".stages[", s, "]")));
    plan.stages.push_back(std::move(stage));
  }
  TANDEM_ASSIGN_OR_RETURN(plan.predicted_iteration_seconds,
                          GetNumberOr(j, "predicted_iteration_seconds", 0, top));
  if (j.contains("predicted_peak_memory_bytes")) {
    TANDEM_ASSIGN_OR_RETURN(plan.predicted_peak_memory_bytes,
                            GetNumberArray(j, "predicted_peak_memory_bytes", top));
  }
  TANDEM_ASSIGN_OR_RETURN(plan.bottleneck_seconds, GetNumberOr(j, "bottleneck_seconds", 0, top));
  TANDEM_ASSIGN_OR_RETURN(plan.time_per_sample, GetNumberOr(j, "time_per_sample", 0, top));
  TANDEM_ASSIGN_OR_RETURN(plan.algorithm, GetStringOr(j, "algorithm", "", top));
  if (j.contains("inputs")) plan.inputs = j["inputs"];
  if (j.contains("layer_order")) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<int64_t> order, GetIntArray(j, "layer_order", top));
    for (int64_t layer : order) {
      if (layer < 0 || layer >= plan.num_layers) {
        return Invalid(absl::StrCat(top, ".layer_order"),
                       absl::StrCat("layer ", layer, " is outside [0, ", plan.num_layers, ")"));
      }
      plan.layer_order.push_back(static_cast<int>(layer));
    }
  }
  // Structural errors name the file too.
  TANDEM_RETURN_IF_ERROR(Annotate(ValidatePlan(plan), where));
  return plan;
}

absl::StatusOr<Plan> ReadPlanFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  return PlanFromJson(j, path);
}

absl::Status WritePlanFile(const Plan& plan, const std::string& path) {
  TANDEM_RETURN_IF_ERROR(Annotate(ValidatePlan(plan), path));
  return WriteFileAtomically(path, ToJson(plan).dump(2) + "\n");
}

}  // namespace tandem::pipeline
