// Prints the elastic layer's planning figures (Oobleck, Jang et al., SOSP 2023): for GPT
// profiles computed from their shapes (planner/gpt_profile.h, A100 80 GB, no tensor
// parallelism) on clusters of N nodes of 8 devices, the time to generate the pipeline templates
// for every node count, then the time of elastic::PlanReinstantiation when 1, 2 or 4 nodes die,
// with what the new configuration predicts and what it moves.
//
// A job starts on all N nodes from nothing held (row "lost 0": every layer comes from the
// checkpoint); the layers each rank then holds are the state the failures start from. Nodes are
// lost independently of each other from that start, chosen with a fixed seed (the 2 lost nodes
// include the 1, the 4 include the 2). The global batch stays fixed, so throughput after / before
// is iteration time before / after; "nodes" beside it is the live share (N - lost) / N.
// Planning times are wall-clock medians of --repetitions runs on one thread.
//
//   instantiation_bench [--nodes=16,64,256] [--models=gpt3-175b,gpt3-6.7b] [--lost=1,2,4]
//                       [--repetitions=5] [--min_pipelines=1] [--template_microbatches=16]
//                       [--format=table|json]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/units.h"
#include "elastic/instantiation.h"
#include "nlohmann/json.hpp"
#include "planner/cluster.h"
#include "planner/gpt_profile.h"
#include "planner/layer_chain.h"
#include "planner/templates.h"

ABSL_FLAG(std::vector<std::string>, nodes, std::vector<std::string>({"16", "64", "256"}),
          "cluster sizes in nodes of 8 devices");
ABSL_FLAG(std::vector<std::string>, models, std::vector<std::string>({"gpt3-175b", "gpt3-6.7b"}),
          "GPT shapes: gpt3-175b, gpt3-175b-split (attention and MLP as separate layers; its "
          "templates take seconds on 256 nodes), gpt3-6.7b, gpt3-1.3b");
ABSL_FLAG(std::vector<std::string>, lost, std::vector<std::string>({"1", "2", "4"}),
          "numbers of nodes lost, each from the same start");
ABSL_FLAG(int, repetitions, 5, "runs of PlanReinstantiation per row (the median is printed)");
ABSL_FLAG(int, min_pipelines, 1, "pipelines the plan must keep (f + 1 to survive f failures)");
ABSL_FLAG(int, template_microbatches, 16, "micro-batches per pipeline the templates assume");
ABSL_FLAG(std::string, format, "table", "table or json (a list of rows)");

namespace tandem::elastic {
namespace {

constexpr int kDevicesPerNode = 8;
constexpr double kA100Memory = 80e9;
constexpr double kNvlink = 300e9;     // bytes/s inside a node
constexpr double kInfiniBand = 25e9;  // bytes/s between nodes
constexpr unsigned kLossSeed = 7;

struct Model {
  planner::GptShape shape;
  int64_t global_microbatches = 0;  // GPT-3's batch sizes in sequences, micro-batch 1
};

// Shapes and batch sizes from Brown et al. 2020, table 2.1.
bool ModelByName(const std::string& name, Model* model) {
  model->shape = planner::Gpt3Shape();
  model->shape.name = name;
  if (name == "gpt3-175b") {
    model->global_microbatches = 1536;  // 3.2M tokens
  } else if (name == "gpt3-175b-split") {  // attention and MLP as layers of their own
    model->shape.split_blocks = true;
    model->global_microbatches = 1536;
  } else if (name == "gpt3-6.7b") {
    model->shape.layers = 32;
    model->shape.hidden = 4096;
    model->shape.heads = 32;
    model->global_microbatches = 1024;  // 2M tokens
  } else if (name == "gpt3-1.3b") {
    model->shape.layers = 24;
    model->shape.hidden = 2048;
    model->shape.heads = 16;
    model->global_microbatches = 512;  // 1M tokens
  } else {
    return false;
  }
  return true;
}

[[noreturn]] void Fail(const std::string& message) {
  std::cerr << "instantiation_bench: " << message << "\n";
  std::exit(2);
}

void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Fail(absl::StrCat(what, ": ", status.ToString()));
}

// A case that cannot be planned (a cluster too small for the model, too few nodes left for
// min_pipelines) is a row of its own, not the end of the run.
nlohmann::json ErrorRow(const std::string& model, int nodes, int lost,
                        const absl::Status& status) {
  return {{"model", model}, {"nodes", nodes}, {"lost_nodes", lost}, {"error", status.ToString()}};
}

std::vector<int> Integers(const std::vector<std::string>& texts, const std::string& flag,
                          int minimum) {
  std::vector<int> values;
  for (const std::string& text : texts) {
    int value = 0;
    if (!absl::SimpleAtoi(text, &value) || value < minimum) {
      Fail(absl::StrFormat("--%s: expected integers >= %d, got \"%s\"", flag, minimum, text));
    }
    values.push_back(value);
  }
  return values;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Median wall time of `repetitions` runs.
double MedianSeconds(int repetitions, const std::function<void()>& run) {
  std::vector<double> times;
  for (int i = 0; i < repetitions; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(SecondsSince(start));
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return n % 2 == 1 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

// Ranks u*g .. u*g + g - 1 on node u.
std::vector<std::vector<int>> Nodes(int nodes) {
  std::vector<std::vector<int>> out(nodes);
  for (int u = 0; u < nodes; ++u) {
    for (int d = 0; d < kDevicesPerNode; ++d) out[u].push_back(u * kDevicesPerNode + d);
  }
  return out;
}

// One row: a (model, cluster, lost nodes) case.
nlohmann::json Row(const std::string& model, int nodes, const planner::TemplateSet& templates,
                   double generation_seconds, int lost, const std::vector<int>& lost_nodes,
                   double plan_seconds, const ElasticPlan* before, const ElasticPlan& after) {
  const StateMovePlan& moves = after.moves;
  // The start row has no "before": null there.
  nlohmann::json pipelines_before, seconds_before, throughput_ratio;
  if (before) {
    pipelines_before = before->instantiation.pipelines.size();
    seconds_before = before->instantiation.iteration_seconds;
    throughput_ratio =
        before->instantiation.iteration_seconds / after.instantiation.iteration_seconds;
  }
  return {{"model", model},
          {"nodes", nodes},
          {"devices_per_node", kDevicesPerNode},
          {"templates", templates.templates.size()},
          {"template_min_nodes", templates.min_nodes},
          {"template_microbatches", templates.microbatches},
          {"template_generation_seconds", generation_seconds},
          {"lost_nodes", lost},
          {"lost_node_names", lost_nodes},  // smallest rank of each lost node
          {"global_microbatches", after.instantiation.global_microbatches},
          {"plan_seconds", plan_seconds},
          {"pipelines_before", pipelines_before},
          {"pipelines_after", after.instantiation.pipelines.size()},
          {"spare_nodes_after", after.instantiation.live_nodes - after.instantiation.used_nodes},
          {"iteration_seconds_before", seconds_before},
          {"iteration_seconds_after", after.instantiation.iteration_seconds},
          {"throughput_ratio", throughput_ratio},
          {"live_share", static_cast<double>(nodes - lost) / nodes},
          {"layer_copies", moves.copies_from_ranks},
          {"bytes_moved", moves.bytes_from_ranks},
          {"max_bytes_from_one_rank", moves.max_bytes_from_one_rank},
          {"source_ranks", moves.source_ranks},
          {"ranks_unchanged", moves.ranks_unchanged},
          {"ranks_in_layout", moves.ranks_in_layout},
          {"layers_from_checkpoint", moves.checkpoint_layers.size()},
          {"bytes_from_checkpoint", moves.bytes_from_checkpoint},
          {"summary", Describe(after)}};
}

std::string Milliseconds(double seconds) { return absl::StrFormat("%.2f", seconds * 1e3); }

void PrintHeader() {
  std::cout << absl::StrFormat("%-5s %-9s %-10s %-6s %-25s %-11s %-7s %-7s %-11s %s\n", "lost",
                               "plan ms", "pipelines", "spare", "iteration",
                               "throughput", "(nodes)", "copies", "moved", "from checkpoint");
}

void PrintRow(const nlohmann::json& row) {
  const bool start = row["lost_nodes"] == 0;
  const std::string pipelines =
      start ? absl::StrCat(row["pipelines_after"].get<int>())
            : absl::StrCat(row["pipelines_before"].get<int>(), "->",
                           row["pipelines_after"].get<int>());
  const std::string iteration =
      start ? FormatSeconds(row["iteration_seconds_after"].get<double>())
            : absl::StrCat(FormatSeconds(row["iteration_seconds_before"].get<double>()), "->",
                           FormatSeconds(row["iteration_seconds_after"].get<double>()));
  std::cout << absl::StrFormat(
      "%-5d %-9s %-10s %-6d %-25s %-11s %-7s %-7d %-11s %d layers (%s)\n",
      row["lost_nodes"].get<int>(), Milliseconds(row["plan_seconds"].get<double>()), pipelines,
      row["spare_nodes_after"].get<int>(), iteration,
      start ? "-" : absl::StrFormat("%.3fx", row["throughput_ratio"].get<double>()),
      start ? "-" : absl::StrFormat("%.3f", row["live_share"].get<double>()),
      row["layer_copies"].get<int64_t>(), FormatBytes(row["bytes_moved"].get<double>()),
      row["layers_from_checkpoint"].get<int>(),
      FormatBytes(row["bytes_from_checkpoint"].get<double>()));
}

void Run() {
  const bool json = absl::GetFlag(FLAGS_format) == "json";
  if (!json && absl::GetFlag(FLAGS_format) != "table") {
    Fail(absl::StrCat("--format: table or json, got \"", absl::GetFlag(FLAGS_format), "\""));
  }
  const std::vector<int> cluster_sizes = Integers(absl::GetFlag(FLAGS_nodes), "nodes", 1);
  const std::vector<int> losses = Integers(absl::GetFlag(FLAGS_lost), "lost", 1);
  const int repetitions = absl::GetFlag(FLAGS_repetitions);
  if (repetitions < 1) Fail("--repetitions: must be positive");
  std::vector<Model> models;
  for (const std::string& name : absl::GetFlag(FLAGS_models)) {
    Model model;
    if (!ModelByName(name, &model)) Fail(absl::StrCat("--models: unknown model \"", name, "\""));
    models.push_back(model);
  }
  nlohmann::json rows = nlohmann::json::array();
  if (!json) {
    std::cout << absl::StrFormat(
        "== Elastic re-instantiation: nodes of %d A100 80 GB (300 GB/s inside, 25 GB/s "
        "between), no tensor parallelism; min_pipelines %d; plan times are medians of %d "
        "runs ==\n",
        kDevicesPerNode, absl::GetFlag(FLAGS_min_pipelines), repetitions);
  }
  for (const Model& model : models) {
    auto chain = planner::LayerChain::FromProfile(
        planner::MakeGptProfile(model.shape, planner::A100Figures()));
    Check(chain.status(), model.shape.name);
    const std::vector<double> layer_bytes = LayerStateBytes(*chain);
    for (int nodes : cluster_sizes) {
      auto cluster = planner::MakeCluster(nodes * kDevicesPerNode, kDevicesPerNode, kA100Memory,
                                          {kNvlink, kInfiniBand});
      Check(cluster.status(), "cluster");
      planner::TemplateOptions options;
      options.microbatches = absl::GetFlag(FLAGS_template_microbatches);
      options.microbatch_size = model.shape.microbatch_size;
      const auto start = std::chrono::steady_clock::now();
      auto templates = planner::GeneratePipelineTemplates(*chain, *cluster, options);
      const double generation_seconds = SecondsSince(start);
      if (!templates.ok()) {
        rows.push_back(ErrorRow(model.shape.name, nodes, 0, templates.status()));
        if (!json) {
          std::cout << absl::StrFormat("\n%s, %d nodes x %d devices: %s\n", model.shape.name,
                                       nodes, kDevicesPerNode, templates.status().ToString());
        }
        continue;
      }
      if (!json) {
        std::cout << absl::StrFormat(
            "\n%s (%d layers in the chain, %s of weights and optimizer state), %d nodes x %d "
            "devices, global batch %d micro-batches:\n  templates: %d for node counts %d..%d "
            "(%d without one), generated in %s for %d micro-batches each\n",
            model.shape.name, chain->num_layers(),
            FormatBytes(std::accumulate(layer_bytes.begin(), layer_bytes.end(), 0.0)), nodes,
            kDevicesPerNode, model.global_microbatches,
            static_cast<int>(templates->templates.size()), templates->min_nodes,
            templates->templates.back().nodes,
            nodes - templates->min_nodes + 1 - static_cast<int>(templates->templates.size()),
            FormatSeconds(generation_seconds), templates->microbatches);
        PrintHeader();
      }
      ReinstantiationInput input;
      input.nodes = Nodes(nodes);
      input.global_microbatches = model.global_microbatches;
      input.min_pipelines = absl::GetFlag(FLAGS_min_pipelines);
      input.layer_state_bytes = layer_bytes;  // template_microbatches: the set's
      absl::StatusOr<ElasticPlan> initial;
      const double initial_seconds = MedianSeconds(
          repetitions, [&] { initial = PlanReinstantiation(*templates, input); });
      if (!initial.ok()) {
        rows.push_back(ErrorRow(model.shape.name, nodes, 0, initial.status()));
        if (!json) std::cout << absl::StrFormat("%-5d %s\n", 0, initial.status().ToString());
        continue;
      }
      rows.push_back(Row(model.shape.name, nodes, *templates, generation_seconds, 0, {},
                         initial_seconds, nullptr, *initial));
      if (!json) PrintRow(rows.back());

      input.held = HeldAfter(initial->assignment);
      std::vector<int> order(nodes);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(kLossSeed));
      for (int lost : losses) {
        if (lost >= nodes) continue;
        ReinstantiationInput after_loss = input;
        std::vector<int> dead(order.begin(), order.begin() + lost);
        std::sort(dead.rbegin(), dead.rend());
        std::vector<int> names;
        for (int u : dead) {
          names.push_back(u * kDevicesPerNode);
          after_loss.nodes.erase(after_loss.nodes.begin() + u);
        }
        std::sort(names.begin(), names.end());
        absl::StatusOr<ElasticPlan> plan;
        const double seconds = MedianSeconds(
            repetitions, [&] { plan = PlanReinstantiation(*templates, after_loss); });
        if (!plan.ok()) {
          rows.push_back(ErrorRow(model.shape.name, nodes, lost, plan.status()));
          if (!json) std::cout << absl::StrFormat("%-5d %s\n", lost, plan.status().ToString());
          continue;
        }
        rows.push_back(Row(model.shape.name, nodes, *templates, generation_seconds, lost, names,
                           seconds, &*initial, *plan));
        if (!json) PrintRow(rows.back());
      }
    }
  }
  if (json) std::cout << rows.dump(2) << "\n";
}

}  // namespace
}  // namespace tandem::elastic

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times pipeline template generation and elastic re-instantiation after losing nodes, for "
      "GPT profiles on clusters of 8-device nodes.");
  absl::ParseCommandLine(argc, argv);
  tandem::elastic::Run();
  return 0;
}
