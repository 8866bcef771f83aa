#include "data/token_dataset.h"

#include <dirent.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "data/internal/token_shard.h"

namespace tandem::data {
namespace {

using internal::TokenShard;

absl::Status DescribeTokenOutsideVocabulary(const TokenShardInfo& info, int64_t index_in_shard,
                                            int64_t token, int64_t vocabulary_size) {
  return absl::InvalidArgumentError(absl::StrCat(
      info.path, ": token ", index_in_shard, " of the file (global offset ",
      info.first_token + index_in_shard, ") is ", token,
      token < 0 ? ", negative" : absl::StrCat(", outside the vocabulary of ", vocabulary_size)));
}

bool IsFolder(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

bool Exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

bool IsPattern(const std::string& source) {
  return source.find_first_of("*?[") != std::string::npos;
}

// The `*.bin` files of a folder, sorted by name.
absl::StatusOr<std::vector<std::string>> BinFilesIn(const std::string& folder) {
  DIR* directory = ::opendir(folder.c_str());
  if (directory == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(folder, ": cannot list the folder"));
  }
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(directory)) {
    const std::string name = entry->d_name;
    if (absl::EndsWith(name, ".bin")) names.push_back(name);
  }
  ::closedir(directory);
  std::sort(names.begin(), names.end());
  if (names.empty()) {
    return absl::NotFoundError(absl::StrCat(folder, ": the folder holds no .bin token shards"));
  }
  const std::string prefix = absl::EndsWith(folder, "/") ? folder : folder + "/";
  for (std::string& name : names) name = prefix + name;
  return names;
}

// The files a glob pattern matches, sorted by name (byte order, whatever the locale), less
// Megatron `.idx` files (each comes with its .bin).
absl::StatusOr<std::vector<std::string>> FilesMatching(const std::string& pattern) {
  glob_t matches;
  const int result = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &matches);
  std::vector<std::string> paths;
  if (result == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) {
      std::string path = matches.gl_pathv[i];
      if (!absl::EndsWith(path, ".idx") && !IsFolder(path)) paths.push_back(std::move(path));
    }
  }
  ::globfree(&matches);
  if (result != 0 && result != GLOB_NOMATCH) {
    return absl::InvalidArgumentError(absl::StrCat(pattern, ": cannot expand the pattern"));
  }
  if (paths.empty()) {
    return absl::NotFoundError(absl::StrCat(pattern, ": the pattern matches no token files"));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// The token files one source names (see TokenDataset::Open).
absl::StatusOr<std::vector<std::string>> ResolveSource(const std::string& source) {
  if (source.empty()) return absl::InvalidArgumentError("an empty token shard path");
  if (IsFolder(source)) return BinFilesIn(source);
  if (Exists(source)) {
    if (absl::EndsWith(source, ".idx")) {
      return std::vector<std::string>{source.substr(0, source.size() - 4) + ".bin"};
    }
    return std::vector<std::string>{source};
  }
  if (Exists(source + ".bin") && Exists(source + ".idx")) {
    return std::vector<std::string>{source + ".bin"};
  }
  if (IsPattern(source)) return FilesMatching(source);
  return absl::NotFoundError(absl::StrCat(source, ": no such file, folder or Megatron prefix"));
}

// One name per file, whatever path reaches it, to find a file listed twice.
std::string CanonicalPath(const std::string& path) {
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

}  // namespace

absl::string_view TokenFileFormatName(TokenFileFormat format) {
  switch (format) {
    case TokenFileFormat::kAuto:
      return "auto";
    case TokenFileFormat::kLlmc:
      return "llm.c";
    case TokenFileFormat::kNanoGpt:
      return "nanogpt";
    case TokenFileFormat::kMegatron:
      return "megatron";
  }
  return "unknown";
}

absl::StatusOr<TokenFileFormat> ParseTokenFileFormat(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "auto") return TokenFileFormat::kAuto;
  if (lower == "llm.c" || lower == "llmc") return TokenFileFormat::kLlmc;
  if (lower == "nanogpt") return TokenFileFormat::kNanoGpt;
  if (lower == "megatron") return TokenFileFormat::kMegatron;
  return absl::InvalidArgumentError(absl::StrCat("unknown token file format \"", name,
                                                 "\" (expected auto, llm.c, nanogpt or megatron)"));
}

absl::string_view TokenTypeName(TokenType type) {
  switch (type) {
    case TokenType::kUint16:
      return "uint16";
    case TokenType::kUint32:
      return "uint32";
    case TokenType::kInt32:
      return "int32";
  }
  return "unknown";
}

int TokenTypeBytes(TokenType type) { return type == TokenType::kUint16 ? 2 : 4; }

struct TokenDataset::State {
  std::vector<std::unique_ptr<TokenShard>> shards;
  std::vector<TokenShardInfo> shard_infos;
  std::vector<int64_t> shard_first_tokens;  // shard_infos[i].first_token, for ShardOf
  int64_t num_tokens = 0;
  DatasetIdentity identity;
};

int64_t TokenDataset::num_tokens() const { return state_->num_tokens; }
int TokenDataset::num_shards() const { return static_cast<int>(state_->shard_infos.size()); }
const TokenShardInfo& TokenDataset::shard(int index) const { return state_->shard_infos[index]; }
const DatasetIdentity& TokenDataset::identity() const { return state_->identity; }

absl::StatusOr<TokenDataset> TokenDataset::Open(const std::string& source,
                                                const TokenDatasetOptions& options) {
  return Open(std::vector<std::string>{source}, options);
}

absl::StatusOr<TokenDataset> TokenDataset::Open(const std::vector<std::string>& sources,
                                                const TokenDatasetOptions& options) {
  if (sources.empty()) return absl::InvalidArgumentError("no token shards given");
  std::vector<std::string> paths;
  for (const std::string& source : sources) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> resolved, ResolveSource(source));
    paths.insert(paths.end(), resolved.begin(), resolved.end());
  }
  std::set<std::string> seen;
  for (const std::string& path : paths) {
    if (!seen.insert(CanonicalPath(path)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": the same token file is listed twice in one data set"));
    }
  }

  auto state = std::make_shared<State>();
  for (const std::string& path : paths) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<TokenShard> shard,
                            TokenShard::Open(path, options.format));
    TokenShardInfo info;
    info.path = shard->path();
    info.index_path = shard->index_path();
    info.format = shard->format();
    info.token_type = shard->token_type();
    info.first_token = state->num_tokens;
    info.num_tokens = shard->num_tokens();
    info.num_documents = shard->num_documents();
    state->num_tokens += info.num_tokens;
    state->shard_first_tokens.push_back(info.first_token);
    state->identity.shards.push_back(shard->identity());
    state->shard_infos.push_back(std::move(info));
    state->shards.push_back(std::move(shard));
  }
  return TokenDataset(std::move(state));
}

int TokenDataset::ShardOf(int64_t offset) const {
  // The last shard starting at or before `offset`: empty shards that start at the same offset
  // come before the shard that holds it.
  const std::vector<int64_t>& firsts = state_->shard_first_tokens;
  const auto after = std::upper_bound(firsts.begin(), firsts.end(), offset);
  return static_cast<int>(after - firsts.begin()) - 1;
}

absl::Status TokenDataset::ReadTokens(int64_t offset, absl::Span<int64_t> out,
                                      int64_t vocabulary_size) const {
  const int64_t count = static_cast<int64_t>(out.size());
  const int64_t total = state_->num_tokens;
  if (offset < 0 || offset > total || count > total - offset) {
    return absl::OutOfRangeError(absl::StrCat("tokens [", offset, ", ", offset + count,
                                              ") are outside the data set's [0, ", total, ")"));
  }
  int64_t done = 0;
  int shard_index = count > 0 ? ShardOf(offset) : 0;
  while (done < count) {
    const TokenShardInfo& info = state_->shard_infos[shard_index];
    const TokenShard& shard = *state_->shards[shard_index];
    const int64_t first = offset + done - info.first_token;
    const int64_t piece = std::min(count - done, info.num_tokens - first);
    shard.CopyTokens(first, piece, out.data() + done);
    if (vocabulary_size > 0) {
      const int64_t bad = shard.FindTokenOutsideVocabulary(first, piece, vocabulary_size);
      if (bad >= 0) {
        return DescribeTokenOutsideVocabulary(info, bad, shard.TokenAt(bad), vocabulary_size);
      }
    }
    done += piece;
    ++shard_index;
  }
  return absl::OkStatus();
}

TokenRange TokenDataset::DocumentTokens(int shard_index, int64_t document) const {
  const auto [begin, end] = state_->shards[shard_index]->DocumentTokens(document);
  const int64_t first = state_->shard_infos[shard_index].first_token;
  return {first + begin, first + end};
}

absl::Status TokenDataset::CheckVocabulary(int64_t vocabulary_size) const {
  if (vocabulary_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocabulary size must be positive, got ", vocabulary_size));
  }
  for (int s = 0; s < num_shards(); ++s) {
    const TokenShard& shard = *state_->shards[s];
    shard.AdviseSequential();
    const int64_t bad = shard.FindTokenOutsideVocabulary(0, shard.num_tokens(), vocabulary_size);
    shard.AdviseNormal();  // sample windows are read at random afterwards
    if (bad >= 0) {
      return DescribeTokenOutsideVocabulary(state_->shard_infos[s], bad, shard.TokenAt(bad),
                                            vocabulary_size);
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::data
