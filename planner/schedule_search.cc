#include "planner/schedule_search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/units.h"
#include "pipeline/generators.h"
#include "pipeline/plan.h"
#include "pipeline/simulator.h"

namespace tandem::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Weights and gradients.
constexpr double kWeightCopies = 2.0;

std::vector<pipeline::ScheduleSpec> SpecsFor(pipeline::ScheduleKind kind, int ranks,
                                             int microbatches,
                                             const ScheduleSearchOptions& options) {
  pipeline::ScheduleSpec base;
  base.kind = kind;
  base.num_ranks = ranks;
  base.num_microbatches = microbatches;
  std::vector<pipeline::ScheduleSpec> specs;
  if (kind == pipeline::ScheduleKind::kInterleaved) {
    for (int v : options.interleaved_chunks) {
      pipeline::ScheduleSpec spec = base;
      spec.chunks = v;
      specs.push_back(spec);
    }
  } else if (kind == pipeline::ScheduleKind::kHanayo) {
    for (int w : options.hanayo_waves) {
      pipeline::ScheduleSpec spec = base;
      spec.waves = w;
      specs.push_back(spec);
    }
  } else {
    specs.push_back(base);
  }
  return specs;
}

struct Variant {
  std::string name;
  std::vector<int> ends;
  std::vector<std::vector<int>> recompute;
};

}  // namespace

std::vector<int> BalancedPartition(const LayerChain& chain, int stages, bool recompute_all) {
  const int n = chain.num_layers();
  auto cost = [&](int a, int b) {
    return chain.ComputeSeconds(a, b) + (recompute_all ? chain.RecomputeSeconds(a, b) : 0.0);
  };
  const size_t width = n + 1;
  std::vector<double> best((stages + 1) * width, kInfinity);
  std::vector<int> arg((stages + 1) * width, -1);
  best[0] = 0;
  for (int i = 1; i <= stages; ++i) {
    for (int b = i; b <= n - (stages - i); ++b) {
      for (int a = b - 1; a >= i - 1; --a) {
        const double candidate = std::max(best[(i - 1) * width + a], cost(a, b));
        if (candidate < best[i * width + b]) {
          best[i * width + b] = candidate;
          arg[i * width + b] = a;
        }
        // Longer stages only get slower.
        if (cost(a, b) >= best[i * width + b]) break;
      }
    }
  }
  std::vector<int> ends(stages);
  for (int i = stages, b = n; i > 0; --i) {
    ends[i - 1] = b;
    b = arg[i * width + b];
  }
  return ends;
}

absl::StatusOr<ScheduleSearchResult> SearchSchedules(const LayerChain& chain,
                                                     const ScheduleSearchOptions& options) {
  if (options.ranks < 1 || options.samples_per_pipeline < 1 ||
      options.profiled_microbatch_size < 1) {
    return absl::InvalidArgumentError(
        "schedule search: ranks, samples per pipeline and micro-batch size must be positive");
  }
  std::vector<int64_t> sizes = options.microbatch_sizes;
  if (sizes.empty()) sizes = {options.profiled_microbatch_size};
  const int n = chain.num_layers();
  ScheduleSearchResult result;
  double best_makespan = kInfinity;
  double smallest_peak = kInfinity;
  for (int64_t size : sizes) {
    if (size < 1 || options.samples_per_pipeline % size != 0) continue;
    const int64_t microbatches64 = options.samples_per_pipeline / size;
    if (microbatches64 > pipeline::kMaxMicrobatches) continue;
    const int microbatches = static_cast<int>(microbatches64);
    const double scale = static_cast<double>(size) / options.profiled_microbatch_size;
    for (pipeline::ScheduleKind kind : options.kinds) {
      for (const pipeline::ScheduleSpec& spec :
           SpecsFor(kind, options.ranks, microbatches, options)) {
        ScheduleEvaluation skeleton;
        skeleton.spec = spec;
        skeleton.microbatch_size = size;
        const int stages = spec.NumStages();
        if (stages > n) {
          skeleton.skipped = absl::StrCat(stages, " stages but only ", n, " layers");
          result.evaluated.push_back(skeleton);
          continue;
        }
        auto schedule = pipeline::GenerateSchedule(spec);
        if (!schedule.ok()) {
          skeleton.skipped = std::string(schedule.status().message());
          result.evaluated.push_back(skeleton);
          continue;
        }
        TANDEM_ASSIGN_OR_RETURN(pipeline::ScheduleSimulator simulator,
                                pipeline::ScheduleSimulator::Create(*schedule));
        std::vector<Variant> variants;
        for (bool recompute_all : {false, true}) {
          Variant v;
          v.name = recompute_all ? "balanced+recompute" : "balanced";
          v.ends = BalancedPartition(chain, stages, recompute_all);
          v.recompute.assign(stages, {});
          int first = 0;
          for (int s = 0; s < stages; ++s) {
            if (recompute_all) {
              for (int l = first; l < v.ends[s]; ++l) v.recompute[s].push_back(l);
            }
            first = v.ends[s];
          }
          variants.push_back(std::move(v));
        }
        const bool one_stage_per_rank = spec.ChunksPerRank() == 1 && spec.NumReplicas() == 1;
        if (one_stage_per_rank) {
          for (const FixedPartition& fixed : options.fixed_partitions) {
            if (static_cast<int>(fixed.stage_ends.size()) == stages) {
              variants.push_back({fixed.name, fixed.stage_ends, fixed.recompute});
            }
          }
        }
        const pipeline::Placement& placement = schedule->placement;
        for (const Variant& variant : variants) {
          ScheduleEvaluation evaluation = skeleton;
          evaluation.partition = variant.name;
          evaluation.stage_ends = variant.ends;
          evaluation.recompute = variant.recompute;
          pipeline::CostModel costs;
          costs.p2p_bandwidth_bytes_per_second = options.p2p_bandwidth_bytes_per_second;
          costs.p2p_latency_seconds = options.p2p_latency_seconds;
          std::vector<double> static_bytes(stages);
          std::vector<double> optimizer_seconds(stages, 0.0);
          int first = 0;
          for (int s = 0; s < stages; ++s) {
            const int end = variant.ends[s];
            for (int l = first; l < end; ++l) {
              optimizer_seconds[s] += chain.layer(l).optimizer_seconds;
            }
            double recompute_seconds = 0, stash = chain.StashedBytes(first, end);
            for (int layer : variant.recompute[s]) {
              recompute_seconds += chain.layer(layer).recompute_seconds;
              stash -= chain.layer(layer).stashed_activation_bytes -
                       chain.layer(layer).recompute_stashed_bytes;
            }
            pipeline::StageCost cost;
            cost.forward_seconds = scale * chain.ForwardSeconds(first, end);
            cost.backward_seconds =
                scale * (chain.BackwardSeconds(first, end) + recompute_seconds);
            cost.activation_bytes = end < n ? scale * chain.CutBytes(end) : 0.0;
            // Peaks come back in the units given here: bytes.
            cost.stash_units = scale * stash;
            costs.stages.push_back(cost);
            evaluation.stage_seconds.push_back(cost.forward_seconds + cost.backward_seconds);
            static_bytes[s] =
                kWeightCopies * chain.ParameterBytes(first, end) +
                chain.OptimizerStateBytes(first, end);
            first = end;
          }
          // The iteration's tail: every rank steps its stages' parameters (the profile's
          // per-layer optimizer step; zero when the profile has none), the slowest rank last.
          for (int rank = 0; rank < options.ranks; ++rank) {
            double seconds = 0;
            for (const auto& [replica, stage] : placement.StagesOf(rank)) {
              seconds += optimizer_seconds[stage];
            }
            costs.optimizer_seconds = std::max(costs.optimizer_seconds, seconds);
          }
          TANDEM_ASSIGN_OR_RETURN(pipeline::SimulationResult simulated, simulator.Run(costs));
          evaluation.makespan_seconds = simulated.makespan_seconds;
          evaluation.rank_memory_bytes.assign(options.ranks, 0.0);
          for (int rank = 0; rank < options.ranks; ++rank) {
            double bytes = simulated.peak_activations[rank];
            for (const auto& [replica, stage] : placement.StagesOf(rank)) {
              bytes += static_bytes[stage];
            }
            evaluation.rank_memory_bytes[rank] = bytes;
            evaluation.peak_memory_bytes = std::max(evaluation.peak_memory_bytes, bytes);
          }
          evaluation.fits =
              options.memory_bytes <= 0 || evaluation.peak_memory_bytes <= options.memory_bytes;
          smallest_peak = std::min(smallest_peak, evaluation.peak_memory_bytes);
          if (evaluation.fits && evaluation.makespan_seconds < best_makespan) {
            best_makespan = evaluation.makespan_seconds;
            result.best = evaluation;
          }
          result.evaluated.push_back(std::move(evaluation));
        }
      }
    }
  }
  if (!std::isfinite(best_makespan)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no schedule fits ", FormatBytes(options.memory_bytes), " per device on ", options.ranks,
        " pipeline ranks",
        std::isfinite(smallest_peak)
            ? absl::StrCat(" (the leanest candidate needs ", FormatBytes(smallest_peak), ")")
            : ""));
  }
  return result;
}

}  // namespace tandem::planner
