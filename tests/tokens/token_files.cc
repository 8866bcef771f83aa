#include "tests/tokens/token_files.h"

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/file_util.h"

namespace tandem::data::testing {
namespace {

template <typename T>
void Append(std::string* bytes, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  bytes->append(raw, sizeof(T));
}

}  // namespace

TemporaryFolder::TemporaryFolder() {
  const char* root = std::getenv("TMPDIR");
  std::string pattern =
      std::string(root != nullptr && *root != '\0' ? root : "/tmp") + "/tandem_tokens_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TemporaryFolder::~TemporaryFolder() { (void)tandem::RemoveAll(path_); }

int64_t TestToken(int64_t stream, int64_t index, int64_t vocabulary) {
  return (index * 7919 + stream * 131 + index / 7) % vocabulary;
}

std::vector<int64_t> TestTokens(int64_t stream, int64_t count, int64_t vocabulary) {
  std::vector<int64_t> tokens(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) tokens[i] = TestToken(stream, i, vocabulary);
  return tokens;
}

std::string LlmcBytes(const std::vector<int64_t>& tokens, int version) {
  std::string bytes;
  Append<int32_t>(&bytes, 20240520);
  Append<int32_t>(&bytes, version);
  Append<int32_t>(&bytes, static_cast<int32_t>(tokens.size()));
  bytes.resize(1024, '\0');
  for (int64_t token : tokens) {
    if (version == 2) {
      Append<uint32_t>(&bytes, static_cast<uint32_t>(token));
    } else {
      Append<uint16_t>(&bytes, static_cast<uint16_t>(token));
    }
  }
  return bytes;
}

std::string NanoGptBytes(const std::vector<int64_t>& tokens) {
  std::string bytes;
  for (int64_t token : tokens) Append<uint16_t>(&bytes, static_cast<uint16_t>(token));
  return bytes;
}

MegatronFileBytes MegatronBytes(const std::vector<std::vector<int64_t>>& documents, int dtype_code,
                                int sequences_per_document, bool sequence_modes) {
  MegatronFileBytes files;
  const int token_bytes = dtype_code == 8 ? 2 : 4;
  std::vector<int32_t> lengths;
  std::vector<int64_t> document_indices = {0};
  for (const std::vector<int64_t>& document : documents) {
    const int64_t size = static_cast<int64_t>(document.size());
    for (int s = 0; s < sequences_per_document; ++s) {
      const int64_t begin = size * s / sequences_per_document;
      const int64_t end = size * (s + 1) / sequences_per_document;
      lengths.push_back(static_cast<int32_t>(end - begin));
    }
    document_indices.push_back(static_cast<int64_t>(lengths.size()));
    for (int64_t token : document) {
      if (token_bytes == 2) {
        Append<uint16_t>(&files.bin, static_cast<uint16_t>(token));
      } else {
        Append<int32_t>(&files.bin, static_cast<int32_t>(token));
      }
    }
  }
  files.idx.append("MMIDIDX\0\0", 9);
  Append<uint64_t>(&files.idx, 1);
  Append<uint8_t>(&files.idx, static_cast<uint8_t>(dtype_code));
  Append<uint64_t>(&files.idx, lengths.size());
  Append<uint64_t>(&files.idx, document_indices.size());
  for (int32_t length : lengths) Append<int32_t>(&files.idx, length);
  int64_t pointer = 0;
  for (int32_t length : lengths) {
    Append<int64_t>(&files.idx, pointer);
    pointer += static_cast<int64_t>(length) * token_bytes;
  }
  for (int64_t index : document_indices) Append<int64_t>(&files.idx, index);
  if (sequence_modes) files.idx.append(lengths.size(), '\0');
  return files;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void WriteMegatron(const std::string& prefix, const MegatronFileBytes& files) {
  WriteBytes(prefix + ".bin", files.bin);
  WriteBytes(prefix + ".idx", files.idx);
}

bool HavePython() { return std::system("python3 -c pass >/dev/null 2>&1") == 0; }

bool HaveNumpy() { return std::system("python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

int RunTokenWriter(const std::string& arguments) {
  const std::string command =
      std::string("python3 " TANDEM_TOKENS_TEST_DIR "/write_token_shards.py ") + arguments;
  return std::system(command.c_str());
}

}  // namespace tandem::data::testing
