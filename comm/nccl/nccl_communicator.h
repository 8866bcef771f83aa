// The NCCL backend: a Communicator over NCCL for CUDA buffers (one process per GPU).
// Declarations live in comm/backend.h (CreateNcclCommunicator, CudaDeviceCount); this header
// exists for code inside comm/ that needs the concrete type.
#pragma once

#include "comm/backend.h"
