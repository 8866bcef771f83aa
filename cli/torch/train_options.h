// `tandem train`'s flags, read once into one structure that the plain run and the elastic job
// share (cli/torch/train_command.cc, cli/torch/elastic_train.cc): the run's length, device and
// arithmetic, the engine's options (optimizer, learning-rate schedule, gradient
// synchronisation, timeouts), outputs, checkpoints and resume, validation, and the elastic
// job's settings. The plan's own flags (--plan, --schedule and its shape, --recompute) are read
// where the plan is made.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipeline/schedule.h"
#include "runtime/engine.h"
#include "runtime/torch/precision.h"

ABSL_DECLARE_FLAG(double, heartbeat_timeout);
ABSL_DECLARE_FLAG(double, startup_timeout);
ABSL_DECLARE_FLAG(double, timeout);
ABSL_DECLARE_FLAG(std::string, log_json);
ABSL_DECLARE_FLAG(bool, elastic);

namespace tandem::cli {

struct ElasticSettings {
  int min_pipelines = 2;        // --elastic-min-pipelines: f + 1 to survive f failures
  bool replace_lost = false;    // --elastic-replace
  absl::Duration agreement_timeout = absl::Seconds(60);
  int devices_per_node = 1;     // ranks (a multiple of the tensor-parallel degree)
  double device_memory_bytes = 0;  // what the templates must fit per device; 0: no limit
  absl::Duration heartbeat_timeout = absl::Seconds(2);
};

struct TrainOptions {
  uint64_t seed = 0;
  int64_t steps = 0;  // the run's last iteration, counted from 1 (a resume goes on to it)
  torch::Device device = torch::kCPU;  // this rank's (cuda: the node's GPUs in turn)
  runtime::libtorch::Precision precision = runtime::libtorch::Precision::kFloat32;
  bool fused_kernels = true;  // --fused-kernels (runtime/torch/fused_ops.h), process-wide
  bool libtorch_device_ops = false;
  double peak_tflops = 0;  // 0: from the table of known GPUs
  runtime::EngineOptions engine;
  int64_t microbatch_size = 1;
  int64_t global_batch = 0;  // samples; 0: the plan's
  int tensor_parallel = 1;   // 0: the planner's choice
  bool sequence_parallel = false;  // --sequence-parallel (a plan may also choose it)
  int expert_parallel = 1;         // --expert-parallel: parts of a group holding the experts
                                   // (0: the planner's choice, resolved from the plan)
  double device_memory_bytes = 0;  // --device-memory-mb per rank; 0: not given
  std::optional<pipeline::ScheduleKind> schedule;  // --schedule, when given

  // Outputs. Every one is checked before the first step (CheckOutputPaths).
  std::string log_json;
  std::string timeline;
  std::string torch_trace;  // this rank's file (FILE.rankN.json beyond one rank)
  std::string checkpoint_dir;
  int checkpoint_every = 0;  // runtime::CheckpointDue

  std::string resume;
  bool reset_data = false;
  bool reset_schedule = false;

  // Validation (runtime::EvaluationDue): every eval_every iterations and after the last,
  // eval_batches batches of the validation data (0: never).
  int eval_every = 0;
  int64_t eval_batches = 0;

  bool elastic = false;
  ElasticSettings elastic_settings;
};

// The flags as TrainOptions for rank `rank` of `world_size` ranks. InvalidArgument naming the
// flag for a bad value or combination; FailedPrecondition for a device that is not there.
absl::StatusOr<TrainOptions> TrainOptionsFromFlags(int rank, int world_size);

// The flags TrainOptionsFromFlags reads, for `tandem train`'s flag list.
std::vector<std::string> TrainOptionFlagNames();

}  // namespace tandem::cli
