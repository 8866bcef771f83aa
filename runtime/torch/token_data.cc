#include "runtime/torch/token_data.h"

#include <sys/stat.h>

#include <optional>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"
#include "data/sample_order.h"

namespace tandem::runtime::libtorch {
namespace {

class TokenShardDataset final : public Dataset {
 public:
  TokenShardDataset(data::TokenDataset tokens, data::SampleWindows windows,
                    const TokenShardOptions& options)
      : tokens_(std::move(tokens)), windows_(std::move(windows)), options_(options) {}

  std::string name() const override {
    return absl::StrCat("token shards (", tokens_.num_shards(), " shard(s), ",
                        tokens_.num_tokens(), " tokens, ", windows_.num_samples(),
                        " windows of ", options_.seq_len, ")");
  }

  absl::Status SetGlobalBatch(int64_t global_batch) override {
    if (global_batch < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": global batch ", global_batch, " is not positive"));
    }
    if (global_batch > windows_.num_samples()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the data set has ", windows_.num_samples(), " windows of ", options_.seq_len + 1,
          " tokens, fewer than the global batch of ", global_batch,
          " samples: more data, a shorter --seq-len or a smaller global batch"));
    }
    data::SampleOrderOptions order;
    order.seed = options_.seed;
    order.samples_per_epoch = windows_.num_samples();
    order.global_batch_size = global_batch;
    order.shuffle = options_.shuffle;
    TANDEM_ASSIGN_OR_RETURN(data::SampleOrder made, data::SampleOrder::Create(order));
    order_ = std::make_shared<const data::SampleOrder>(std::move(made));
    global_batch_ = global_batch;
    return absl::OkStatus();
  }

  nlohmann::json Identity() const override {
    nlohmann::json identity = tokens_.identity().ToJson();
    identity["kind"] = "token shards";
    identity["seq_len"] = options_.seq_len;
    identity["layout"] = options_.within_documents ? "within documents" : "contiguous";
    return identity;
  }

  absl::StatusOr<Batch> Samples(int64_t iteration, int64_t first,
                                int64_t count) const override {
    if (iteration < 0 || first < 0 || count <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(name(), ": bad sample request (iteration ",
                                                     iteration, ", samples [", first, ", +",
                                                     count, "))"));
    }
    const int64_t length = options_.seq_len;
    std::vector<int64_t> inputs(count * length), targets(count * length);
    for (int64_t i = 0; i < count; ++i) {
      int64_t sample = 0;
      if (order_ == nullptr) {
        // Before the global batch is known (profiling a layer): the first windows of the
        // first epoch's order.
        sample = (first + i) % windows_.num_samples();
      } else {
        if (first + count > global_batch_) {
          return absl::InvalidArgumentError(absl::StrCat(
              name(), ": samples [", first, ", ", first + count, ") of a global batch of ",
              global_batch_));
        }
        const int64_t steps = order_->steps_per_epoch();
        const int64_t epoch = iteration / steps;
        const int64_t position = (iteration % steps) * global_batch_ + first + i;
        sample = order_->SampleAt(epoch, position);
      }
      TANDEM_RETURN_IF_ERROR(windows_.FetchSample(
          sample, absl::MakeSpan(inputs.data() + i * length, length),
          absl::MakeSpan(targets.data() + i * length, length)));
    }
    Batch batch;
    batch.inputs = at::from_blob(inputs.data(), {count, length}, at::kLong).clone();
    batch.targets = at::from_blob(targets.data(), {count, length}, at::kLong).clone();
    return batch;
  }

 private:
  data::TokenDataset tokens_;
  data::SampleWindows windows_;
  TokenShardOptions options_;
  // Set once by SetGlobalBatch, before any training batch is read.
  std::shared_ptr<const data::SampleOrder> order_;
  int64_t global_batch_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Dataset>> MakeTokenShardDataset(const TokenShardOptions& options) {
  if (options.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("token shards: sequence length ", options.seq_len, " is not positive"));
  }
  if (options.vocab < 1) {
    return absl::InvalidArgumentError("token shards: the model's vocabulary size is unknown");
  }
  data::TokenDatasetOptions open;
  open.format = options.format;
  TANDEM_ASSIGN_OR_RETURN(data::TokenDataset tokens,
                          data::TokenDataset::Open(options.sources, open));
  TANDEM_RETURN_IF_ERROR(tokens.CheckVocabulary(options.vocab));
  data::SampleWindowOptions window;
  window.sequence_length = options.seq_len;
  window.layout = options.within_documents ? data::WindowLayout::kWithinDocuments
                                           : data::WindowLayout::kContiguous;
  TANDEM_ASSIGN_OR_RETURN(data::SampleWindows windows, data::SampleWindows::Create(tokens, window));
  return std::make_shared<TokenShardDataset>(std::move(tokens), std::move(windows), options);
}

namespace {

bool IsFolder(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// A prepared folder's dataset.json, or nullopt when the folder has none.
absl::StatusOr<std::optional<nlohmann::json>> PreparedDescription(const std::string& folder) {
  const std::string path = absl::StrCat(folder, "/dataset.json");
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) return std::nullopt;
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, /*max_bytes=*/16 << 20));
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json json, ParseJson(text, path));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a JSON object"));
  }
  return json;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> PreparedSplitShards(
    const std::vector<std::string>& sources, const std::string& split) {
  std::vector<std::string> resolved;
  for (const std::string& source : sources) {
    if (!IsFolder(source)) {
      resolved.push_back(source);
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(std::optional<nlohmann::json> description,
                            PreparedDescription(source));
    if (!description.has_value() || !description->contains("splits")) {
      resolved.push_back(source);
      continue;
    }
    const std::string where = absl::StrCat(source, "/dataset.json");
    const nlohmann::json& splits = (*description)["splits"];
    if (!splits.is_object() || !splits.contains(split) || !splits[split].is_object() ||
        !splits[split].contains("shards") || !splits[split]["shards"].is_array() ||
        splits[split]["shards"].empty()) {
      return absl::NotFoundError(absl::StrCat(where, ": no ", split, " shards"));
    }
    for (const nlohmann::json& name : splits[split]["shards"]) {
      if (!name.is_string() || name.get<std::string>().empty() ||
          absl::StrContains(name.get<std::string>(), "/")) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": splits.", split, ".shards holds ", name.dump(),
                         ", not a file name"));
      }
      resolved.push_back(absl::StrCat(source, "/", name.get<std::string>()));
    }
  }
  return resolved;
}

bool LooksLikeTokenShards(const std::string& source) {
  if (IsFolder(source)) return true;
  return absl::StrContains(source, "*") || absl::StrContains(source, "?") ||
         absl::EndsWith(source, ".bin");
}

absl::StatusOr<int64_t> RecordedVocabularySize(const std::vector<std::string>& sources) {
  if (sources.empty()) return 0;
  std::string folder = sources.front();
  if (!IsFolder(folder)) {
    const size_t slash = folder.find_last_of('/');
    folder = slash == std::string::npos ? "." : folder.substr(0, slash);
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<nlohmann::json> description,
                          PreparedDescription(folder));
  if (!description.has_value()) return 0;
  const nlohmann::json& json = *description;
  if (!json.contains("vocab_size") || !json["vocab_size"].is_number_integer() ||
      json["vocab_size"].get<int64_t>() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(folder, "/dataset.json: no positive integer \"vocab_size\""));
  }
  return json["vocab_size"].get<int64_t>();
}

}  // namespace tandem::runtime::libtorch
