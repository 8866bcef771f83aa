// Memory that a communication library may still use after the operation using it was given
// up on.
//
// A Work that timed out, failed or was aborted (Communicator::Abort) reads as done, but what
// it posted is not retracted: MPI may still deliver into a receive's buffer, or read a send's,
// long after the caller has moved on (NCCL likewise, until its communicator is destroyed).
// Freeing that memory would let a late message corrupt whatever is allocated there next. So
// memory an operation given up on may still touch is handed to KeepAliveAfterAbort and stays
// allocated until the process ends. This happens only after a failure and only for what was in
// flight then (sizes, headers, heartbeats, the buffers of the transfers being waited for).
//
// The usual shape: keep the buffer on the heap while the operation runs, and on an error
// return hand it over instead of dropping it:
//   auto size = std::make_shared<int64_t>(0);
//   absl::Status s = comm.Recv(comm::CpuBuffer(size.get(), 1), peer, tag)->Wait();
//   if (!s.ok()) { comm::KeepAliveAfterAbort(size); return s; }
#pragma once

#include <memory>

namespace tandem::comm {

// Keeps `memory` allocated until the process ends. Thread-safe; null is ignored.
void KeepAliveAfterAbort(std::shared_ptr<void> memory);

}  // namespace tandem::comm
