// Megatron-LM's weak-scaling table (Narayanan et al., SC'21, Table 1) by simulation: for every
// row, the published teraFLOP/s per GPU beside tandem's prediction from the cost model of
// planner/megatron_model.h (interleaved 1F1B simulated per row), and the relative error; then
// the configuration a search over the same cost model picks (planner/megatron_model.h,
// SearchMegatronConfig) with its predicted throughput.
//
//   megatron_table_bench [--format text|json] [--fit] [--no-search]
//     --fit        grid search of the two fitted constants (GEMM efficiency, element-wise
//                  traffic) minimising the largest relative error over the rows
//     --no-search  only the reproduction, not the configuration searches
//     --adapipe-max-gpus N  run tandem's AdaPipe (with the schedule search) only on rows of at
//                  most N GPUs
#include <ctime>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "planner/cluster.h"
#include "planner/megatron_model.h"
#include "planner/planner.h"

namespace tandem::planner {
namespace {

// Processor seconds of this (single-threaded) program since `start`.
double Seconds(std::clock_t start) {
  return static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
}

double LargestError(const std::vector<MegatronTableRow>& rows, const A100Cluster& cluster) {
  double worst = 0;
  for (const MegatronTableRow& row : rows) {
    auto predicted = PredictMegatron(row.model, row.config, cluster);
    if (!predicted.ok()) return 1e9;
    worst = std::max(worst, std::abs(predicted->tflops_per_gpu / row.published_tflops_per_gpu - 1));
  }
  return worst;
}

int Fit(const std::vector<MegatronTableRow>& rows) {
  A100Cluster best = SeleneA100();
  double best_error = 1e9;
  for (double efficiency = 0.50; efficiency <= 0.901; efficiency += 0.01) {
    for (double traffic = 0.0; traffic <= 6.001; traffic += 0.25) {
      A100Cluster cluster = SeleneA100();
      cluster.gemm_efficiency = efficiency;
      cluster.elementwise_traffic = traffic;
      const double error = LargestError(rows, cluster);
      if (error < best_error) {
        best_error = error;
        best = cluster;
      }
    }
  }
  absl::PrintF("best fit: gemm_efficiency %.2f, elementwise_traffic %.2f, largest error %.1f%%\n",
               best.gemm_efficiency, best.elementwise_traffic, 100 * best_error);
  return 0;
}

struct AdaPipeChoice {
  std::string shape = "-";  // t/p/d/schedule
  double tflops_per_gpu = 0;
  double seconds = 0;       // wall time of the planner
  std::string error;
};

// tandem's AdaPipe with the schedule search ("auto") on the cost model's profile.
AdaPipeChoice PlanWithAdaPipe(const MegatronTableRow& row, const A100Cluster& figures) {
  AdaPipeChoice choice;
  PlanRequest request;
  request.algorithm = Algorithm::kAdaPipe;
  request.profile = MegatronProfile(row.model, /*microbatch_size=*/1, figures);
  request.cluster.nodes = row.config.Gpus() / figures.gpus_per_node;
  request.cluster.devices_per_node = figures.gpus_per_node;
  request.cluster.device_memory_bytes = figures.memory_bytes;
  request.cluster.levels = {{figures.nvlink_bytes_per_second, figures.latency_seconds},
                            {figures.infiniband_bytes_per_second_per_gpu, figures.latency_seconds}};
  request.microbatches = static_cast<int>(row.config.global_batch);
  request.schedule = "auto";
  const auto start = std::clock();
  auto outcome = MakePlan(request);
  choice.seconds = Seconds(start);
  if (!outcome.ok()) {
    choice.error = std::string(outcome.status().message());
    choice.shape = "failed";
    return choice;
  }
  const pipeline::Plan& plan = outcome->plan;
  choice.shape = absl::StrFormat("%d/%d/%d/%s", plan.tensor_parallel, plan.pipeline_parallel,
                                 plan.data_parallel,
                                 pipeline::ScheduleKindName(plan.schedule.kind));
  if (plan.schedule.chunks > 1) absl::StrAppendFormat(&choice.shape, "x%d", plan.schedule.chunks);
  choice.tflops_per_gpu = MegatronIterationFlops(row.model, row.config.global_batch) /
                          (double(row.config.Gpus()) * plan.predicted_iteration_seconds) / 1e12;
  return choice;
}

int Main(int argc, char** argv) {
  std::string format = "text";
  bool fit = false, search = true;
  int adapipe_max_gpus = 1 << 30;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--format") && i + 1 < argc) {
      format = argv[++i];
    } else if (!std::strcmp(argv[i], "--fit")) {
      fit = true;
    } else if (!std::strcmp(argv[i], "--no-search")) {
      search = false;
    } else if (!std::strcmp(argv[i], "--adapipe-max-gpus") && i + 1 < argc) {
      adapipe_max_gpus = std::atoi(argv[++i]);
    } else {
      std::cerr << "usage: megatron_table_bench [--format text|json] [--fit] [--no-search] "
                   "[--adapipe-max-gpus N]\n";
      return 2;
    }
  }
  if (format != "text" && format != "json") {
    std::cerr << "--format: expected text or json, got " << format << "\n";
    return 2;
  }
  const std::vector<MegatronTableRow> rows = MegatronTable1();
  if (fit) return Fit(rows);

  const A100Cluster cluster = SeleneA100();
  nlohmann::json out = nlohmann::json::array();
  if (format == "text") {
    absl::PrintF(
        "Megatron-LM SC'21 Table 1 by simulation (A100 %.0f TFLOP/s peak; GEMMs at %.0f%% of "
        "peak, element-wise traffic %.1fx activations at %.0f GB/s HBM)\n",
        cluster.peak_flops / 1e12, 100 * cluster.gemm_efficiency, cluster.elementwise_traffic,
        cluster.hbm_bytes_per_second / 1e9);
    absl::PrintF("%8s %5s %4s %3s %4s %5s %5s %2s %5s %7s %7s %6s %6s %7s | %-18s %7s %6s %7s | %-20s %7s %7s\n",
                 "params", "GPUs", "t", "p", "d", "batch", "m", "v", "iter", "publ", "pred",
                 "error", "bubble", "sim_ms", "search t/p/d/b/v/rc", "pred", "gain", "time", "adapipe t/p/d/sched", "pred",
                 "time");
  }
  double worst = 0;
  for (const MegatronTableRow& row : rows) {
    const auto start = std::clock();
    auto predicted = PredictMegatron(row.model, row.config, cluster);
    const double simulate_seconds = Seconds(start);
    if (!predicted.ok()) {
      std::cerr << row.parameters_billions << "B: " << predicted.status() << "\n";
      return 1;
    }
    const double error = predicted->tflops_per_gpu / row.published_tflops_per_gpu - 1;
    worst = std::max(worst, std::abs(error));
    nlohmann::json j = {
        {"parameters", row.parameters_billions * 1e9},
        {"parameters_computed", row.model.Parameters()},
        {"gpus", row.config.Gpus()},
        {"tensor_parallel", row.config.tensor_parallel},
        {"pipeline_parallel", row.config.pipeline_parallel},
        {"data_parallel", row.config.data_parallel},
        {"global_batch", row.config.global_batch},
        {"interleave_chunks", row.config.interleave_chunks},
        {"published_tflops_per_gpu", row.published_tflops_per_gpu},
        {"predicted_tflops_per_gpu", predicted->tflops_per_gpu},
        {"relative_error", error},
        {"iteration_seconds", predicted->iteration_seconds},
        {"bubble_ratio", predicted->bubble_ratio},
        {"memory_bytes", predicted->memory_bytes},
        {"simulation_seconds", simulate_seconds}};
    std::string searched = "-";
    double search_seconds = 0;
    double searched_tflops = 0;
    if (search) {
      const auto search_start = std::clock();
      auto best = SearchMegatronConfig(row.model, row.config.Gpus(), row.config.global_batch,
                                       cluster);
      search_seconds = Seconds(search_start);
      if (best.ok()) {
        const MegatronConfig& c = best->config;
        searched = absl::StrFormat("%d/%d/%d/%d/%d/%s", c.tensor_parallel, c.pipeline_parallel,
                                   c.data_parallel, c.microbatch_size, c.interleave_chunks,
                                   c.recompute ? "full" : "none");
        searched_tflops = best->prediction.tflops_per_gpu;
        j["search"] = {{"tensor_parallel", c.tensor_parallel},
                       {"pipeline_parallel", c.pipeline_parallel},
                       {"data_parallel", c.data_parallel},
                       {"microbatch_size", c.microbatch_size},
                       {"interleave_chunks", c.interleave_chunks},
                       {"recompute", c.recompute},
                       {"predicted_tflops_per_gpu", searched_tflops},
                       {"memory_bytes", best->prediction.memory_bytes},
                       {"candidates", best->candidates},
                       {"simulated", best->simulated},
                       {"search_seconds", search_seconds}};
      } else {
        searched = "none fits";
        j["search"] = {{"error", std::string(best.status().message())}};
      }
    }
    AdaPipeChoice adapipe;
    if (search && row.config.Gpus() <= adapipe_max_gpus) {
      adapipe = PlanWithAdaPipe(row, cluster);
      j["adapipe"] = {{"choice", adapipe.shape},
                      {"predicted_tflops_per_gpu", adapipe.tflops_per_gpu},
                      {"planning_seconds", adapipe.seconds}};
      if (!adapipe.error.empty()) j["adapipe"]["error"] = adapipe.error;
    }
    out.push_back(j);
    if (format == "text") {
      absl::PrintF(
          "%7.1fB %5d %4d %3d %4d %5d %5d %2d %4.1fs %7.0f %7.1f %+5.1f%% %5.1f%% %7.1f | %-18s "
          "%7.1f %+5.1f%% %6.2fs | %-20s %7.1f %6.2fs\n",
          row.parameters_billions, row.config.Gpus(), row.config.tensor_parallel,
          row.config.pipeline_parallel, row.config.data_parallel, int(row.config.global_batch),
          predicted->microbatches, row.config.interleave_chunks, predicted->iteration_seconds,
          row.published_tflops_per_gpu, predicted->tflops_per_gpu, 100 * error,
          100 * predicted->bubble_ratio, 1e3 * simulate_seconds, searched, searched_tflops,
          searched_tflops > 0 ? 100 * (searched_tflops / predicted->tflops_per_gpu - 1) : 0.0,
          search_seconds, adapipe.shape, adapipe.tflops_per_gpu, adapipe.seconds);
    }
  }
  if (format == "json") {
    std::cout << out.dump(2) << "\n";
  } else {
    absl::PrintF("largest relative error: %.1f%%\n", 100 * worst);
  }
  return 0;
}

}  // namespace
}  // namespace tandem::planner

int main(int argc, char** argv) { return tandem::planner::Main(argc, argv); }
