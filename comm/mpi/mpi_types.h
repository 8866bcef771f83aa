// Mapping of tandem's data types and reductions onto MPI (internal to the MPI backend).
// bfloat16 and float16 have no MPI type: they travel as a committed 2-byte contiguous type
// with user-defined commutative reductions that compute in float32 and round back.
#pragma once

#include <mpi.h>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace tandem::comm::mpi_internal {

// The MPI datatype for `type` (creates the 16-bit float types on first use; thread-safe).
absl::StatusOr<MPI_Datatype> ToMpiType(DataType type);
// MPI's own datatype for `type`; MPI_DATATYPE_NULL for the 16-bit floats (ToMpiType) or an
// unknown value. No allocation, no lock: for the small point-to-point path.
MPI_Datatype BuiltinMpiType(DataType type);
// The MPI reduction for `op` on `type`; kAverage maps to the sum (the caller divides).
absl::StatusOr<MPI_Op> ToMpiOp(ReduceOp op, DataType type);

}  // namespace tandem::comm::mpi_internal
