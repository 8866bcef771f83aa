#include "common/file_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  // One read of the size fstat reports, then on until end of file (the size may change, and
  // pipes report none).
  std::string contents;
  struct stat opened;
  if (::fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode) && opened.st_size > 0) {
    contents.reserve(static_cast<size_t>(opened.st_size) + 1);
  }
  constexpr size_t kChunk = 1 << 16;
  while (true) {
    const size_t room = contents.capacity() > contents.size()
                            ? contents.capacity() - contents.size()
                            : kChunk;
    const size_t old_size = contents.size();
    contents.resize(old_size + room);
    const ssize_t got = ::read(fd, contents.data() + old_size, room);
    if (got < 0) {
      const int error = errno;
      contents.resize(old_size);
      if (error == EINTR) continue;
      ::close(fd);
      return absl::DataLossError(absl::StrCat(path, ": read error: ", std::strerror(error)));
    }
    contents.resize(old_size + static_cast<size_t>(got));
    if (got == 0) break;
  }
  ::close(fd);
  return contents;
}

namespace {

// Writes all of `contents` to `fd`; errno on failure.
bool WriteAll(int fd, absl::string_view contents) {
  const char* p = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

// The file a path names once symbolic links are followed (the last link's target when it
// dangles, relative targets taken from the link's folder); the path itself otherwise.
std::string FollowLinks(const std::string& path) {
  std::string current = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st;
    if (::lstat(current.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return current;
    std::vector<char> target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4095) + 1);
    const ssize_t n = ::readlink(current.c_str(), target.data(), target.size() - 1);
    if (n < 0) return current;
    std::string next(target.data(), static_cast<size_t>(n));
    if (!next.empty() && next[0] != '/') {
      const size_t slash = current.rfind('/');
      if (slash != std::string::npos) next = current.substr(0, slash + 1) + next;
    }
    current = next;
  }
  return current;
}

}  // namespace

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path) {
  AtomicFileWriter writer;
  writer.path_ = path;
  if (path == "-") {
    writer.to_stdout_ = true;
    return writer;
  }
  if (path.empty()) return absl::InvalidArgumentError("empty output path");
  // Through symbolic links to what they name: the link stays a link.
  writer.target_ = FollowLinks(path);
  struct stat st;
  const bool exists = ::stat(writer.target_.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory (give a file name for the output)"));
  }
  if (exists && !S_ISREG(st.st_mode)) {
    // A FIFO, a device (/dev/null, /dev/stdout) or a socket: written directly, never replaced.
    writer.fd_ = ::open(writer.target_.c_str(), O_WRONLY | O_CLOEXEC);
    if (writer.fd_ < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": cannot open for writing: ", std::strerror(errno)));
    }
    return writer;
  }
  // A regular file (or none yet): written beside it and renamed onto it, so a reader never
  // sees half of it; an existing file keeps its permissions.
  // One temporary per writer: two writers open at once on one path (--trace and --svg
  // naming the same file) must not share one, or each would write over the other's bytes.
  static std::atomic<int64_t> writers{0};
  writer.tmp_ = absl::StrCat(writer.target_, ".tmp.", ::getpid(), ".", writers++);
  writer.fd_ = ::open(writer.tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                      0644);
  if (writer.fd_ < 0) {
    const int err = errno;
    writer.tmp_.clear();
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot create: ", std::strerror(err)));
  }
  if (exists) ::fchmod(writer.fd_, st.st_mode & 07777);
  return writer;
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept { *this = std::move(other); }

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Discard();
    path_ = std::move(other.path_);
    target_ = std::move(other.target_);
    tmp_ = std::move(other.tmp_);
    fd_ = std::exchange(other.fd_, -1);
    to_stdout_ = std::exchange(other.to_stdout_, false);
    error_ = other.error_;
    written_ = other.written_;
    buffer_ = std::move(other.buffer_);
    other.tmp_.clear();
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Discard(); }

void AtomicFileWriter::Discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
}

void AtomicFileWriter::Append(absl::string_view text) {
  if (text.size() < kBufferBytes) {
    buffer_.append(text.data(), text.size());
    Flush();
    return;
  }
  // Large text is written from where it is, not copied into the buffer first.
  WriteBuffer();
  written_ += static_cast<int64_t>(text.size());
  if (error_ != 0) return;
  if (to_stdout_) {
    std::cout.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!std::cout) error_ = EIO;
  } else if (fd_ >= 0 && !WriteAll(fd_, text)) {
    error_ = errno;
  }
}

void AtomicFileWriter::WriteBuffer() {
  written_ += static_cast<int64_t>(buffer_.size());
  if (error_ == 0) {
    if (to_stdout_) {
      std::cout.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
      if (!std::cout) error_ = EIO;
    } else if (fd_ >= 0 && !WriteAll(fd_, buffer_)) {
      error_ = errno;
    }
  }
  buffer_.clear();
}

absl::Status AtomicFileWriter::Commit() {
  WriteBuffer();
  if (to_stdout_) {
    std::cout.flush();
    to_stdout_ = false;
    if (error_ != 0 || !std::cout) {
      return absl::DataLossError(absl::StrCat(path_, ": write failed"));
    }
    return absl::OkStatus();
  }
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": not open"));
  if (error_ != 0) {
    const int err = error_;
    Discard();
    return absl::DataLossError(absl::StrCat(path_, ": write failed: ", std::strerror(err)));
  }
  if (tmp_.empty()) {  // written directly
    const int fd = std::exchange(fd_, -1);
    ::close(fd);
    return absl::OkStatus();
  }
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    Discard();
    return absl::DataLossError(absl::StrCat(path_, ": flush failed: ", std::strerror(err)));
  }
  if (std::rename(tmp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    Discard();
    return absl::DataLossError(absl::StrCat(path_, ": rename failed: ", std::strerror(err)));
  }
  tmp_.clear();
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  TANDEM_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Open(path));
  writer.Append(contents);
  return writer.Commit();
}

namespace {

int RemoveOne(const char* path, const struct stat*, int type, struct FTW*) {
  return (type == FTW_DP ? rmdir(path) : unlink(path)) == 0 ? 0 : errno;
}

}  // namespace

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes) {
  // Non-blocking, so that opening a FIFO without a writer returns at once.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open: ", std::strerror(error)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    const char* kind = S_ISDIR(info.st_mode)    ? "a folder"
                       : S_ISFIFO(info.st_mode) ? "a FIFO"
                       : S_ISCHR(info.st_mode)  ? "a character device"
                       : S_ISBLK(info.st_mode)  ? "a block device"
                       : S_ISSOCK(info.st_mode) ? "a socket"
                                                : "not a regular file";
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is ", kind, ", not a regular file; refusing to read it"));
  }
  if (info.st_size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": ", info.st_size,
                                                     " bytes, more than the ", max_bytes,
                                                     " this file may have"));
  }
  // Blocking reads again (a regular file never blocks, but O_NONBLOCK stays harmless).
  std::string contents(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t got = ::read(fd, contents.data() + done, contents.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": read: ", std::strerror(errno)));
    }
    if (got == 0) break;  // shrank while being read
    done += static_cast<size_t>(got);
  }
  contents.resize(done);
  return contents;
}

absl::Status AppendToFile(const std::string& path, absl::string_view text) {
  if (path == "-") {
    std::cout << text << std::flush;
    return std::cout ? absl::OkStatus() : absl::InternalError("writing standard output");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open for appending: ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t wrote = ::write(fd, text.data() + done, text.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) {
      const int error = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": append: ", std::strerror(error)));
    }
    done += static_cast<size_t>(wrote);
  }
  if (::close(fd) != 0) {
    return absl::InternalError(absl::StrCat(path, ": close: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

namespace {

// The folder holding `path` ("." for a bare name).
std::string FolderOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status OutputError(absl::string_view what, const std::string& path,
                         absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": ", problem));
}

}  // namespace

absl::Status CheckOutputFile(const std::string& path, absl::string_view what) {
  if (path == "-") return absl::OkStatus();
  if (path.empty() || path.back() == '/') return OutputError(what, path, "not a file name");
  struct stat info;
  if (::stat(path.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) return OutputError(what, path, "is a folder");
    if (::access(path.c_str(), W_OK) != 0) {
      return OutputError(what, path, absl::StrCat("cannot be written: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  const std::string folder = FolderOf(path);
  if (::stat(folder.c_str(), &info) != 0) {
    return OutputError(what, path,
                       absl::StrCat("its folder ", folder, " does not exist (create it first)"));
  }
  if (!S_ISDIR(info.st_mode)) return OutputError(what, path, folder + " is not a folder");
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return OutputError(what, path, absl::StrCat("its folder ", folder, " cannot be written: ",
                                                std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckOutputFolder(const std::string& path, absl::string_view what) {
  if (path.empty()) return OutputError(what, path, "empty");
  std::string existing;
  struct stat info;
  // Ranks of one job check the same path at once, and each makes and removes the first
  // missing folder (below): the folder found may be another rank's, gone again before it is
  // checked. Then the check starts over.
  for (int attempt = 0;; ++attempt) {
    existing = path;
    while (existing.size() > 1 && existing.back() == '/') existing.pop_back();
    while (::stat(existing.c_str(), &info) != 0) {
      const std::string above = FolderOf(existing);
      if ((errno != ENOENT && errno != ENOTDIR) || above == existing) {
        return OutputError(what, path, absl::StrCat(existing, ": ", std::strerror(errno)));
      }
      existing = above;
    }
    if (!S_ISDIR(info.st_mode)) {
      return OutputError(what, path, absl::StrCat(existing, " is a file, not a folder"));
    }
    if (::access(existing.c_str(), W_OK | X_OK) == 0) break;
    if (errno != ENOENT || attempt >= 100) {
      return OutputError(what, path, absl::StrCat(existing, " cannot be written: ",
                                                  std::strerror(errno)));
    }
  }
  // Permissions do not say everything (a read-only or virtual file system such as /sys takes
  // no folder, even from root): the first missing folder is made and removed again.
  std::string wanted = path;
  while (wanted.size() > 1 && wanted.back() == '/') wanted.pop_back();
  if (wanted != existing) {
    std::string first = wanted;
    while (FolderOf(first) != existing && FolderOf(first) != first) first = FolderOf(first);
    // Another rank checking the same path may have made it meanwhile (EEXIST): fine.
    if (::mkdir(first.c_str(), 0755) == 0) {
      ::rmdir(first.c_str());
    } else if (errno != EEXIST) {
      return OutputError(what, path, absl::StrCat(first, " cannot be made: ",
                                                  std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status RemoveAll(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(info.st_mode)) {
    if (unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(path, ": cannot remove: ", std::strerror(errno)));
  }
  const int failed = nftw(path.c_str(), RemoveOne, 16, FTW_DEPTH | FTW_PHYS);
  if (failed != 0) {
    const int error = failed > 0 ? failed : errno;
    return absl::InternalError(absl::StrCat(path, ": cannot remove: ", std::strerror(error)));
  }
  return absl::OkStatus();
}

}  // namespace tandem
