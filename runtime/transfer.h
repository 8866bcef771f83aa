// Activation and gradient transfers between pipeline neighbours without per-model code.
//
// One protocol, TransferBatcher's (below). A run of consecutive sends and receives of one rank,
// as the schedule IR groups them, goes out as one SendRecvBatch (one NCCL group, so neighbours
// that send to each other at the same moment cannot deadlock). The first transfer of each kind
// (peer, action type, stage, replica) is preceded by a header (TransferHeader: the action it
// belongs to, how many tensors, each tensor's dtype and shape; 64 int64 words): the receiver
// checks it against the transfer it expects, so a routing mistake is an error naming both
// transfers instead of garbage data, and both sides then cache the shapes. Later transfers of
// that kind carry only their tensors, so a stage's outputs must keep their shapes from
// micro-batch to micro-batch: a sender whose shapes differ from the cached ones fails with
// InvalidArgument before anything is posted.
//
// Ordering: messages between a pair of ranks on one tag are matched in the order posted
// (MPI's non-overtaking rule, NCCL's FIFO); both ends post matching runs in the same order, as
// the validated schedule guarantees. Received tensors are waited for only when first used
// (ArrivingTensors). Memory that an operation given up on (an error, a timeout, an abort) may
// still touch is kept alive until the process ends (comm/keep_alive.h).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
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

// A batch's sends in flight: their Work handles and what must stay alive until they complete
// (the headers of first exchanges, the tensors).
class PendingSend {
 public:
  PendingSend(std::string what, std::vector<std::shared_ptr<TransferHeader::Words>> headers,
              std::vector<Tensor> tensors, std::vector<comm::WorkPtr> works)
      : what_(std::move(what)), headers_(std::move(headers)), tensors_(std::move(tensors)),
        works_(std::move(works)) {}
  // True when every message is sent; an error if one failed.
  absl::StatusOr<bool> Test();
  absl::Status Wait();
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  std::vector<std::shared_ptr<TransferHeader::Words>> headers_;
  std::vector<Tensor> tensors_;
  std::vector<comm::WorkPtr> works_;
};

// Tensors received (or being received): wait before the first use.
class ArrivingTensors {
 public:
  ArrivingTensors() = default;
  ArrivingTensors(std::vector<Tensor> tensors, comm::WorkPtr ready, std::string what)
      : tensors_(std::move(tensors)), ready_(std::move(ready)), what_(std::move(what)) {}
  // Tensors produced on this rank: nothing to wait for.
  explicit ArrivingTensors(std::vector<Tensor> local) : tensors_(std::move(local)) {}
  // Tensors still arriving when dropped (the engine gave up after an abort) are kept alive
  // (comm/keep_alive.h): the library may still write into them.
  ~ArrivingTensors();
  ArrivingTensors(ArrivingTensors&&) = default;
  ArrivingTensors& operator=(ArrivingTensors&&) = default;

  // Waits for the payload (if any). After a failed wait the tensors' memory is kept alive
  // (the library may still write into it).
  absl::Status Wait();
  // Wait, then hands the tensors over.
  absl::StatusOr<std::vector<Tensor>> Take();

 private:
  std::vector<Tensor> tensors_;
  comm::WorkPtr ready_;
  std::string what_;
};

// One send of a batch: the send's identity (type, stage, micro-batch, replica) and tensors.
struct OutgoingTransfer {
  int peer = 0;
  TransferHeader header;  // shapes are taken from `tensors`
  std::vector<Tensor> tensors;
};

// One receive of a batch: the identity expected (the matching send's type) and how to
// allocate the tensors to receive into.
struct IncomingTransfer {
  int peer = 0;
  TransferHeader expected;
  std::function<absl::StatusOr<Tensor>(const TensorMeta&)> allocate;
};

// Posts runs of transfers (the protocol at the top of this file). The first transfer of each kind (peer,
// action type, stage, replica) carries a header, which the receiver checks against what it
// expects and whose shapes both sides then cache; later transfers of that kind send only the
// payload, and a sender whose shapes differ from the cached ones fails with InvalidArgument
// (a stage's outputs must keep their shapes from micro-batch to micro-batch). Headers use
// `header_tag` on `header_comm` (MPI); payloads `payload_tag` on `payload_comm` (the same
// communicator on the CPU; NCCL or host-staged MPI for device tensors).
//
// Collective in the point-to-point sense: both ends must post matching runs in the same
// order, as the validated schedule guarantees. One thread.
class TransferBatcher {
 public:
  TransferBatcher(comm::Communicator& header_comm, comm::Communicator& payload_comm,
                  int header_tag, int payload_tag);

  struct Posted {
    std::vector<ArrivingTensors> received;  // in the order of `receives`
    std::unique_ptr<PendingSend> sends;     // null when there were none
  };
  // Exchanges the headers still needed (waiting only for those), then posts every payload
  // in one SendRecvBatch. The receives' payloads may still be in flight on return.
  absl::StatusOr<Posted> Post(std::vector<OutgoingTransfer> sends,
                              std::vector<IncomingTransfer> receives);

 private:
  using Kind = std::tuple<int, int, int, int>;  // peer, send type, stage, replica
  comm::Communicator& header_comm_;
  comm::Communicator& payload_comm_;
  int header_tag_;
  int payload_tag_;
  // NCCL needs a run's sends and receives in one group; other backends give the receives a
  // Work of their own (decided once: backend() builds a string).
  bool one_group_per_run_ = false;
  std::map<Kind, std::vector<TensorMeta>> sent_shapes_;
  std::map<Kind, std::vector<TensorMeta>> received_shapes_;
};

}  // namespace tandem::runtime
