// Training data as a pure function, so any rank can produce any micro-batch of any
// data-parallel replica without communication, and the single-process reference sees exactly
// the same samples.
//
// The batch rule. The global batch of iteration i has G samples, numbered 0..G-1. With D
// data-parallel replicas and M micro-batches per replica per iteration, every micro-batch has
// b = G / (D * M) samples, and micro-batch m of replica d holds the samples
//     [ (d * M + m) * b,  (d * M + m + 1) * b ).
// Sample j of iteration i is a pure function of (data set seed, i, j). The reference trainer
// takes samples [0, G) in one batch; summing each micro-batch's mean loss scaled by
// 1 / (D * M) gives the same global-batch mean.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::runtime::libtorch {

// Inputs (for the first layer) and targets (for the loss) of a run of samples; the first
// dimension is the sample. CPU tensors.
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::string name() const = 0;
  // Samples [first, first + count) of the global batch of `iteration`. Deterministic: the same
  // arguments give the same tensors on every rank and in every process.
  virtual absl::StatusOr<Batch> Samples(int64_t iteration, int64_t first,
                                        int64_t count) const = 0;
  // For a data set whose order depends on the global batch G (epochs over a finite corpus):
  // called with G before a training batch is read, from one thread. Default: nothing to do.
  virtual absl::Status SetGlobalBatch(int64_t global_batch) { return absl::OkStatus(); }
  // What a checkpoint records so that a resume on other data is refused; by default the name.
  virtual nlohmann::json Identity() const { return {{"name", name()}}; }
};

struct SampleRange {
  int64_t first = 0;
  int64_t count = 0;
};

// The batch rule above. InvalidArgument when G is not divisible by D * M or an index is out of
// range.
absl::StatusOr<SampleRange> MicrobatchSamples(int64_t global_batch, int data_parallel,
                                              int microbatches, int replica, int microbatch);

// A deterministic 64-bit mix (splitmix64) of the arguments; the data sets' randomness.
uint64_t MixSeed(uint64_t seed, uint64_t iteration, uint64_t sample);

// The embedded synthetic task: arithmetic sequences modulo the vocabulary. Sample j has a
// random start x0 and a random stride k in [1, strides] and tokens x_t = (x0 + t * k) mod vocab
// for t = 0..seq_len; inputs are x_0..x_{S-1}, targets x_1..x_S (next-token prediction). The
// loss falls in two steps a small transformer learns quickly: from ln(vocab) to about
// ln(strides) once it knows which tokens may follow a token (embedding and head alone), then
// towards ln(strides) / seq_len once it attends to the previous token to find the stride
// (x_{t+1} = 2 x_t - x_{t-1} mod vocab).
struct SyntheticTaskOptions {
  int64_t vocab = 16;
  int64_t seq_len = 32;
  uint64_t seed = 0;
  int64_t strides = 3;  // in [1, vocab)
};
absl::StatusOr<std::shared_ptr<Dataset>> MakeSyntheticDataset(const SyntheticTaskOptions& options);

// Byte-level language modelling on a text file (vocabulary 256): sample j of iteration i is
// the window of seq_len + 1 bytes at a random offset chosen by MixSeed(seed, i, j); inputs are
// its first seq_len bytes, targets the last seq_len. NotFound / InvalidArgument name the file
// (missing, or shorter than seq_len + 1 bytes).
absl::StatusOr<std::shared_ptr<Dataset>> MakeByteTextDataset(const std::string& path,
                                                             int64_t seq_len, uint64_t seed);

inline constexpr int64_t kByteVocabulary = 256;

}  // namespace tandem::runtime::libtorch
