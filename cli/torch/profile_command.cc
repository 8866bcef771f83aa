// `tandem profile`: measure a LibTorch model layer by layer (warm-up, median of repeats) and
// write the profile JSON the planner reads (pipeline/profile.h).
#include <iostream>
#include <string>
#include <vector>

#include <torch/cuda.h>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/torch/commands.h"
#include "cli/torch/model_registry.h"
#include "cli/flags.h"
#include "cli/torch/model_flags.h"
#include "cli/torch/shard_profiles.h"
#include "cli/torch_commands.h"
#include "comm/backend.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/units.h"
#include "pipeline/profile.h"
#include "runtime/control.h"
#include "runtime/torch/profiler.h"

ABSL_DECLARE_FLAG(int, tensor_parallel);  // cli/torch/train_options.cc
ABSL_DECLARE_FLAG(int, expert_parallel);  // cli/torch/train_options.cc

ABSL_FLAG(int, warmup, 3, "profile: untimed rounds before measuring each layer");
ABSL_FLAG(int, repeats, 10, "profile: timed rounds per layer (the median is reported)");

namespace tandem::cli {
namespace {

using runtime::libtorch::OptimizerStateKind;

absl::StatusOr<OptimizerStateKind> OptimizerStateFromFlags() {
  const std::string optimizer = absl::GetFlag(FLAGS_optimizer);
  if (optimizer == "adamw") return OptimizerStateKind::kAdam;
  if (optimizer == "sgd") return OptimizerStateKind::kMomentum;
  return absl::InvalidArgumentError(
      absl::StrCat("--optimizer: '", optimizer, "' is not sgd or adamw"));
}

void PrintTable(const pipeline::Profile& profile) {
  std::cout << absl::StrFormat("profile of %s, micro-batch %d, on %s\n", profile.model,
                               profile.microbatch_size, profile.device);
  std::cout << absl::StrFormat("%-12s %10s %10s %10s %10s %12s %12s %12s\n", "layer",
                               "forward", "backward", "bw-input", "bw-weight", "output",
                               "stashed", "parameters");
  for (const auto& layer : profile.layers) {
    std::cout << absl::StrFormat(
        "%-12s %10s %10s %10s %10s %12s %12s %12s\n", layer.name,
        FormatSeconds(layer.forward_seconds), FormatSeconds(layer.backward_seconds),
        FormatSeconds(layer.backward_input_seconds), FormatSeconds(layer.backward_weight_seconds),
        FormatBytes(layer.output_activation_bytes), FormatBytes(layer.stashed_activation_bytes),
        FormatBytes(layer.parameter_bytes));
  }
  std::cout << absl::StrFormat("total: forward %s, backward %s, parameters %s\n",
                               FormatSeconds(profile.TotalForwardSeconds()),
                               FormatSeconds(profile.TotalBackwardSeconds()),
                               FormatBytes(profile.TotalParameterBytes()));
}

// --tensor-parallel and --expert-parallel: what shards to measure beside the whole model, and
// whether this job's ranks can measure them.
absl::StatusOr<ShardMeasurements> ShardsFromFlags(int world_size) {
  const int tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  const int expert_parallel = absl::GetFlag(FLAGS_expert_parallel);
  if (tensor_parallel < 0 || expert_parallel < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel (", tensor_parallel, ") and --expert-parallel (", expert_parallel,
        ") must not be negative"));
  }
  ShardMeasurements measure;
  measure.expert_parallel = expert_parallel;
  if (tensor_parallel == 1) {
    if (expert_parallel != 1) {
      return absl::InvalidArgumentError(
          "--expert-parallel places the experts on parts of a tensor-parallel group: give "
          "--tensor-parallel T (or 0) too");
    }
    return measure;
  }
  // Both ways: the planner weighs sequence parallelism where memory is short.
  measure.sequence_parallel = {false, true};
  if (tensor_parallel == 0) {
    for (int t : {2, 4, 8}) {
      if (t <= world_size && world_size % t == 0) measure.degrees.push_back(t);
    }
    if (measure.degrees.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tensor-parallel 0 measures the shards at 2, 4 and 8 ranks that divide the job: "
          "run under mpirun -np 2 or more (this job has ",
          world_size, " rank", world_size == 1 ? "" : "s", ")"));
    }
  } else {
    if (world_size < tensor_parallel || world_size % tensor_parallel != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tensor-parallel ", tensor_parallel, " measures the shards on ", tensor_parallel,
          " ranks together: run under mpirun -np ", tensor_parallel, " (this job has ",
          world_size, " rank", world_size == 1 ? "" : "s", ")"));
    }
    if (expert_parallel > 1 && tensor_parallel % expert_parallel != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--expert-parallel ", expert_parallel, " places the experts on parts of the group: "
          "it must divide --tensor-parallel ", tensor_parallel));
    }
    measure.degrees = {tensor_parallel};
  }
  return measure;
}

absl::Status Profile(comm::Communicator& world) {
  const int seed = absl::GetFlag(FLAGS_seed);
  runtime::libtorch::ProfilerOptions options;
  options.microbatch_size = absl::GetFlag(FLAGS_microbatch_size);
  options.warmup = absl::GetFlag(FLAGS_warmup);
  options.repeats = absl::GetFlag(FLAGS_repeats);
  if (options.microbatch_size < 1 || options.warmup < 0 || options.repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--microbatch-size (", options.microbatch_size, ") and --repeats (", options.repeats,
        ") must be positive and --warmup (", options.warmup, ") not negative"));
  }
  TANDEM_ASSIGN_OR_RETURN(options.optimizer_state, OptimizerStateFromFlags());
  TANDEM_ASSIGN_OR_RETURN(options.device, DeviceFromFlags());
  if (options.device.is_cuda() && absl::GetFlag(FLAGS_device) == "cuda") {
    // As `tandem train`: the ranks of a job take the node's devices in turn.
    const int devices = static_cast<int>(torch::cuda::device_count());
    options.device =
        torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(world.rank() % devices));
  }
  TANDEM_ASSIGN_OR_RETURN(const ShardMeasurements measure, ShardsFromFlags(world.size()));
  TANDEM_ASSIGN_OR_RETURN(ModelAndData model_and_data, ModelAndDataFromFlags(seed));
  TANDEM_ASSIGN_OR_RETURN(runtime::libtorch::LayeredModel model,
                          model_and_data.spec.BuildLayers(seed, /*first=*/0, /*end=*/0));
  if (!measure.degrees.empty() && !model.shard_for_tensor_parallel) {
    return absl::InvalidArgumentError(absl::StrCat(
        model.name, " has no tensor-parallel form: profile it without --tensor-parallel"));
  }
  const std::string output = absl::GetFlag(FLAGS_output);
  // Rank 0 writes the file: a path it cannot write is refused before anything is measured.
  TANDEM_RETURN_IF_ERROR(runtime::AgreeOnSuccess(
      &world, world.rank() == 0 && !output.empty() ? CheckOutputFile(output, "-o")
                                                   : absl::OkStatus(),
      "checking the output path"));
  // With the profile on standard output, the progress lines go to standard error.
  std::ostream& progress = output == "-" ? std::cerr : std::cout;
  // The shards first, every rank of the job measuring together; then rank 0 the whole model.
  absl::StatusOr<std::vector<ShardProfile>> shards =
      ProfileShards(world, options, model, *model_and_data.data, measure, progress);
  TANDEM_RETURN_IF_ERROR(
      runtime::AgreeOnSuccess(&world, shards.status(), "profiling tensor-parallel shards"));
  if (!measure.degrees.empty() && world.rank() == 0 && shards->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        model.name, " splits into none of the shards asked for (--tensor-parallel ",
        absl::GetFlag(FLAGS_tensor_parallel), "): see the lines above"));
  }
  if (world.rank() != 0) return absl::OkStatus();
  if (!measure.degrees.empty()) progress << "profiling the whole model on rank 0 ..." << std::endl;
  TANDEM_ASSIGN_OR_RETURN(pipeline::Profile profile,
                          runtime::libtorch::ProfileModel(model, *model_and_data.data, options));
  TANDEM_RETURN_IF_ERROR(AddShardVariants(*shards, &profile, progress));
  TANDEM_RETURN_IF_ERROR(pipeline::ValidateProfile(profile, "measured profile"));
  if (!output.empty()) TANDEM_RETURN_IF_ERROR(pipeline::WriteProfileFile(profile, output));
  if (output != "-") {
    PrintTable(profile);
    if (!output.empty()) std::cout << "wrote " << output << "\n";
  }
  return absl::OkStatus();
}

int RunProfile(const std::vector<std::string>& args) {
  if (!args.empty()) {
    return ReportError("profile", absl::InvalidArgumentError(
                                      absl::StrCat("unexpected argument '", args[0], "'")));
  }
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  if (!world.ok()) return ReportError("profile", world.status());
  absl::Status status = Profile(**world);
  if (!status.ok()) {
    return ReportError(
        (*world)->size() > 1 ? absl::StrCat("profile (rank ", (*world)->rank(), ")") : "profile",
        status);
  }
  return kExitOk;
}

std::vector<std::string> ProfileFlags() {
  std::vector<std::string> flags = ModelFlagNames();
  for (const char* name : {"microbatch_size", "warmup", "repeats", "optimizer", "device", "seed",
                           "tensor_parallel", "expert_parallel", "output"}) {
    flags.push_back(name);
  }
  return flags;
}

}  // namespace

CommandInfo ProfileCommand() {
  return {
    .name = "profile",
    .summary = kProfileSummary,
    .usage = absl::StrCat(
        "tandem profile [--model gpt|NAME] --layers N --hidden H --heads A --seq-len S\n"
        "    [--vocab V] [--data FILE] --microbatch-size B [--warmup 3] [--repeats 10]\n"
        "    [--optimizer adamw|sgd] [--device cpu|cuda|cuda:N] [--seed X]\n"
        "    [--tensor-parallel T|0 [--expert-parallel N|0]] [-o profile.json]\n\n"
        "Builds the model from --seed, feeds each layer a micro-batch of the data (the\n"
        "synthetic task, or --data's bytes) and measures per layer: forward and backward time\n"
        "(median of --repeats after --warmup; the backward split into input and weight\n"
        "gradients for zero-bubble schedules), output and stashed activation bytes, parameter\n"
        "and optimizer-state bytes (2x parameters for adamw, 1x for sgd), recompute cost. On\n"
        "a GPU every timed region is synchronised. Prints a table; -o writes the profile JSON\n"
        "('-' for standard output, then no table and the progress lines on standard error).\n\n"
        "Under `mpirun -np T`, --tensor-parallel T also measures the model's tensor-parallel\n"
        "shards (heads, MLP units and vocabulary split over T ranks, their collectives timed\n"
        "with them), without and with sequence parallelism, and writes them as each layer's\n"
        "`tensor_parallel` variants, which `tandem plan --tensor-parallel` weighs; 0 measures\n"
        "every degree of 2, 4 and 8 that divides the job. For a mixture of experts,\n"
        "--expert-parallel N measures the experts placed whole on N parts of the group, 0 on\n"
        "every N that divides the degree (default 1: every expert split over the group).\n"
        "Rank 0 measures the whole model and writes the file; with --device cuda the ranks\n"
        "take the node's GPUs in turn, and each group's collectives run over NCCL.",
        ModelsHelp()),
    .flags = ProfileFlags(),
    .aliases = {{"o", "output"}},
    .run = RunProfile};
}

}  // namespace tandem::cli
