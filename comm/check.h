// One checking macro per library: each turns the library's error code into an absl::Status
// naming the library, the failed call, the error text, and the file and line, and returns it
// from the enclosing function (which must return absl::Status or absl::StatusOr<T>).
//
//   TANDEM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
//   TANDEM_CUDA_CHECK(cudaStreamCreate(&stream));    // comm/nccl/ only
//   TANDEM_NCCL_CHECK(ncclCommInitRank(...));        // comm/nccl/ only
//
// The macros expand at the call site, so this header includes none of the libraries: MPI code
// includes <mpi.h>, CUDA and NCCL code (only under comm/nccl/) their own headers.
// The *_STATUS variants give the status without returning, for code that must clean up first.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::comm::internal {

// "<library> error in <call> at <file>:<line>: <text>", with `code` chosen by the caller.
inline absl::Status LibraryError(absl::StatusCode code, const char* library, const char* call,
                                 const std::string& text, const char* file, int line) {
  return absl::Status(code, absl::StrCat(library, " error in ", call, " at ", file, ":", line,
                                         ": ", text));
}

}  // namespace tandem::comm::internal

// ---- MPI ----------------------------------------------------------------------------------
// MPI errors become Internal, except MPI_ERR_TRUNCATE (a mismatched message: InvalidArgument)
// and failures of a peer process (Unavailable).
#define TANDEM_MPI_STATUS(expr) ::tandem::comm::internal::MpiErrorStatus((expr), #expr, __FILE__, __LINE__)
#define TANDEM_MPI_CHECK(expr)                                       \
  do {                                                               \
    const int _tandem_mpi_rc = (expr);                               \
    if (_tandem_mpi_rc != MPI_SUCCESS) {                             \
      return ::tandem::comm::internal::MpiErrorStatus(_tandem_mpi_rc, #expr, __FILE__, __LINE__); \
    }                                                                \
  } while (0)

namespace tandem::comm::internal {
// Defined in comm/mpi/mpi_check.cc; OK for MPI_SUCCESS.
absl::Status MpiErrorStatus(int code, const char* call, const char* file, int line);
}  // namespace tandem::comm::internal

// ---- CUDA runtime ---------------------------------------------------------------------------
#define TANDEM_CUDA_STATUS(expr)                                                               \
  ([&]() -> ::absl::Status {                                                                   \
    const cudaError_t _tandem_cuda_rc = (expr);                                                \
    if (_tandem_cuda_rc == cudaSuccess) return ::absl::OkStatus();                             \
    return ::tandem::comm::internal::LibraryError(                                             \
        ::absl::StatusCode::kInternal, "CUDA", #expr,                                          \
        ::absl::StrCat(cudaGetErrorName(_tandem_cuda_rc), ": ",                                \
                       cudaGetErrorString(_tandem_cuda_rc)),                                   \
        __FILE__, __LINE__);                                                                   \
  }())
#define TANDEM_CUDA_CHECK(expr)                                   \
  do {                                                            \
    ::absl::Status _tandem_cuda_status = TANDEM_CUDA_STATUS(expr); \
    if (!_tandem_cuda_status.ok()) return _tandem_cuda_status;    \
  } while (0)

// ---- NCCL -------------------------------------------------------------------------------------
// ncclInProgress (non-blocking communicators) is not an error; ncclRemoteError (a peer failed)
// becomes Unavailable, everything else Internal.
#define TANDEM_NCCL_STATUS(expr)                                                               \
  ([&]() -> ::absl::Status {                                                                   \
    const ncclResult_t _tandem_nccl_rc = (expr);                                               \
    if (_tandem_nccl_rc == ncclSuccess || _tandem_nccl_rc == ncclInProgress) {                 \
      return ::absl::OkStatus();                                                               \
    }                                                                                          \
    return ::tandem::comm::internal::LibraryError(                                             \
        _tandem_nccl_rc == ncclRemoteError ? ::absl::StatusCode::kUnavailable                  \
        : _tandem_nccl_rc == ncclInvalidArgument || _tandem_nccl_rc == ncclInvalidUsage        \
            ? ::absl::StatusCode::kInvalidArgument                                             \
            : ::absl::StatusCode::kInternal,                                                   \
        "NCCL", #expr, ncclGetErrorString(_tandem_nccl_rc), __FILE__, __LINE__);               \
  }())
#define TANDEM_NCCL_CHECK(expr)                                   \
  do {                                                            \
    ::absl::Status _tandem_nccl_status = TANDEM_NCCL_STATUS(expr); \
    if (!_tandem_nccl_status.ok()) return _tandem_nccl_status;    \
  } while (0)
