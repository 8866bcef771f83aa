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
#include "cli/torch/train_options.h"
#include "comm/communicator.h"
#include "pipeline/schedule.h"
#include "runtime/engine.h"
#include "runtime/torch/data.h"
#include "runtime/torch/model.h"
#include "runtime/torch/profiler.h"

namespace tandem::cli {

struct ElasticRun {
  // The run's settings: steps, engine options, micro-batch and global batch, schedule, tensor
  // parallelism, outputs, checkpoints, resume, validation and the elastic settings.
  TrainOptions options;
  comm::Communicator* world = nullptr;
  const runtime::libtorch::LayeredModel* model = nullptr;
  std::shared_ptr<const runtime::libtorch::Dataset> data;
  runtime::libtorch::ProfilerOptions profiler;
  runtime::StageFactory factory;
  double tokens_per_sample = 0;  // sequence length
  std::string model_text;
};

// Runs the elastic job to its end on this rank. Collective; survives the death of ranks.
absl::Status RunElasticTraining(const ElasticRun& run, const std::function<void()>& started);

// Whether ranks of this process's elastic job died or were started while it ran. Then
// MPI_Finalize may wait for them for ever (Open MPI 4.1 under --enable-recovery): the process
// should end without it.
bool ElasticJobLostRanks();

// Catches SIGUSR1 (stop with a checkpoint) and SIGUSR2 (grow by a node) for the elastic job.
// Called as early as the command line says --elastic: a scheduler's request that arrives
// while the job starts is kept for when it runs (their default action would end the rank).
void CatchElasticSignals();

// Whether this process was started by a running elastic job to grow it (it joins that job).
bool ElasticJoining();

}  // namespace tandem::cli
