// Activation and gradient transfers between pipeline neighbours without per-model code.
//
// Every transfer is two or more point-to-point messages on one communicator and tag: first a
// fixed-size header (TransferHeader: which action it belongs to, how many tensors, and each
// tensor's dtype and shape), then one message per tensor. The receiver waits for the header,
// checks that it belongs to the transfer it expects (action type, stage, micro-batch,
// replica), allocates tensors of the announced shapes and receives into them. A header is
// sent before every payload (rather than caching shapes after a first exchange) so shapes may
// change between micro-batches (e.g. the last, smaller micro-batch of a data set) and a
// routing mistake is caught as an error naming both transfers instead of garbage data. The
// header is 64 int64s; its cost is one small message per transfer.
//
// Ordering: messages between a pair of ranks on one tag are matched in the order posted
// (MPI's non-overtaking rule, NCCL's FIFO), so a receive's payload is posted only after its
// header arrived and before the next header from the same peer is waited for.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "pipeline/schedule.h"
#include "runtime/stage.h"

namespace tandem::runtime {

inline constexpr int kMaxTensorsPerTransfer = 4;
inline constexpr int kMaxTensorDims = 8;
inline constexpr int kTransferHeaderWords = 64;

// Identity and shapes of one transfer, as 64 int64 words on the wire.
struct TransferHeader {
  pipeline::ActionType type = pipeline::ActionType::kSendActivation;  // the send's type
  int stage = 0;
  int microbatch = 0;
  int replica = 0;
  std::vector<TensorMeta> tensors;

  using Words = std::array<int64_t, kTransferHeaderWords>;
  // InvalidArgument when there are too many tensors or dimensions.
  absl::StatusOr<Words> Encode() const;
  // DataLoss when the words are not a header (bad magic, counts out of range).
  static absl::StatusOr<TransferHeader> Decode(const Words& words);
  // "sA3.1r1 [8x16 float32]".
  std::string Describe() const;
};

// A send in flight: its Work handles and what must stay alive until they complete.
class PendingSend {
 public:
  PendingSend(std::string what, std::shared_ptr<TransferHeader::Words> header,
              std::vector<Tensor> tensors, std::vector<comm::WorkPtr> works)
      : what_(std::move(what)), header_(std::move(header)), tensors_(std::move(tensors)),
        works_(std::move(works)) {}
  // True when every message is sent; an error if one failed.
  absl::StatusOr<bool> Test();
  absl::Status Wait();
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  std::shared_ptr<TransferHeader::Words> header_;
  std::vector<Tensor> tensors_;
  std::vector<comm::WorkPtr> works_;
};

// Posts the header and the tensors to `peer` without waiting.
absl::StatusOr<PendingSend> SendTensors(comm::Communicator& comm, int peer, int tag,
                                        const TransferHeader& header,
                                        std::vector<Tensor> tensors);
// The same with the payloads on `payload_comm` (over the same ranks), e.g. NCCL for CUDA
// tensors while the header travels on MPI. NCCL has no tags: payloads use tag 0 there.
absl::StatusOr<PendingSend> SendTensors(comm::Communicator& header_comm,
                                        comm::Communicator& payload_comm, int peer, int tag,
                                        const TransferHeader& header,
                                        std::vector<Tensor> tensors);

// Receives a transfer from `peer` whose header must match `expected` (type, stage,
// micro-batch, replica; shapes are taken from the header). `allocate` makes the tensors to
// receive into. Waits with the communicator's timeout. After a failed wait the posted
// receive's memory is deliberately leaked (the library may still write into it).
absl::StatusOr<std::vector<Tensor>> ReceiveTensors(
    comm::Communicator& comm, int peer, int tag, const TransferHeader& expected,
    const std::function<absl::StatusOr<Tensor>(const TensorMeta&)>& allocate);
absl::StatusOr<std::vector<Tensor>> ReceiveTensors(
    comm::Communicator& header_comm, comm::Communicator& payload_comm, int peer, int tag,
    const TransferHeader& expected,
    const std::function<absl::StatusOr<Tensor>(const TensorMeta&)>& allocate);

}  // namespace tandem::runtime
