// A read-only memory mapping of a whole regular file, for the readers of large inputs (token
// shards, safetensors files). The mapping
// is never written and never read whole by this class: callers read the pages they touch.
//
// The file must not be truncated or rewritten while it is mapped: reading a page past a file
// that shrank underneath is a SIGBUS, which no status can report (the same contract as numpy's
// memmap, which Megatron-LM and nanoGPT use).
//
// Thread safety: immutable after Open; every const method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

class MappedFile {
 public:
  // Maps `path` read-only. NotFound for a missing file; InvalidArgument for something that is
  // not a regular file (a folder, a FIFO, a device: never opened for reading, so never waited
  // on); each names the path. An empty file maps to no bytes (data() is null).
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  int64_t size_bytes() const { return size_bytes_; }

  // Hints that the whole file will be read in order soon (a full scan), and back to the
  // default (random windows) once done. Advice only.
  void AdviseSequential() const;
  void AdviseNormal() const;

 private:
  MappedFile(std::string path, const uint8_t* data, int64_t size_bytes)
      : path_(std::move(path)), data_(data), size_bytes_(size_bytes) {}

  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_bytes_ = 0;
};

}  // namespace tandem
