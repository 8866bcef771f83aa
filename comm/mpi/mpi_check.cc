// MPI error codes as absl::Status (see comm/check.h).
#include <mpi.h>

#include "comm/check.h"

namespace tandem::comm::internal {

absl::Status MpiErrorStatus(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    snprintf(text, sizeof(text), "MPI error code %d", code);
  }
  int error_class = code;
  MPI_Error_class(code, &error_class);
  absl::StatusCode status_code = absl::StatusCode::kInternal;
  if (error_class == MPI_ERR_TRUNCATE || error_class == MPI_ERR_COUNT ||
      error_class == MPI_ERR_TYPE || error_class == MPI_ERR_RANK || error_class == MPI_ERR_TAG ||
      error_class == MPI_ERR_ROOT || error_class == MPI_ERR_BUFFER) {
    status_code = absl::StatusCode::kInvalidArgument;
  }
#ifdef MPIX_ERR_PROC_FAILED
  if (error_class == MPIX_ERR_PROC_FAILED) status_code = absl::StatusCode::kUnavailable;
#endif
  return LibraryError(status_code, "MPI", call, text, file, line);
}

}  // namespace tandem::comm::internal
