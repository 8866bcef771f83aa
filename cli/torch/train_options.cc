#include "cli/torch/train_options.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/torch/model_flags.h"
#include "common/status.h"
#include "runtime/grad_sync.h"
#include "runtime/optimizer.h"
#include "runtime/torch/device_ops.h"
#include "runtime/torch/fused_ops.h"

ABSL_FLAG(int, steps, 10,
          "train: the run's last iteration, counted from 1 (a resumed run goes on to it; the "
          "progress line, the JSON log and the checkpoints count alike)");
ABSL_FLAG(bool, elastic, false,
          "train: survive dead ranks (run under `mpirun --enable-recovery`): pipelines from "
          "templates for every node count, re-formed on the survivors after a failure "
          "(docs/elastic.md); schedules GPipe, 1F1B or ZB-H1, with --tensor-parallel too");
ABSL_FLAG(int, elastic_min_pipelines, 2,
          "train --elastic: pipelines at the start, f + 1 to survive f failures");
ABSL_FLAG(bool, elastic_replace, false,
          "train --elastic: after ranks die, start new ones (MPI_Comm_spawn) for the lost nodes "
          "once the survivors train, back to the job's starting size (SIGUSR2 to the job adds "
          "a node at any time)");
ABSL_FLAG(double, elastic_agreement_timeout, 60,
          "train --elastic: seconds survivors wait for each other after a failure, to agree on "
          "who lives, and inside a call MPI cannot interrupt (building the survivors' "
          "communicator, starting new ranks) before a rank ends with an error instead");
ABSL_FLAG(double, device_memory_mb, 0,
          "train, planned (no --plan, --schedule or --schedule-file) or --elastic: memory per "
          "rank (MiB) that the model's parameters, gradients, optimizer state and stashed "
          "activations must fit; the planner recomputes layers (AdaPipe) and, with "
          "--tensor-parallel 0, weighs sequence parallelism to fit it (0: for a planned run on a "
          "GPU 90% of the rank's share of the device, otherwise no limit)");
ABSL_FLAG(int, devices_per_node, 1,
          "train --elastic: ranks per node (a node that loses a rank is dropped whole; default "
          "1, or --tensor-parallel's T: a tensor-parallel group lives inside a node)");
ABSL_FLAG(std::string, timeline, "",
          "train: write the last iteration's timeline here (Chrome trace, every rank, with the "
          "simulator's prediction beside it; on a GPU the recorded iteration waits for the "
          "device after each action, so its times are the device's, and the summary's mean "
          "leaves it out when other iterations were measured); with --elastic, every "
          "iteration and every recovery's phases");
ABSL_FLAG(std::string, torch_trace, "",
          "train: write LibTorch's profiler trace (operators and, on CUDA, kernels; Chrome "
          "JSON) of the last iteration to this file, one per rank (FILE.rankN.json beyond one "
          "rank); LibTorch 2 or later");
ABSL_FLAG(std::string, log_json, "",
          "train: write one JSON object per iteration here (iteration, loss, tokens_per_second, "
          "iteration_ms, ...), events ({\"event\": \"validation\"|\"checkpoint\"|...}) and "
          "how the run ended ({\"event\": \"finished\"}, or {\"event\": \"failed\"} from each "
          "failing rank)");
ABSL_FLAG(double, lr, 1e-3, "train: base learning rate");
ABSL_FLAG(int, warmup_steps, 0, "train: linear learning-rate warm-up steps");
ABSL_FLAG(int, decay_steps, 0,
          "train: step at which the cosine decay reaches --min-lr (0: no decay)");
ABSL_FLAG(double, min_lr, 0, "train: learning rate at the end of the decay");
ABSL_FLAG(double, momentum, 0.9, "train: SGD momentum");
ABSL_FLAG(double, weight_decay, 0, "train: weight decay (SGD: L2; AdamW: decoupled)");
ABSL_FLAG(double, clip_norm, 0, "train: clip the global gradient norm to this (0: off)");
ABSL_FLAG(std::string, grad_sync, "allreduce",
          "train: gradient synchronisation: allreduce (bucketed) or dear (decoupled)");
ABSL_FLAG(double, bucket_mb, 25, "train: gradient bucket size in MiB");
ABSL_FLAG(std::string, grad_comm, "fp32",
          "train: the type gradients are communicated in between data-parallel replicas: fp32, "
          "or bf16 (half the bytes; summed in bfloat16, averaged and applied in float32)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "train: write checkpoints into this folder (one step-NNNNNNNN folder per save, "
          "`latest` naming the newest complete one)");
ABSL_FLAG(int, checkpoint_every, 0, "train: checkpoint every N iterations (0: at the end only)");
ABSL_FLAG(int, keep_checkpoints, 2,
          "train: step folders kept in --checkpoint-dir, the newest (0: keep all)");
ABSL_FLAG(std::string, resume, "",
          "train: resume from this checkpoint folder (its latest step, or a step folder)");
ABSL_FLAG(bool, reset_optimizer, false,
          "train: with --resume, start the optimizer afresh from the saved parameters (a "
          "checkpoint whose optimizer state is missing is refused without it)");
ABSL_FLAG(bool, reset_data, false,
          "train: with --resume, accept a checkpoint trained on other data or another global "
          "batch (the data order then starts from the resumed iteration of the new data)");
ABSL_FLAG(bool, reset_schedule, false,
          "train: with --resume, accept a checkpoint trained with another learning-rate "
          "schedule (the new flags' schedule, at the resumed iteration)");
ABSL_FLAG(double, timeout, 300, "train: seconds any wait may take before it is an error");
ABSL_FLAG(double, heartbeat_timeout, 2,
          "train: seconds of silence (no heartbeat: the rank was killed or stopped) after which "
          "a rank counts as failed; a silent rank on the same host is then killed so the job "
          "ends (0: off, e.g. to stop a rank in a debugger)");
ABSL_FLAG(double, startup_timeout, 60,
          "train: seconds MPI's start-up may take (a rank that dies while MPI starts leaves the "
          "others inside MPI_Init or the first split; after them, heartbeats notice a dead rank "
          "within 2 s)");
ABSL_FLAG(std::string, precision, "",
          "train: arithmetic of the forward computation: bf16 (autocast; float32 master "
          "weights, gradients and loss) or fp32 (default: bf16 on CUDA, fp32 on the CPU)");
ABSL_FLAG(std::string, fused_kernels, "on",
          "train: on: the language models' fused CUDA kernels where this build has them (the "
          "token cross-entropy over bf16 logits in two passes, the LM head's products padded "
          "to a multiple of 64 words, the residual add with the layer norm after it); off: "
          "LibTorch's operations, as on the CPU (for comparisons). No effect on the CPU");
ABSL_FLAG(bool, libtorch_device_ops, false,
          "train: CPU stages run gradient averaging and the optimizer as LibTorch tensor "
          "operations, as CUDA stages always do (default: the runtime's vectorised loops)");
ABSL_FLAG(double, peak_tflops, 0,
          "train: the device's peak TFLOP/s for the MFU figure (0: from a table of known GPUs "
          "for the precision; no MFU on the CPU)");
ABSL_FLAG(int, global_batch, 0,
          "train: samples per iteration over all replicas, G (0: microbatch-size x "
          "micro-batches x data-parallel, or the plan's)");
ABSL_FLAG(int, tensor_parallel, 1,
          "train: tensor-parallel degree T inside every stage (Megatron-style sharding of the "
          "GPT, T consecutive ranks per pipeline position; world = D x stages x T): with "
          "--schedule, with --elastic, or planned (the planner partitions over world / T "
          "groups); 0 (without --schedule): the shards are profiled at T = 2, 4, 8 and the "
          "planner chooses T with the partition. profile: also measure the shards of T ranks "
          "(0: of 2, 4 and 8 ranks) and write them as the layers' tensor-parallel variants");
ABSL_FLAG(bool, sequence_parallel, false,
          "train: with --tensor-parallel T, split the activations outside the split matrix "
          "products along the sequence (Megatron-LM's sequence parallelism: layer norms, "
          "residuals and pipeline transfers on S/T tokens per rank; S must divide by T)");
ABSL_FLAG(int, expert_parallel_replicas, 1,
          "train: spread a mixture's experts over E data-parallel replicas as well (Megatron-LM's "
          "expert parallelism over data-parallel ranks, with its all-to-all token dispatcher): "
          "every E consecutive replicas hold one copy of the experts, 1/E each, and send each "
          "routed token to the replica holding its expert and back; the experts' gradients are "
          "synchronised over the replicas holding the same experts. E must divide the "
          "data-parallel degree and the experts (of each part, with --expert-parallel); not "
          "with --elastic. 1: every replica holds every expert");
ABSL_FLAG(int, expert_parallel, 1,
          "train: with --tensor-parallel T, a mixture of experts places its experts whole on N "
          "parts of each tensor-parallel group, T/N ranks each, which split their experts' "
          "units (Megatron-LM's expert parallelism with its all-gather dispatcher, expert "
          "tensor parallelism T/N); N must divide T and the experts; 1: every expert split "
          "over the T ranks; 0 (a planned run: no --plan, --schedule or --elastic): the shards "
          "are profiled with the experts on every N that divides T and the experts, and the "
          "planner chooses N with T and the partition. profile: the experts' placements to "
          "measure with --tensor-parallel (0: every N)");
ABSL_FLAG(int, eval_every, 0,
          "train: every N iterations (and after the last) evaluate the validation loss on "
          "--eval-batches batches of --valid-data (0: never)");
ABSL_FLAG(int, eval_batches, 4,
          "train: validation batches per evaluation (each of the global batch's size; the "
          "same batches every time)");

namespace tandem::cli {
namespace {

constexpr double kBytesPerMiB = 1 << 20;

absl::StatusOr<runtime::OptimizerConfig> OptimizerFromFlags() {
  TANDEM_ASSIGN_OR_RETURN(runtime::OptimizerKind kind,
                          runtime::ParseOptimizerKind(absl::GetFlag(FLAGS_optimizer)));
  const double weight_decay = absl::GetFlag(FLAGS_weight_decay);
  runtime::OptimizerConfig config =
      kind == runtime::OptimizerKind::kAdamW
          ? runtime::OptimizerConfig::AdamW(weight_decay)
          : runtime::OptimizerConfig::Sgd(absl::GetFlag(FLAGS_momentum), weight_decay);
  TANDEM_RETURN_IF_ERROR(runtime::ValidateOptimizerConfig(config));
  return config;
}

absl::StatusOr<runtime::EngineOptions> EngineOptionsFromFlags() {
  runtime::EngineOptions options;
  TANDEM_ASSIGN_OR_RETURN(options.optimizer, OptimizerFromFlags());
  auto sync = runtime::ParseGradSyncStrategy(absl::GetFlag(FLAGS_grad_sync));
  if (!sync.ok()) return Annotate(sync.status(), "--grad-sync");
  options.grad_sync = *sync;
  options.reset_optimizer = absl::GetFlag(FLAGS_reset_optimizer);
  for (const auto& [name, set] :
       {std::pair<const char*, bool>{"--reset-optimizer", options.reset_optimizer},
        {"--reset-data", absl::GetFlag(FLAGS_reset_data)},
        {"--reset-schedule", absl::GetFlag(FLAGS_reset_schedule)}}) {
    if (set && absl::GetFlag(FLAGS_resume).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " applies to --resume; there is none"));
    }
  }
  if (options.reset_optimizer && absl::GetFlag(FLAGS_elastic)) {
    return absl::InvalidArgumentError(
        "--reset-optimizer is for plain runs: an elastic job's checkpoints also restore lost "
        "layers, whose optimizer state must stay; resume once without --elastic");
  }
  options.expert_replicas = absl::GetFlag(FLAGS_expert_parallel_replicas);
  if (options.expert_replicas < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-parallel-replicas must be at least 1, not ", options.expert_replicas));
  }
  if (options.expert_replicas > 1 && absl::GetFlag(FLAGS_elastic)) {
    return absl::InvalidArgumentError(
        "--expert-parallel-replicas does not go with --elastic: an elastic job's pipelines "
        "change shape and count, and each must hold every expert");
  }
  const std::string grad_comm = absl::GetFlag(FLAGS_grad_comm);
  if (grad_comm == "bf16") {
    options.gradient_communication = comm::DataType::kBFloat16;
  } else if (grad_comm != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--grad-comm: '", grad_comm, "' is not fp32 or bf16"));
  }
  const double bucket_mb = absl::GetFlag(FLAGS_bucket_mb);
  const double lr = absl::GetFlag(FLAGS_lr);
  const double clip = absl::GetFlag(FLAGS_clip_norm);
  const double timeout = absl::GetFlag(FLAGS_timeout);
  if (!(bucket_mb > 0) || !(lr >= 0) || !(clip >= 0) || !(timeout > 0) ||
      absl::GetFlag(FLAGS_warmup_steps) < 0 || absl::GetFlag(FLAGS_decay_steps) < 0) {
    return absl::InvalidArgumentError(
        "--bucket-mb and --timeout must be positive; --lr, --clip-norm, --warmup-steps and "
        "--decay-steps must not be negative");
  }
  options.bucket_bytes = static_cast<int64_t>(bucket_mb * kBytesPerMiB);
  options.lr_schedule.base_lr = lr;
  options.lr_schedule.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  options.lr_schedule.decay_end_step = absl::GetFlag(FLAGS_decay_steps);
  options.lr_schedule.min_lr = absl::GetFlag(FLAGS_min_lr);
  options.clip_norm = clip;
  options.timeout = absl::Seconds(timeout);
  if (absl::GetFlag(FLAGS_keep_checkpoints) < 0) {
    return absl::InvalidArgumentError("--keep-checkpoints must not be negative");
  }
  options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  const double heartbeat = absl::GetFlag(FLAGS_heartbeat_timeout);
  if (!(heartbeat >= 0)) {
    return absl::InvalidArgumentError("--heartbeat-timeout must not be negative");
  }
  options.heartbeat_timeout = absl::Seconds(heartbeat);
  return options;
}

// --device-memory-mb in bytes (0: not given).
double DeviceMemoryFlagBytes() {
  return std::max(0.0, absl::GetFlag(FLAGS_device_memory_mb)) * kBytesPerMiB;
}

absl::StatusOr<ElasticSettings> ElasticSettingsFromFlags(int tensor_parallel) {
  ElasticSettings e;
  e.min_pipelines = absl::GetFlag(FLAGS_elastic_min_pipelines);
  if (e.min_pipelines < 1) {
    return absl::InvalidArgumentError("--elastic-min-pipelines must be at least 1");
  }
  e.replace_lost = absl::GetFlag(FLAGS_elastic_replace);
  const double agreement = absl::GetFlag(FLAGS_elastic_agreement_timeout);
  if (!(agreement > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--elastic-agreement-timeout must be a positive number of seconds, got ", agreement));
  }
  e.agreement_timeout = absl::Seconds(agreement);
  e.devices_per_node = std::max(1, absl::GetFlag(FLAGS_devices_per_node));
  if (tensor_parallel > 1 && e.devices_per_node == 1) e.devices_per_node = tensor_parallel;
  if (tensor_parallel > 0 && e.devices_per_node % tensor_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--devices-per-node ", e.devices_per_node, " is not a multiple of --tensor-parallel ",
        tensor_parallel, " (a tensor-parallel group lives inside one node)"));
  }
  e.device_memory_bytes = DeviceMemoryFlagBytes();
  e.heartbeat_timeout = absl::Seconds(std::max(0.1, absl::GetFlag(FLAGS_heartbeat_timeout)));
  return e;
}

// Flags that do something only beside another setting, given without it: refused, since
// otherwise nothing happens and nothing says so (--checkpoint-every without a folder writes no
// checkpoint; --valid-data without --eval-every is never evaluated).
absl::Status CheckFlagsThatNeedOthers() {
  struct Need {
    const char* flag;  // as ABSL_FLAG names it
    bool met;          // whether what it applies to is there
    std::string what;  // what it applies to, and how this run stands
  };
  const std::string optimizer = absl::GetFlag(FLAGS_optimizer);
  const int decay_steps = absl::GetFlag(FLAGS_decay_steps);
  const int warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  const bool decays = decay_steps > warmup_steps;
  const bool checkpoints = !absl::GetFlag(FLAGS_checkpoint_dir).empty();
  const bool evaluates = absl::GetFlag(FLAGS_eval_every) > 0;
  const bool elastic = absl::GetFlag(FLAGS_elastic);
  const Need needs[] = {
      // (an unknown optimizer is named as such further on)
      {"momentum", optimizer != "adamw", "--optimizer sgd (this run's is adamw)"},
      {"min_lr", decays, "a cosine decay (--decay-steps past --warmup-steps); there is none"},
      {"checkpoint_every", checkpoints, "--checkpoint-dir; there is none"},
      {"keep_checkpoints", checkpoints, "--checkpoint-dir; there is none"},
      {"eval_batches", evaluates, "--eval-every N; there is none"},
      {"valid_data", evaluates, "--eval-every N, which evaluates it; there is none"},
      {"elastic_min_pipelines", elastic, "--elastic; this run is not elastic"},
      {"elastic_replace", elastic, "--elastic; this run is not elastic"},
      {"elastic_agreement_timeout", elastic, "--elastic; this run is not elastic"},
      {"devices_per_node", elastic, "--elastic; this run is not elastic"},
      // (--device-memory-mb also applies to a planned run: checked where the plan is made)
  };
  for (const Need& need : needs) {
    if (need.met || !FlagGivenOnCommandLine(need.flag)) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(CommandLineFlag(need.flag), " applies to ", need.what));
  }
  if (decay_steps > 0 && !decays) {
    return absl::InvalidArgumentError(
        absl::StrCat("--decay-steps ", decay_steps,
                     " is the step at which the cosine decay ends, counted "
                     "from the first (warm-up included): it must exceed --warmup-steps ",
                     warmup_steps, ", or be 0 for no decay"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainOptions> TrainOptionsFromFlags(int rank, int world_size) {
  TANDEM_RETURN_IF_ERROR(CheckFlagsThatNeedOthers());
  TrainOptions o;
  o.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  o.steps = absl::GetFlag(FLAGS_steps);
  if (o.steps < 0) return absl::InvalidArgumentError("--steps must not be negative");
  TANDEM_ASSIGN_OR_RETURN(o.engine, EngineOptionsFromFlags());
  TANDEM_ASSIGN_OR_RETURN(o.device, DeviceFromFlags());
  if (o.device.is_cuda() && absl::GetFlag(FLAGS_device) == "cuda") {
    // One device per rank: ranks on a node take the node's devices in turn (several ranks
    // share one when there are fewer devices than ranks).
    const int devices = static_cast<int>(torch::cuda::device_count());
    o.device = torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(rank % devices));
  }
  o.precision = runtime::libtorch::DefaultPrecision(o.device);
  if (!absl::GetFlag(FLAGS_precision).empty()) {
    auto parsed = runtime::libtorch::ParsePrecision(absl::GetFlag(FLAGS_precision));
    if (!parsed.ok()) return Annotate(parsed.status(), "--precision");
    o.precision = *parsed;
  }
  const std::string fused = absl::GetFlag(FLAGS_fused_kernels);
  if (fused != "on" && fused != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--fused-kernels: '", fused, "' is neither on nor off"));
  }
  o.fused_kernels = fused == "on";
  runtime::libtorch::SetFusedKernelsEnabled(o.fused_kernels);
  o.libtorch_device_ops = absl::GetFlag(FLAGS_libtorch_device_ops);
  o.peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  if (o.peak_tflops < 0) return absl::InvalidArgumentError("--peak-tflops must not be negative");
  o.microbatch_size = absl::GetFlag(FLAGS_microbatch_size);
  o.global_batch = absl::GetFlag(FLAGS_global_batch);
  if (o.global_batch < 0) return absl::InvalidArgumentError("--global-batch must not be negative");
  o.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  o.sequence_parallel = absl::GetFlag(FLAGS_sequence_parallel);
  o.expert_parallel = absl::GetFlag(FLAGS_expert_parallel);
  if (o.expert_parallel < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--expert-parallel must be at least 1, or 0 for the planner's choice, not ",
                     o.expert_parallel));
  }
  if (!absl::GetFlag(FLAGS_schedule).empty()) {
    TANDEM_ASSIGN_OR_RETURN(o.schedule, pipeline::ParseScheduleKind(absl::GetFlag(FLAGS_schedule)));
  }

  o.log_json = absl::GetFlag(FLAGS_log_json);
  o.timeline = absl::GetFlag(FLAGS_timeline);
  o.torch_trace = absl::GetFlag(FLAGS_torch_trace);
  if (!o.torch_trace.empty() && !runtime::libtorch::HasTorchTrace()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--torch-trace needs LibTorch 2 or later (its Kineto profiler); this build has ",
        TORCH_VERSION));
  }
  if (!o.torch_trace.empty() && world_size > 1) {
    // FILE.rankN.json beyond one rank (a ".json" ending moved after the rank).
    std::string stem = o.torch_trace;
    if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".json") == 0) stem.resize(stem.size() - 5);
    o.torch_trace = absl::StrCat(stem, ".rank", rank, ".json");
  }
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  if (o.checkpoint_every < 0) {
    return absl::InvalidArgumentError("--checkpoint-every must not be negative");
  }
  o.resume = absl::GetFlag(FLAGS_resume);
  o.reset_data = absl::GetFlag(FLAGS_reset_data);
  o.reset_schedule = absl::GetFlag(FLAGS_reset_schedule);

  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.eval_batches = absl::GetFlag(FLAGS_eval_batches);
  if (o.eval_every < 0 || o.eval_batches < 1) {
    return absl::InvalidArgumentError(
        "--eval-every must not be negative and --eval-batches must be at least 1");
  }

  const double memory_mb = absl::GetFlag(FLAGS_device_memory_mb);
  if (!(memory_mb >= 0) || !std::isfinite(memory_mb)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device-memory-mb must be a non-negative number of MiB (0: the default), got ",
        memory_mb));
  }
  o.device_memory_bytes = DeviceMemoryFlagBytes();
  o.elastic = absl::GetFlag(FLAGS_elastic);
  if (o.elastic) {
    TANDEM_ASSIGN_OR_RETURN(o.elastic_settings, ElasticSettingsFromFlags(o.tensor_parallel));
  }
  return o;
}

std::vector<std::string> TrainOptionFlagNames() {
  return {"steps", "seed", "device", "precision", "fused_kernels", "libtorch_device_ops",
          "peak_tflops",
          "optimizer", "lr", "warmup_steps", "decay_steps", "min_lr", "momentum",
          "weight_decay", "clip_norm", "grad_sync", "grad_comm", "bucket_mb",
          "microbatch_size", "global_batch", "tensor_parallel", "sequence_parallel",
          "expert_parallel", "expert_parallel_replicas", "log_json", "timeline", "torch_trace",
          "checkpoint_dir", "checkpoint_every", "keep_checkpoints", "resume", "reset_optimizer", "reset_data",
          "reset_schedule", "eval_every", "eval_batches", "elastic", "elastic_min_pipelines",
          "elastic_replace", "elastic_agreement_timeout", "devices_per_node", "device_memory_mb",
          "timeout", "startup_timeout", "heartbeat_timeout"};
}

}  // namespace tandem::cli
