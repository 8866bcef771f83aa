#include "common/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return out.str();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  if (path == "-") {
    std::cout.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    std::cout.flush();
    return absl::OkStatus();
  }
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  const char* p = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::DataLossError(absl::StrCat(path, ": write failed: ", std::strerror(err)));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat(path, ": flush failed: ", std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat(path, ": rename failed: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace tandem
