#include "data/dataset_identity.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_util.h"
#include "common/status.h"

namespace tandem::data {
namespace {

std::string Hex(uint64_t value) { return absl::StrFormat("%016x", value); }

// Exactly 16 hex digits (what Hex writes), nothing else.
bool ParseHex(const std::string& text, uint64_t* value) {
  if (text.size() != 16) return false;
  *value = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return false;
    }
    *value = (*value << 4) | static_cast<uint64_t>(digit);
  }
  return true;
}

}  // namespace

bool ShardIdentity::operator==(const ShardIdentity& other) const {
  return name == other.name && size_bytes == other.size_bytes && num_tokens == other.num_tokens &&
         checksum == other.checksum;
}

int64_t DatasetIdentity::num_tokens() const {
  int64_t total = 0;
  for (const ShardIdentity& shard : shards) total += shard.num_tokens;
  return total;
}

std::string DatasetIdentity::ToString() const {
  std::string text = absl::StrCat(shards.size(), shards.size() == 1 ? " shard, " : " shards, ",
                                  num_tokens(), " tokens:");
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardIdentity& shard = shards[i];
    absl::StrAppend(&text, i == 0 ? " " : "; ", shard.name, " ", shard.size_bytes, " bytes ",
                    shard.num_tokens, " tokens checksum ", Hex(shard.checksum));
  }
  return text;
}

nlohmann::json DatasetIdentity::ToJson() const {
  nlohmann::json list = nlohmann::json::array();
  for (const ShardIdentity& shard : shards) {
    list.push_back({{"name", shard.name},
                    {"size_bytes", shard.size_bytes},
                    {"num_tokens", shard.num_tokens},
                    {"checksum", Hex(shard.checksum)}});
  }
  return {{"shards", std::move(list)}};
}

absl::StatusOr<DatasetIdentity> DatasetIdentity::FromJson(const nlohmann::json& json,
                                                          absl::string_view where) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected an object"));
  }
  TANDEM_ASSIGN_OR_RETURN(const Json* list, GetArray(json, "shards", where));
  DatasetIdentity identity;
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string at = absl::StrCat(where, ".shards[", i, "]");
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": expected an object"));
    }
    ShardIdentity shard;
    TANDEM_ASSIGN_OR_RETURN(shard.name, GetString(entry, "name", at));
    TANDEM_ASSIGN_OR_RETURN(shard.size_bytes, GetInt(entry, "size_bytes", at));
    TANDEM_ASSIGN_OR_RETURN(shard.num_tokens, GetInt(entry, "num_tokens", at));
    TANDEM_ASSIGN_OR_RETURN(const std::string checksum, GetString(entry, "checksum", at));
    if (shard.size_bytes < 0 || shard.num_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": sizes must be non-negative"));
    }
    if (!ParseHex(checksum, &shard.checksum)) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".checksum: expected 16 hex digits, got \"", checksum, "\""));
    }
    identity.shards.push_back(std::move(shard));
  }
  return identity;
}

absl::Status CheckSameDataset(const DatasetIdentity& saved, const DatasetIdentity& current) {
  if (saved.shards.size() != current.shards.size()) {
    return absl::FailedPreconditionError(absl::StrCat("the data set changed: the checkpoint's has ",
                                                      saved.shards.size(), " shards, this one ",
                                                      current.shards.size()));
  }
  for (size_t i = 0; i < saved.shards.size(); ++i) {
    const ShardIdentity& was = saved.shards[i];
    const ShardIdentity& is = current.shards[i];
    if (was == is) continue;
    std::string what;
    if (was.name != is.name) {
      what = absl::StrCat("is ", is.name, ", was ", was.name);
    } else if (was.size_bytes != is.size_bytes) {
      what = absl::StrCat(is.name, " holds ", is.size_bytes, " bytes, was ", was.size_bytes);
    } else if (was.num_tokens != is.num_tokens) {
      what = absl::StrCat(is.name, " holds ", is.num_tokens, " tokens, was ", was.num_tokens);
    } else {
      what = absl::StrCat(is.name, " has checksum ", Hex(is.checksum), ", was ", Hex(was.checksum),
                          " (same size, other contents)");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("the data set changed: shard ", i, " ", what));
  }
  return absl::OkStatus();
}

}  // namespace tandem::data
