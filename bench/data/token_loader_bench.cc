// Throughput of the data loader's inner loop on one core: sample windows of sequence length
// 1024 fetched in the shuffled order of data/sample_order.h from memory-mapped shards into
// int64 input and target buffers, in tokens per second (input tokens). It writes shards of
// the given size to a temporary folder (llm.c uint16, then Megatron int32), and times
//   * the open (headers and Megatron index checked, identities computed),
//   * fetches with the page cache cold (the files dropped from it with posix_fadvise before
//     they are opened: what a first epoch from local disk sees),
//   * the vocabulary scan (CheckVocabulary, a streaming pass over every token), cold,
//   * fetches with the page cache warm (after the scan), and the scan again, warm.
// These are the loader's figures alone: no tensors built, no host-to-device copy, no training
// step; compare them with the tokens per second a training run consumes.
//
//   data_token_loader_bench [megabytes per format, default 200] [seconds per figure, default 2]
//                           [folder, default $TMPDIR or /tmp]
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/sample_order.h"
#include "data/sample_windows.h"
#include "data/token_dataset.h"

namespace {

using tandem::data::LoaderPosition;
using tandem::data::SampleOrder;
using tandem::data::SampleOrderOptions;
using tandem::data::SampleWindowOptions;
using tandem::data::SampleWindows;
using tandem::data::TokenDataset;

constexpr int64_t kSequenceLength = 1024;
constexpr int64_t kVocabulary = 50257;
constexpr int kShards = 4;
constexpr int64_t kGlobalBatch = 64;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t NextRandom(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool WriteAll(int descriptor, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t written = ::write(descriptor, bytes.data() + done, bytes.size() - done);
    if (written <= 0) return false;
    done += static_cast<size_t>(written);
  }
  return true;
}

bool WriteFile(const std::string& path, const std::string& bytes) {
  const int descriptor = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (descriptor < 0) return false;
  const bool ok = WriteAll(descriptor, bytes) && ::fsync(descriptor) == 0;
  return ::close(descriptor) == 0 && ok;
}

// Random token bytes: `count` tokens of `token_bytes` each.
std::string RandomTokens(int64_t count, int token_bytes, uint64_t* state) {
  std::string bytes(static_cast<size_t>(count * token_bytes), '\0');
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t token = static_cast<uint32_t>(NextRandom(state) % kVocabulary);
    std::memcpy(&bytes[static_cast<size_t>(i * token_bytes)], &token, token_bytes);
  }
  return bytes;
}

template <typename T>
void Append(std::string* bytes, T value) {
  bytes->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// kShards llm.c (version 1) shards of `tokens_per_shard` uint16 tokens.
std::vector<std::string> WriteLlmcShards(const std::string& folder, int64_t tokens_per_shard) {
  std::vector<std::string> paths;
  uint64_t state = 1;
  for (int s = 0; s < kShards; ++s) {
    std::string bytes(1024, '\0');
    const int32_t header[3] = {20240520, 1, static_cast<int32_t>(tokens_per_shard)};
    std::memcpy(bytes.data(), header, sizeof(header));
    bytes += RandomTokens(tokens_per_shard, 2, &state);
    const std::string path = absl::StrCat(folder, "/llmc_", s, ".bin");
    if (!WriteFile(path, bytes)) return {};
    paths.push_back(path);
  }
  return paths;
}

// kShards Megatron int32 shards, documents of 200 to 4000 tokens.
std::vector<std::string> WriteMegatronShards(const std::string& folder, int64_t tokens_per_shard) {
  std::vector<std::string> paths;
  uint64_t state = 2;
  for (int s = 0; s < kShards; ++s) {
    std::vector<int32_t> lengths;
    for (int64_t total = 0; total < tokens_per_shard;) {
      const int64_t length =
          std::min<int64_t>(200 + NextRandom(&state) % 3800, tokens_per_shard - total);
      lengths.push_back(static_cast<int32_t>(length));
      total += length;
    }
    std::string index("MMIDIDX\0\0", 9);
    Append<uint64_t>(&index, 1);
    Append<uint8_t>(&index, 4);  // int32
    Append<uint64_t>(&index, lengths.size());
    Append<uint64_t>(&index, lengths.size() + 1);
    for (int32_t length : lengths) Append<int32_t>(&index, length);
    int64_t pointer = 0;
    for (int32_t length : lengths) {
      Append<int64_t>(&index, pointer);
      pointer += int64_t{4} * length;
    }
    for (size_t d = 0; d <= lengths.size(); ++d) Append<int64_t>(&index, static_cast<int64_t>(d));
    const std::string prefix = absl::StrCat(folder, "/megatron_", s);
    if (!WriteFile(prefix + ".idx", index) ||
        !WriteFile(prefix + ".bin", RandomTokens(tokens_per_shard, 4, &state))) {
      return {};
    }
    paths.push_back(prefix + ".bin");
  }
  return paths;
}

void DropFromPageCache(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    for (const std::string& file : {path, path.substr(0, path.size() - 4) + ".idx"}) {
      const int descriptor = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      if (descriptor < 0) continue;
      ::posix_fadvise(descriptor, 0, 0, POSIX_FADV_DONTNEED);
      ::close(descriptor);
    }
  }
}

// Fetches global batches in the shuffled order for about `seconds`, or one epoch when
// `one_epoch` (a cold page cache stays cold only until every window was read once); returns
// input tokens/s.
double FetchRate(const SampleWindows& windows, double seconds, bool one_epoch, int64_t* checksum) {
  SampleOrderOptions order_options;
  order_options.seed = 1234;
  order_options.samples_per_epoch = windows.num_samples();
  order_options.global_batch_size = std::min(kGlobalBatch, windows.num_samples());
  const SampleOrder order = *SampleOrder::Create(order_options);
  std::vector<int64_t> inputs(kSequenceLength), targets(kSequenceLength);
  LoaderPosition position = order.Start();
  int64_t tokens = 0;
  const double start = Now();
  double elapsed = 0;
  while (elapsed < seconds && !(one_epoch && position.epoch > 0)) {
    for (int64_t sample : order.ReplicaBatch(position)) {
      const absl::Status status =
          windows.FetchSample(sample, absl::MakeSpan(inputs), absl::MakeSpan(targets));
      if (!status.ok()) {
        std::fprintf(stderr, "fetch failed: %s\n", std::string(status.message()).c_str());
        std::exit(1);
      }
      *checksum += inputs[0] + targets[kSequenceLength - 1];
      tokens += kSequenceLength;
    }
    position = order.Next(position);
    elapsed = Now() - start;
  }
  return static_cast<double>(tokens) / elapsed;
}

// Opens `paths` with nothing of them in the page cache.
absl::StatusOr<TokenDataset> OpenCold(const std::vector<std::string>& paths, double* seconds) {
  DropFromPageCache(paths);
  const double start = Now();
  auto dataset = TokenDataset::Open(paths);
  *seconds = Now() - start;
  return dataset;
}

int Measure(const char* format, const std::vector<std::string>& paths, double seconds) {
  if (paths.empty()) {
    std::fprintf(stderr, "data_token_loader_bench: cannot write the %s shards\n", format);
    return 1;
  }
  SampleWindowOptions window_options;
  window_options.sequence_length = kSequenceLength;
  int64_t checksum = 0;
  // Cold: a fresh mapping of files dropped from the page cache; every window a disk read.
  {
    double open_seconds = 0;
    auto dataset = OpenCold(paths, &open_seconds);
    if (!dataset.ok()) {
      std::fprintf(stderr, "open failed: %s\n", std::string(dataset.status().message()).c_str());
      return 1;
    }
    const SampleWindows windows = *SampleWindows::Create(*dataset, window_options);
    std::printf("%-9s %d shards, %" PRId64 " tokens, %" PRId64 " samples of %" PRId64
                ": open %.3f s (page cache cold)\n",
                format, dataset->num_shards(), dataset->num_tokens(), windows.num_samples(),
                kSequenceLength, open_seconds);
    const double cold = FetchRate(windows, seconds, /*one_epoch=*/true, &checksum);
    std::printf(
        "%-9s fetch, page cache cold: %7.1f Mtokens/s (%.0f samples/s; the first epoch's "
        "random windows read from the disk)\n",
        format, cold / 1e6, cold / kSequenceLength);
  }
  // Warm: the vocabulary scan reads every page from the disk, then windows come from memory.
  double open_seconds = 0;
  auto dataset = OpenCold(paths, &open_seconds);
  const double scan_start = Now();
  const absl::Status vocabulary = dataset->CheckVocabulary(kVocabulary);
  const double scan_seconds = Now() - scan_start;
  if (!vocabulary.ok()) {
    std::fprintf(stderr, "vocabulary: %s\n", std::string(vocabulary.message()).c_str());
    return 1;
  }
  const double tokens = static_cast<double>(dataset->num_tokens());
  std::printf("%-9s vocabulary scan, page cache cold: %7.1f Mtokens/s\n", format,
              tokens / scan_seconds / 1e6);
  const SampleWindows windows = *SampleWindows::Create(*dataset, window_options);
  const double warm = FetchRate(windows, seconds, /*one_epoch=*/false, &checksum);
  std::printf(
      "%-9s fetch, page cache warm: %7.1f Mtokens/s (%.0f samples/s, %.2f GB/s of int64 "
      "inputs and targets written)\n",
      format, warm / 1e6, warm / kSequenceLength, warm * 16 / 1e9);
  const double rescan_start = Now();
  (void)dataset->CheckVocabulary(kVocabulary);
  std::printf("%-9s vocabulary scan, page cache warm: %7.1f Mtokens/s [checksum %" PRId64 "]\n",
              format, tokens / (Now() - rescan_start) / 1e6, checksum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const double megabytes = argc > 1 ? std::atof(argv[1]) : 200;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 2;
  const char* tmp = std::getenv("TMPDIR");
  std::string root = argc > 3 ? argv[3] : (tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  if (megabytes <= 0 || seconds <= 0) {
    std::fprintf(stderr, "usage: data_token_loader_bench [megabytes] [seconds] [folder]\n");
    return 2;
  }
  std::string folder = root + "/tandem_token_bench_XXXXXX";
  if (::mkdtemp(folder.data()) == nullptr) {
    std::fprintf(stderr, "data_token_loader_bench: cannot create a folder in %s\n", root.c_str());
    return 2;
  }
  std::printf("data_token_loader_bench: one thread, sequence length %" PRId64
              ", global batch %" PRId64
              " in shuffled order, %.0f MB of shards per format in %s\n"
              "(the loader's inner loop only: no tensors, no device copy, no training)\n",
              kSequenceLength, kGlobalBatch, megabytes, folder.c_str());
  const int64_t bytes_per_shard = static_cast<int64_t>(megabytes * 1e6) / kShards;
  int status = 0;
  {
    const std::vector<std::string> paths = WriteLlmcShards(folder, bytes_per_shard / 2);
    status |= Measure("llm.c", paths, seconds);
    for (const std::string& path : paths) ::unlink(path.c_str());
  }
  {
    const std::vector<std::string> paths = WriteMegatronShards(folder, bytes_per_shard / 4);
    status |= Measure("megatron", paths, seconds);
    for (const std::string& path : paths) {
      ::unlink(path.c_str());
      ::unlink((path.substr(0, path.size() - 4) + ".idx").c_str());
    }
  }
  ::rmdir(folder.c_str());
  return status;
}
