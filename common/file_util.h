// File helpers. Output files are written atomically (temporary file in the same folder,
// flushed, then renamed) so a crash or an error never leaves a half-written file that looks
// valid.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Reads a whole file. NotFound / InvalidArgument name the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to `path`. "-" writes to standard output. A regular file (or a new one)
// is replaced atomically: written beside it and renamed onto it, keeping its permissions. A
// symbolic link is followed (the link stays, its target is written); a FIFO or a device file
// is written directly, never replaced. A directory is InvalidArgument.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace tandem
