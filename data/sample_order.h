// The order in which a data loader reads samples, and the position a checkpoint saves: pure
// arithmetic on sample indices (data/sample_windows.h turns an index into tokens).
//
// Each epoch reads a permutation of the samples [0, N), a new one every epoch, derived from
// (seed, epoch) alone. Global batch b of an epoch is positions [b * G, (b + 1) * G) of that
// permutation (G the global batch size); the last N mod G positions of each epoch are not read
// (they are other samples every epoch). Data-parallel replica r of D reads the r-th of the D
// equal consecutive parts of each global batch: the union over replicas, in replica order, is
// the global batch whatever D is, so a run resumed with another data-parallel degree reads
// exactly the samples an uninterrupted run would.
//
// The permutation is a keyed bijection computed position by position (a six-round Feistel
// network over SplitMix64, cycle-walked onto [0, N)): no table, the same numbers on every
// platform and compiler (no std::shuffle or std::uniform_int_distribution, whose results the
// standard leaves to each library), and the sample at any position costs a few hashes, so a
// resume jumps straight to its position. It is a pseudo-random permutation, not a uniform
// draw among all N! orders: plenty for shuffling training data.
//
// Thread safety: immutable; every method may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::data {

// Where a loader stands: the next global batch to read is positions
// [sample_offset, sample_offset + G) of epoch `epoch`'s order. Saved with a checkpoint.
struct LoaderPosition {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t sample_offset = 0;      // positions of this epoch's order already read (all replicas)
  int64_t samples_per_epoch = 0;  // N of the order, checked when the position is restored

  bool operator==(const LoaderPosition& other) const;
  bool operator!=(const LoaderPosition& other) const { return !(*this == other); }
  // "epoch 3, sample 4096 of 100000, seed 1234"
  std::string ToString() const;
  // {"seed": 1234, "epoch": 3, "sample_offset": 4096, "samples_per_epoch": 100000}; the seed
  // is an unsigned JSON integer.
  nlohmann::json ToJson() const;
  // The inverse of ToJson. InvalidArgument names `where` and the field.
  static absl::StatusOr<LoaderPosition> FromJson(const nlohmann::json& json,
                                                 absl::string_view where);
};

struct SampleOrderOptions {
  uint64_t seed = 0;
  int64_t samples_per_epoch = 0;  // N, e.g. SampleWindows::num_samples()
  int64_t global_batch_size = 1;  // G samples a step, all replicas together
  int data_parallel_degree = 1;   // D; must divide G
  int replica_index = 0;          // this replica, 0 <= r < D
  bool shuffle = true;            // false: data-set order every epoch (evaluation)
};

class SampleOrder {
 public:
  // InvalidArgument unless 1 <= G <= N < 2^62, D >= 1 divides G, and 0 <= r < D.
  static absl::StatusOr<SampleOrder> Create(const SampleOrderOptions& options);

  const SampleOrderOptions& options() const { return options_; }
  int64_t steps_per_epoch() const {
    return options_.samples_per_epoch / options_.global_batch_size;
  }
  int64_t local_batch_size() const {
    return options_.global_batch_size / options_.data_parallel_degree;
  }

  // The sample read at position `index` (0 <= index < N) of epoch `epoch`'s order.
  int64_t SampleAt(int64_t epoch, int64_t index) const;

  // The first position of a run: epoch 0, nothing read.
  LoaderPosition Start() const;
  // The position after reading the global batch at `position`: the next batch of the epoch,
  // or the start of the next epoch when fewer than G positions are left.
  LoaderPosition Next(const LoaderPosition& position) const;
  // Checks a position read from a checkpoint against this order: FailedPrecondition when its
  // seed or samples per epoch differ (naming both), InvalidArgument when it is outside the
  // epoch. Returns it moved to the next epoch when fewer than G positions of its epoch are
  // left (a resume with a larger global batch).
  absl::StatusOr<LoaderPosition> Restore(const LoaderPosition& saved) const;

  // This replica's samples of the global batch at `position` (local_batch_size() of them):
  // positions [offset + r * G / D, offset + (r + 1) * G / D) of the epoch's order.
  // `position` should be one this order produced (Start, Next, Restore); one past its
  // epoch's last full batch reads the next epoch's first.
  std::vector<int64_t> ReplicaBatch(const LoaderPosition& position) const;
  // The whole global batch at `position`, all replicas in replica order.
  std::vector<int64_t> GlobalBatch(const LoaderPosition& position) const;

 private:
  static constexpr int kRounds = 6;
  struct EpochKeys {
    std::array<uint64_t, kRounds> round_keys;
  };

  explicit SampleOrder(const SampleOrderOptions& options);
  EpochKeys KeysOf(int64_t epoch) const;
  int64_t Permute(const EpochKeys& keys, int64_t index) const;
  void Fill(const LoaderPosition& position, int64_t first, int64_t count, int64_t* out) const;

  SampleOrderOptions options_;
  int half_bits_ = 1;  // the Feistel network permutes [0, 2^(2 * half_bits_)) >= N
};

}  // namespace tandem::data
