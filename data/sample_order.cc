#include "data/sample_order.h"

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/status.h"

namespace tandem::data {
namespace {

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;
constexpr int64_t kMaxSamplesPerEpoch = int64_t{1} << 62;

// SplitMix64's output function (Steele, Lea, Flood 2014): a fixed bijection of 64-bit values
// with good avalanche, the same on every platform.
uint64_t Mix64(uint64_t value) {
  value += kGoldenGamma;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

}  // namespace

bool LoaderPosition::operator==(const LoaderPosition& other) const {
  return seed == other.seed && epoch == other.epoch && sample_offset == other.sample_offset &&
         samples_per_epoch == other.samples_per_epoch;
}

std::string LoaderPosition::ToString() const {
  return absl::StrCat("epoch ", epoch, ", sample ", sample_offset, " of ", samples_per_epoch,
                      ", seed ", seed);
}

nlohmann::json LoaderPosition::ToJson() const {
  return {{"seed", seed},
          {"epoch", epoch},
          {"sample_offset", sample_offset},
          {"samples_per_epoch", samples_per_epoch}};
}

absl::StatusOr<LoaderPosition> LoaderPosition::FromJson(const nlohmann::json& json,
                                                        absl::string_view where) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected an object"));
  }
  LoaderPosition position;
  const auto seed = json.find("seed");
  if (seed == json.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".seed: missing field"));
  }
  if (seed->is_number_unsigned()) {
    position.seed = seed->get<uint64_t>();
  } else if (seed->is_number_integer() && seed->get<int64_t>() >= 0) {
    position.seed = static_cast<uint64_t>(seed->get<int64_t>());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".seed: expected an integer in [0, 2^64)"));
  }
  TANDEM_ASSIGN_OR_RETURN(position.epoch, GetInt(json, "epoch", where));
  TANDEM_ASSIGN_OR_RETURN(position.sample_offset, GetInt(json, "sample_offset", where));
  TANDEM_ASSIGN_OR_RETURN(position.samples_per_epoch, GetInt(json, "samples_per_epoch", where));
  if (position.epoch < 0 || position.sample_offset < 0 || position.samples_per_epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": epoch, sample_offset and samples_per_epoch must be >= 0"));
  }
  return position;
}

absl::StatusOr<SampleOrder> SampleOrder::Create(const SampleOrderOptions& options) {
  const int64_t samples = options.samples_per_epoch;
  const int64_t batch = options.global_batch_size;
  if (samples < 1 || samples >= kMaxSamplesPerEpoch) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples per epoch must be in [1, 2^62), got ", samples));
  }
  if (batch < 1 || batch > samples) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global batch size must be in [1, samples per epoch ", samples, "], got ", batch));
  }
  if (options.data_parallel_degree < 1 || batch % options.data_parallel_degree != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-parallel degree ", options.data_parallel_degree,
                     " must be at least 1 and divide the global batch size ", batch));
  }
  if (options.replica_index < 0 || options.replica_index >= options.data_parallel_degree) {
    return absl::InvalidArgumentError(absl::StrCat("replica index ", options.replica_index,
                                                   " is outside [0, ", options.data_parallel_degree,
                                                   ")"));
  }
  return SampleOrder(options);
}

SampleOrder::SampleOrder(const SampleOrderOptions& options) : options_(options) {
  while ((uint64_t{1} << (2 * half_bits_)) < static_cast<uint64_t>(options.samples_per_epoch)) {
    ++half_bits_;
  }
}

SampleOrder::EpochKeys SampleOrder::KeysOf(int64_t epoch) const {
  const uint64_t epoch_key = Mix64(Mix64(options_.seed) ^ static_cast<uint64_t>(epoch));
  EpochKeys keys;
  for (int round = 0; round < kRounds; ++round) {
    keys.round_keys[round] = Mix64(epoch_key + static_cast<uint64_t>(round) * kGoldenGamma);
  }
  return keys;
}

int64_t SampleOrder::Permute(const EpochKeys& keys, int64_t index) const {
  if (!options_.shuffle) return index;
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  const uint64_t samples = static_cast<uint64_t>(options_.samples_per_epoch);
  uint64_t value = static_cast<uint64_t>(index);
  // Cycle walking: the network permutes [0, 2^(2h)); applying it again until the value falls
  // inside [0, N) permutes [0, N). 2^(2h) < 4N, so a few steps on average.
  do {
    uint64_t left = value >> half_bits_;
    uint64_t right = value & mask;
    for (int round = 0; round < kRounds; ++round) {
      const uint64_t mixed = left ^ (Mix64(right ^ keys.round_keys[round]) & mask);
      left = right;
      right = mixed;
    }
    value = (left << half_bits_) | right;
  } while (value >= samples);
  return static_cast<int64_t>(value);
}

int64_t SampleOrder::SampleAt(int64_t epoch, int64_t index) const {
  return Permute(KeysOf(epoch), index);
}

LoaderPosition SampleOrder::Start() const {
  LoaderPosition position;
  position.seed = options_.seed;
  position.samples_per_epoch = options_.samples_per_epoch;
  return position;
}

LoaderPosition SampleOrder::Next(const LoaderPosition& position) const {
  LoaderPosition next = position;
  next.sample_offset += options_.global_batch_size;
  if (next.sample_offset + options_.global_batch_size > options_.samples_per_epoch) {
    ++next.epoch;
    next.sample_offset = 0;
  }
  return next;
}

absl::StatusOr<LoaderPosition> SampleOrder::Restore(const LoaderPosition& saved) const {
  if (saved.seed != options_.seed || saved.samples_per_epoch != options_.samples_per_epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("the saved loader position (seed ", saved.seed, ", ", saved.samples_per_epoch,
                     " samples per epoch) belongs to another sample order than this run's (seed ",
                     options_.seed, ", ", options_.samples_per_epoch, " samples per epoch)"));
  }
  if (saved.epoch < 0 || saved.sample_offset < 0 ||
      saved.sample_offset > options_.samples_per_epoch) {
    return absl::InvalidArgumentError(
        absl::StrCat("the saved loader position (", saved.ToString(), ") is outside its epoch"));
  }
  LoaderPosition position = saved;
  if (position.sample_offset + options_.global_batch_size > options_.samples_per_epoch) {
    ++position.epoch;
    position.sample_offset = 0;
  }
  return position;
}

void SampleOrder::Fill(const LoaderPosition& position, int64_t first, int64_t count,
                       int64_t* out) const {
  int64_t epoch = position.epoch;
  int64_t offset = position.sample_offset;
  // A position no order produces reads the next epoch's first batch, as Restore would move
  // it, rather than indices outside [0, N) (which the cycle walk might never leave).
  if (offset < 0 || offset + options_.global_batch_size > options_.samples_per_epoch) {
    ++epoch;
    offset = 0;
  }
  const EpochKeys keys = KeysOf(epoch);
  for (int64_t i = 0; i < count; ++i) out[i] = Permute(keys, offset + first + i);
}

std::vector<int64_t> SampleOrder::ReplicaBatch(const LoaderPosition& position) const {
  std::vector<int64_t> samples(static_cast<size_t>(local_batch_size()));
  Fill(position, options_.replica_index * local_batch_size(), local_batch_size(), samples.data());
  return samples;
}

std::vector<int64_t> SampleOrder::GlobalBatch(const LoaderPosition& position) const {
  std::vector<int64_t> samples(static_cast<size_t>(options_.global_batch_size));
  Fill(position, 0, options_.global_batch_size, samples.data());
  return samples;
}

}  // namespace tandem::data
