// File helpers. Output files are written atomically (temporary file in the same folder,
// flushed, then renamed) so a crash or an error never leaves a half-written file that looks
// valid.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Reads a whole file. NotFound / InvalidArgument name the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Reads a whole file that must be a regular file (a symbolic link to one is followed) of at
// most `max_bytes`: a FIFO, a device, a socket or a folder is InvalidArgument without being
// read (so a reader never hangs on one or reads forever), a larger file is
// ResourceExhausted, a missing one NotFound; each names the path.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes);

// Writes `contents` to `path`. "-" writes to standard output. A regular file (or a new one)
// is replaced atomically: written beside it and renamed onto it, keeping its permissions. A
// symbolic link is followed (the link stays, its target is written); a FIFO or a device file
// is written directly, never replaced. A directory is InvalidArgument.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// WriteFileAtomically for output too large to hold in memory (a 10^8-action schedule's
// timeline is gigabytes of JSON): Open, Append as it is made (buffered), then Commit, which
// renames the finished file onto `path`. Until Commit nothing appears at `path`: a writer
// destroyed without it (an error on the way) removes its temporary file, so a failed command
// leaves no half-written output. "-", a FIFO or a device are written directly as they go.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> Open(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  // Buffers `text`, writing the buffer out when it fills. An error is kept and reported by
  // Commit (later appends are dropped).
  void Append(absl::string_view text);
  // The buffer to append to directly (for formatting without a temporary string); call
  // Flush() now and then so it does not grow without bound.
  std::string& buffer() { return buffer_; }
  void Flush() {
    if (buffer_.size() >= kBufferBytes) WriteBuffer();
  }
  // Writes what is buffered, flushes it to disk and renames the file onto the path.
  absl::Status Commit();
  // Bytes appended so far.
  int64_t bytes() const { return written_ + static_cast<int64_t>(buffer_.size()); }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  AtomicFileWriter() = default;
  void WriteBuffer();
  void Discard();

  std::string path_;    // as given, for messages
  std::string target_;  // what is replaced (links followed)
  std::string tmp_;     // empty when written directly
  int fd_ = -1;
  bool to_stdout_ = false;
  int error_ = 0;  // errno of the first failed write
  int64_t written_ = 0;  // bytes out of the buffer
  std::string buffer_;
};

// Checks, before any work is done, that an output file can be written at `path`: its folder
// exists and is writable, and `path` is not a folder (an existing file must be writable). "-"
// (standard output) passes. InvalidArgument names `what` (e.g. "--log-json") and the path.
absl::Status CheckOutputFile(const std::string& path, absl::string_view what);

// The same for an output folder that is created with its missing parents when written: `path`
// is a writable folder, or the nearest folder above it that exists is writable (a file in the
// way is InvalidArgument).
absl::Status CheckOutputFolder(const std::string& path, absl::string_view what);

// Appends `text` to `path` (created if missing; "-" is standard output) and returns once it is
// written:
// for logs that grow a line at a time, which rewriting whole would make quadratic.
absl::Status AppendToFile(const std::string& path, absl::string_view text);

// Removes `path` and, if it is a folder, everything under it (symbolic links are removed, not
// followed); a path that does not exist is fine. What std::filesystem::remove_all does, without
// it: PyTorch's pip LibTorch (2.11) exports its own copy of that function, which the dynamic
// linker binds in every program linked against it, and which crashes (a call through null).
absl::Status RemoveAll(const std::string& path);

}  // namespace tandem
