// What the example programs share: their data set, y = sin(3 x0) + x1 x2 for x uniform in
// [-1, 1]^4 (sample j of iteration i comes from a generator seeded by MixSeed(seed, i, j), so
// every rank can make any micro-batch on its own: runtime/torch/data.h), and their error
// handling.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>

#include "runtime/engine.h"
#include "runtime/torch/data.h"
#include "runtime/torch/model.h"
#include "runtime/torch/reference.h"

class CurveData final : public tandem::runtime::libtorch::Dataset {
 public:
  static constexpr int kInputs = 4;

  std::string name() const override { return "curve"; }
  absl::StatusOr<tandem::runtime::libtorch::Batch> Samples(int64_t iteration, int64_t first,
                                                           int64_t count) const override {
    tandem::runtime::libtorch::Batch batch{torch::empty({count, kInputs}),
                                           torch::empty({count, 1})};
    for (int64_t i = 0; i < count; ++i) {
      std::mt19937_64 random(tandem::runtime::libtorch::MixSeed(/*seed=*/42, iteration, first + i));
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      float* x = batch.inputs[i].data_ptr<float>();
      for (int k = 0; k < kInputs; ++k) x[k] = uniform(random);
      batch.targets.data_ptr<float>()[i] = std::sin(3 * x[0]) + x[1] * x[2];
    }
    return batch;
  }
};

template <typename T>  // example-level error handling: print the status and exit
T OrExit(absl::StatusOr<T> value) {
  if (!value.ok()) std::fprintf(stderr, "%s\n", value.status().ToString().c_str()), std::exit(1);
  return *std::move(value);
}

// The oracle: trains the same model, data and optimizer (AdamW, `options`' learning rates) in
// one process with torch::optim and runs `steps` iterations of `engine` beside it. Rank 0
// prints some steps (each line ending in `label`). Returns the exit code: 0 if every loss is
// within 1e-5 relative of the reference's and the reference's loss halves, else 1.
inline int TrainBesideTheReference(tandem::runtime::Engine& engine,
                                   const tandem::runtime::libtorch::LayeredModel& model,
                                   const tandem::runtime::libtorch::Dataset& data,
                                   int64_t global_batch,
                                   const tandem::runtime::EngineOptions& options, int steps,
                                   int rank, const std::string& label) {
  namespace libtorch = tandem::runtime::libtorch;
  libtorch::ReferenceOptions reference_options;
  reference_options.global_batch = global_batch;
  reference_options.steps = steps;
  reference_options.optimizer.kind = libtorch::OptimizerKind::kAdamW;
  reference_options.lr = options.lr_schedule;
  auto reference = OrExit(libtorch::TrainReference(model, data, reference_options));
  double worst = 0;  // largest relative loss difference from the reference
  for (int step = 0; step < steps; ++step) {
    auto result = OrExit(engine.RunIteration());
    worst = std::max(worst, std::abs(result.loss / reference.losses[step] - 1));
    if (rank == 0 && (step % 20 == 0 || step == steps - 1)) {
      std::printf("step %3d  loss %.6f  reference %.6f  (%s)\n", step, result.loss,
                  reference.losses[step], label.c_str());
    }
  }
  if (rank == 0) std::printf("largest relative difference: %.2e\n", worst);
  return worst < 1e-5 && reference.losses.back() < 0.5 * reference.losses.front() ? 0 : 1;
}
