// `tandem train --elastic`: the job survives dead ranks (elastic/trainer.h). Rank 0 profiles
// the model; every rank builds the same pipeline templates from that profile for every node
// count; the trainer runs pipelines made from them and re-forms them on the survivors after a
// failure.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "comm/communicator.h"
#include "pipeline/schedule.h"
#include "runtime/engine.h"
#include "runtime/torch/data.h"
#include "runtime/torch/model.h"
#include "runtime/torch/profiler.h"

namespace tandem::cli {

struct ElasticRun {
  comm::Communicator* world = nullptr;
  const runtime::libtorch::LayeredModel* model = nullptr;
  std::shared_ptr<const runtime::libtorch::Dataset> data;
  runtime::libtorch::ProfilerOptions profiler;
  runtime::StageFactory factory;
  runtime::EngineOptions engine;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::k1F1B;
  int64_t microbatch_size = 1;
  int64_t global_batch = 0;  // samples
  int64_t steps = 0;
  int min_pipelines = 2;
  bool replace_lost = false;  // start ranks anew for the nodes lost, after a recovery
  int devices_per_node = 1;  // ranks
  int tensor_parallel = 1;   // ranks per stage, inside a node: the templates' devices are groups
  double device_memory_bytes = 0;  // what the templates must fit per device; 0: no limit
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  absl::Duration agreement_timeout = absl::Seconds(60);  // ElasticOptions::agreement_timeout
  double tokens_per_sample = 0;  // sequence length
  std::string model_text;
  std::string log_json;
  std::string checkpoint_dir;  // job checkpoints; lost layers are restored from them
  int checkpoint_every = 0;
  int keep_checkpoints = 2;
  std::string resume;  // a checkpoint of any partition to start from
  // A Chrome trace of the job written at the end by the reporting rank: every iteration and
  // every recovery's phases (detection, agreement, shrink, re-plan, state copy, engines, first
  // step after) on that rank's clock. Empty: none.
  std::string timeline;
};

// Runs the elastic job to its end on this rank. Collective; survives the death of ranks.
absl::Status RunElasticTraining(const ElasticRun& run, const std::function<void()>& started);

// Whether ranks of this process's elastic job died or were started while it ran. Then
// MPI_Finalize may wait for them for ever (Open MPI 4.1 under --enable-recovery): the process
// should end without it.
bool ElasticJobLostRanks();

// Whether this process was started by a running elastic job to grow it (it joins that job).
bool ElasticJoining();

}  // namespace tandem::cli
