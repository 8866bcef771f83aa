#include "runtime/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"

namespace tandem::runtime {
namespace {

// A shard file: the magic, the header length as a uint64 (host byte order: checkpoints are
// read on the machines that wrote them), the JSON header, then the tensors' bytes in header
// order.
constexpr char kShardMagic[] = "TANDEMSHARD1";
constexpr size_t kShardMagicSize = sizeof(kShardMagic) - 1;
constexpr int kLargestDataType = static_cast<int>(comm::DataType::kInt64);

}  // namespace

const ShardTensor* CheckpointShard::Find(absl::string_view name) const {
  for (const ShardTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const ShardRecord* CheckpointManifest::FindShard(int stage, int part) const {
  for (const ShardRecord& r : shards) {
    if (r.stage == stage && r.part == part) return &r;
  }
  return nullptr;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i > 0 ? ", " : "", shape[i]);
  return out + "]";
}

int64_t ShapeElements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

bool ShapesCompatible(const std::vector<int64_t>& saved, const std::vector<int64_t>& wanted) {
  if (saved.empty() || wanted.empty() || saved == wanted) return true;
  return saved.size() == 1 && saved[0] == ShapeElements(wanted);
}

std::string ShardFileName(int stage, int part, int num_parts) {
  return absl::StrFormat("stage-%03d.part-%d-of-%d.bin", stage, part, num_parts);
}

std::string Checksum(absl::string_view bytes) {
  constexpr uint64_t kOffsetBasis = 14695981039346656037ull;
  constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t hash = kOffsetBasis;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= kPrime;
  }
  return absl::StrFormat("%016x", hash);
}

std::string SerializeShard(const CheckpointShard& shard) {
  nlohmann::json header = {{"stage", shard.stage},
                           {"part", shard.part},
                           {"num_parts", shard.num_parts},
                           {"metadata", shard.metadata}};
  nlohmann::json tensors = nlohmann::json::array();
  for (const ShardTensor& t : shard.tensors) {
    tensors.push_back({{"name", t.name},
                       {"dtype", static_cast<int>(t.dtype)},
                       {"dtype_name", comm::DataTypeName(t.dtype)},
                       {"count", t.count}});
    if (!t.shape.empty()) tensors.back()["shape"] = t.shape;
  }
  header["tensors"] = tensors;
  const std::string header_text = header.dump();
  const uint64_t header_size = header_text.size();
  std::string out(kShardMagic, kShardMagicSize);
  out.append(reinterpret_cast<const char*>(&header_size), sizeof(header_size));
  out += header_text;
  for (const ShardTensor& t : shard.tensors) out += t.bytes;
  return out;
}

namespace {

// Elements of `t` whose exponent bits are all ones (NaN or infinite; none for integer types),
// and the first one's index in `first`.
template <typename Bits>
int64_t CountAllOnesExponent(const std::string& bytes, Bits exponent, int64_t* first) {
  int64_t found = 0;
  const size_t n = bytes.size() / sizeof(Bits);
  for (size_t i = 0; i < n; ++i) {
    Bits value;
    std::memcpy(&value, bytes.data() + i * sizeof(Bits), sizeof(Bits));
    if ((value & exponent) != exponent) continue;
    if (found++ == 0) *first = static_cast<int64_t>(i);
  }
  return found;
}

int64_t CountNonFinite(const ShardTensor& t, int64_t* first) {
  switch (t.dtype) {
    case comm::DataType::kFloat32:
      return CountAllOnesExponent<uint32_t>(t.bytes, 0x7f800000u, first);
    case comm::DataType::kFloat64:
      return CountAllOnesExponent<uint64_t>(t.bytes, 0x7ff0000000000000ull, first);
    case comm::DataType::kBFloat16: return CountAllOnesExponent<uint16_t>(t.bytes, 0x7f80, first);
    case comm::DataType::kFloat16: return CountAllOnesExponent<uint16_t>(t.bytes, 0x7c00, first);
    default: return 0;
  }
}

}  // namespace

absl::StatusOr<CheckpointShard> ParseShard(absl::string_view data, absl::string_view source) {
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(source, ": corrupt shard: ", why));
  };
  if (data.size() < kShardMagicSize + sizeof(uint64_t) ||
      data.substr(0, kShardMagicSize) != absl::string_view(kShardMagic, kShardMagicSize)) {
    return corrupt("bad magic (not a tandem checkpoint shard)");
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, data.data() + kShardMagicSize, sizeof(header_size));
  size_t offset = kShardMagicSize + sizeof(header_size);
  if (header_size > data.size() - offset) return corrupt("header runs past the end");
  absl::StatusOr<nlohmann::json> parsed = ParseJson(data.substr(offset, header_size), "header");
  if (!parsed.ok()) return corrupt(parsed.status().message());
  nlohmann::json header = *std::move(parsed);
  if (!header.is_object()) return corrupt("header is not a JSON object");
  offset += header_size;
  const std::string where = absl::StrCat(source, " header");
  CheckpointShard shard;
  auto bad = [&](const absl::Status& s) { return absl::DataLossError(s.message()); };
  auto stage = GetInt(header, "stage", where);
  auto part = GetInt(header, "part", where);
  auto num_parts = GetInt(header, "num_parts", where);
  auto tensors = GetArray(header, "tensors", where);
  if (!stage.ok()) return bad(stage.status());
  if (!part.ok()) return bad(part.status());
  if (!num_parts.ok()) return bad(num_parts.status());
  if (!tensors.ok()) return bad(tensors.status());
  shard.stage = static_cast<int>(*stage);
  shard.part = static_cast<int>(*part);
  shard.num_parts = static_cast<int>(*num_parts);
  if (header.contains("metadata")) shard.metadata = header["metadata"];
  for (size_t i = 0; i < (*tensors)->size(); ++i) {
    const nlohmann::json& tj = (**tensors)[i];
    const std::string twhere = absl::StrCat(where, ": tensors[", i, "]");
    auto name = GetString(tj, "name", twhere);
    auto dtype = GetInt(tj, "dtype", twhere);
    auto count = GetInt(tj, "count", twhere);
    if (!name.ok()) return bad(name.status());
    if (!dtype.ok()) return bad(dtype.status());
    if (!count.ok()) return bad(count.status());
    if (*dtype < 0 || *dtype > kLargestDataType || *count < 0) {
      return corrupt(absl::StrCat("tensors[", i, "] has a bad dtype or count"));
    }
    ShardTensor t;
    t.name = *name;
    t.dtype = static_cast<comm::DataType>(*dtype);
    t.count = *count;
    // Shapes are recorded since shards carry them; an older shard's tensors have none.
    if (tj.contains("shape")) {
      const nlohmann::json& shape = tj["shape"];
      bool valid = shape.is_array();
      bool zero = false;
      uint64_t product = 1;
      for (size_t d = 0; valid && d < shape.size(); ++d) {
        valid = shape[d].is_number_integer() && shape[d].get<int64_t>() >= 0;
        if (!valid) break;
        const uint64_t dim = static_cast<uint64_t>(shape[d].get<int64_t>());
        zero = zero || dim == 0;
        // Compared by division: a crafted shape could overflow the product.
        if (dim != 0 && product > UINT64_MAX / dim) valid = false;
        if (dim != 0) product *= dim;
        t.shape.push_back(static_cast<int64_t>(dim));
      }
      if (zero) product = 0;
      if (!valid || product != static_cast<uint64_t>(t.count)) {
        return corrupt(absl::StrCat("tensor '", t.name, "' has shape ", shape.dump(),
                                    ", which does not hold its ", t.count, " elements"));
      }
    }
    // Compared by division: count * size could overflow for a crafted count.
    const uint64_t element = comm::SizeOf(t.dtype);
    if (element == 0 || static_cast<uint64_t>(t.count) > (data.size() - offset) / element) {
      return corrupt(absl::StrCat("tensor '", t.name, "' (", t.count,
                                  " elements) runs past the end of the file"));
    }
    const uint64_t bytes = static_cast<uint64_t>(t.count) * element;
    t.bytes = std::string(data.substr(offset, bytes));
    offset += bytes;
    // A checkpoint is written from finite values only (training stops at a non-finite loss):
    // a NaN or an infinity here is damage that a checksum recomputed over it would hide.
    int64_t first = 0;
    if (const int64_t bad_values = CountNonFinite(t, &first); bad_values > 0) {
      return corrupt(absl::StrCat("tensor '", t.name, "' holds ", bad_values,
                                  " non-finite value(s) (NaN or infinite; the first at element ",
                                  first, ")"));
    }
    shard.tensors.push_back(std::move(t));
  }
  if (offset != data.size()) {
    return corrupt(absl::StrCat(data.size() - offset, " trailing bytes"));
  }
  return shard;
}

absl::StatusOr<ShardRecord> WriteShard(const std::string& dir, const CheckpointShard& shard) {
  ShardRecord record;
  record.stage = shard.stage;
  record.part = shard.part;
  record.num_parts = shard.num_parts;
  record.file = ShardFileName(shard.stage, shard.part, shard.num_parts);
  const std::string contents = SerializeShard(shard);
  record.bytes = static_cast<int64_t>(contents.size());
  record.checksum = Checksum(contents);
  TANDEM_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/", record.file), contents));
  return record;
}

absl::StatusOr<CheckpointShard> ReadShard(const std::string& dir, const ShardRecord& record) {
  const std::string path = absl::StrCat(dir, "/", record.file);
  // One byte more than the manifest says, so that a longer file is reported as such.
  auto contents = ReadRegularFile(path, std::max<int64_t>(record.bytes, 0) + 1);
  if (!contents.ok()) {
    if (absl::IsNotFound(contents.status())) {
      return absl::NotFoundError(
          absl::StrCat(path, ": shard file listed in the manifest is missing"));
    }
    return contents.status();
  }
  if (static_cast<int64_t>(contents->size()) != record.bytes) {
    return absl::DataLossError(absl::StrCat(path, ": has ", contents->size(),
                                            " bytes, the manifest says ", record.bytes,
                                            " (truncated or overwritten shard)"));
  }
  const std::string checksum = Checksum(*contents);
  if (checksum != record.checksum) {
    return absl::DataLossError(absl::StrCat(path, ": checksum ", checksum,
                                            " differs from the manifest's ", record.checksum,
                                            " (corrupt shard)"));
  }
  TANDEM_ASSIGN_OR_RETURN(CheckpointShard shard, ParseShard(*contents, path));
  if (shard.stage != record.stage || shard.part != record.part ||
      shard.num_parts != record.num_parts) {
    return absl::DataLossError(absl::StrCat(path, ": holds stage ", shard.stage, " part ",
                                            shard.part, ", the manifest says stage ",
                                            record.stage, " part ", record.part));
  }
  return shard;
}

nlohmann::json ToJson(const CheckpointManifest& manifest) {
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardRecord& r : manifest.shards) {
    shards.push_back({{"stage", r.stage},
                      {"part", r.part},
                      {"num_parts", r.num_parts},
                      {"file", r.file},
                      {"bytes", r.bytes},
                      {"checksum", r.checksum}});
  }
  return {{"format_version", manifest.format_version},
          {"model", manifest.model},
          {"step", manifest.step},
          {"data_position", manifest.data_position},
          {"optimizer", manifest.optimizer},
          {"run", manifest.run},
          {"plan", manifest.plan},
          {"shards", shards}};
}

absl::StatusOr<CheckpointManifest> ManifestFromJson(const nlohmann::json& j,
                                                    absl::string_view source) {
  const std::string where(source);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
  }
  CheckpointManifest m;
  TANDEM_ASSIGN_OR_RETURN(int64_t version, GetInt(j, "format_version", where));
  if (version != kCheckpointFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": format_version ", version,
                                                   " is not supported (expected ",
                                                   kCheckpointFormatVersion, ")"));
  }
  m.format_version = static_cast<int>(version);
  TANDEM_ASSIGN_OR_RETURN(m.model, GetString(j, "model", where));
  TANDEM_ASSIGN_OR_RETURN(m.step, GetInt(j, "step", where));
  if (m.step < 0 || m.step > kMaxCheckpointStep) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": step: must be in [0, ", kMaxCheckpointStep, "], got ", m.step));
  }
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* plan, GetObject(j, "plan", where));
  m.plan = *plan;
  if (j.contains("data_position")) m.data_position = j["data_position"];
  if (j.contains("optimizer")) m.optimizer = j["optimizer"];
  if (j.contains("run")) {
    if (!j["run"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": run: expected a JSON object"));
    }
    m.run = j["run"];
  }
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* shards, GetArray(j, "shards", where));
  for (size_t i = 0; i < shards->size(); ++i) {
    const std::string swhere = absl::StrCat(where, ": shards[", i, "]");
    const nlohmann::json& sj = (*shards)[i];
    ShardRecord r;
    TANDEM_ASSIGN_OR_RETURN(int64_t stage, GetInt(sj, "stage", swhere));
    TANDEM_ASSIGN_OR_RETURN(int64_t part, GetInt(sj, "part", swhere));
    TANDEM_ASSIGN_OR_RETURN(int64_t num_parts, GetInt(sj, "num_parts", swhere));
    TANDEM_ASSIGN_OR_RETURN(r.file, GetString(sj, "file", swhere));
    TANDEM_ASSIGN_OR_RETURN(r.bytes, GetInt(sj, "bytes", swhere));
    TANDEM_ASSIGN_OR_RETURN(r.checksum, GetString(sj, "checksum", swhere));
    if (stage < 0 || num_parts < 1 || part < 0 || part >= num_parts || r.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(swhere, ": stage/part/num_parts/bytes out of range"));
    }
    if (r.file.empty() || r.file.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(swhere, ": file: must be a plain file name, got '", r.file, "'"));
    }
    r.stage = static_cast<int>(stage);
    r.part = static_cast<int>(part);
    r.num_parts = static_cast<int>(num_parts);
    if (m.FindShard(r.stage, r.part) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(swhere, ": stage ", r.stage, " part ",
                                                     r.part, " listed twice"));
    }
    m.shards.push_back(std::move(r));
  }
  return m;
}

absl::Status EnsureDirectory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": cannot create checkpoint folder: ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& manifest) {
  return WriteFileAtomically(absl::StrCat(dir, "/", kManifestFileName),
                             ToJson(manifest).dump(2) + "\n");
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kManifestFileName);
  auto text = ReadRegularFile(path, kMaxManifestBytes);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat(
          path, ": no checkpoint manifest (missing, or the checkpoint was never completed)"));
    }
    return text.status();
  }
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(*text, path));
  TANDEM_ASSIGN_OR_RETURN(CheckpointManifest manifest, ManifestFromJson(j, path));
  for (const ShardRecord& r : manifest.shards) {
    const std::string shard_path = absl::StrCat(dir, "/", r.file);
    struct stat st;
    if (::stat(shard_path.c_str(), &st) != 0) {
      return absl::NotFoundError(
          absl::StrCat(shard_path, ": shard file listed in the manifest is missing"));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::DataLossError(absl::StrCat(
          shard_path, ": shard listed in the manifest is ",
          S_ISDIR(st.st_mode) ? "a folder" : "not a regular file", ", not a file"));
    }
    if (static_cast<int64_t>(st.st_size) != r.bytes) {
      return absl::DataLossError(absl::StrCat(shard_path, ": has ", st.st_size,
                                              " bytes, the manifest says ", r.bytes,
                                              " (truncated or overwritten shard)"));
    }
  }
  return manifest;
}

absl::Status RemoveManifest(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kManifestFileName);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(absl::StrCat(path, ": cannot remove: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string StepFolderName(int64_t step) { return absl::StrFormat("step-%08d", step); }

std::string PartialFolderName(int64_t step) {
  return absl::StrFormat(".step-%08d.partial", step);
}

namespace {

constexpr char kStepPrefix[] = "step-";

// The step a folder name "step-NNNNNNNN" stands for; -1 for any other name.
int64_t StepOfFolder(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0) return -1;
  const std::string digits = name.substr(sizeof(kStepPrefix) - 1);
  if (digits.empty() || digits.size() > 13) return -1;
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

}  // namespace

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& root) {
  const std::string latest_path = absl::StrCat(root, "/", kLatestFileName);
  std::error_code ec;
  if (!std::filesystem::exists(latest_path, ec)) return root;
  // One short line; a FIFO, a device or a long file is refused without being read through.
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(latest_path, kMaxLatestBytes));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (StepOfFolder(text) < 0) {
    return absl::DataLossError(absl::StrCat(latest_path, ": expected a step folder name (",
                                            StepFolderName(12), "), got '",
                                            absl::CHexEscape(text.substr(0, 64)), "'"));
  }
  return absl::StrCat(root, "/", text);
}

absl::Status CleanCheckpointLeftovers(const std::string& root) {
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return absl::OkStatus();
  std::vector<std::filesystem::path> leftovers;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    const bool partial = name.rfind(".step-", 0) == 0;
    const bool temporary = name.find(".tmp.") != std::string::npos;
    if (partial || temporary) leftovers.push_back(entry.path());
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(root, ": cannot list the checkpoint folder: ", ec.message()));
  }
  for (const auto& path : leftovers) {
    TANDEM_RETURN_IF_ERROR(RemoveAll(path.string()));
  }
  return absl::OkStatus();
}

absl::Status PublishCheckpoint(const std::string& root, const std::string& partial,
                               int64_t step, int keep) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path final_path = fs::path(root) / StepFolderName(step);
  if (fs::exists(final_path, ec)) {
    // An older save of this step (a run restarted from an earlier checkpoint). If `latest`
    // names it, it stays loadable until the rename below replaces it: moved aside first.
    const fs::path aside = fs::path(root) / absl::StrCat(PartialFolderName(step), ".old");
    RemoveAll(aside.string()).IgnoreError();  // a failure shows in the rename
    fs::rename(final_path, aside, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat(final_path.string(), ": cannot replace: ", ec.message()));
    }
  }
  fs::rename(partial, final_path, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(partial, ": cannot rename to ", final_path.string(),
                                            ": ", ec.message()));
  }
  TANDEM_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(root, "/", kLatestFileName),
                                             StepFolderName(step) + "\n"));
  TANDEM_RETURN_IF_ERROR(CleanCheckpointLeftovers(root));
  if (keep <= 0) return absl::OkStatus();
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const int64_t s = StepOfFolder(entry.path().filename().string());
    if (s >= 0 && entry.is_directory(ec)) steps.emplace_back(s, entry.path());
  }
  std::sort(steps.begin(), steps.end());
  // The newest `keep` stay, and always the one just published.
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i) {
    if (steps[i].first == step) continue;
    RemoveAll(steps[i].second.string()).IgnoreError();  // a leftover, not an error
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime
