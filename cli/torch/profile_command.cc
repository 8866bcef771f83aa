// `tandem profile`: measure a LibTorch model layer by layer (warm-up, median of repeats) and
// write the profile JSON the planner reads (pipeline/profile.h).
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/torch/commands.h"
#include "cli/torch/model_registry.h"
#include "cli/flags.h"
#include "cli/torch/model_flags.h"
#include "cli/torch_commands.h"
#include "common/status.h"
#include "common/units.h"
#include "pipeline/profile.h"
#include "runtime/torch/profiler.h"

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

absl::Status Profile() {
  const int seed = absl::GetFlag(FLAGS_seed);
  TANDEM_ASSIGN_OR_RETURN(ModelAndData model_and_data, ModelAndDataFromFlags(seed));
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
  TANDEM_ASSIGN_OR_RETURN(runtime::libtorch::LayeredModel model,
                          model_and_data.spec.BuildLayers(seed, /*first=*/0, /*end=*/0));
  TANDEM_ASSIGN_OR_RETURN(pipeline::Profile profile,
                          runtime::libtorch::ProfileModel(model, *model_and_data.data, options));
  TANDEM_RETURN_IF_ERROR(pipeline::ValidateProfile(profile, "measured profile"));
  const std::string output = absl::GetFlag(FLAGS_output);
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
  absl::Status status = Profile();
  if (!status.ok()) return ReportError("profile", status);
  return kExitOk;
}

std::vector<std::string> ProfileFlags() {
  std::vector<std::string> flags = ModelFlagNames();
  for (const char* name : {"microbatch_size", "warmup", "repeats", "optimizer", "device", "seed",
                           "output"}) {
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
        "    [--optimizer adamw|sgd] [--device cpu|cuda|cuda:N] [--seed X] [-o profile.json]\n\n"
        "Builds the model from --seed, feeds each layer a micro-batch of the data (the\n"
        "synthetic task, or --data's bytes) and measures per layer: forward and backward time\n"
        "(median of --repeats after --warmup; the backward split into input and weight\n"
        "gradients for zero-bubble schedules), output and stashed activation bytes, parameter\n"
        "and optimizer-state bytes (2x parameters for adamw, 1x for sgd), recompute cost. On\n"
        "a GPU every timed region is synchronised. Prints a table; -o writes the profile JSON\n"
        "('-' for standard output, then no table).",
        ModelsHelp()),
    .flags = ProfileFlags(),
    .aliases = {{"o", "output"}},
    .run = RunProfile};
}

}  // namespace tandem::cli
