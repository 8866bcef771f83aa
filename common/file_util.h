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
