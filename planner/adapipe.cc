#include "planner/adapipe.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/units.h"

namespace tandem::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Weights and their gradients.
constexpr double kWeightCopies = 2.0;
// An activation forward and its gradient backward cross each boundary.
constexpr double kTransfersPerBoundary = 2.0;

}  // namespace

AdaPipePlanner::AdaPipePlanner(const LayerChain& chain, double memory_bytes,
                               bool allow_recompute)
    : chain_(chain), memory_bytes_(memory_bytes), allow_recompute_(allow_recompute) {}

double AdaPipePlanner::StaticBytes(int first, int end) const {
  return kWeightCopies * chain_.ParameterBytes(first, end) +
         chain_.OptimizerStateBytes(first, end);
}

AdaPipeStage AdaPipePlanner::CostStage(int first, int end, int in_flight) {
  AdaPipeStage stage;
  stage.first_layer = first;
  stage.end_layer = end;
  stage.in_flight = in_flight;
  const double static_bytes = StaticBytes(first, end);
  const double compute = chain_.ComputeSeconds(first, end);
  const double full_stash = chain_.StashedBytes(first, end);
  stage.memory_bytes = static_bytes + in_flight * full_stash;
  stage.seconds = compute;
  if (memory_bytes_ <= 0 || stage.memory_bytes <= memory_bytes_) return stage;
  if (!allow_recompute_) {
    stage.seconds = kInfinity;
    return stage;
  }
  items_.clear();
  for (int layer = first; layer < end; ++layer) {
    const pipeline::LayerProfile& l = chain_.layer(layer);
    items_.push_back({l.recompute_seconds,
                      in_flight * (l.stashed_activation_bytes - l.recompute_stashed_bytes)});
  }
  const CoverResult cover =
      solver_.Solve(items_, stage.memory_bytes - memory_bytes_, /*want_items=*/true);
  if (!cover.feasible) {
    stage.seconds = kInfinity;
    return stage;
  }
  exact_ = exact_ && cover.exact;
  for (int i : cover.switched) {
    stage.recompute_layers.push_back(first + i);
    stage.memory_bytes -= items_[i].saving;
  }
  stage.seconds = compute + cover.extra_cost;
  return stage;
}

double AdaPipePlanner::StageSeconds(int first, int end, int in_flight) {
  const int layers = chain_.num_layers();
  const size_t index =
      (static_cast<size_t>(first) * (layers + 1) + end) * (max_in_flight_ + 1) + in_flight;
  double& cached = cache_[index];
  if (std::isnan(cached)) {
    // Without recomputation the answer needs no knapsack.
    const double plain = StaticBytes(first, end) + in_flight * chain_.StashedBytes(first, end);
    if (memory_bytes_ <= 0 || plain <= memory_bytes_) {
      cached = chain_.ComputeSeconds(first, end);
    } else {
      items_.clear();
      cached = CostStage(first, end, in_flight).seconds;
    }
  }
  return cached;
}

double AdaPipePlanner::IterationSeconds(const std::vector<AdaPipeStage>& stages,
                                        int microbatches,
                                        double p2p_bandwidth_bytes_per_second) const {
  double slowest = 0, total = 0, transfers = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    slowest = std::max(slowest, stages[i].seconds);
    total += stages[i].seconds;
    if (i > 0 && p2p_bandwidth_bytes_per_second > 0) {
      transfers += kTransfersPerBoundary * chain_.CutBytes(stages[i].first_layer) /
                   p2p_bandwidth_bytes_per_second;
    }
  }
  return (microbatches - 1) * slowest + total + transfers;
}

absl::StatusOr<AdaPipeResult> AdaPipePlanner::Plan(int stages, int microbatches,
                                                   double p2p_bandwidth_bytes_per_second,
                                                   int replicas) {
  const int layers = chain_.num_layers();
  if (stages < 1 || stages > layers) {
    return absl::InvalidArgumentError(absl::StrCat("AdaPipe: stages must be in [1, ", layers,
                                                   "] (one layer at least per stage), got ",
                                                   stages));
  }
  if (replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdaPipe: replicas per stage must be at least 1, got ", replicas));
  }
  if (microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdaPipe: micro-batches must be at least 1, got ", microbatches));
  }
  const double cache_bytes = static_cast<double>(layers + 1) * (layers + 1) *
                             (std::max(stages, max_in_flight_) + 1) * sizeof(double);
  if (cache_bytes > kMaxCacheBytes) {
    return absl::OutOfRangeError(absl::StrCat(
        "AdaPipe's search over ", layers, " layers in ", stages, " stage(s) would keep ",
        FormatBytes(cache_bytes), " of stage costs, beyond its limit of ",
        FormatBytes(kMaxCacheBytes), " (merge layers of the profile, or plan fewer stages)"));
  }
  if (stages > max_in_flight_) {
    // Grow the cache; entries are (first, end, in-flight), so re-index what is known.
    const int old_max = max_in_flight_;
    std::vector<double> grown(static_cast<size_t>(layers + 1) * (layers + 1) * (stages + 1),
                              std::numeric_limits<double>::quiet_NaN());
    for (size_t range = 0; old_max > 0 && range < static_cast<size_t>(layers + 1) * (layers + 1);
         ++range) {
      for (int q = 0; q <= old_max; ++q) {
        grown[range * (stages + 1) + q] = cache_[range * (old_max + 1) + q];
      }
    }
    cache_ = std::move(grown);
    max_in_flight_ = stages;
  }
  exact_ = true;
  // best[i][b]: slowest stage when [0, b) forms i stages (positions 0 .. i-1).
  const size_t width = layers + 1;
  std::vector<double> best((stages + 1) * width, kInfinity);
  std::vector<int> arg((stages + 1) * width, -1);
  best[0] = 0;
  for (int i = 1; i <= stages; ++i) {
    const int in_flight = (stages - (i - 1) + replicas - 1) / replicas;
    for (int b = i; b <= layers - (stages - i); ++b) {
      double current = kInfinity;
      int current_arg = -1;
      for (int a = b - 1; a >= i - 1; --a) {
        const double before = best[(i - 1) * width + a];
        if (!(before < current)) continue;
        // Recomputation only adds time: the plain time bounds the stage from below.
        if (std::max(before, chain_.ComputeSeconds(a, b)) >= current) continue;
        const double candidate = std::max(before, StageSeconds(a, b, in_flight));
        if (candidate < current) {
          current = candidate;
          current_arg = a;
        }
      }
      best[i * width + b] = current;
      arg[i * width + b] = current_arg;
    }
  }
  if (!std::isfinite(best[stages * width + layers])) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no partition of ", layers, " layers into ", stages, " stages fits ",
        FormatBytes(memory_bytes_), " per device, even with every layer recomputed"));
  }
  AdaPipeResult result;
  result.bottleneck_seconds = best[stages * width + layers];
  std::vector<int> ends;
  for (int i = stages, b = layers; i > 0; --i) {
    ends.push_back(b);
    b = arg[i * width + b];
  }
  std::reverse(ends.begin(), ends.end());
  int first = 0;
  for (int i = 0; i < stages; ++i) {
    result.stages.push_back(CostStage(first, ends[i], (stages - i + replicas - 1) / replicas));
    first = ends[i];
  }
  result.iteration_seconds =
      IterationSeconds(result.stages, microbatches, p2p_bandwidth_bytes_per_second);
  result.exact = exact_;
  return result;
}

absl::StatusOr<AdaPipeResult> RunAdaPipe(const LayerChain& chain, const AdaPipeOptions& options) {
  AdaPipePlanner planner(chain, options.memory_bytes, options.allow_recompute);
  return planner.Plan(options.stages, options.microbatches,
                      options.p2p_bandwidth_bytes_per_second);
}

absl::StatusOr<AdaPipeResult> UniformFullRecompute(const LayerChain& chain,
                                                   const AdaPipeOptions& options) {
  const int layers = chain.num_layers();
  const int p = options.stages;
  if (p < 1 || p > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages must be in [1, ", layers, "], got ", p));
  }
  // Middle layers split evenly; the first and last layers join the end stages.
  const bool ends_apart = layers - 2 >= p;
  const int body_first = ends_apart ? 1 : 0;
  const int body = ends_apart ? layers - 2 : layers;
  std::vector<int> ends;
  int end = body_first;
  for (int i = 0; i < p; ++i) {
    end += body / p + (i < body % p ? 1 : 0);
    ends.push_back(end);
  }
  ends.back() = layers;
  AdaPipeResult result;
  int first = 0;
  for (int i = 0; i < p; ++i) {
    AdaPipeStage stage;
    stage.first_layer = first;
    stage.end_layer = ends[i];
    stage.in_flight = p - i;
    for (int layer = first; layer < ends[i]; ++layer) stage.recompute_layers.push_back(layer);
    stage.seconds = chain.ComputeSeconds(first, ends[i]) + chain.RecomputeSeconds(first, ends[i]);
    stage.memory_bytes = kWeightCopies * chain.ParameterBytes(first, ends[i]) +
                         chain.OptimizerStateBytes(first, ends[i]) +
                         stage.in_flight * chain.RecomputeStashedBytes(first, ends[i]);
    if (options.memory_bytes > 0 && stage.memory_bytes > options.memory_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uniform partition with full recomputation: stage ", i, " needs ",
          FormatBytes(stage.memory_bytes), ", more than ", FormatBytes(options.memory_bytes)));
    }
    result.bottleneck_seconds = std::max(result.bottleneck_seconds, stage.seconds);
    result.stages.push_back(std::move(stage));
    first = ends[i];
  }
  AdaPipePlanner estimator(chain, options.memory_bytes);
  result.iteration_seconds = estimator.IterationSeconds(result.stages, options.microbatches,
                                                        options.p2p_bandwidth_bytes_per_second);
  return result;
}

absl::StatusOr<pipeline::Profile> ProfileAtTensorParallel(const pipeline::Profile& profile,
                                                          int degree,
                                                          std::optional<bool> sequence_parallel,
                                                          int expert_parallel) {
  if (degree == 1) return profile;
  pipeline::Profile out = profile;
  for (size_t i = 0; i < out.layers.size(); ++i) {
    pipeline::LayerProfile& layer = out.layers[i];
    const pipeline::TensorParallelVariant* variant = nullptr;
    for (const auto& v : layer.tensor_parallel) {
      if (v.degree == degree && v.expert_parallel == expert_parallel &&
          (!sequence_parallel.has_value() || v.sequence_parallel == *sequence_parallel)) {
        variant = &v;
      }
    }
    if (variant == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          profile.model, ": layers[", i, "] ('", layer.name,
          "') has no tensor-parallel variant of degree ", degree,
          !sequence_parallel.has_value() ? ""
          : *sequence_parallel           ? " with sequence parallelism"
                                         : " without sequence parallelism",
          expert_parallel != 1 ? absl::StrCat(" with the experts on ", expert_parallel, " parts")
                               : ""));
    }
    const double forward_share =
        layer.forward_seconds > 0 ? variant->forward_seconds / layer.forward_seconds : 0.0;
    const double parameter_share =
        layer.parameter_bytes > 0 ? variant->parameter_bytes / layer.parameter_bytes : 0.0;
    const double half_communication = variant->communication_seconds / 2;
    const double backward = variant->backward_seconds + half_communication;
    if (layer.backward_input_seconds + layer.backward_weight_seconds > 0) {
      const double input_share = layer.backward_input_seconds / layer.backward_seconds;
      layer.backward_input_seconds = backward * input_share;
      layer.backward_weight_seconds = backward - layer.backward_input_seconds;
    }
    layer.recompute_seconds = layer.recompute_seconds * forward_share + half_communication;
    layer.forward_seconds = variant->forward_seconds + half_communication;
    layer.backward_seconds = backward;
    layer.stashed_activation_bytes = variant->stashed_activation_bytes;
    if (variant->sequence_parallel) {
      layer.output_activation_bytes /= degree;
      layer.recompute_stashed_bytes /= degree;
    }
    layer.recompute_stashed_bytes =
        std::min(layer.recompute_stashed_bytes, layer.stashed_activation_bytes);
    layer.optimizer_state_bytes *= parameter_share;
    layer.parameter_bytes = variant->parameter_bytes;
    layer.tensor_parallel.clear();
  }
  out.model = absl::StrCat(
      profile.model, " (tensor parallel ", degree,
      sequence_parallel.value_or(false) ? ", sequence parallel" : "",
      expert_parallel != 1 ? absl::StrCat(", experts on ", expert_parallel, " parts") : "", ")");
  return out;
}

}  // namespace tandem::planner
