// `tandem train`: trains a LibTorch model with the pipeline runtime on every rank of an
// `mpirun` job (or in one process): reads a plan, or makes a uniform one from --schedule, or
// profiles the model on rank 0 and plans for the world size; builds TorchStages and runs the
// engine; prints a progress line per iteration on rank 0, a final summary, and optionally a
// JSON log, a timeline (with the simulator's prediction beside it) and checkpoints.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <tuple>
#include <iostream>
#include <memory>
#include <map>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/version.h>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/command.h"
#include "cli/torch/commands.h"
#include "cli/torch/model_registry.h"
#include "cli/flags.h"
#include "cli/torch/elastic_train.h"
#include "cli/torch/hf_models.h"
#include "cli/torch/model_flags.h"
#include "cli/torch/shard_profiles.h"
#include "cli/torch/train_options.h"
#include "cli/torch/train_reporter.h"
#include "cli/torch_commands.h"
#include "comm/backend.h"
#include "data/dataset_identity.h"
#include "runtime/grad_sync.h"
#include "runtime/optimizer.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/printable.h"
#include "common/status.h"
#include "common/units.h"
#include "pipeline/plan.h"
#include "pipeline/profile.h"
#include "pipeline/torch_csv.h"
#include "planner/cluster.h"
#include "planner/planner.h"
#include "runtime/checkpoint.h"
#include "runtime/control.h"
#include "runtime/devices.h"
#include "runtime/engine.h"
#include "runtime/failure_notices.h"
#include "runtime/peer_liveness.h"
#include "runtime/lr_schedule.h"
#include "runtime/timeline.h"
#include "runtime/torch/device_ops.h"
#include "runtime/torch/gpt.h"
#include "runtime/torch/precision.h"
#include "runtime/torch/profiler.h"
#include "runtime/torch/stage_factory.h"
#include "runtime/torch/torch_stage.h"

ABSL_FLAG(int, data_parallel, 1, "train: pipeline replicas, D (with --schedule)");
ABSL_FLAG(std::string, plan, "", "train: plan.json to run (from `tandem plan`)");
ABSL_FLAG(std::string, schedule_file, "",
          "train: run the schedule in this file, torch.distributed.pipelining's CSV format "
          "(a row of actions per rank, e.g. written by its _dump_csv or `tandem schedule "
          "--to-csv`), instead of a generated one: p ranks per pipeline x --data-parallel D "
          "(x --tensor-parallel T) = the world");
ABSL_FLAG(std::string, recompute, "",
          "train: layers whose activations are recomputed in backward: none, all, or a comma "
          "list of layer indices (default: the plan's)");

namespace tandem::cli {
namespace {

using runtime::libtorch::LayeredModel;

constexpr int kDefaultMicrobatchesPerRank = 4;  // auto plans: micro-batches per device

// --recompute applied to every stage of `plan` ("" keeps the plan's).
absl::Status ApplyRecompute(pipeline::Plan* plan) {
  const std::string text = absl::GetFlag(FLAGS_recompute);
  if (text.empty()) return absl::OkStatus();
  std::vector<int> layers;
  if (text == "all") {
    for (int l = 0; l < plan->num_layers; ++l) layers.push_back(l);
  } else if (text != "none") {
    for (absl::string_view part : absl::StrSplit(text, ',')) {
      int layer = 0;
      if (!absl::SimpleAtoi(part, &layer) || layer < 0 || layer >= plan->num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("--recompute: '", part, "' is not a layer index in [0, ",
                         plan->num_layers, ") (or use none / all)"));
      }
      layers.push_back(layer);
    }
  }
  for (pipeline::PlanStage& stage : plan->stages) {
    stage.recompute_layers.clear();
    for (int l : layers) {
      if (l >= stage.first_layer && l < stage.end_layer) stage.recompute_layers.push_back(l);
    }
  }
  return absl::OkStatus();
}

// ZB-V's planning costs (pipeline::ScheduleSpec::planning_costs): --planning-costs, else the
// model's estimates, scaled to integers with the largest 100; zeros for other schedules.
absl::StatusOr<std::array<int, 3>> PlanningCosts(pipeline::ScheduleKind kind,
                                                 const LayeredModel& model) {
  const std::string flag = absl::GetFlag(FLAGS_planning_costs);
  if (kind != pipeline::ScheduleKind::kZBV) {
    if (!flag.empty()) {
      return absl::InvalidArgumentError("--planning-costs is for --schedule zb-v only");
    }
    return std::array<int, 3>{};
  }
  std::array<double, 3> costs = model.split_pass_costs;
  if (!flag.empty()) {
    TANDEM_ASSIGN_OR_RETURN(costs, pipeline::ParsePlanningCosts(flag));
  }
  return pipeline::PlanningCostTicks(costs);
}

// --tensor-parallel T: T groups of the run's ranks (0, the planner's choice, only where
// `planned`).
absl::Status CheckTensorParallel(int tensor_parallel, int world_size, bool planned,
                                 absl::string_view where) {
  if (tensor_parallel == 0 && !planned) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel 0 (the planner's choice) does not go with ", where, ": give T"));
  }
  if (tensor_parallel < 0 || (tensor_parallel > 0 && world_size % tensor_parallel != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel ", tensor_parallel,
                                                   " does not divide the ", world_size,
                                                   " ranks of this run"));
  }
  return absl::OkStatus();
}

// --sequence-parallel needs the degree the run has (from the flag, a plan file or the
// planner's choice) to be 2 or more.
absl::Status CheckSequenceParallel(const TrainOptions& options, int tensor_parallel) {
  if (!options.sequence_parallel || tensor_parallel >= 2) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--sequence-parallel splits the sequence over a tensor-parallel group: it needs "
      "--tensor-parallel 2 or more (this run's is ", tensor_parallel, ")"));
}

// --expert-parallel 0 (the planner's choice) needs a planned run.
absl::Status CheckExpertParallelGiven(const TrainOptions& options, absl::string_view where) {
  if (options.expert_parallel != 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--expert-parallel 0 (the planner's choice) does not go with ", where, ": give N"));
}

// --expert-parallel N places the experts on N parts of each tensor-parallel group: N must
// divide the run's degree.
absl::Status CheckExpertParallel(const TrainOptions& options, int tensor_parallel) {
  if (options.expert_parallel <= 1 || tensor_parallel % options.expert_parallel == 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--expert-parallel ", options.expert_parallel,
      " places the experts on parts of a tensor-parallel group: it must divide the group's ",
      tensor_parallel, " ranks (--tensor-parallel, a plan's or the planner's degree)"));
}

// Whether --microbatch-size was given (its default, 1, is also a size one may ask for).
bool MicrobatchSizeGiven() { return FlagGivenOnCommandLine("microbatch_size"); }

// A plan from --schedule, --stages, --microbatches, --data-parallel: the layers split by the
// model's cost estimates where it has them (each pipeline position's load as even as whole
// layers allow), evenly by count otherwise.
absl::StatusOr<pipeline::Plan> PlanFromScheduleFlags(const TrainOptions& options,
                                                     const LayeredModel& model,
                                                     int world_size) {
  const int num_layers = model.num_layers();
  pipeline::ScheduleSpec spec;
  if (options.engine.schedule != nullptr) {
    // A schedule read from a file: its shape is the file's; the flags may only repeat it.
    spec = options.engine.schedule->spec;
    for (const auto& [flag, given, has] :
         {std::tuple<const char*, int, int>{"--stages", absl::GetFlag(FLAGS_stages), spec.num_ranks},
          {"--microbatches", absl::GetFlag(FLAGS_microbatches), spec.num_microbatches}}) {
      if (given != 0 && given != has) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " ", given, " differs from the ",
                                                       has, " of --schedule-file"));
      }
    }
  } else {
    spec.kind = *options.schedule;
  }
  const int data_parallel = absl::GetFlag(FLAGS_data_parallel);
  const int tensor_parallel = options.tensor_parallel;
  TANDEM_RETURN_IF_ERROR(
      CheckTensorParallel(tensor_parallel, world_size, /*planned=*/false, "--schedule"));
  world_size /= tensor_parallel;  // pipeline positions: the plan gets its groups below
  if (options.engine.schedule == nullptr) {
    spec.num_ranks = absl::GetFlag(FLAGS_stages);
    if (spec.num_ranks == 0 && data_parallel > 0) spec.num_ranks = world_size / data_parallel;
    spec.num_microbatches = absl::GetFlag(FLAGS_microbatches);
    if (spec.num_microbatches == 0 && options.global_batch > 0 && MicrobatchSizeGiven() &&
        data_parallel > 0) {
      // --global-batch and --microbatch-size given: as many micro-batches as that makes.
      const int64_t per_pipeline = int64_t{data_parallel} * options.microbatch_size;
      if (options.global_batch % per_pipeline != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--global-batch ", options.global_batch, " is not divisible by --microbatch-size ",
            options.microbatch_size, " x --data-parallel ", data_parallel));
      }
      spec.num_microbatches = static_cast<int>(options.global_batch / per_pipeline);
    }
    if (spec.num_microbatches == 0) {
      spec.num_microbatches = kDefaultMicrobatchesPerRank * spec.num_ranks;
    }
    spec.chunks = absl::GetFlag(FLAGS_chunks);
    spec.waves = absl::GetFlag(FLAGS_waves);
    TANDEM_ASSIGN_OR_RETURN(spec.planning_costs, PlanningCosts(spec.kind, model));
  }
  if (data_parallel < 1 || spec.num_ranks * data_parallel != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stages ", spec.num_ranks, " x --data-parallel ", data_parallel,
        tensor_parallel > 1 ? absl::StrCat(" x --tensor-parallel ", tensor_parallel) : "",
        " = ", spec.num_ranks * data_parallel * tensor_parallel,
        " ranks, but this run has ", world_size * tensor_parallel));
  }
  int64_t microbatch_size = options.microbatch_size;
  const int64_t global_batch = options.global_batch;
  if (global_batch > 0) {
    const int64_t per_microbatch = int64_t{spec.num_microbatches} * data_parallel;
    if (global_batch % per_microbatch != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--global-batch ", global_batch, " is not divisible by --microbatches ",
          spec.num_microbatches, " x --data-parallel ", data_parallel));
    }
    microbatch_size = global_batch / per_microbatch;
    if (MicrobatchSizeGiven() && microbatch_size != options.microbatch_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--global-batch ", global_batch, " over --microbatches ", spec.num_microbatches,
          " x --data-parallel ", data_parallel, " gives micro-batches of ", microbatch_size,
          ", not --microbatch-size ", options.microbatch_size, ": give two of the three"));
    }
  }
  pipeline::Plan plan;
  if (static_cast<int>(model.layer_costs.size()) == num_layers) {
    TANDEM_ASSIGN_OR_RETURN(plan, pipeline::MakeBalancedPlan(model.layer_costs, spec,
                                                             data_parallel, microbatch_size));
  } else {
    TANDEM_ASSIGN_OR_RETURN(
        plan, pipeline::MakeUniformPlan(num_layers, spec, data_parallel, microbatch_size));
  }
  if (tensor_parallel == 1) return plan;
  return pipeline::WithTensorParallel(std::move(plan), tensor_parallel);
}

// Ranks of this node that share `device`: on a GPU the node's ranks over its GPUs, on the CPU
// every rank of the node.
int RanksSharingDevice(torch::Device device) {
  const int local_ranks = LocalRanks();
  return device.is_cuda()
             ? std::max(1, local_ranks / std::max(1, static_cast<int>(torch::cuda::device_count())))
             : local_ranks;
}

// The memory per rank a planned run must fit, and where the figure comes from.
struct MemoryLimit {
  double bytes = 0;  // 0: none
  std::string source;
};

// Of a GPU's memory the plan takes this share by default: the planner counts parameters,
// gradients, optimizer state and stashed activations, not the CUDA context, LibTorch's
// workspaces or the caching allocator's fragmentation.
constexpr double kDefaultDeviceShare = 0.9;

// --device-memory-mb; else on a GPU kDefaultDeviceShare of this rank's share of the device;
// else (the CPU) none.
MemoryLimit PlanningMemoryLimit(const TrainOptions& options) {
  if (options.device_memory_bytes > 0) return {options.device_memory_bytes, "--device-memory-mb"};
  if (!options.device.is_cuda()) return {};
  const double memory = runtime::libtorch::DeviceMemoryBytes(options.device);
  if (memory <= 0) return {};
  const int sharing = RanksSharingDevice(options.device);
  return {kDefaultDeviceShare * memory / sharing,
          absl::StrFormat("%.0f%% of %s's %s%s; --device-memory-mb to change",
                          kDefaultDeviceShare * 100, options.device.str(), FormatBytes(memory),
                          sharing > 1 ? absl::StrCat(" over ", sharing, " ranks") : "")};
}

// Rank 0 profiles the model and plans for the world (AdaPipe: a uniform mesh with per-stage
// recomputation); the plan is returned on rank 0 only.
runtime::libtorch::ProfilerOptions AutoPlanProfilerOptions(const TrainOptions& options) {
  runtime::libtorch::ProfilerOptions profiler;
  profiler.microbatch_size = options.microbatch_size;
  profiler.warmup = 1;
  profiler.repeats = 3;
  profiler.device = options.device;
  profiler.optimizer_state = absl::GetFlag(FLAGS_optimizer) == "adamw"
                                 ? runtime::libtorch::OptimizerStateKind::kAdam
                                 : runtime::libtorch::OptimizerStateKind::kMomentum;
  return profiler;
}

absl::StatusOr<pipeline::Plan> AutoPlan(const TrainOptions& options, const LayeredModel& model,
                                        const runtime::libtorch::Dataset& data, int world_size,
                                        const std::vector<ShardProfile>& shards,
                                        double memory_bytes) {
  const runtime::libtorch::ProfilerOptions profiler = AutoPlanProfilerOptions(options);
  std::cout << "profiling " << model.name << " (micro-batch " << profiler.microbatch_size
            << ") on rank 0 ..." << std::endl;
  TANDEM_ASSIGN_OR_RETURN(pipeline::Profile profile,
                          runtime::libtorch::ProfileModel(model, data, profiler));
  // Measured shards as the layers' tensor-parallel variants (their times include the
  // collectives): the planner weighs every degree against pipelines and replicas.
  TANDEM_RETURN_IF_ERROR(AddShardVariants(shards, &profile, std::cout));
  planner::PlanRequest request;
  request.algorithm = planner::Algorithm::kAdaPipe;
  request.profile = profile;
  // With measured shards the devices are the ranks, and the planner weighs the shards (only
  // those of a given degree, and of a given number of parts for the experts); without, the
  // devices are groups of `ranks_per_device` ranks (a given tensor-parallel degree).
  const int ranks_per_device = shards.empty() ? std::max(1, options.tensor_parallel) : 1;
  if (!shards.empty()) {
    request.tensor_parallel = options.tensor_parallel;
    request.expert_parallel = options.expert_parallel;
  }
  request.memory_flag_hint = [ranks_per_device](double bytes) {
    const double mib = bytes / ranks_per_device / (1 << 20);
    return absl::StrFormat("--device-memory-mb %.2f", std::ceil(mib * 100) / 100);
  };
  TANDEM_ASSIGN_OR_RETURN(
      request.cluster,
      planner::MakeCluster(world_size, world_size, memory_bytes, {/*bandwidth=*/10e9}));
  const int64_t global_batch = options.global_batch;
  if (global_batch > 0) {
    if (global_batch % profiler.microbatch_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--global-batch ", global_batch, " is not divisible by --microbatch-size ",
                       profiler.microbatch_size));
    }
    request.microbatches = static_cast<int>(global_batch / profiler.microbatch_size);
  } else {
    request.microbatches = kDefaultMicrobatchesPerRank * world_size;
  }
  TANDEM_ASSIGN_OR_RETURN(planner::PlanOutcome outcome, planner::MakePlan(request));
  std::cout << outcome.summary << std::endl;
  return outcome.plan;
}

// Every rank learns whether any rank failed; the others report the lowest failing rank and its code.
absl::Status Agree(comm::Communicator& world, const absl::Status& local, absl::string_view what) {
  return runtime::AgreeOnSuccess(&world, local, what);
}

absl::StatusOr<pipeline::Plan> PlanForRun(comm::Communicator& world, const TrainOptions& options,
                                          const LayeredModel& model,
                                          const runtime::libtorch::Dataset& data) {
  const int world_size = world.size();
  const std::string plan_file = absl::GetFlag(FLAGS_plan);
  const bool from_schedule = options.schedule.has_value() || options.engine.schedule != nullptr;
  if (!plan_file.empty() && from_schedule) {
    return absl::InvalidArgumentError("give --plan or --schedule (--schedule-file), not both");
  }
  const int tensor_parallel = options.tensor_parallel;
  if (tensor_parallel != 1 && !plan_file.empty()) {
    return absl::InvalidArgumentError(
        "--tensor-parallel does not go with --plan: a plan file carries its own "
        "tensor_parallel");
  }
  if (FlagGivenOnCommandLine("device_memory_mb") && (!plan_file.empty() || from_schedule)) {
    return absl::InvalidArgumentError(
        "--device-memory-mb applies to a planned run (no --plan, --schedule or "
        "--schedule-file) or to --elastic: this run's plan is given");
  }
  pipeline::Plan plan;
  if (!plan_file.empty()) {
    absl::Status local = [&]() -> absl::Status {
      TANDEM_ASSIGN_OR_RETURN(plan, pipeline::ReadPlanFile(plan_file));
      TANDEM_RETURN_IF_ERROR(
          Annotate(pipeline::ValidatePlan(plan, world_size, model.num_layers()), plan_file));
      // A model's layers run in their own order: a plan that reorders them (PipeDream on a
      // branching graph) is for a model the runtime does not build.
      for (int position = 0; position < plan.num_layers; ++position) {
        if (plan.LayerAt(position) != position) {
          return absl::InvalidArgumentError(absl::StrCat(
              plan_file, ": layer_order puts layer ", plan.LayerAt(position), " at position ",
              position, "; tandem train runs a model's layers in their own order"));
        }
      }
      return absl::OkStatus();
    }();
    TANDEM_RETURN_IF_ERROR(Agree(world, local, "reading the plan"));
  } else if (from_schedule) {
    TANDEM_RETURN_IF_ERROR(CheckExpertParallelGiven(
        options, options.schedule.has_value() ? "--schedule" : "--schedule-file"));
    TANDEM_ASSIGN_OR_RETURN(plan, PlanFromScheduleFlags(options, model, world_size));
  } else {
    std::string text;
    absl::Status local = absl::OkStatus();
    // --tensor-parallel 0: the shards measured first (every rank takes part), then the
    // planner chooses the degree with the partition.
    TANDEM_RETURN_IF_ERROR(
        CheckTensorParallel(tensor_parallel, world_size, /*planned=*/true, "a planned run"));
    const MemoryLimit limit = PlanningMemoryLimit(options);
    if (world.rank() == 0 && limit.bytes > 0) {
      std::cout << "planning for " << FormatBytes(limit.bytes) << " per rank (" << limit.source
                << ")" << std::endl;
    }
    std::vector<ShardProfile> shards;
    // The shards are measured for the planner to choose T (--tensor-parallel 0) or, with a
    // given T of 2 or more, the experts' parts (--expert-parallel 0).
    const bool measure =
        tensor_parallel == 0 || (options.expert_parallel == 0 && tensor_parallel > 1);
    if (measure) {
      // Sequence parallelism saves activation memory at the same communication: weighed where
      // memory is limited, the only choice with --sequence-parallel.
      const std::vector<bool> variants = options.sequence_parallel ? std::vector<bool>{true}
                                         : limit.bytes > 0 && tensor_parallel == 0
                                             ? std::vector<bool>{false, true}
                                             : std::vector<bool>{false};
      const std::vector<int> degrees =
          tensor_parallel == 0 ? std::vector<int>{2, 4, 8} : std::vector<int>{tensor_parallel};
      absl::StatusOr<std::vector<ShardProfile>> measured = ProfileShards(
          world, AutoPlanProfilerOptions(options), model, data,
          {.degrees = degrees, .sequence_parallel = variants,
           .expert_parallel = options.expert_parallel},
          std::cout);
      TANDEM_RETURN_IF_ERROR(Agree(world, measured.status(), "profiling tensor-parallel shards"));
      shards = *std::move(measured);
    }
    if (world.rank() == 0) {
      // With a given degree the planner partitions over the groups (the layers' costs are
      // the unsharded profile's: every stage T times faster leaves the partition as it is),
      // each with the memory of its T ranks, and each plan position becomes a group of T
      // ranks.
      auto planned = [&]() -> absl::StatusOr<pipeline::Plan> {
        if (measure) return AutoPlan(options, model, data, world_size, shards, limit.bytes);
        TANDEM_ASSIGN_OR_RETURN(pipeline::Plan plan,
                                AutoPlan(options, model, data, world_size / tensor_parallel,
                                         /*shards=*/{}, limit.bytes * tensor_parallel));
        if (tensor_parallel == 1) return plan;
        return pipeline::WithTensorParallel(std::move(plan), tensor_parallel);
      }();
      if (planned.ok()) {
        text = pipeline::ToJson(*planned).dump();
      } else {
        local = planned.status();
      }
    }
    TANDEM_RETURN_IF_ERROR(Agree(world, local, "planning"));
    TANDEM_ASSIGN_OR_RETURN(text, runtime::BroadcastString(world, text));
    TANDEM_ASSIGN_OR_RETURN(plan, pipeline::PlanFromJson(nlohmann::json::parse(text),
                                                         "broadcast plan"));
  }
  TANDEM_RETURN_IF_ERROR(ApplyRecompute(&plan));
  const int64_t global_batch = options.global_batch;
  if (global_batch > 0 && global_batch != plan.GlobalBatchSize()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global-batch ", global_batch, " differs from the plan's ", plan.GlobalBatchSize(),
        " (micro-batch ", plan.microbatch_size, " x ", plan.schedule.num_microbatches,
        " micro-batches x ", plan.data_parallel, " pipelines)"));
  }
  return plan;
}

std::string DescribePlan(const pipeline::Plan& plan) {
  std::string out = absl::StrFormat(
      "plan: %s, %d pipeline(s) x %d stage(s)%s (%d ranks), %d micro-batches of %d, "
      "global batch %d\n",
      pipeline::ScheduleKindName(plan.schedule.kind), plan.data_parallel, plan.pipeline_parallel,
      plan.tensor_parallel > 1 ? absl::StrCat(" x ", plan.tensor_parallel, " tensor-parallel",
                                              plan.sequence_parallel ? " (sequence parallel)" : "")
                               : "",
      plan.world_size, plan.schedule.num_microbatches, plan.microbatch_size,
      plan.GlobalBatchSize());
  if (plan.algorithm == "balanced") out += "  (layers split by the model's FLOP estimates)\n";
  const std::array<int, 3>& costs = plan.schedule.planning_costs;
  if (costs[0] > 0) {
    absl::StrAppendFormat(&out, "  (order planned for forward : input gradient : weight gradient = "
                          "%d : %d : %d)\n", costs[0], costs[1], costs[2]);
  }
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const pipeline::PlanStage& st = plan.stages[s];
    absl::StrAppendFormat(
        &out, "  stage %d: layers [%d, %d)%s%s\n", s, st.first_layer, st.end_layer,
        st.recompute_layers.empty()
            ? ""
            : absl::StrCat(", recompute ", st.recompute_layers.size(), " layer(s)"),
        st.predicted_memory_bytes > 0
            ? absl::StrCat(", ", FormatBytes(st.predicted_memory_bytes), " per rank predicted")
            : "");
  }
  return out;
}

// MFU = model FLOPs per second / (ranks x the device's peak). The peak comes from
// --peak-tflops or a table of known GPUs; on the CPU (or an unknown GPU) it is unknown: -1.
struct MfuModel {
  double flops_per_token = 0;
  double total_peak_flops = 0;  // summed over ranks
  double Of(double tokens_per_second) const {
    return total_peak_flops > 0 ? tokens_per_second * flops_per_token / total_peak_flops : -1;
  }
  std::string Text(double tokens_per_second) const {
    const double mfu = Of(tokens_per_second);
    return mfu < 0 ? std::string() : absl::StrFormat("  MFU %.1f%%", mfu * 100);
  }
};

MfuModel MfuFor(const TrainOptions& options, double flops_per_token, int ranks) {
  const torch::Device device = options.device;
  MfuModel m;
  m.flops_per_token = flops_per_token;
  double peak = options.peak_tflops * 1e12;
  if (peak <= 0 && device.is_cuda()) {
    peak = runtime::libtorch::KnownPeakFlops(comm::CudaDeviceName(device.index()),
                                             options.precision);
  }
  // Ranks that share a GPU share its peak: count the GPUs, not the ranks.
  int devices = ranks;
  if (device.is_cuda()) {
    const int per_node = std::max(1, static_cast<int>(torch::cuda::device_count()));
    const int sharing = std::max(1, LocalRanks() / per_node);
    devices = std::max(1, ranks / sharing);
  }
  m.total_peak_flops = peak * devices;
  return m;
}

// Writes the last iteration's timeline with the simulator's prediction from that iteration's
// measured costs (compute per stage, and the optimizer tail with the gradient synchronisation
// it waits for) beside it. Collective.
absl::Status WriteTimeline(runtime::Engine& engine, const std::string& path, int64_t iteration,
                           const std::vector<runtime::ActionTiming>& timings) {
  TANDEM_ASSIGN_OR_RETURN(ChromeTrace trace, engine.GatherTimeline());
  TANDEM_ASSIGN_OR_RETURN(runtime::WorldTimings all, engine.GatherTimings(timings));
  if (engine.world_rank() != 0) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(pipeline::CostModel costs,
                          runtime::MeasuredCosts(all, engine.plan().schedule));
  TANDEM_ASSIGN_OR_RETURN(runtime::TimeRange range, runtime::IterationRange(all));
  TANDEM_ASSIGN_OR_RETURN(
      pipeline::SimulationResult predicted,
      runtime::AddPrediction(engine.schedule(), costs, range.start_seconds, &trace));
  TANDEM_RETURN_IF_ERROR(trace.WriteFile(path));
  const double measured = range.end_seconds - range.start_seconds;
  std::cout << absl::StrFormat(
                   "timeline of iteration %d: %s (measured %.1f ms; simulator with the "
                   "measured stage times and optimizer step: %.1f ms, %.3fx)",
                   iteration + 1, path, measured * 1e3, predicted.makespan_seconds * 1e3,
                   predicted.makespan_seconds / measured)
            << std::endl;
  return absl::OkStatus();
}

// A first bound on the plan's micro-batch size before anything is allocated (a sanity bound,
// not a memory planner: it catches sizes such as 10^6 that would run out of memory or run for
// minutes). The activations a stage keeps at the least (the model's estimate, for
// min(micro-batches, stages) micro-batches in flight, as 1F1B keeps them) must fit this rank's
// share of the device's memory (the host's is shared by the ranks on it, a GPU's by the ranks
// that use it). Models without an estimate are not checked.
absl::Status CheckMicrobatchFits(const pipeline::Plan& plan, const ModelAndData& model,
                                 torch::Device device) {
  const double memory = runtime::libtorch::DeviceMemoryBytes(device);
  if (memory <= 0 || !model.minimum_activation_bytes) return absl::OkStatus();
  const int sharing = RanksSharingDevice(device);
  const double share = memory / sharing;
  const double in_flight = std::min(plan.schedule.num_microbatches, plan.schedule.NumStages());
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const pipeline::PlanStage& st = plan.stages[i];
    const double bytes =
        in_flight * model.minimum_activation_bytes(plan.microbatch_size,
                                                   st.end_layer - st.first_layer,
                                                   i + 1 == plan.stages.size());
    if (bytes > share) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the plan's micro-batches of %d samples need at least %s of activations in stage %d, "
          "more than this rank's share of %s (%s over %d rank(s)): lower microbatch_size",
          plan.microbatch_size, FormatBytes(bytes), i,
          device.str(), FormatBytes(memory), sharing));
    }
  }
  return absl::OkStatus();
}

// Every output path, before any work, on every rank that writes it (the plain run's log and
// timeline are rank 0's; in an elastic job whichever rank leads the first pipeline writes them,
// so every rank checks), agreed: a path that cannot be written is bad input on every rank.
absl::Status CheckOutputPaths(comm::Communicator& world, const TrainOptions& options) {
  const bool every_rank = options.elastic || world.rank() == 0;
  absl::Status local = absl::OkStatus();
  auto check = [&](absl::Status status) {
    if (local.ok()) local = std::move(status);
  };
  if (every_rank && !options.log_json.empty()) {
    check(CheckOutputFile(options.log_json, "--log-json"));
  }
  if (every_rank && !options.timeline.empty()) {
    check(CheckOutputFile(options.timeline, "--timeline"));
  }
  if (!options.torch_trace.empty()) check(CheckOutputFile(options.torch_trace, "--torch-trace"));
  if (!options.checkpoint_dir.empty()) {
    check(CheckOutputFolder(options.checkpoint_dir, "--checkpoint-dir"));
  }
  return runtime::AgreeOnSuccess(&world, local, "checking the output paths");
}

// The whole run; errors carry their codes (InvalidArgument etc. for bad input).
// What every checkpoint of this run records, for a resume to check: the data set's identity
// and the global batch (together the data position, with the iteration), and the
// learning-rate schedule; and for an export or a generation from it, the config.json that sized
// the model, where one did (HfConfigOfRun; the model was built from it, so it reads).
nlohmann::json RunRecord(const runtime::libtorch::Dataset& data, int64_t global_batch,
                         const runtime::LrSchedule& lr) {
  nlohmann::json record = {{"data", data.Identity()},
                           {"global_batch", global_batch},
                           {"lr_schedule",
                            {{"base_lr", lr.base_lr},
                             {"warmup_steps", lr.warmup_steps},
                             {"decay_end_step", lr.decay_end_step},
                             {"min_lr", lr.min_lr}}}};
  absl::StatusOr<std::optional<nlohmann::json>> config = HfConfigOfRun();
  if (config.ok() && config->has_value()) record["hf_config"] = **config;
  return record;
}

// Refuses a resume whose checkpoint was trained on other data, another global batch or another
// learning-rate schedule, naming the difference, unless --reset-data / --reset-schedule accept
// it. Checkpoints without a record (older ones) are not checked.
absl::Status CheckResumeMatches(const TrainOptions& options, const nlohmann::json& current) {
  const std::string& resume = options.resume;
  TANDEM_ASSIGN_OR_RETURN(std::string dir, runtime::ResolveCheckpoint(resume));
  TANDEM_ASSIGN_OR_RETURN(runtime::CheckpointManifest manifest, runtime::ReadManifest(dir));
  const nlohmann::json& saved = manifest.run;
  if (saved.empty()) return absl::OkStatus();
  if (!options.reset_data) {
    const char* reset = " (--reset-data to go on from this checkpoint on other data)";
    if (saved.contains("data") && saved["data"] != current["data"]) {
      const nlohmann::json& a = saved["data"];
      const nlohmann::json& b = current["data"];
      if (a.is_object() && b.is_object() && a.contains("shards") && b.contains("shards")) {
        auto saved_identity = data::DatasetIdentity::FromJson(a, dir);
        auto current_identity = data::DatasetIdentity::FromJson(b, "--data");
        if (saved_identity.ok() && current_identity.ok()) {
          absl::Status same = data::CheckSameDataset(*saved_identity, *current_identity);
          if (!same.ok()) {
            return absl::InvalidArgumentError(
                absl::StrCat(dir, ": ", same.message(), reset));
          }
        }
      }
      return absl::InvalidArgumentError(absl::StrCat(dir, ": the checkpoint was trained on ",
                                                     a.dump(), "; this run reads ", b.dump(),
                                                     reset));
    }
    if (saved.contains("global_batch") && saved["global_batch"] != current["global_batch"]) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": the checkpoint was trained with a global batch of ",
          saved["global_batch"].dump(), " samples, this run's is ",
          current["global_batch"].dump(), reset));
    }
  }
  if (!options.reset_schedule && saved.contains("lr_schedule") &&
      saved["lr_schedule"] != current["lr_schedule"]) {
    std::vector<std::string> differences;
    const std::map<std::string, std::string> flag_of = {{"base_lr", "--lr"},
                                                        {"warmup_steps", "--warmup-steps"},
                                                        {"decay_end_step", "--decay-steps"},
                                                        {"min_lr", "--min-lr"}};
    for (const auto& [field, flag] : flag_of) {
      const nlohmann::json a = saved["lr_schedule"].value(field, nlohmann::json());
      const nlohmann::json b = current["lr_schedule"].value(field, nlohmann::json());
      if (a != b) differences.push_back(absl::StrCat(flag, " ", a.dump(), " (this run ", b.dump(), ")"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": the checkpoint was trained with another learning-rate schedule: ",
        absl::StrJoin(differences, ", "),
        " (the same flags continue it; --reset-schedule to start the new one from this "
        "checkpoint)"));
  }
  return absl::OkStatus();
}

absl::Status Train(comm::Communicator& world, const std::function<void()>& engine_started) {
  const int rank = world.rank();
  TANDEM_ASSIGN_OR_RETURN(TrainOptions options, TrainOptionsFromFlags(rank, world.size()));
  TANDEM_RETURN_IF_ERROR(CheckOutputPaths(world, options));
  const std::string schedule_file = absl::GetFlag(FLAGS_schedule_file);
  if (!schedule_file.empty()) {
    if (options.schedule.has_value() || options.elastic) {
      return absl::InvalidArgumentError(
          "--schedule-file is the schedule: drop --schedule (and --elastic, which plans its own)");
    }
    absl::StatusOr<pipeline::Schedule> read = pipeline::ReadTorchCsvSchedule(schedule_file);
    if (!read.ok()) return Annotate(read.status(), "--schedule-file");
    options.engine.schedule = std::make_shared<const pipeline::Schedule>(*std::move(read));
  }
  const std::string threads = SetHostThreads();
  TANDEM_ASSIGN_OR_RETURN(ModelAndData model_and_data, ModelAndDataFromFlags(options.seed));
  if (options.eval_every > 0 && model_and_data.validation == nullptr) {
    return absl::InvalidArgumentError(
        "--eval-every needs validation data: --valid-data (a folder scripts/prepare_data.py "
        "wrote gives its validation split by itself)");
  }
  // The model's description alone: each stage builds its own layers (a model given whole is
  // built whole here), and profiling builds one layer at a time.
  TANDEM_ASSIGN_OR_RETURN(LayeredModel model,
                          model_and_data.spec.BuildLayers(options.seed, /*first=*/0, /*end=*/0));
  std::shared_ptr<const runtime::libtorch::Dataset> data = model_and_data.data;
  std::shared_ptr<const runtime::libtorch::Dataset> validation = model_and_data.validation;
  runtime::StageFactory factory =
      [&](const runtime::StageSpec& s) -> absl::StatusOr<std::unique_ptr<runtime::Stage>> {
    runtime::libtorch::TorchStageOptions o =
        runtime::libtorch::TorchStageOptionsFor(s, options.device);
    o.precision = options.precision;
    o.libtorch_device_ops = options.libtorch_device_ops;
    o.tensor_parallel.sequence_parallel = options.sequence_parallel;
    o.tensor_parallel.expert_parallel = options.expert_parallel;
    o.validation_data = validation;
    TANDEM_ASSIGN_OR_RETURN(auto stage, runtime::libtorch::TorchStage::Create(model, data, o));
    return std::unique_ptr<runtime::Stage>(std::move(stage));
  };
  const std::string model_text = absl::StrCat(model_and_data.description, " seed=", options.seed);
  const std::string start_line =
      absl::StrCat(model_text, ", ", runtime::libtorch::PrecisionName(options.precision), " on ",
                   options.device.str(), options.elastic ? ", elastic, " : ", ", threads);
  if (options.elastic) {
    TANDEM_RETURN_IF_ERROR(CheckTensorParallel(options.tensor_parallel, world.size(),
                                               /*planned=*/false, "--elastic"));
    TANDEM_RETURN_IF_ERROR(CheckExpertParallelGiven(options, "--elastic"));
    TANDEM_RETURN_IF_ERROR(CheckSequenceParallel(options, options.tensor_parallel));
    TANDEM_RETURN_IF_ERROR(CheckExpertParallel(options, options.tensor_parallel));
    if (!absl::GetFlag(FLAGS_plan).empty()) {
      return absl::InvalidArgumentError(
          "--elastic plans its own pipelines from templates; drop --plan");
    }
    ElasticRun run{.options = options};
    run.world = &world;
    run.model = &model;
    run.data = data;
    run.profiler.microbatch_size = options.microbatch_size;
    run.profiler.warmup = 1;
    run.profiler.repeats = 3;
    run.profiler.device = options.device;
    run.factory = factory;
    run.tokens_per_sample = model_and_data.tokens_per_sample;
    run.model_text = model_text;
    if (rank == 0 && !ElasticJoining()) std::cout << start_line << std::endl;
    if (options.global_batch > 0) {
      TANDEM_RETURN_IF_ERROR(model_and_data.data->SetGlobalBatch(options.global_batch));
      if (validation != nullptr) {
        TANDEM_RETURN_IF_ERROR(model_and_data.validation->SetGlobalBatch(options.global_batch));
      }
    }
    run.options.engine.checkpoint_run =
        RunRecord(*model_and_data.data, options.global_batch, options.engine.lr_schedule);
    if (!options.resume.empty()) {
      TANDEM_RETURN_IF_ERROR(CheckResumeMatches(options, run.options.engine.checkpoint_run));
    }
    return RunElasticTraining(run, engine_started);
  }
  TANDEM_ASSIGN_OR_RETURN(pipeline::Plan plan,
                          PlanForRun(world, options, model, *model_and_data.data));
  TANDEM_RETURN_IF_ERROR(CheckMicrobatchFits(plan, model_and_data, options.device));
  TANDEM_RETURN_IF_ERROR(model_and_data.data->SetGlobalBatch(plan.GlobalBatchSize()));
  if (validation != nullptr) {
    TANDEM_RETURN_IF_ERROR(model_and_data.validation->SetGlobalBatch(plan.GlobalBatchSize()));
  }
  options.engine.checkpoint_run =
      RunRecord(*model_and_data.data, plan.GlobalBatchSize(), options.engine.lr_schedule);
  if (!options.resume.empty()) {
    TANDEM_RETURN_IF_ERROR(CheckResumeMatches(options, options.engine.checkpoint_run));
  }
  // The planner's choice, or a plan file's.
  if (plan.sequence_parallel) options.sequence_parallel = true;
  if (options.sequence_parallel && options.tensor_parallel == 0 && plan.tensor_parallel < 2) {
    if (rank == 0) {
      std::cout << "the planner chose no tensor parallelism: --sequence-parallel has no group "
                   "to split the sequence over; running without it"
                << std::endl;
    }
    options.sequence_parallel = false;
  }
  TANDEM_RETURN_IF_ERROR(CheckSequenceParallel(options, std::max(1, plan.tensor_parallel)));
  // The experts' parts: the planner's choice (--expert-parallel 0) or a plan file's.
  const bool experts_chosen = options.expert_parallel == 0;
  if (plan.expert_parallel > 1) {
    if (options.expert_parallel > 1 && options.expert_parallel != plan.expert_parallel) {
      return absl::InvalidArgumentError(
          absl::StrCat("--expert-parallel ", options.expert_parallel,
                       " differs from the plan's expert_parallel ", plan.expert_parallel,
                       ": drop the flag (the plan places the experts)"));
    }
    options.expert_parallel = plan.expert_parallel;
  } else if (options.expert_parallel == 0) {
    options.expert_parallel = 1;
  }
  TANDEM_RETURN_IF_ERROR(CheckExpertParallel(options, std::max(1, plan.tensor_parallel)));
  if (rank == 0) {
    std::cout << start_line << "\n" << DescribePlan(plan);
    if (options.expert_parallel > 1) {
      const int t = std::max(1, plan.tensor_parallel);
      std::cout << "  experts: whole on " << options.expert_parallel
                << " parts of each tensor-parallel group, split over "
                << t / options.expert_parallel << " rank(s) within a part ("
                << (plan.expert_parallel > 1 ? "the plan's" : "--expert-parallel") << " "
                << options.expert_parallel << ")\n";
    } else if (experts_chosen && plan.tensor_parallel > 1) {
      std::cout << "  experts: each split over the " << plan.tensor_parallel
                << " ranks of its tensor-parallel group (the planner's choice)\n";
    }
    if (options.engine.expert_replicas > 1) {
      std::cout << "  experts: spread over " << options.engine.expert_replicas
                << " data-parallel replicas, 1/" << options.engine.expert_replicas
                << " of them each; routed tokens travel by all-to-all "
                   "(--expert-parallel-replicas)\n";
    }
    std::cout << std::flush;
  }

  const MfuModel mfu = MfuFor(options, model_and_data.training_flops_per_token, world.size());
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine,
                          runtime::Engine::Create(plan, &world, factory, options.engine));
  engine_started();  // the engine's own failure watch takes over
  if (!options.resume.empty()) {
    TANDEM_RETURN_IF_ERROR(engine->LoadCheckpoint(options.resume, model_text));
    if (rank == 0) {
      std::cout << "resumed from " << options.resume << " after iteration "
                << engine->iteration() << std::endl;
    }
  }
  const int64_t first = engine->iteration();
  const int64_t end = std::max(first, options.steps);
  if (rank == 0 && first >= options.steps && options.steps > 0) {
    std::cout << "the checkpoint is at iteration " << first << ", --steps " << options.steps
              << ": nothing to train (--steps is the run's last iteration)" << std::endl;
  }
  const double tokens_per_iteration =
      static_cast<double>(plan.GlobalBatchSize()) * model_and_data.tokens_per_sample;
  TrainReporter reporter(options.log_json);
  if (rank == 0) TANDEM_RETURN_IF_ERROR(reporter.StartLog());
  double measured_seconds = 0, measured_bubble = 0;
  int measured = 0;
  double last_loss = 0;
  std::vector<runtime::ActionTiming> last_timings;
  for (int64_t it = first; it < end; ++it) {
    const int64_t done = it + 1;  // counted from 1 from here on
    const bool recorded = !options.timeline.empty() && done == end;
    engine->set_record_timeline(recorded);
    const bool trace_now = !options.torch_trace.empty() && done == end;
    if (trace_now) {
      TANDEM_RETURN_IF_ERROR(runtime::libtorch::StartTorchTrace(options.device.is_cuda()));
    }
    TANDEM_ASSIGN_OR_RETURN(runtime::IterationResult r, engine->RunIteration());
    TANDEM_RETURN_IF_ERROR(runtime::CheckLossIsFinite(r));
    if (trace_now) {
      TANDEM_RETURN_IF_ERROR(runtime::libtorch::StopTorchTrace(options.torch_trace));
      std::cout << "LibTorch trace of iteration " << done << " (rank " << rank
                << "): " << options.torch_trace << std::endl;
    }
    last_loss = r.loss;
    last_timings = r.timings;
    // The first iteration includes warm-up costs, and the recorded one waits for the device
    // after every action: the mean counts neither unless nothing else was measured.
    if ((it > first || end - first == 1) && !(recorded && it > first + 1)) {
      measured_seconds += r.seconds;
      measured_bubble += r.bubble_ratio;
      ++measured;
    }
    if (rank == 0) {
      ProgressLine line;
      line.iteration = done;
      line.end = end;
      line.loss = r.loss;
      line.seconds = r.seconds;
      line.tokens_per_second = tokens_per_iteration / r.seconds;
      line.grad_norm = r.grad_norm;
      line.learning_rate = r.learning_rate;
      line.bubble = r.bubble_ratio;
      line.peak_bytes = runtime::libtorch::PeakMemoryBytes(options.device);
      if (mfu.Of(line.tokens_per_second) >= 0) line.mfu = mfu.Of(line.tokens_per_second);
      TANDEM_RETURN_IF_ERROR(reporter.Iteration(line));
    }
    if (runtime::EvaluationDue(done, end, options.eval_every)) {
      TANDEM_ASSIGN_OR_RETURN(const double loss, engine->Evaluate(options.eval_batches));
      if (rank == 0) TANDEM_RETURN_IF_ERROR(reporter.Validation(done, loss));
    }
    if (!options.checkpoint_dir.empty() &&
        runtime::CheckpointDue(done, end, options.checkpoint_every)) {
      TANDEM_RETURN_IF_ERROR(engine->SaveCheckpoint(options.checkpoint_dir, model_text));
      if (rank == 0) TANDEM_RETURN_IF_ERROR(reporter.Checkpoint(options.checkpoint_dir, done));
    }
  }
  if (!options.timeline.empty() && end > first) {
    TANDEM_RETURN_IF_ERROR(WriteTimeline(*engine, options.timeline, end - 1, last_timings));
  }
  if (rank == 0 && measured > 0) {
    const double mean = measured_seconds / measured;
    RunSummary summary;
    summary.iterations = end;
    summary.trained = end - first;
    summary.ranks = world.size();
    summary.final_loss = last_loss;
    summary.mean_seconds = mean;
    summary.tokens_per_second = tokens_per_iteration / mean;
    summary.bubble = measured_bubble / measured;
    summary.memory = absl::StrCat(
        "peak ", options.device.is_cuda() ? "device" : "host", " memory ",
        FormatBytes(runtime::libtorch::PeakMemoryBytes(options.device)), " (rank 0)");
    if (mfu.Of(summary.tokens_per_second) >= 0) summary.mfu = mfu.Of(summary.tokens_per_second);
    // The log says how the run ended (under `mpirun --enable-recovery` mpirun exits 0 either
    // way), as an elastic job's does.
    TANDEM_RETURN_IF_ERROR(reporter.Finish(
        summary, {{"event", "finished"},
                  {"iterations", end},
                  {"final_loss", last_loss},
                  {"unix_time", absl::ToUnixMicros(absl::Now()) * 1e-6}}));
  }
  return absl::OkStatus();
}

// Ends the process with one line if MPI's start-up does not finish within `limit` (a rank
// that dies while MPI starts leaves the others waiting inside MPI_Init).
class StartupDeadline {
 public:
  explicit StartupDeadline(absl::Duration limit) {
    thread_ = std::thread([this, limit] {
      std::unique_lock<std::mutex> lock(mu_);
      if (!done_cv_.wait_for(lock, absl::ToChronoSeconds(limit), [this] { return done_; })) {
        // A rank stopped inside MPI's start-up would keep mpirun waiting for ever (under
        // --enable-recovery it ends no rank): the ranks of this host end their stopped
        // siblings. Only under a launcher: a shell's stopped jobs are siblings too.
        std::string killed;
        if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
            std::getenv("PMIX_RANK") != nullptr) {
          const std::vector<int64_t> stopped = runtime::KillStoppedSiblings();
          if (!stopped.empty()) {
            killed = absl::StrCat("; killed the stopped rank process(es) ",
                                  absl::StrJoin(stopped, ", "), " on this host");
          }
        }
        std::fprintf(stderr,
                     "tandem train: error: MPI start-up did not finish within %s (a rank died "
                     "or hangs while the job starts)%s\n",
                     absl::FormatDuration(limit).c_str(), killed.c_str());
        std::fflush(stderr);
        std::_Exit(kExitFailure);
      }
    });
  }
  ~StartupDeadline() { Done(); }
  void Done() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

int RunTrain(const std::vector<std::string>& args) {
  if (!args.empty()) {
    return ReportError("train", absl::InvalidArgumentError(
                                    absl::StrCat("unexpected argument '", args[0], "'")));
  }
  const absl::Duration timeout = absl::Seconds(std::max(1.0, absl::GetFlag(FLAGS_timeout)));
  // MPI's start-up and the split of the start-up watch's communicator: until the watch's
  // heartbeats run, a rank that dies leaves the others inside MPI (neither call returns).
  StartupDeadline deadline(absl::Seconds(std::max(1.0, absl::GetFlag(FLAGS_startup_timeout))));
  auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
  if (!world.ok()) return ReportError("train", world.status());
  (*world)->set_timeout(timeout);
  const int rank = (*world)->rank();
  SetLogRank((*world)->size() > 1 ? rank : -1);
  // Until the engine watches its peers: heartbeats on a duplicate of the world, and a silent
  // rank (died during start-up: model building, planning) ends every other at once.
  std::unique_ptr<comm::Communicator> watch_comm;
  std::unique_ptr<runtime::FailureNotices> startup_watch;
  runtime::FailureNoticeOptions watch_options;
  watch_options.heartbeat_timeout =
      absl::Seconds(std::max(0.0, absl::GetFlag(FLAGS_heartbeat_timeout)));
  if ((*world)->size() > 1 && watch_options.heartbeat_timeout > absl::ZeroDuration()) {
    auto split = (*world)->Split(/*color=*/0, /*key=*/rank);
    if (!split.ok()) return ReportError("train", split.status());
    watch_comm = std::move(split).value();
    auto watch = runtime::FailureNotices::Start(
        *watch_comm, watch_options, [rank](const absl::Status& reason) {
          ReportError(absl::StrCat("train (rank ", rank, ")"),
                      Annotate(reason, "during start-up"));
          std::fflush(stdout);
          std::_Exit(kExitFailure);
        });
    if (!watch.ok()) return ReportError("train", watch.status());
    startup_watch = std::move(watch).value();
  }
  deadline.Done();
  absl::Status status = Train(**world, [&] {
    startup_watch.reset();
    // A peer may still send a failure notice on it: aborted, it is never freed.
    if (watch_comm != nullptr) watch_comm->Abort(absl::CancelledError("start-up watch ended"));
    watch_comm.reset();
  });
  if (status.ok() && ElasticJobLostRanks()) {
    // MPI_Finalize would wait for the dead.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(kExitOk);
  }
  if (status.ok()) return kExitOk;
  // A run that logged ends its log with its failure, one line per failing rank (a log that was
  // never started, e.g. bad input, stays unwritten). An elastic job's ranks log their own.
  const std::string log = absl::GetFlag(FLAGS_log_json);
  if (!absl::GetFlag(FLAGS_elastic) && !log.empty() && log != "-" &&
      std::filesystem::exists(log)) {
    (void)AppendLogEvent(log, {{"event", "failed"},
                               {"rank", rank},
                               {"error", Printable(status.message())}});
  }
  const int code = ReportError(
      (*world)->size() > 1 ? absl::StrCat("train (rank ", rank, ")") : "train", status);
  if ((*world)->size() > 1) {
    // Peers may be gone or stuck: leave without finalising MPI.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  return code;
}

std::vector<std::string> TrainFlags() {
  std::vector<std::string> flags = ModelFlagNames();
  for (const std::string& name : TrainOptionFlagNames()) flags.push_back(name);
  for (const char* name : {"microbatches", "schedule", "stages", "chunks", "waves",
                           "planning_costs", "data_parallel", "plan", "recompute",
                           "schedule_file"}) {
    flags.push_back(name);
  }
  return flags;
}

}  // namespace

CommandInfo TrainCommand() {
  return {
    .name = "train",
    .summary = kTrainSummary,
    .usage = absl::StrCat(
        "mpirun -np N tandem train [--model gpt|NAME] --layers L --hidden H --heads A --seq-len S\n"
        "    [--data SHARDS|FILE [--valid-data ...] [--eval-every N --eval-batches K]]\n"
        "    [--global-batch G] [--microbatches M] [--schedule NAME --stages P\n"
        "    --data-parallel D [--chunks V] [--waves W] | --schedule-file torch.csv\n"
        "    | --plan plan.json] [--steps LAST]\n"
        "    [--seed X] [--optimizer adamw|sgd] [--lr R] [--warmup-steps N] [--decay-steps N]\n"
        "    [--clip-norm C] [--grad-sync allreduce|dear] [--recompute none|all|L,L,...]\n"
        "    [--timeline FILE] [--log-json FILE] [--checkpoint-dir DIR] [--resume DIR\n"
        "    [--reset-optimizer]]\n"
        "    [--device cpu|cuda|cuda:N] [--precision bf16|fp32] [--attention auto|explicit|fused]\n"
        "    [--elastic [--elastic-min-pipelines F+1] [--devices-per-node G]\n"
        "    [--elastic-replace] [--elastic-agreement-timeout SECONDS]]\n\n"
        "Every rank builds the model from --seed and runs its share of the plan: with --plan\n"
        "the given plan (checked against the world size and the model), with --schedule a\n"
        "plan of P stages x D pipelines (the GPT's layers split by its FLOP estimates so that\n"
        "every position, which holds both ends of a V under zb-v and hanayo, gets an even\n"
        "share; a custom model's evenly by count), and with neither rank 0 profiles the model,\n"
        "plans for the world size (AdaPipe: partition and recomputation), prints the plan and\n"
        "broadcasts it. Rank 0 prints a progress line per iteration (loss, time, tokens/s,\n"
        "measured bubble, peak memory: the GPU's peak allocated on CUDA, the host's RSS on the\n"
        "CPU; MFU for known GPUs or --peak-tflops) and a summary. With --device cuda each rank\n"
        "takes a GPU in turn; ranks sharing one communicate over MPI through pinned host\n"
        "memory (NCCL refuses that), otherwise over NCCL. --log-json writes one JSON object per\n"
        "iteration; --timeline writes the last iteration of every rank as a Chrome trace\n"
        "(open in https://ui.perfetto.dev) with the simulator's prediction beside it; on a GPU\n"
        "that iteration waits for the device after each action, so its times are the device's\n"
        "(the summary's mean leaves it out when other iterations were measured).\n"
        "With --elastic (under `mpirun --enable-recovery`) the job survives dead ranks: rank 0\n"
        "profiles the model, every rank builds pipeline templates for every node count, the\n"
        "job starts with --elastic-min-pipelines pipelines and, when ranks die, the survivors\n"
        "agree on who lives, re-form pipelines from the templates, copy the lost layers'\n"
        "parameters and optimizer state from surviving replicas and redo the interrupted\n"
        "iteration. The job also grows while it runs: SIGUSR2 to mpirun (or any rank) starts\n"
        "a node's worth of new ranks (MPI_Comm_spawn) after the next iteration, and with\n"
        "--elastic-replace lost nodes are started anew after a recovery; new ranks receive\n"
        "their layers' state from the ranks that hold them (docs/elastic.md).\n"
        "Iterations count from 1 in the progress line, the JSON log and the checkpoints;\n"
        "--steps is the last one (a resumed run goes on to it). --eval-every N evaluates the\n"
        "validation loss on --eval-batches fixed batches after every N-th iteration and the\n"
        "last (docs/data.md). --schedule-file runs a schedule in torch.distributed.pipelining's\n"
        "CSV format (docs/pipeline.md).\n"
        "Exit codes: 0 done, 1 runtime failure (every rank reports), 2 bad input.",
        ModelsHelp()),
    .flags = TrainFlags(),
    .run = RunTrain};
}

}  // namespace tandem::cli
