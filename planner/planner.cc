#include "planner/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/units.h"
#include "planner/adapipe.h"
#include "planner/importers.h"
#include "planner/layer_chain.h"
#include "planner/pipedream.h"
#include "planner/schedule_search.h"

namespace tandem::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Default micro-batches per pipeline when none are given: enough for 1F1B's steady state.
constexpr int kDefaultMicrobatchesPerStage = 4;
// Unlimited memory for algorithms that need a number.
constexpr double kUnlimitedMemory = 1e30;
// Weights and gradients.
constexpr double kWeightCopies = 2.0;
// Ring all-reduce moves 2 (D-1)/D of the bytes.
constexpr double kRingFactor = 2.0;
// The smallest-memory search stops at this relative precision.
constexpr double kMemorySearchPrecision = 0.01;
constexpr int kMemorySearchDoublings = 40;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string RankRange(const std::vector<int>& ranks) {
  if (ranks.empty()) return "-";
  bool consecutive = true;
  for (size_t i = 1; i < ranks.size(); ++i) consecutive &= ranks[i] == ranks[i - 1] + 1;
  if (consecutive && ranks.size() > 1) return absl::StrCat(ranks.front(), "-", ranks.back());
  if (ranks.size() <= 4) return absl::StrJoin(ranks, ",");
  return absl::StrCat(ranks[0], ",", ranks[1], ",...,", ranks.back(), " (", ranks.size(), ")");
}

std::string RecomputeText(const pipeline::PlanStage& stage) {
  if (stage.recompute_layers.empty()) return "-";
  const int size = stage.end_layer - stage.first_layer;
  if (static_cast<int>(stage.recompute_layers.size()) == size) return "all";
  return absl::StrCat(stage.recompute_layers.size(), "/", size);
}

std::string StageTable(const pipeline::Plan& plan) {
  std::string out = absl::StrFormat("%-6s %-16s %-22s %-3s %-10s %-12s %s\n", "stage",
                                    "layers", "ranks", "tp", "recompute", "compute/mb",
                                    "memory/rank");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const pipeline::PlanStage& stage = plan.stages[s];
    std::string layers = absl::StrCat("[", stage.first_layer, ", ", stage.end_layer, ")");
    std::string line = absl::StrFormat("%-6d %-16s %-22s %-3d %-10s %-12s %s", s, layers,
                                       RankRange(stage.ranks), stage.tensor_parallel,
                                       RecomputeText(stage),
                                       FormatSeconds(stage.predicted_compute_seconds),
                                       FormatBytes(stage.predicted_memory_bytes));
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

// Per-stage degrees -> plan ranks, numbered stage by stage. Uniform when every stage has the
// same (replicas, tensor-parallel) degrees.
void AssignStageMajorRanks(const std::vector<int>& replicas, const std::vector<int>& degrees,
                           pipeline::Plan* plan) {
  const int p = static_cast<int>(replicas.size());
  bool uniform = true;
  for (int s = 1; s < p; ++s) {
    uniform &= replicas[s] == replicas[0] && degrees[s] == degrees[0];
  }
  int next = 0;
  for (int s = 0; s < p; ++s) {
    pipeline::PlanStage& stage = plan->stages[s];
    stage.tensor_parallel = degrees[s];
    stage.ranks.clear();
    for (int k = 0; k < replicas[s] * degrees[s]; ++k) stage.ranks.push_back(next++);
  }
  plan->world_size = next;
  plan->pipeline_parallel = p;
  plan->schedule.num_ranks = p;
  if (uniform) {
    const int d_count = replicas[0], t = degrees[0];
    plan->data_parallel = d_count;
    plan->tensor_parallel = t;
    plan->mesh.assign(d_count, std::vector<int>(p));
    for (int d = 0; d < d_count; ++d) {
      for (int q = 0; q < p; ++q) plan->mesh[d][q] = (q * d_count + d) * t;
    }
  } else {
    plan->data_parallel = 1;
    plan->tensor_parallel = 1;
    plan->mesh.clear();
  }
}

void FillPeakMemory(pipeline::Plan* plan) {
  plan->predicted_peak_memory_bytes.assign(plan->world_size, 0.0);
  for (const pipeline::PlanStage& stage : plan->stages) {
    for (int rank : stage.ranks) {
      plan->predicted_peak_memory_bytes[rank] += stage.predicted_memory_bytes;
    }
  }
}

// Synchronous stages wait for their slowest replica: on a heterogeneous cluster, Piper and
// AdaPipe plan with every device at the slowest device's speed.
pipeline::Profile AtSlowestSpeed(const pipeline::Profile& profile, const ClusterSpec& cluster) {
  const double slowdown = 1.0 / cluster.SlowestSpeed();
  if (slowdown == 1.0) return profile;
  pipeline::Profile scaled = profile;
  for (pipeline::LayerProfile& layer : scaled.layers) {
    layer.forward_seconds *= slowdown;
    layer.backward_seconds *= slowdown;
    layer.backward_input_seconds *= slowdown;
    layer.backward_weight_seconds *= slowdown;
    layer.recompute_seconds *= slowdown;
    for (pipeline::TensorParallelVariant& v : layer.tensor_parallel) {
      v.forward_seconds *= slowdown;
      v.backward_seconds *= slowdown;
    }
  }
  return scaled;
}


// ---- PipeDream -----------------------------------------------------------------------------

// The profile with its layers in `order`, a topological order: inputs become explicit and
// renumbered (an empty list means "the previous layer", which the new order changes).
pipeline::Profile Reordered(const pipeline::Profile& profile, const std::vector<int>& order) {
  std::vector<int> position(order.size());
  for (size_t q = 0; q < order.size(); ++q) position[order[q]] = static_cast<int>(q);
  pipeline::Profile reordered = profile;
  reordered.layers.clear();
  for (size_t q = 0; q < order.size(); ++q) {
    const int v = order[q];
    pipeline::LayerProfile layer = profile.layers[v];
    if (layer.inputs.empty() && v > 0) layer.inputs = {v - 1};
    for (int& u : layer.inputs) u = position[u];
    std::sort(layer.inputs.begin(), layer.inputs.end());
    if (layer.inputs.size() == 1 && layer.inputs[0] == static_cast<int>(q) - 1) {
      layer.inputs.clear();
    }
    reordered.layers.push_back(std::move(layer));
  }
  return reordered;
}

absl::StatusOr<PlanOutcome> PlanPipeDream(const PlanRequest& request) {
  TANDEM_ASSIGN_OR_RETURN(LayerChain chain, LayerChain::FromProfile(request.profile));
  const ClusterSpec& cluster = request.cluster;
  PipeDreamOptions options;
  if (cluster.levels.size() == 1) {
    options.levels = {{cluster.NumDevices(), cluster.levels[0].bandwidth_bytes_per_second}};
  } else {
    options.levels = {{cluster.devices_per_node, cluster.levels[0].bandwidth_bytes_per_second},
                      {cluster.nodes, cluster.levels[1].bandwidth_bytes_per_second}};
  }
  options.straight = request.straight;
  options.use_fewer_machines = request.use_fewer_machines;
  options.use_memory_constraint = cluster.device_memory_bytes > 0;
  options.memory_bytes = cluster.device_memory_bytes;
  options.activation_compression_ratio = request.activation_compression_ratio;
  options.device_speeds = cluster.device_speeds;
  options.max_states = request.pipedream_max_states;
  // Over PipeDream's antichain states when the graph is known: its stages are differences of
  // down-sets, contiguous in a topological order the plan then carries (layer_order). When
  // that search cannot run, or finds no partition where contiguous ranges of the profile's
  // order may still find one, the plan is the best over that order and a note says so.
  std::string search_note;
  std::optional<PipeDreamResult> over_states;
  if (request.pipedream_graph.has_value()) {
    options.graph = *request.pipedream_graph;
    auto states = RunPipeDream(chain, options);
    options.graph = PipeDreamGraph{};
    if (states.ok()) {
      over_states = *std::move(states);
    } else if (states.status().code() != absl::StatusCode::kResourceExhausted) {
      return states.status();
    } else {
      search_note = absl::StrCat(
          "note: PipeDream's search over antichain states did not finish (",
          states.status().message(),
          "); planned over contiguous ranges of the profile's layer order instead, which is "
          "not PipeDream's optimum",
          IsTooManyStates(states.status())
              ? absl::StrCat("; --max-antichain-states raises the limit of ",
                             request.pipedream_max_states)
              : "",
          "\n");
    }
  }
  if (!over_states.has_value()) {
    TANDEM_ASSIGN_OR_RETURN(over_states, RunPipeDream(chain, options));
  }
  const PipeDreamResult& result = *over_states;
  // Stage sums over the plan's order.
  if (!result.layer_order.empty()) {
    TANDEM_ASSIGN_OR_RETURN(chain,
                            LayerChain::FromProfile(Reordered(request.profile,
                                                              result.layer_order)));
  }

  pipeline::Plan plan;
  plan.model = request.profile.model;
  plan.num_layers = chain.num_layers();
  plan.microbatch_size = request.profile.microbatch_size;
  plan.algorithm = "pipedream";
  plan.layer_order = result.layer_order;
  const int p = static_cast<int>(result.stages.size());
  std::vector<int> replicas, degrees(p, 1);
  for (const PipeDreamStage& s : result.stages) {
    pipeline::PlanStage stage;
    stage.first_layer = s.first_layer;
    stage.end_layer = s.end_layer;
    stage.predicted_compute_seconds = chain.ComputeSeconds(s.first_layer, s.end_layer);
    const int in_flight = p - static_cast<int>(plan.stages.size());
    stage.predicted_memory_bytes =
        kWeightCopies * chain.ParameterBytes(s.first_layer, s.end_layer) +
        chain.OptimizerStateBytes(s.first_layer, s.end_layer) +
        in_flight * chain.StashedBytes(s.first_layer, s.end_layer);
    plan.stages.push_back(stage);
    replicas.push_back(s.replicas);
  }
  plan.schedule.kind = pipeline::ScheduleKind::k1F1B;
  AssignStageMajorRanks(replicas, degrees, &plan);
  const int total = request.microbatches > 0
                        ? request.microbatches
                        : kDefaultMicrobatchesPerStage * p * plan.data_parallel;
  if (plan.IsUniform() && total % plan.data_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--microbatches ", total, " is not a multiple of the ", plan.data_parallel,
        " data-parallel pipelines of the PipeDream plan"));
  }
  plan.schedule.num_microbatches = plan.IsUniform() ? total / plan.data_parallel : total;
  plan.bottleneck_seconds = result.bottleneck_seconds;
  // Throughput is one micro-batch per bottleneck; the first also crosses every stage.
  double fill = 0;
  for (const pipeline::PlanStage& stage : plan.stages) fill += stage.predicted_compute_seconds;
  plan.predicted_iteration_seconds = (total - 1) * result.bottleneck_seconds + fill;
  FillPeakMemory(&plan);
  plan.inputs = request.inputs;

  PlanOutcome outcome;
  outcome.plan = std::move(plan);
  outcome.summary = absl::StrFormat(
      "pipedream%s on %s (%d layers), %d devices: bottleneck (time per stage) %.9g s; one "
      "machine %.9g s (%.2fx); data-parallel %.9g s\n",
      request.straight ? " (straight)" : "", request.profile.model, chain.num_layers(),
      cluster.NumDevices(), result.bottleneck_seconds, result.single_machine_seconds,
      result.single_machine_seconds / result.bottleneck_seconds, result.data_parallel_seconds);
  if (request.pipedream_graph.has_value() && search_note.empty()) {
    absl::StrAppend(&outcome.summary, "PipeDream's search over its ", result.num_states,
                    " antichain states",
                    result.layer_order.empty()
                        ? ""
                        : "; stages are contiguous in the plan's layer_order, a topological "
                          "order of the layers",
                    "\n");
  }
  outcome.notes = search_note;
  outcome.summary += search_note;
  return outcome;
}

// ---- Piper ---------------------------------------------------------------------------------

// The Piper problem of a request: the imported instance with the cluster's settings, or one
// built from the profile.
PiperInstance PiperInstanceFor(const PlanRequest& request) {
  const ClusterSpec& cluster = request.cluster;
  PiperInstance instance;
  if (request.piper_instance.has_value()) {
    instance = *request.piper_instance;
    instance.max_devices = cluster.NumDevices();
    if (cluster.device_memory_bytes > 0) {
      instance.memory_per_device_bytes = cluster.device_memory_bytes;
    }
    instance.bandwidth_bytes_per_second = cluster.levels.back().bandwidth_bytes_per_second;
    if (request.microbatches > 0) instance.microbatches_per_batch = request.microbatches;
    for (PiperNode& node : instance.nodes) {
      for (auto& [degree, configs] : node.configs) {
        for (PiperConfig& c : configs) c.time_per_sample /= cluster.SlowestSpeed();
      }
    }
  } else {
    PiperProblemSettings settings;
    settings.max_devices = cluster.NumDevices();
    settings.memory_per_device_bytes =
        cluster.device_memory_bytes > 0 ? cluster.device_memory_bytes : kUnlimitedMemory;
    settings.bandwidth_bytes_per_second = cluster.levels.back().bandwidth_bytes_per_second;
    // The default stays within what a plan may hold (pipeline::kMaxMicrobatches, the count
    // of a non-uniform plan): 4 per device on a million devices is 4e6, which Piper's search
    // took 27 s to plan before the plan was refused.
    settings.microbatches_per_batch =
        request.microbatches > 0
            ? request.microbatches
            : static_cast<int>(std::min<int64_t>(
                  int64_t{kDefaultMicrobatchesPerStage} * cluster.NumDevices(),
                  pipeline::kMaxMicrobatches));
    instance = PiperFromProfile(AtSlowestSpeed(request.profile, cluster), settings);
  }
  return instance;
}

absl::StatusOr<PlanOutcome> PlanPiper(const PlanRequest& request) {
  const PiperInstance instance = PiperInstanceFor(request);
  PiperOptions options;
  options.knapsack = request.knapsack;
  TANDEM_ASSIGN_OR_RETURN(PiperResult result, RunPiper(instance, options));

  pipeline::Plan plan;
  plan.model = request.profile.model;
  plan.num_layers = static_cast<int>(instance.nodes.size());
  plan.microbatch_size = request.profile.microbatch_size;
  plan.algorithm = "piper";
  std::vector<int> replicas, degrees;
  std::vector<double> per_microbatch;
  for (const PiperStage& s : result.stages) {
    pipeline::PlanStage stage;
    stage.first_layer = s.first_node;
    stage.end_layer = s.end_node;
    for (int v = s.first_node; v < s.end_node; ++v) {
      if (s.config_ids[v - s.first_node] != "vanilla" &&
          s.config_ids[v - s.first_node].find("recomp") != std::string::npos) {
        stage.recompute_layers.push_back(v);
      }
    }
    // The load is per micro-batch over d replicas; one replica takes d times as long.
    stage.predicted_compute_seconds = s.load * s.data_parallel;
    stage.predicted_memory_bytes = s.memory_bytes;
    per_microbatch.push_back(stage.predicted_compute_seconds);
    plan.stages.push_back(stage);
    replicas.push_back(s.data_parallel);
    degrees.push_back(s.tensor_parallel);
  }
  plan.schedule.kind = pipeline::ScheduleKind::k1F1B;
  AssignStageMajorRanks(replicas, degrees, &plan);
  const int total = instance.microbatches_per_batch;
  plan.schedule.num_microbatches = plan.IsUniform() ? total / plan.data_parallel : total;
  plan.time_per_sample = result.time_per_sample;
  double fill = 0;
  for (double s : per_microbatch) fill += s;
  plan.predicted_iteration_seconds = (total - 1) * result.time_per_sample + fill;
  FillPeakMemory(&plan);
  plan.inputs = request.inputs;

  PlanOutcome outcome;
  outcome.plan = std::move(plan);
  outcome.summary = absl::StrFormat(
      "piper on %s (%d layers), %d devices, %s per device, %d micro-batches per batch: "
      "maximum load (time per sample) %.9g s using %d devices (sum of data-parallel degrees "
      "%d)\n",
      request.profile.model, static_cast<int>(instance.nodes.size()), instance.max_devices,
      FormatBytes(instance.memory_per_device_bytes), instance.microbatches_per_batch,
      result.time_per_sample, result.devices_used, result.sum_data_parallel);
  return outcome;
}

// ---- AdaPipe -------------------------------------------------------------------------------

struct AdaPipeCandidate {
  int tensor_parallel = 1;
  bool sequence_parallel = false;
  int expert_parallel = 1;
  int stages = 1;
  int data_parallel = 1;
  int microbatches = 1;  // per pipeline
  double sync_seconds = 0;
  double seconds = kInfinity;  // iteration + gradient sync
  AdaPipeResult result;
  absl::StatusOr<AdaPipeResult> baseline = absl::UnknownError("not computed");
  std::shared_ptr<LayerChain> chain;
};

// A tensor-parallel degree, whether its variants run with sequence parallelism (unset: any
// variant of the degree, for a degree the profile does not have whole, whose error
// ProfileAtTensorParallel names) and on how many parts of the group the experts sit.
struct TensorParallelChoice {
  int degree = 1;
  std::optional<bool> sequence_parallel;
  int expert_parallel = 1;
};

// The degrees AdaPipe weighs: 1, and each degree (at most a node's devices) that every layer
// has a variant of, with and without sequence parallelism where every layer has both (without
// first, so that it wins a tie), and with the experts on each number of parts every layer has
// (fewest first). A degree the request fixes is the only one; an expert parallelism it fixes
// leaves out the variants without it (and degree 1 when it is above 1).
std::vector<TensorParallelChoice> TensorParallelCandidates(const PlanRequest& request) {
  const auto& layers = request.profile.layers;
  auto everywhere = [&](int degree, bool sequence_parallel, int expert_parallel) {
    return std::all_of(layers.begin(), layers.end(), [&](const auto& layer) {
      return std::any_of(layer.tensor_parallel.begin(), layer.tensor_parallel.end(),
                         [&](const auto& w) {
                           return w.degree == degree && w.sequence_parallel == sequence_parallel &&
                                  w.expert_parallel == expert_parallel;
                         });
    });
  };
  std::set<int> parts = {1};
  if (!layers.empty()) {
    for (const pipeline::TensorParallelVariant& v : layers.front().tensor_parallel) {
      parts.insert(v.expert_parallel);
    }
  }
  if (request.expert_parallel > 0) parts = {request.expert_parallel};
  std::vector<TensorParallelChoice> choices;
  auto add = [&](int degree, bool forced) {
    if (degree == 1) {
      if (parts.count(1) > 0) choices.push_back({1, false, 1});
      return;
    }
    const size_t before = choices.size();
    for (int expert_parallel : parts) {
      for (bool sequence_parallel : {false, true}) {
        if (everywhere(degree, sequence_parallel, expert_parallel)) {
          choices.push_back({degree, sequence_parallel, expert_parallel});
        }
      }
    }
    if (forced && choices.size() == before) {
      choices.push_back({degree, std::nullopt, *parts.begin()});
    }
  };
  if (request.tensor_parallel > 0) {
    add(request.tensor_parallel, /*forced=*/true);
    return choices;
  }
  std::set<int> degrees = {1};
  if (!layers.empty()) {
    for (const pipeline::TensorParallelVariant& v : layers.front().tensor_parallel) {
      if (v.degree <= request.cluster.devices_per_node) degrees.insert(v.degree);
    }
  }
  for (int degree : degrees) add(degree, /*forced=*/false);
  return choices;
}

absl::StatusOr<PlanOutcome> PlanAdaPipe(const PlanRequest& request) {
  if (request.adapipe_baseline && !request.schedule.empty()) {
    return absl::InvalidArgumentError(
        "AdaPipe's baseline (Megatron-LM's default) is planned for 1F1B: drop --schedule");
  }
  const ClusterSpec& cluster = request.cluster;
  const int devices = cluster.NumDevices();
  const double memory = cluster.device_memory_bytes;
  const double inter_bandwidth = cluster.levels.back().bandwidth_bytes_per_second;
  AdaPipeCandidate best;
  absl::Status last_error = absl::ResourceExhaustedError("no candidate");
  bool any_tried = false;
  for (const TensorParallelChoice& choice : TensorParallelCandidates(request)) {
    const int t = choice.degree;
    if (devices % t != 0) continue;
    TANDEM_ASSIGN_OR_RETURN(
        pipeline::Profile at_t,
        ProfileAtTensorParallel(AtSlowestSpeed(request.profile, cluster), t,
                                choice.sequence_parallel, choice.expert_parallel));
    TANDEM_ASSIGN_OR_RETURN(LayerChain chain_value, LayerChain::FromProfile(at_t));
    auto chain = std::make_shared<LayerChain>(std::move(chain_value));
    AdaPipePlanner planner(*chain, memory);
    const int pipeline_devices = devices / t;
    for (int p = 1; p <= std::min(pipeline_devices, chain->num_layers()); ++p) {
      if (pipeline_devices % p != 0) continue;
      if (request.stages > 0 && p != request.stages) continue;
      const int d = pipeline_devices / p;
      const int total =
          request.microbatches > 0 ? request.microbatches : kDefaultMicrobatchesPerStage * p * d;
      if (total % d != 0) continue;
      const int m = total / d;
      any_tried = true;
      auto result = planner.Plan(p, m, inter_bandwidth);
      // A search too large to run says so at once instead of quietly leaving a shape out.
      if (absl::IsOutOfRange(result.status())) return result.status();
      if (!result.ok()) {
        last_error = result.status();
        continue;
      }
      double sync = 0;
      if (d > 1) {
        for (const AdaPipeStage& stage : result->stages) {
          sync = std::max(sync, kRingFactor * (d - 1) / d *
                                    chain->ParameterBytes(stage.first_layer, stage.end_layer) /
                                    inter_bandwidth);
        }
      }
      const double seconds = result->iteration_seconds + sync;
      if (seconds < best.seconds) {
        best.tensor_parallel = t;
        best.sequence_parallel = t > 1 && choice.sequence_parallel.value_or(false);
        best.expert_parallel = choice.expert_parallel;
        best.stages = p;
        best.data_parallel = d;
        best.microbatches = m;
        best.sync_seconds = sync;
        best.seconds = seconds;
        best.result = *result;
        best.chain = chain;
      }
    }
  }
  if (!any_tried) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AdaPipe: no pipeline shape fits ", devices, " devices",
        request.stages > 0 ? absl::StrCat(" with ", request.stages, " stages") : "",
        request.microbatches > 0
            ? absl::StrCat(" and ", request.microbatches,
                           " micro-batches per batch (they must divide among the pipelines)")
            : ""));
  }
  if (!std::isfinite(best.seconds)) return last_error;
  AdaPipeOptions baseline_options{best.stages, best.microbatches, memory, true, inter_bandwidth};
  best.baseline = UniformFullRecompute(*best.chain, baseline_options);
  // The baseline asked for: its partition and recomputation become the plan, AdaPipe's
  // figures stay for the summary's comparison.
  const double adaptive_seconds = best.seconds;
  if (request.adapipe_baseline) {
    if (!best.baseline.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "Megatron-LM's default (uniform, full recomputation) does not fit the shape AdaPipe "
          "chose (", best.data_parallel, " data x ", best.stages, " pipeline x ",
          best.tensor_parallel, " tensor parallel): ", best.baseline.status().message()));
    }
    best.result = *best.baseline;
    best.seconds = best.baseline->iteration_seconds + best.sync_seconds;
  }

  pipeline::Plan plan;
  plan.model = request.profile.model;
  plan.num_layers = best.chain->num_layers();
  plan.microbatch_size = request.profile.microbatch_size;
  plan.algorithm = request.adapipe_baseline ? "adapipe-baseline" : "adapipe";
  plan.schedule.kind = pipeline::ScheduleKind::k1F1B;
  plan.schedule.num_ranks = best.stages;
  plan.schedule.num_microbatches = best.microbatches;
  plan.data_parallel = best.data_parallel;
  plan.pipeline_parallel = best.stages;
  plan.tensor_parallel = best.tensor_parallel;
  plan.sequence_parallel = best.sequence_parallel;
  plan.expert_parallel = best.expert_parallel;
  plan.world_size = devices;
  for (int d = 0; d < best.data_parallel; ++d) {
    std::vector<int> row(best.stages);
    for (int q = 0; q < best.stages; ++q) {
      row[q] = (d * best.stages + q) * best.tensor_parallel;
    }
    plan.mesh.push_back(std::move(row));
  }
  // Stages of the 1F1B partition AdaPipe chose; the schedule search may replace them.
  std::vector<int> ends;
  std::vector<std::vector<int>> recompute;
  std::vector<double> stage_seconds, stage_memory;
  for (const AdaPipeStage& s : best.result.stages) {
    ends.push_back(s.end_layer);
    recompute.push_back(s.recompute_layers);
    stage_seconds.push_back(s.seconds);
    stage_memory.push_back(s.memory_bytes);
  }
  plan.bottleneck_seconds = best.result.bottleneck_seconds;
  plan.predicted_iteration_seconds = best.seconds;
  std::string schedule_note;
  if (!request.schedule.empty()) {
    ScheduleSearchOptions search;
    search.ranks = best.stages;
    search.profiled_microbatch_size = request.profile.microbatch_size;
    search.samples_per_pipeline = int64_t{best.microbatches} * request.profile.microbatch_size;
    search.memory_bytes = memory;
    search.p2p_bandwidth_bytes_per_second = inter_bandwidth;
    search.p2p_latency_seconds = cluster.levels.back().latency_seconds;
    if (request.schedule != "auto") {
      TANDEM_ASSIGN_OR_RETURN(pipeline::ScheduleKind kind,
                              pipeline::ParseScheduleKind(request.schedule));
      search.kinds = {kind};
    }
    search.fixed_partitions.push_back({ends, recompute, "adapipe"});
    TANDEM_ASSIGN_OR_RETURN(ScheduleSearchResult searched,
                            SearchSchedules(*best.chain, search));
    const ScheduleEvaluation& chosen = searched.best;
    plan.schedule = chosen.spec;
    plan.microbatch_size = chosen.microbatch_size;
    ends = chosen.stage_ends;
    recompute = chosen.recompute;
    stage_seconds = chosen.stage_seconds;
    // A stage's memory is its rank's (weights of every chunk there plus peak activations).
    const pipeline::Placement placement = pipeline::PlacementFor(chosen.spec);
    stage_memory.assign(ends.size(), 0.0);
    for (size_t st = 0; st < ends.size(); ++st) {
      for (int r = 0; r < placement.NumReplicas(); ++r) {
        stage_memory[st] = std::max(stage_memory[st],
                                    chosen.rank_memory_bytes[placement.RankOf(r, st)]);
      }
    }
    plan.bottleneck_seconds = *std::max_element(stage_seconds.begin(), stage_seconds.end());
    plan.predicted_iteration_seconds = chosen.makespan_seconds + best.sync_seconds;
    int evaluated = 0;
    for (const ScheduleEvaluation& e : searched.evaluated) evaluated += e.skipped.empty() ? 1 : 0;
    schedule_note = absl::StrFormat(
        "schedule search: %d candidates simulated; chose %s (chunks %d, waves %d, %s "
        "partition, micro-batch size %d): makespan %s, peak %s per device\n",
        evaluated, pipeline::ScheduleKindName(chosen.spec.kind), chosen.spec.chunks,
        chosen.spec.waves, chosen.partition, chosen.microbatch_size,
        FormatSeconds(chosen.makespan_seconds), FormatBytes(chosen.peak_memory_bytes));
  }
  const pipeline::Placement placement = pipeline::PlacementFor(plan.schedule);
  int first = 0;
  for (size_t st = 0; st < ends.size(); ++st) {
    pipeline::PlanStage stage;
    stage.first_layer = first;
    stage.end_layer = ends[st];
    first = ends[st];
    stage.tensor_parallel = best.tensor_parallel;
    stage.recompute_layers = recompute[st];
    stage.predicted_compute_seconds = stage_seconds[st];
    stage.predicted_memory_bytes = stage_memory[st];
    for (int d = 0; d < best.data_parallel; ++d) {
      for (int r = 0; r < placement.NumReplicas(); ++r) {
        for (int k = 0; k < best.tensor_parallel; ++k) {
          stage.ranks.push_back(plan.mesh[d][placement.RankOf(r, static_cast<int>(st))] + k);
        }
      }
    }
    plan.stages.push_back(std::move(stage));
  }
  plan.predicted_peak_memory_bytes.assign(plan.world_size, 0.0);
  for (const pipeline::PlanStage& stage : plan.stages) {
    for (int rank : stage.ranks) {
      plan.predicted_peak_memory_bytes[rank] =
          std::max(plan.predicted_peak_memory_bytes[rank], stage.predicted_memory_bytes);
    }
  }
  plan.inputs = request.inputs;

  PlanOutcome outcome;
  outcome.plan = std::move(plan);
  std::string baseline = "does not fit";
  if (best.baseline.ok()) {
    const double base_seconds = best.baseline->iteration_seconds + best.sync_seconds;
    baseline = absl::StrFormat("%s (AdaPipe %.3fx faster)", FormatSeconds(base_seconds),
                               base_seconds / adaptive_seconds);
  }
  const std::string sequence_note = absl::StrCat(
      best.sequence_parallel ? " (sequence parallel)" : "",
      best.expert_parallel > 1 ? absl::StrCat(" (experts on ", best.expert_parallel, " parts)")
                               : "");
  if (request.adapipe_baseline) {
    outcome.summary = absl::StrFormat(
        "adapipe baseline on %s (%d layers), %d devices as %d data x %d pipeline x %d tensor "
        "parallel%s, %d micro-batches per pipeline: Megatron-LM default (uniform, full "
        "recomputation) %s (slowest stage %s, gradient sync %s); AdaPipe's plan: iteration "
        "%s (%.3fx faster)\n",
        request.profile.model, best.chain->num_layers(), devices, best.data_parallel, best.stages,
        best.tensor_parallel, sequence_note, best.microbatches, FormatSeconds(best.seconds),
        FormatSeconds(best.result.bottleneck_seconds), FormatSeconds(best.sync_seconds),
        FormatSeconds(adaptive_seconds), best.seconds / adaptive_seconds);
  } else {
    outcome.summary = absl::StrFormat(
        "adapipe on %s (%d layers), %d devices as %d data x %d pipeline x %d tensor "
        "parallel%s, %d micro-batches per pipeline: iteration %s (slowest stage %s, gradient "
        "sync %s); Megatron-LM default (uniform, full recomputation): %s\n",
        request.profile.model, best.chain->num_layers(), devices, best.data_parallel, best.stages,
        best.tensor_parallel, sequence_note, best.microbatches, FormatSeconds(best.seconds),
        FormatSeconds(best.result.bottleneck_seconds), FormatSeconds(best.sync_seconds), baseline);
  }
  outcome.summary += schedule_note;
  return outcome;
}

absl::StatusOr<PlanOutcome> Dispatch(const PlanRequest& request) {
  switch (request.algorithm) {
    case Algorithm::kPipeDream:
      return PlanPipeDream(request);
    case Algorithm::kPiper:
      return PlanPiper(request);
    case Algorithm::kAdaPipe:
      return PlanAdaPipe(request);
  }
  return absl::InternalError("unknown algorithm");
}

// The smallest memory per device with which `request` finds a plan (bisection to 1%), or
// nullopt when none does.
// Whether a plan fits request.cluster's memory: true, false (ResourceExhausted) or an error.
// Piper answers without its search.
absl::StatusOr<bool> Fits(const PlanRequest& request) {
  if (request.algorithm == Algorithm::kPiper) {
    PiperOptions options;
    options.knapsack = request.knapsack;
    return PiperFits(PiperInstanceFor(request), options);
  }
  auto outcome = Dispatch(request);
  if (outcome.ok()) return true;
  if (outcome.status().code() == absl::StatusCode::kResourceExhausted) return false;
  return outcome.status();
}

std::optional<double> SmallestFittingMemory(PlanRequest request) {
  double low = request.cluster.device_memory_bytes;
  if (!(low > 0)) return std::nullopt;
  double high = low;
  bool found = false;
  for (int i = 0; i < kMemorySearchDoublings && !found; ++i) {
    high *= 2;
    request.cluster.device_memory_bytes = high;
    auto fits = Fits(request);
    if (!fits.ok()) return std::nullopt;
    found = *fits;
  }
  if (!found) return std::nullopt;
  while (high - low > kMemorySearchPrecision * high) {
    const double mid = (low + high) / 2;
    request.cluster.device_memory_bytes = mid;
    auto fits = Fits(request);
    if (!fits.ok()) return std::nullopt;
    (*fits ? high : low) = mid;
  }
  return high;
}

}  // namespace

absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name) {
  if (name == "pipedream") return Algorithm::kPipeDream;
  if (name == "piper") return Algorithm::kPiper;
  if (name == "adapipe") return Algorithm::kAdaPipe;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown algorithm '", name, "' (expected pipedream, piper or adapipe)"));
}

absl::string_view AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kPipeDream:
      return "pipedream";
    case Algorithm::kPiper:
      return "piper";
    case Algorithm::kAdaPipe:
      return "adapipe";
  }
  return "?";
}

absl::StatusOr<PlanOutcome> MakePlan(const PlanRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(ValidateCluster(request.cluster));
  if (!request.piper_instance.has_value()) {
    TANDEM_RETURN_IF_ERROR(pipeline::ValidateProfile(request.profile, request.profile.model));
  }
  if (request.microbatches < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--microbatches must be positive, got ", request.microbatches));
  }
  auto outcome = Dispatch(request);
  if (!outcome.ok()) {
    if (outcome.status().code() != absl::StatusCode::kResourceExhausted) {
      return outcome.status();
    }
    std::optional<double> fits = SmallestFittingMemory(request);
    std::string hint =
        fits.has_value()
            ? absl::StrCat("; the smallest memory per device that fits on ",
                           request.cluster.NumDevices(), " devices is about ", FormatBytes(*fits),
                           " (",
                           request.memory_flag_hint
                               ? request.memory_flag_hint(*fits)
                               : absl::StrCat("--memory ", static_cast<int64_t>(std::ceil(*fits))),
                           ")")
            : "";
    return absl::ResourceExhaustedError(absl::StrCat(outcome.status().message(), hint));
  }
  outcome->planning_seconds = Seconds(start);
  TANDEM_RETURN_IF_ERROR(Annotate(pipeline::ValidatePlan(outcome->plan), "planner produced"));
  absl::StrAppend(&outcome->summary, StageTable(outcome->plan),
                  absl::StrFormat("predicted iteration %s with %d micro-batches %s; "
                                  "planned in %s\n",
                                  FormatSeconds(outcome->plan.predicted_iteration_seconds),
                                  outcome->plan.schedule.num_microbatches,
                                  outcome->plan.IsUniform() ? "per pipeline" : "in all",
                                  FormatSeconds(outcome->planning_seconds)));
  return outcome;
}

}  // namespace tandem::planner
