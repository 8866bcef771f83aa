// `tandem checkpoint inspect DIR`, `tandem checkpoint diff A B [--tolerance X]` and
// `tandem checkpoint export --format safetensors DIR OUT [--hf-config FILE]`: what a checkpoint
// (runtime/checkpoint.h) holds, how far two are apart, tensor by tensor, and its parameters as a
// Hugging Face folder (runtime/torch/hf_weights.h). Part of tandem-torch because the checkpoint
// format lives in the runtime library (inspect and diff use no LibTorch).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/torch/commands.h"
#include "cli/torch_commands.h"
#include "common/status.h"
#include "common/units.h"
#include "pipeline/plan.h"
#include "runtime/checkpoint.h"
#include "runtime/torch/hf_weights.h"

ABSL_DECLARE_FLAG(std::string, hf_config);  // cli/torch/hf_models.cc

ABSL_FLAG(double, tolerance, 0,
          "checkpoint diff: largest relative difference allowed per tensor (|a - b| over the "
          "tensor's largest magnitude); above it the command exits 1");

namespace tandem::cli {
namespace {

// Every tensor of a checkpoint (a root or a step folder) by name, with its manifest.
struct Loaded {
  std::string folder;
  runtime::CheckpointManifest manifest;
  std::map<std::string, std::vector<float>> tensors;
  std::map<std::string, std::vector<int64_t>> shape_of;  // empty: not recorded (older shards)
  std::map<std::string, int> stage_of;
};

absl::StatusOr<Loaded> Load(const std::string& path) {
  Loaded out;
  TANDEM_ASSIGN_OR_RETURN(out.folder, runtime::ResolveCheckpoint(path));
  TANDEM_ASSIGN_OR_RETURN(out.manifest, runtime::ReadManifest(out.folder));
  for (const runtime::ShardRecord& record : out.manifest.shards) {
    TANDEM_ASSIGN_OR_RETURN(runtime::CheckpointShard shard,
                            runtime::ReadShard(out.folder, record));
    for (const runtime::ShardTensor& t : shard.tensors) {
      if (t.dtype != comm::DataType::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat(out.folder, "/", record.file, ": tensor '",
                                                       t.name, "' is not float32"));
      }
      std::vector<float> values(static_cast<size_t>(t.count));
      std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
      if (!out.tensors.emplace(t.name, std::move(values)).second) {
        return absl::DataLossError(absl::StrCat(out.folder, ": tensor '", t.name,
                                                "' is in more than one shard"));
      }
      out.stage_of[t.name] = shard.stage;
      out.shape_of[t.name] = t.shape;
    }
  }
  return out;
}

absl::Status Inspect(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(Loaded c, Load(path));
  const runtime::CheckpointManifest& m = c.manifest;
  std::cout << "checkpoint " << c.folder << "\n"
            << "  model: " << m.model << "\n"
            << "  step: " << m.step << " (training resumes at iteration " << m.step + 1 << ")\n"
            << "  optimizer: " << m.optimizer.dump() << "\n";
  auto plan = pipeline::PlanFromJson(m.plan, "plan");
  if (plan.ok()) {
    std::cout << "  saved by: " << plan->algorithm << ", " << plan->world_size << " rank(s), "
              << plan->stages.size() << " stage(s) over " << plan->num_layers << " layer(s)\n";
  }
  double bytes = 0;
  for (const runtime::ShardRecord& r : m.shards) bytes += static_cast<double>(r.bytes);
  std::cout << "  " << m.shards.size() << " shard(s), " << FormatBytes(bytes)
            << ", checksums verified\n";
  std::cout << absl::StrFormat("  %-5s %-48s %-16s %12s %12s %12s\n", "stage", "tensor",
                               "shape", "elements", "rms", "max |x|");
  for (const auto& [name, values] : c.tensors) {
    double sum = 0, largest = 0;
    for (float v : values) {
      sum += static_cast<double>(v) * v;
      largest = std::max(largest, static_cast<double>(std::fabs(v)));
    }
    const double rms = values.empty() ? 0 : std::sqrt(sum / static_cast<double>(values.size()));
    const std::vector<int64_t>& shape = c.shape_of[name];
    std::cout << absl::StrFormat("  %-5d %-48s %-16s %12d %12.6g %12.6g\n", c.stage_of[name],
                                 name, shape.empty() ? "-" : runtime::ShapeString(shape),
                                 values.size(), rms, largest);
  }
  return absl::OkStatus();
}

// 0: within the tolerance; 1: above it, or the checkpoints hold different tensors or steps.
absl::StatusOr<int> Diff(const std::string& a_path, const std::string& b_path, double tolerance) {
  TANDEM_ASSIGN_OR_RETURN(Loaded a, Load(a_path));
  TANDEM_ASSIGN_OR_RETURN(Loaded b, Load(b_path));
  int differences = 0;
  if (a.manifest.model != b.manifest.model) {
    std::cout << "model differs: '" << a.manifest.model << "' vs '" << b.manifest.model << "'\n";
    ++differences;
  }
  if (a.manifest.step != b.manifest.step) {
    std::cout << "step differs: " << a.manifest.step << " vs " << b.manifest.step << "\n";
    ++differences;
  }
  std::cout << absl::StrFormat("%-48s %14s %14s  (tensors above the tolerance)\n", "tensor",
                               "max |a - b|", "relative");
  double worst_abs = 0, worst_rel = 0;
  std::string worst;
  for (const auto& [name, x] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end()) {
      std::cout << absl::StrFormat("%-48s only in %s\n", name, a.folder);
      ++differences;
      continue;
    }
    const std::vector<float>& y = it->second;
    if (x.size() != y.size()) {
      std::cout << absl::StrFormat("%-48s %d vs %d elements\n", name, x.size(), y.size());
      ++differences;
      continue;
    }
    const std::vector<int64_t>& a_shape = a.shape_of[name];
    const std::vector<int64_t>& b_shape = b.shape_of[name];
    if (!runtime::ShapesCompatible(a_shape, b_shape) ||
        !runtime::ShapesCompatible(b_shape, a_shape)) {
      std::cout << absl::StrFormat("%-48s shape %s vs %s\n", name,
                                   runtime::ShapeString(a_shape), runtime::ShapeString(b_shape));
      ++differences;
      continue;
    }
    double diff = 0, scale = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
      scale = std::max({scale, std::fabs(static_cast<double>(x[i])),
                        std::fabs(static_cast<double>(y[i]))});
    }
    const double relative = scale > 0 ? diff / scale : 0;
    const bool above = relative > tolerance;
    differences += above;
    if (above) {
      std::cout << absl::StrFormat("%-48s %14.6g %14.6g  above the tolerance\n", name, diff,
                                   relative);
    }
    if (worst.empty() || relative > worst_rel) worst = name;
    worst_abs = std::max(worst_abs, diff);
    worst_rel = std::max(worst_rel, relative);
  }
  for (const auto& [name, y] : b.tensors) {
    if (!a.tensors.count(name)) {
      std::cout << absl::StrFormat("%-48s only in %s\n", name, b.folder);
      ++differences;
    }
  }
  std::cout << absl::StrFormat(
      "%d tensor(s) compared: largest difference %.6g, largest relative %.6g (%s); tolerance "
      "%.3g: %s\n",
      a.tensors.size(), worst_abs, worst_rel, worst.empty() ? "-" : worst, tolerance,
      differences == 0 ? "equal within it" : absl::StrCat(differences, " difference(s)"));
  return differences == 0 ? kExitOk : kExitFailure;
}

absl::Status Export(const std::string& checkpoint, const std::string& out) {
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "safetensors") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format: export writes Hugging Face safetensors folders (--format safetensors), got '",
        format, "'"));
  }
  runtime::libtorch::HfExportOptions options;
  options.hf_config = absl::GetFlag(FLAGS_hf_config);
  TANDEM_ASSIGN_OR_RETURN(const runtime::libtorch::HfExportResult result,
                          runtime::libtorch::ExportCheckpointToHf(checkpoint, out, options));
  std::cout << "exported " << result.checkpoint << " (" << result.model << ") to " << out
            << ": " << result.tensors << " tensor(s), "
            << FormatBytes(static_cast<double>(result.bytes)) << " in "
            << absl::StrJoin(result.files, ", ") << "; config.json from "
            << result.config_source << "\n";
  return absl::OkStatus();
}

constexpr char kExpected[] =
    "expected `inspect DIR`, `diff A B` or `export --format safetensors DIR OUT`";

int RunCheckpoint(const std::vector<std::string>& args) {
  const double tolerance = absl::GetFlag(FLAGS_tolerance);
  if (args.empty()) {
    return ReportError("checkpoint", absl::InvalidArgumentError(kExpected));
  }
  if (!(tolerance >= 0)) {
    return ReportError("checkpoint",
                       absl::InvalidArgumentError("--tolerance must not be negative"));
  }
  // Each flag serves one subcommand: given to another, it would be ignored.
  const bool known = args[0] == "inspect" || args[0] == "diff" || args[0] == "export";
  for (const auto& [flag, owner] : {std::pair<const char*, const char*>{"tolerance", "diff"},
                                    {"format", "export"},
                                    {"hf_config", "export"}}) {
    if (known && args[0] != owner && FlagGivenOnCommandLine(flag)) {
      return ReportError("checkpoint", absl::InvalidArgumentError(absl::StrCat(
                                           CommandLineFlag(flag), " applies to `tandem checkpoint ",
                                           owner, "`, not `", args[0], "`")));
    }
  }
  if (args[0] == "inspect" && args.size() == 2) {
    absl::Status s = Inspect(args[1]);
    return s.ok() ? kExitOk : ReportError("checkpoint inspect", s);
  }
  if (args[0] == "diff" && args.size() == 3) {
    absl::StatusOr<int> code = Diff(args[1], args[2], tolerance);
    return code.ok() ? *code : ReportError("checkpoint diff", code.status());
  }
  if (args[0] == "export" && args.size() == 3) {
    absl::Status s = Export(args[1], args[2]);
    return s.ok() ? kExitOk : ReportError("checkpoint export", s);
  }
  return ReportError("checkpoint",
                     absl::InvalidArgumentError(absl::StrCat(
                         kExpected, ", got '", args[0], "' with ", args.size() - 1,
                         " argument(s)")));
}

}  // namespace

CommandInfo CheckpointCommand() {
  return {
    .name = "checkpoint",
    .summary = kCheckpointSummary,
    .usage =
        "tandem checkpoint inspect DIR\n"
        "tandem checkpoint diff A B [--tolerance X]\n"
        "tandem checkpoint export --format safetensors DIR OUT [--hf-config config.json]\n\n"
        "DIR, A and B are checkpoint roots (their `latest` step) or step folders, saved by any\n"
        "run and partition. inspect checks every shard's checksum and prints the model, step,\n"
        "optimizer and every tensor (parameters `param:NAME`, optimizer state\n"
        "`optim:NAME:BUFFER`) with its shape, size, rms and largest magnitude. diff compares two\n"
        "checkpoints tensor by tensor, by name, whatever partition saved them: the largest\n"
        "absolute difference and the relative one (over the tensor's largest magnitude); exit\n"
        "0 when every tensor is within --tolerance (0: bit-equal) and both have the same model,\n"
        "step and tensors, 1 otherwise, 2 for bad input.\n\n"
        "export writes the parameters of a llama or gpt2 checkpoint as a Hugging Face folder OUT\n"
        "(which must not exist or be empty) that transformers' from_pretrained loads:\n"
        "config.json and model.safetensors (shards and model.safetensors.index.json past 5 GB),\n"
        "float32 under transformers' names, a tied embedding once. config.json is --hf-config's\n"
        "file when given (it must describe the checkpoint's model), else written from the model\n"
        "description the checkpoint records, with the norm epsilon at 1e-5 and Llama's\n"
        "max_position_embeddings at the sequence length (as `tandem train` sets them without\n"
        "--hf-config): pass --hf-config for a model trained from a config.json. Nothing is left\n"
        "behind on an error (the folder is written aside and renamed).",
    .flags = {"tolerance", "format", "hf_config"},
    .run = RunCheckpoint};
}

}  // namespace tandem::cli
