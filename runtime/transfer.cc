#include "runtime/transfer.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/keep_alive.h"
#include "common/status.h"

namespace tandem::runtime {
namespace {

// "TNDMHDR1" as a number, so a stray message is not taken for a header.
constexpr int64_t kHeaderMagic = 0x544e444d48445231;
// Word layout: magic, type, stage, microbatch, replica, tensor count, then per tensor
// dtype, ndim and kMaxTensorDims dimensions.
constexpr int kFixedWords = 6;
constexpr int kWordsPerTensor = 2 + kMaxTensorDims;
static_assert(kFixedWords + kMaxTensorsPerTransfer * kWordsPerTensor <= kTransferHeaderWords,
              "header layout exceeds its size");
constexpr int64_t kLargestActionType = static_cast<int64_t>(pipeline::ActionType::kOptimizerStep);
constexpr int64_t kLargestDataType = static_cast<int64_t>(comm::DataType::kInt64);

comm::Buffer HeaderBuffer(TransferHeader::Words* words) {
  comm::Buffer b;
  b.data = words->data();
  b.count = kTransferHeaderWords;
  b.dtype = comm::DataType::kInt64;
  return b;
}

int PayloadTag(const comm::Communicator& payload_comm, int tag) {
  return payload_comm.backend() == "nccl" ? 0 : tag;
}

// "[8x16 float32, 4 int64]".
std::string DescribeMetas(const std::vector<TensorMeta>& metas) {
  std::vector<std::string> shapes;
  for (const TensorMeta& m : metas) {
    shapes.push_back(absl::StrCat(absl::StrJoin(m.shape, "x"), " ", comm::DataTypeName(m.dtype)));
  }
  return absl::StrCat("[", absl::StrJoin(shapes, ", "), "]");
}

std::string Identity(pipeline::ActionType type, int stage, int microbatch, int replica) {
  std::string id = absl::StrCat(pipeline::ActionTypeName(type), stage, ".", microbatch);
  if (replica != 0) absl::StrAppend(&id, "r", replica);
  return id;
}

}  // namespace

absl::StatusOr<TransferHeader::Words> TransferHeader::Encode() const {
  if (tensors.size() > static_cast<size_t>(kMaxTensorsPerTransfer)) {
    return absl::InvalidArgumentError(absl::StrCat("a transfer carries at most ",
                                                   kMaxTensorsPerTransfer, " tensors, got ",
                                                   tensors.size()));
  }
  Words w{};
  w[0] = kHeaderMagic;
  w[1] = static_cast<int64_t>(type);
  w[2] = stage;
  w[3] = microbatch;
  w[4] = replica;
  w[5] = static_cast<int64_t>(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorMeta& meta = tensors[t];
    if (meta.shape.size() > static_cast<size_t>(kMaxTensorDims)) {
      return absl::InvalidArgumentError(absl::StrCat("a transferred tensor has at most ",
                                                     kMaxTensorDims, " dimensions, got ",
                                                     meta.shape.size()));
    }
    const int base = kFixedWords + static_cast<int>(t) * kWordsPerTensor;
    w[base] = static_cast<int64_t>(meta.dtype);
    w[base + 1] = static_cast<int64_t>(meta.shape.size());
    for (size_t d = 0; d < meta.shape.size(); ++d) w[base + 2 + d] = meta.shape[d];
  }
  return w;
}

absl::StatusOr<TransferHeader> TransferHeader::Decode(const Words& w) {
  if (w[0] != kHeaderMagic) {
    return absl::DataLossError("transfer header: bad magic (a payload taken for a header?)");
  }
  if (w[1] < 0 || w[1] > kLargestActionType || w[5] < 0 || w[5] > kMaxTensorsPerTransfer) {
    return absl::DataLossError("transfer header: action type or tensor count out of range");
  }
  TransferHeader h;
  h.type = static_cast<pipeline::ActionType>(w[1]);
  h.stage = static_cast<int>(w[2]);
  h.microbatch = static_cast<int>(w[3]);
  h.replica = static_cast<int>(w[4]);
  for (int t = 0; t < w[5]; ++t) {
    const int base = kFixedWords + t * kWordsPerTensor;
    if (w[base] < 0 || w[base] > kLargestDataType || w[base + 1] < 0 ||
        w[base + 1] > kMaxTensorDims) {
      return absl::DataLossError(
          absl::StrCat("transfer header: tensor ", t, " has a bad dtype or rank"));
    }
    TensorMeta meta;
    meta.dtype = static_cast<comm::DataType>(w[base]);
    for (int d = 0; d < w[base + 1]; ++d) {
      if (w[base + 2 + d] < 0) {
        return absl::DataLossError(
            absl::StrCat("transfer header: tensor ", t, " has a negative dimension"));
      }
      meta.shape.push_back(w[base + 2 + d]);
    }
    h.tensors.push_back(std::move(meta));
  }
  return h;
}

std::string TransferHeader::Describe() const {
  return absl::StrCat(Identity(type, stage, microbatch, replica), " ", DescribeMetas(tensors));
}

absl::StatusOr<bool> PendingSend::Test() {
  for (const comm::WorkPtr& w : works_) {
    if (!w->Test()) return false;
    TANDEM_RETURN_IF_ERROR(w->error());
  }
  return true;
}

absl::Status PendingSend::Wait() {
  for (const comm::WorkPtr& w : works_) {
    absl::Status s = w->Wait();
    if (!s.ok()) return Annotate(s, absl::StrCat("send of ", what_));
  }
  return absl::OkStatus();
}

ArrivingTensors::~ArrivingTensors() {
  if (ready_ == nullptr || (ready_->Test() && ready_->error().ok())) return;
  for (Tensor& t : tensors_) comm::KeepAliveAfterAbort(std::move(t.holder));
}

absl::Status ArrivingTensors::Wait() {
  if (ready_ == nullptr) return absl::OkStatus();
  const absl::Status s = ready_->Wait();
  if (!s.ok()) {
    for (Tensor& t : tensors_) comm::KeepAliveAfterAbort(std::move(t.holder));
    tensors_.clear();
    return Annotate(s, absl::StrCat("receiving ", what_));
  }
  ready_.reset();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> ArrivingTensors::Take() {
  TANDEM_RETURN_IF_ERROR(Wait());
  return std::move(tensors_);
}

TransferBatcher::TransferBatcher(comm::Communicator& header_comm,
                                 comm::Communicator& payload_comm, int header_tag,
                                 int payload_tag)
    : header_comm_(header_comm),
      payload_comm_(payload_comm),
      header_tag_(header_tag),
      payload_tag_(PayloadTag(payload_comm, payload_tag)),
      one_group_per_run_(payload_comm.backend() == "nccl") {}

absl::StatusOr<TransferBatcher::Posted> TransferBatcher::Post(
    std::vector<OutgoingTransfer> sends, std::vector<IncomingTransfer> receives) {
  std::vector<comm::PointToPoint> payloads;
  std::vector<comm::WorkPtr> header_works;
  std::vector<std::shared_ptr<TransferHeader::Words>> header_words;
  std::vector<Tensor> sent_tensors;
  std::string what;
  // On an error return, memory that a posted send may still read is kept alive.
  bool handed_over = false;
  auto keep_posted = absl::Cleanup([&] {
    if (handed_over) return;
    for (auto& words : header_words) comm::KeepAliveAfterAbort(std::move(words));
    for (Tensor& t : sent_tensors) comm::KeepAliveAfterAbort(std::move(t.holder));
  });
  // Sends: shapes from the tensors; a header on the first exchange of a kind.
  for (OutgoingTransfer& send : sends) {
    TransferHeader full = send.header;
    full.tensors.clear();
    for (const Tensor& t : send.tensors) {
      if (t.buffer.count != t.meta.NumElements() || t.buffer.dtype != t.meta.dtype) {
        return absl::InternalError(absl::StrCat("sending ", full.Describe(), ": buffer has ",
                                                t.buffer.count, " elements of ",
                                                comm::DataTypeName(t.buffer.dtype),
                                                ", its meta says otherwise"));
      }
      full.tensors.push_back(t.meta);
    }
    const Kind kind{send.peer, static_cast<int>(full.type), full.stage, full.replica};
    auto cached = sent_shapes_.find(kind);
    if (cached == sent_shapes_.end()) {
      TANDEM_ASSIGN_OR_RETURN(TransferHeader::Words words, full.Encode());
      auto holder = std::make_shared<TransferHeader::Words>(words);
      header_works.push_back(header_comm_.Send(HeaderBuffer(holder.get()), send.peer, header_tag_));
      header_words.push_back(std::move(holder));
      sent_shapes_.emplace(kind, full.tensors);
    } else if (!(cached->second == full.tensors)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sending ", full.Describe(), " to rank ", send.peer, ": earlier transfers of this kind "
          "had shapes ", DescribeMetas(cached->second), "; a stage's outputs must keep their "
          "shapes from micro-batch to micro-batch (shapes are cached after the first exchange)"));
    }
    absl::StrAppend(&what, what.empty() ? "" : ", ", full.Describe(), " to ", send.peer);
    for (Tensor& t : send.tensors) {
      comm::PointToPoint p;
      p.kind = comm::PointToPoint::Kind::kSend;
      p.buffer = t.buffer;
      p.peer = send.peer;
      p.tag = payload_tag_;
      payloads.push_back(p);
      sent_tensors.push_back(std::move(t));
    }
  }
  // Receives of a kind not seen yet: their headers, posted together, then waited for.
  std::vector<std::shared_ptr<TransferHeader::Words>> incoming(receives.size());
  std::vector<comm::WorkPtr> incoming_works(receives.size());
  bool any_header = false;
  for (size_t r = 0; r < receives.size(); ++r) {
    const TransferHeader& e = receives[r].expected;
    const Kind kind{receives[r].peer, static_cast<int>(e.type), e.stage, e.replica};
    if (received_shapes_.count(kind) != 0) continue;
    incoming[r] = std::make_shared<TransferHeader::Words>();
    incoming_works[r] =
        header_comm_.Recv(HeaderBuffer(incoming[r].get()), receives[r].peer, header_tag_);
    any_header = true;
  }
  // The sends go out before this rank waits for a header: the peer may need them before it
  // can send what this rank waits for (GPipe's last forward send and first gradient receive
  // form one run). The receives then follow in one batch of their own, in program order.
  comm::WorkPtr send_work;
  if (any_header && !payloads.empty()) {
    send_work = payload_comm_.SendRecvBatch(payloads);
    payloads.clear();
  }
  Posted posted;
  std::vector<std::string> received_names;
  for (size_t r = 0; r < receives.size(); ++r) {
    const IncomingTransfer& receive = receives[r];
    const TransferHeader& e = receive.expected;
    const Kind kind{receive.peer, static_cast<int>(e.type), e.stage, e.replica};
    const std::string expected_id = Identity(e.type, e.stage, e.microbatch, e.replica);
    if (incoming_works[r] != nullptr) {
      const absl::Status s = incoming_works[r]->Wait();
      if (!s.ok()) {
        for (size_t k = r; k < receives.size(); ++k) {
          if (incoming[k] != nullptr) comm::KeepAliveAfterAbort(incoming[k]);
        }
        return Annotate(s, absl::StrCat("waiting for ", expected_id, " from rank ", receive.peer));
      }
      auto header = TransferHeader::Decode(*incoming[r]);
      if (!header.ok()) {
        return Annotate(header.status(),
                        absl::StrCat("receiving ", expected_id, " from rank ", receive.peer));
      }
      if (header->type != e.type || header->stage != e.stage ||
          header->microbatch != e.microbatch || header->replica != e.replica) {
        return absl::InternalError(absl::StrCat("expected ", expected_id, " from rank ",
                                                receive.peer, ", received ", header->Describe(),
                                                " (programs out of step)"));
      }
      received_shapes_[kind] = header->tensors;
    }
    const std::vector<TensorMeta>& metas = received_shapes_[kind];
    std::vector<Tensor> tensors;
    for (const TensorMeta& meta : metas) {
      TANDEM_ASSIGN_OR_RETURN(Tensor t, receive.allocate(meta));
      if (t.buffer.count != meta.NumElements() || t.buffer.dtype != meta.dtype) {
        return absl::InternalError(absl::StrCat("receiving ", expected_id, ": the stage allocated ",
                                                t.buffer.count, " elements of ",
                                                comm::DataTypeName(t.buffer.dtype)));
      }
      comm::PointToPoint p;
      p.kind = comm::PointToPoint::Kind::kRecv;
      p.buffer = t.buffer;
      p.peer = receive.peer;
      p.tag = payload_tag_;
      payloads.push_back(p);
      tensors.push_back(std::move(t));
    }
    received_names.push_back(absl::StrCat(expected_id, " ", DescribeMetas(metas), " from rank ",
                                          receive.peer));
    posted.received.emplace_back(std::move(tensors), nullptr, received_names.back());
  }
  // The receives' own work, so that a received tensor is waited for without waiting for this
  // run's sends too (a send of a large tensor completes only once the peer has posted its
  // receive, which may be a whole action later). NCCL needs one group for both, or two
  // neighbours sending to each other at once would each wait for the other's receive.
  if (!one_group_per_run_ && !payloads.empty() &&
      payloads.front().kind == comm::PointToPoint::Kind::kSend &&
      payloads.back().kind == comm::PointToPoint::Kind::kRecv) {
    const auto first_receive =
        std::find_if(payloads.begin(), payloads.end(), [](const comm::PointToPoint& p) {
          return p.kind == comm::PointToPoint::Kind::kRecv;
        });
    std::vector<comm::PointToPoint> run_sends(payloads.begin(), first_receive);
    payloads.erase(payloads.begin(), first_receive);
    send_work = payload_comm_.SendRecvBatch(run_sends);
  }
  comm::WorkPtr work = payloads.empty() ? nullptr : payload_comm_.SendRecvBatch(payloads);
  if (work != nullptr) {
    for (size_t r = 0; r < posted.received.size(); ++r) {
      auto tensors = posted.received[r].Take();  // nothing to wait for yet
      posted.received[r] = ArrivingTensors(*std::move(tensors), work, received_names[r]);
    }
  }
  if (!sends.empty()) {
    std::vector<comm::WorkPtr> works = std::move(header_works);
    if (send_work != nullptr) works.push_back(send_work);
    if (work != nullptr) works.push_back(work);
    handed_over = true;
    posted.sends = std::make_unique<PendingSend>(what, std::move(header_words),
                                                 std::move(sent_tensors), std::move(works));
  }
  return posted;
}

}  // namespace tandem::runtime
