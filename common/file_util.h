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

// Removes `path` and, if it is a folder, everything under it (symbolic links are removed, not
// followed); a path that does not exist is fine. What std::filesystem::remove_all does, without
// it: PyTorch's pip LibTorch (2.11) exports its own copy of that function, which the dynamic
// linker binds in every program linked against it, and which crashes (a call through null).
absl::Status RemoveAll(const std::string& path);

}  // namespace tandem
