// Test helpers for the data module: token files in each format, written byte by byte from the
// layouts documented in data/token_dataset.h, a temporary folder, and the Python writer
// (write_token_shards.py) beside these tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::data::testing {

// A fresh folder under $TMPDIR (or /tmp), removed with its contents when destroyed.
class TemporaryFolder {
 public:
  TemporaryFolder();
  ~TemporaryFolder();
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The deterministic test token at `index` of a stream labelled `stream`, in [0, vocabulary).
// write_token_shards.py computes the same numbers.
int64_t TestToken(int64_t stream, int64_t index, int64_t vocabulary);
std::vector<int64_t> TestTokens(int64_t stream, int64_t count, int64_t vocabulary);

// llm.c: 256 int32 header (magic, version, count), then uint16 (version 1) or uint32 tokens.
std::string LlmcBytes(const std::vector<int64_t>& tokens, int version = 1);
// nanoGPT: headerless uint16.
std::string NanoGptBytes(const std::vector<int64_t>& tokens);

struct MegatronFileBytes {
  std::string bin;
  std::string idx;
};
// Megatron-LM's indexed dataset with `documents`, each cut into `sequences_per_document`
// sequences as evenly as possible; `dtype_code` 8 (uint16) or 4 (int32) — any other code is
// written as given, with 4-byte tokens; `sequence_modes` appends the multimodal int8 modes.
MegatronFileBytes MegatronBytes(const std::vector<std::vector<int64_t>>& documents,
                                int dtype_code = 8, int sequences_per_document = 1,
                                bool sequence_modes = false);

void WriteBytes(const std::string& path, const std::string& bytes);
std::string ReadBytes(const std::string& path);
void WriteMegatron(const std::string& prefix, const MegatronFileBytes& files);

// Whether python3 runs, and whether it has numpy.
bool HavePython();
bool HaveNumpy();
// Runs tests/tokens/write_token_shards.py with `arguments`; returns its exit status.
int RunTokenWriter(const std::string& arguments);

}  // namespace tandem::data::testing
