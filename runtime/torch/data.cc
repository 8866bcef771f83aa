#include "runtime/torch/data.h"

#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"

namespace tandem::runtime::libtorch {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

absl::Status CheckSampleRange(const std::string& name, int64_t iteration, int64_t first,
                              int64_t count) {
  if (iteration < 0 || first < 0 || count <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": bad sample request (iteration ",
                                                   iteration, ", samples [", first, ", +",
                                                   count, "))"));
  }
  return absl::OkStatus();
}

// Copies a [count, seq_len] token table into int64 input and target tensors.
Batch TokensToBatch(const std::vector<int64_t>& inputs, const std::vector<int64_t>& targets,
                    int64_t count, int64_t seq_len) {
  const auto options = at::TensorOptions().dtype(at::kLong);
  Batch batch;
  batch.inputs = at::empty({count, seq_len}, options);
  batch.targets = at::empty({count, seq_len}, options);
  std::copy(inputs.begin(), inputs.end(), batch.inputs.data_ptr<int64_t>());
  std::copy(targets.begin(), targets.end(), batch.targets.data_ptr<int64_t>());
  return batch;
}

class SyntheticDataset final : public Dataset {
 public:
  explicit SyntheticDataset(SyntheticTaskOptions options) : options_(options) {}

  std::string name() const override {
    return absl::StrCat("synthetic arithmetic sequences (vocab ", options_.vocab, ", strides ",
                        options_.strides, ", length ", options_.seq_len, ")");
  }

  absl::StatusOr<Batch> Samples(int64_t iteration, int64_t first,
                                int64_t count) const override {
    if (absl::Status ok = CheckSampleRange(name(), iteration, first, count); !ok.ok()) return ok;
    const int64_t length = options_.seq_len;
    const int64_t vocab = options_.vocab;
    std::vector<int64_t> inputs(count * length), targets(count * length);
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t random = MixSeed(options_.seed, iteration, first + i);
      const int64_t start = static_cast<int64_t>(random % vocab);
      const int64_t stride = 1 + static_cast<int64_t>((random >> 32) % options_.strides);
      for (int64_t t = 0; t < length; ++t) {
        inputs[i * length + t] = (start + t * stride) % vocab;
        targets[i * length + t] = (start + (t + 1) * stride) % vocab;
      }
    }
    return TokensToBatch(inputs, targets, count, length);
  }

 private:
  SyntheticTaskOptions options_;
};

class ByteTextDataset final : public Dataset {
 public:
  ByteTextDataset(std::string path, std::string bytes, int64_t seq_len, uint64_t seed)
      : path_(std::move(path)), bytes_(std::move(bytes)), seq_len_(seq_len), seed_(seed) {}

  std::string name() const override {
    return absl::StrCat("bytes of ", path_, " (", bytes_.size(), " bytes, length ", seq_len_,
                        ")");
  }

  absl::StatusOr<Batch> Samples(int64_t iteration, int64_t first,
                                int64_t count) const override {
    if (absl::Status ok = CheckSampleRange(name(), iteration, first, count); !ok.ok()) return ok;
    const uint64_t offsets = bytes_.size() - static_cast<uint64_t>(seq_len_);  // >= 1
    std::vector<int64_t> inputs(count * seq_len_), targets(count * seq_len_);
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t offset = MixSeed(seed_, iteration, first + i) % offsets;
      for (int64_t t = 0; t < seq_len_; ++t) {
        inputs[i * seq_len_ + t] = static_cast<unsigned char>(bytes_[offset + t]);
        targets[i * seq_len_ + t] = static_cast<unsigned char>(bytes_[offset + t + 1]);
      }
    }
    return TokensToBatch(inputs, targets, count, seq_len_);
  }

 private:
  std::string path_;
  std::string bytes_;
  int64_t seq_len_;
  uint64_t seed_;
};

}  // namespace

uint64_t MixSeed(uint64_t seed, uint64_t iteration, uint64_t sample) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ iteration) ^ sample);
}

absl::StatusOr<SampleRange> MicrobatchSamples(int64_t global_batch, int data_parallel,
                                              int microbatches, int replica, int microbatch) {
  if (data_parallel <= 0 || microbatches <= 0 || global_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch rule: global batch ", global_batch, ", data-parallel ", data_parallel,
                     " and micro-batches ", microbatches, " must be positive"));
  }
  const int64_t slices = static_cast<int64_t>(data_parallel) * microbatches;
  if (global_batch % slices != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch rule: global batch ", global_batch, " is not divisible by data-parallel ",
        data_parallel, " x micro-batches ", microbatches));
  }
  if (replica < 0 || replica >= data_parallel || microbatch < 0 || microbatch >= microbatches) {
    return absl::InvalidArgumentError(absl::StrCat("batch rule: replica ", replica,
                                                   " / micro-batch ", microbatch,
                                                   " out of range (", data_parallel, " x ",
                                                   microbatches, ")"));
  }
  const int64_t size = global_batch / slices;
  return SampleRange{(static_cast<int64_t>(replica) * microbatches + microbatch) * size, size};
}

absl::StatusOr<std::shared_ptr<Dataset>> MakeSyntheticDataset(
    const SyntheticTaskOptions& options) {
  if (options.vocab < 2 || options.seq_len < 1 || options.strides < 1 ||
      options.strides >= options.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic data: vocab (", options.vocab, ") must be >= 2, strides (", options.strides,
        ") in [1, vocab) and seq_len (", options.seq_len, ") >= 1"));
  }
  return std::shared_ptr<Dataset>(std::make_shared<SyntheticDataset>(options));
}

absl::StatusOr<std::shared_ptr<Dataset>> MakeByteTextDataset(const std::string& path,
                                                             int64_t seq_len, uint64_t seed) {
  if (seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": seq_len ", seq_len,
                                                   " must be >= 1"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot open text data file"));
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (static_cast<int64_t>(bytes.size()) < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": has ", bytes.size(),
                                                   " bytes, fewer than seq_len + 1 = ",
                                                   seq_len + 1));
  }
  return std::shared_ptr<Dataset>(
      std::make_shared<ByteTextDataset>(path, std::move(bytes), seq_len, seed));
}

}  // namespace tandem::runtime::libtorch
