#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(error)));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file (a token shard must be a file)"));
  }
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat above, open() returns at
  // once instead of waiting for a writer; the fstat below then refuses it.
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (descriptor < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  if (::fstat(descriptor, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(descriptor);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const int64_t size_bytes = static_cast<int64_t>(info.st_size);
  const uint8_t* data = nullptr;
  if (size_bytes > 0) {
    void* mapping =
        ::mmap(nullptr, static_cast<size_t>(size_bytes), PROT_READ, MAP_PRIVATE, descriptor, 0);
    if (mapping == MAP_FAILED) {
      const int error = errno;
      ::close(descriptor);
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": cannot map ", size_bytes, " bytes: ", std::strerror(error)));
    }
    data = static_cast<const uint8_t*>(mapping);
  }
  ::close(descriptor);  // the mapping keeps the file open
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size_bytes));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_bytes_));
}

void MappedFile::AdviseSequential() const {
  if (data_ != nullptr) {
    ::madvise(const_cast<uint8_t*>(data_), static_cast<size_t>(size_bytes_), MADV_SEQUENTIAL);
  }
}

void MappedFile::AdviseNormal() const {
  if (data_ != nullptr) {
    ::madvise(const_cast<uint8_t*>(data_), static_cast<size_t>(size_bytes_), MADV_NORMAL);
  }
}

}  // namespace tandem
