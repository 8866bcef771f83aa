#include "runtime/control.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/buffer.h"
#include "comm/keep_alive.h"
#include "common/status.h"

namespace tandem::runtime {

comm::Buffer DoubleBuffer(double* data, int64_t count) {
  comm::Buffer b;
  b.data = data;
  b.count = count;
  b.dtype = comm::DataType::kFloat64;
  return b;
}

absl::Status AgreeOnSuccess(comm::Communicator* world, const absl::Status& local,
                            absl::string_view what) {
  // rank * 32 + status code: the minimum names the lowest failing rank and its code (codes
  // are below 32), which every other rank reports, so bad input is bad input everywhere.
  constexpr double kNone = 1e15;
  double failed = local.ok() ? kNone
                             : static_cast<double>(world->rank()) * 32 +
                                   static_cast<double>(static_cast<int>(local.code()) & 31);
  absl::Status s = world->AllReduce(DoubleBuffer(&failed, 1), comm::ReduceOp::kMin)->Wait();
  if (!local.ok()) return local;
  if (!s.ok()) return Annotate(s, absl::StrCat("agreeing on ", what));
  if (failed != kNone) {
    const int64_t encoded = static_cast<int64_t>(failed);
    return absl::Status(static_cast<absl::StatusCode>(encoded % 32),
                        absl::StrCat("rank ", encoded / 32, " failed ", what, " (see its error)"));
  }
  return absl::OkStatus();
}

namespace {

// Sends a string to `peer` / receives one from `peer` (size first, then bytes).
absl::Status SendString(comm::Communicator& comm, int peer, const std::string& text) {
  int64_t size = static_cast<int64_t>(text.size());
  comm::Buffer size_buffer;
  size_buffer.data = &size;
  size_buffer.count = 1;
  size_buffer.dtype = comm::DataType::kInt64;
  TANDEM_RETURN_IF_ERROR(comm.Send(size_buffer, peer, kGatherTag)->Wait());
  comm::Buffer bytes;
  bytes.data = const_cast<char*>(text.data());
  bytes.count = size;
  bytes.dtype = comm::DataType::kUInt8;
  return comm.Send(bytes, peer, kGatherTag)->Wait();
}

absl::StatusOr<std::string> ReceiveString(comm::Communicator& comm, int peer) {
  int64_t size = 0;
  comm::Buffer size_buffer;
  size_buffer.data = &size;
  size_buffer.count = 1;
  size_buffer.dtype = comm::DataType::kInt64;
  TANDEM_RETURN_IF_ERROR(comm.Recv(size_buffer, peer, kGatherTag)->Wait());
  std::string text(static_cast<size_t>(size), '\0');
  comm::Buffer bytes;
  bytes.data = text.data();
  bytes.count = size;
  bytes.dtype = comm::DataType::kUInt8;
  TANDEM_RETURN_IF_ERROR(comm.Recv(bytes, peer, kGatherTag)->Wait());
  return text;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> GatherStrings(comm::Communicator& comm,
                                                       const std::string& mine) {
  std::vector<std::string> all;
  if (comm.rank() != 0) {
    TANDEM_RETURN_IF_ERROR(SendString(comm, 0, mine));
    return all;
  }
  all.resize(comm.size());
  all[0] = mine;
  for (int r = 1; r < comm.size(); ++r) {
    TANDEM_ASSIGN_OR_RETURN(all[r], ReceiveString(comm, r));
  }
  return all;
}

absl::StatusOr<std::string> BroadcastString(comm::Communicator& comm, std::string text) {
  // On the heap: a broadcast given up on may still write into them.
  auto size = std::make_shared<int64_t>(static_cast<int64_t>(text.size()));
  const absl::Status sized = comm.Broadcast(comm::CpuBuffer(size.get(), 1), /*root=*/0)->Wait();
  if (!sized.ok()) {
    comm::KeepAliveAfterAbort(size);
    return sized;
  }
  auto bytes = std::make_shared<std::string>(std::move(text));
  bytes->resize(static_cast<size_t>(*size));
  const absl::Status sent =
      comm.Broadcast(comm::MakeBuffer(bytes->data(), *size, comm::DataType::kUInt8), /*root=*/0)
          ->Wait();
  if (!sent.ok()) {
    comm::KeepAliveAfterAbort(bytes);
    return sent;
  }
  return std::move(*bytes);
}

}  // namespace tandem::runtime
