// `tandem plan`: turn a model profile and a cluster description into a plan (plan.json) with
// PipeDream's, Piper's or AdaPipe's algorithm; print a readable table or the plan as JSON.
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/units.h"
#include "pipeline/plan.h"
#include "planner/cluster.h"
#include "planner/importers.h"
#include "planner/planner.h"
#include "planner/adapipe.h"
#include "planner/layer_chain.h"
#include "planner/templates.h"
#include "absl/strings/str_format.h"

ABSL_FLAG(std::string, profile, "", "model profile to plan for");
ABSL_FLAG(std::string, profile_format, "tandem",
          "format of --profile: tandem (profile.json), pipedream (graph.txt), piper (Piper's "
          "input JSON), metis (Metis profile sample) or builtin (--profile gpt3-175b, "
          "gpt3-175b-split or gpt3-175b-sp: computed from GPT-3's shapes and A100 figures)");
ABSL_FLAG(std::string, algorithm, "", "planner: pipedream, piper or adapipe");
ABSL_FLAG(bool, straight, false, "PipeDream: no replication, one device per stage");
ABSL_FLAG(bool, use_fewer_machines, false,
          "PipeDream: the pipeline may leave devices unused (faster search on large clusters)");
ABSL_FLAG(int, max_antichain_states, tandem::planner::PipeDreamOptions{}.max_states,
          "PipeDream on a graph.txt DAG: the most antichain states its search runs over; above "
          "it the plan is the best over the profile's layer order (not PipeDream's optimum)");
ABSL_FLAG(double, activation_compression_ratio, 0.0,
          "PipeDream: also bound stages by their activation transfers, divided by this ratio "
          "(0: ignore transfers, as PipeDream's default)");
ABSL_FLAG(int, devices_per_node, 0,
          "devices per node (needed when two --bandwidth levels, intra-node and inter-node, are "
          "given; 0 = all devices in one node)");
ABSL_FLAG(std::string, cluster, "",
          "cluster description JSON. tandem plan: nodes, devices_per_node, device_memory, "
          "levels, device_speeds; replaces --devices/--memory/--bandwidth. tandem cluster "
          "simulate: device_types (name, nodes, gpus_per_node, speed), application_speeds; "
          "replaces --gpus/--gpus-per-node");
ABSL_FLAG(std::string, knapsack, "exact",
          "Piper: per-layer configuration choice, exact or greedy (Piper's heuristic)");
ABSL_FLAG(int, tensor_parallel, 0,
          "AdaPipe: tensor-parallel degree (0: search); templates: the degree of every stage");
ABSL_FLAG(int, expert_parallel, 0,
          "AdaPipe: on how many parts of each tensor-parallel group a mixture of experts holds "
          "its experts whole (0: the fastest the profile's variants offer; N: only its "
          "variants with expert_parallel N)");
ABSL_FLAG(bool, baseline, false,
          "AdaPipe: plan Megatron-LM's default instead (uniform partition, every layer "
          "recomputed) for the pipeline shape AdaPipe chooses, the baseline it is compared with");
ABSL_FLAG(bool, templates, false,
          "instead of one plan, print the best pipeline template for every node count from the "
          "smallest that fits up to the cluster's (Oobleck-style, for the elastic layer)");

namespace tandem::cli {
namespace {

// For a profile that failed to read as the default format (tandem's profile.json): which
// --profile-format it looks like, or the list of them. PipeDream's graph.txt gives "malformed
// JSON" otherwise, which does not say what to do.
std::string ProfileFormatHint(const std::string& path) {
  std::ifstream in(path);
  if (!in.is_open()) return "";  // the error names the path already
  std::string line;
  while (in && line.empty()) std::getline(in, line);
  if (absl::StartsWith(line, "node") && absl::StrContains(line, " -- ")) {
    return " (this looks like PipeDream's graph.txt: add --profile-format pipedream)";
  }
  return " (read as tandem's profile.json; --profile-format pipedream, piper, metis or builtin "
         "reads the others)";
}

// PipeDream's default bandwidth (bytes/s) when neither --bandwidth nor the profile gives one.
constexpr double kDefaultBandwidth = 1e9;

// `piper`: a Piper file's settings, the defaults for Piper runs (null for others).
absl::StatusOr<planner::ClusterSpec> ClusterFromFlags(const planner::PiperInstance* piper) {
  const std::string cluster_file = absl::GetFlag(FLAGS_cluster);
  if (!cluster_file.empty()) return planner::ReadClusterFile(cluster_file);
  int devices = absl::GetFlag(FLAGS_devices);
  if (devices == 0 && piper != nullptr) devices = piper->max_devices;
  if (devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices must be at least 1 (or give --cluster), got ", devices));
  }
  double memory = 0;
  const std::string memory_text = absl::GetFlag(FLAGS_memory);
  if (!memory_text.empty()) {
    auto parsed = ParseBytes(memory_text);
    if (!parsed.ok()) return Annotate(parsed.status(), "--memory");
    if (*parsed <= 0) return absl::InvalidArgumentError("--memory must be positive");
    memory = *parsed;
  } else if (piper != nullptr) {
    memory = piper->memory_per_device_bytes;
  }
  std::vector<double> bandwidths;
  for (const std::string& text : absl::GetFlag(FLAGS_bandwidth)) {
    auto parsed = ParseBytesPerSecond(text);
    if (!parsed.ok()) return Annotate(parsed.status(), "--bandwidth");
    if (*parsed <= 0) return absl::InvalidArgumentError("--bandwidth must be positive");
    bandwidths.push_back(*parsed);
  }
  if (bandwidths.empty()) {
    bandwidths.push_back(piper != nullptr ? piper->bandwidth_bytes_per_second
                                          : kDefaultBandwidth);
  }
  if (bandwidths.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bandwidth: at most two levels (intra-node, inter-node), got ", bandwidths.size()));
  }
  return planner::MakeCluster(devices, absl::GetFlag(FLAGS_devices_per_node), memory,
                              bandwidths);
}

absl::Status PrintTemplates(const planner::PlanRequest& request,
                            const std::string& output_format) {
  const int degree = request.tensor_parallel > 0 ? request.tensor_parallel : 1;
  TANDEM_ASSIGN_OR_RETURN(pipeline::Profile profile,
                          planner::ProfileAtTensorParallel(request.profile, degree));
  TANDEM_ASSIGN_OR_RETURN(planner::LayerChain chain, planner::LayerChain::FromProfile(profile));
  planner::TemplateOptions options;
  if (request.microbatches > 0) options.microbatches = request.microbatches;
  options.microbatch_size = profile.microbatch_size;
  TANDEM_ASSIGN_OR_RETURN(planner::TemplateSet set,
                          planner::GeneratePipelineTemplates(chain, request.cluster, options));
  std::string text;
  if (output_format == "json") {
    text = planner::ToJson(set).dump(2) + "\n";
  } else {
    text = absl::StrFormat(
        "pipeline templates for %s, nodes of %d devices, %s each; "
        "smallest node count that fits: %d; generated in %s\n%-6s %-8s %-10s %-14s %s\n",
        profile.model, request.cluster.devices_per_node,
        FormatBytes(request.cluster.device_memory_bytes), set.min_nodes,
        FormatSeconds(set.generation_seconds), "nodes", "stages", "dev/stage", "iteration",
        "samples/s");
    for (const planner::PipelineTemplate& t : set.templates) {
      absl::StrAppend(&text, absl::StrFormat("%-6d %-8d %-10d %-14s %.4g\n", t.nodes,
                                             static_cast<int>(t.stages.size()),
                                             t.devices_per_stage,
                                             FormatSeconds(t.iteration_seconds),
                                             t.throughput_samples_per_second));
    }
  }
  const std::string output = absl::GetFlag(FLAGS_output);
  if (!output.empty()) return WriteFileAtomically(output, planner::ToJson(set).dump(2) + "\n");
  std::cout << text;
  return absl::OkStatus();
}

absl::Status RunPlanOrError() {
  planner::PlanRequest request;
  const std::string path = absl::GetFlag(FLAGS_profile);
  if (path.empty()) return absl::InvalidArgumentError("missing --profile FILE");
  const std::string algorithm = absl::GetFlag(FLAGS_algorithm);
  if (algorithm.empty()) {
    return absl::InvalidArgumentError("missing --algorithm (pipedream, piper or adapipe)");
  }
  TANDEM_ASSIGN_OR_RETURN(request.algorithm, planner::ParseAlgorithm(algorithm));
  const std::string format = absl::GetFlag(FLAGS_profile_format);
  if (format == "piper") {
    TANDEM_ASSIGN_OR_RETURN(planner::PiperInstance instance, planner::ReadPiperFile(path));
    const std::string stem = path.substr(path.find_last_of('/') + 1);
    TANDEM_ASSIGN_OR_RETURN(request.profile,
                            planner::ProfileFromPiper(instance, stem.substr(0, stem.find('.'))));
    request.piper_instance = std::move(instance);
    if (request.algorithm != planner::Algorithm::kPiper) request.piper_instance.reset();
  } else if (format == "pipedream") {
    planner::PipeDreamGraph graph;
    TANDEM_ASSIGN_OR_RETURN(request.profile, planner::ReadPipeDreamGraphFile(path, &graph));
    request.pipedream_graph = std::move(graph);
  } else {
    absl::StatusOr<pipeline::Profile> profile = planner::ReadProfileAs(path, format);
    if (!profile.ok() && !FlagGivenOnCommandLine("profile_format")) {
      return absl::Status(profile.status().code(),
                          absl::StrCat(profile.status().message(), ProfileFormatHint(path)));
    }
    TANDEM_ASSIGN_OR_RETURN(request.profile, std::move(profile));
  }
  // A Piper file's settings are the defaults for Piper runs only.
  TANDEM_ASSIGN_OR_RETURN(request.cluster,
                          ClusterFromFlags(request.piper_instance.has_value()
                                               ? &*request.piper_instance
                                               : nullptr));
  request.microbatches = absl::GetFlag(FLAGS_microbatches);
  request.straight = absl::GetFlag(FLAGS_straight);
  request.use_fewer_machines = absl::GetFlag(FLAGS_use_fewer_machines);
  request.pipedream_max_states = absl::GetFlag(FLAGS_max_antichain_states);
  if (request.pipedream_max_states < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-antichain-states must be at least 1, got ", request.pipedream_max_states));
  }
  request.activation_compression_ratio = absl::GetFlag(FLAGS_activation_compression_ratio);
  if (!(request.activation_compression_ratio >= 0)) {
    return absl::InvalidArgumentError("--activation-compression-ratio must not be negative");
  }
  const std::string knapsack = absl::GetFlag(FLAGS_knapsack);
  if (knapsack == "exact") {
    request.knapsack = planner::KnapsackMode::kExact;
  } else if (knapsack == "greedy") {
    request.knapsack = planner::KnapsackMode::kGreedy;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--knapsack must be exact or greedy, got '", knapsack, "'"));
  }
  request.schedule = absl::GetFlag(FLAGS_schedule);
  if (!request.schedule.empty() && request.algorithm != planner::Algorithm::kAdaPipe) {
    return absl::InvalidArgumentError(
        "--schedule applies to --algorithm adapipe (the others plan for 1F1B)");
  }
  request.adapipe_baseline = absl::GetFlag(FLAGS_baseline);
  if (request.adapipe_baseline && request.algorithm != planner::Algorithm::kAdaPipe) {
    return absl::InvalidArgumentError("--baseline applies to --algorithm adapipe");
  }
  request.stages = absl::GetFlag(FLAGS_stages);
  request.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  request.expert_parallel = absl::GetFlag(FLAGS_expert_parallel);
  if (request.stages < 0 || request.tensor_parallel < 0 || request.expert_parallel < 0) {
    return absl::InvalidArgumentError(
        "--stages, --tensor-parallel and --expert-parallel must not be negative");
  }
  if (request.expert_parallel > 0 && request.algorithm != planner::Algorithm::kAdaPipe) {
    return absl::InvalidArgumentError("--expert-parallel applies to --algorithm adapipe");
  }
  const std::string output_format = absl::GetFlag(FLAGS_format);
  if (output_format != "text" && output_format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be text or json, got '", output_format, "'"));
  }
  request.inputs = {{"profile", path},
                    {"profile_format", format},
                    {"algorithm", algorithm},
                    {"cluster", planner::ToJson(request.cluster)},
                    {"microbatches", request.microbatches},
                    {"straight", request.straight},
                    {"use_fewer_machines", request.use_fewer_machines},
                    {"knapsack", knapsack},
                    {"schedule", request.schedule}};
  if (request.adapipe_baseline) request.inputs["baseline"] = true;

  if (absl::GetFlag(FLAGS_templates)) return PrintTemplates(request, output_format);
  TANDEM_ASSIGN_OR_RETURN(planner::PlanOutcome outcome, planner::MakePlan(request));
  // What is printed is what -o would write: a plan `tandem train` reads back.
  TANDEM_RETURN_IF_ERROR(Annotate(pipeline::ValidatePlan(outcome.plan), "the plan found"));
  const std::string json = pipeline::ToJson(outcome.plan).dump(2) + "\n";
  const std::string output = absl::GetFlag(FLAGS_output);
  if (!output.empty()) {
    TANDEM_RETURN_IF_ERROR(pipeline::WritePlanFile(outcome.plan, output));
  }
  if (output != "-") std::cout << (output_format == "json" ? json : outcome.summary);
  // Which search ran, when it is not the algorithm's own, whatever stdout carries.
  if (output == "-" || output_format == "json") std::cerr << outcome.notes;
  return absl::OkStatus();
}

int RunPlan(const std::vector<std::string>& args) {
  if (!args.empty()) {
    return ReportError("plan", absl::InvalidArgumentError(
                                   absl::StrCat("unexpected argument '", args[0], "'")));
  }
  absl::Status status = RunPlanOrError();
  if (!status.ok()) return ReportError("plan", status);
  return kExitOk;
}

const CommandRegistrar registrar({
    .name = "plan",
    .summary = "plan partition, replication and recomputation from a profile",
    .usage =
        "tandem plan --profile FILE [--profile-format tandem|pipedream|piper|metis|builtin]\n"
        "    --algorithm {pipedream,piper,adapipe} --devices N [--memory BYTES]\n"
        "    [--bandwidth BYTES_PER_S ...] [--devices-per-node K] [--cluster FILE]\n"
        "    [--microbatches M] [--straight] [--use-fewer-machines] [--max-antichain-states N]\n"
        "    [--activation-compression-ratio R] [--knapsack exact|greedy] [--stages P]\n"
        "    [--tensor-parallel T] [--schedule auto|1f1b|interleaved|chimera|hanayo|zb-h1]\n"
        "    [--baseline] [--format text|json] [-o plan.json] [--templates]\n\n"
        "Algorithms: pipedream (partition + per-stage replication; --straight for none; on a\n"
        "graph.txt DAG over PipeDream's antichain states, the plan's layer_order keeping each\n"
        "stage contiguous),\n"
        "piper (stages x data/tensor-parallel degrees x per-layer configurations such as\n"
        "recomputation), adapipe (per-stage adaptive recomputation with the partition, over\n"
        "pipeline depths and tensor-parallel degrees; with --schedule, the simulator times\n"
        "each schedule's programs and the fastest that fits memory wins, 'auto' trying all;\n"
        "--baseline plans Megatron-LM's default for the same shape instead, uniform with every\n"
        "layer recomputed, to run beside AdaPipe's plan).\n"
        "--microbatches is the number of micro-batches per iteration over all pipelines\n"
        "(Piper's mbsInBatch). --bandwidth is innermost first; with two, --devices-per-node\n"
        "says how many devices share the first.\n"
        "A Piper file's maxDevices, maxMemoryPerDevice, bandwidth and mbsInBatch are the\n"
        "defaults for Piper. Sizes take suffixes (8GiB, 25GiB/s). Prints a table (text) or the\n"
        "plan (json: bottleneck_seconds for PipeDream, time_per_sample for Piper, stages);\n"
        "-o writes plan.json atomically. No plan fits: exit 2 with the smallest memory that\n"
        "would fit. --templates prints (or writes with -o) the best pipeline template for\n"
        "every node count instead.",
    .flags = {"profile", "profile_format", "algorithm", "devices", "memory", "bandwidth",
              "devices_per_node", "cluster", "microbatches", "straight", "use_fewer_machines",
              "max_antichain_states", "activation_compression_ratio", "knapsack", "stages",
              "tensor_parallel", "expert_parallel", "schedule", "baseline", "templates",
              "format", "output"},
    .aliases = {{"o", "output"}},
    .run = RunPlan,
});

}  // namespace
}  // namespace tandem::cli
