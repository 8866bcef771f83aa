// The transfer protocol (TransferBatcher: a header on the first exchange of each kind, shapes
// cached after it) and its header's encoding, under mpirun -np 2.
#include "runtime/transfer.h"

#include <memory>
#include <vector>

#include "comm/backend.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

Tensor MakeFloats(std::vector<int64_t> shape, float first) {
  TensorMeta meta{shape, comm::DataType::kFloat32};
  auto data = std::make_shared<std::vector<float>>(static_cast<size_t>(meta.NumElements()));
  for (size_t i = 0; i < data->size(); ++i) (*data)[i] = first + static_cast<float>(i);
  Tensor t;
  t.meta = meta;
  t.buffer.data = data->data();
  t.buffer.count = meta.NumElements();
  t.buffer.dtype = comm::DataType::kFloat32;
  t.holder = data;
  return t;
}

absl::StatusOr<Tensor> Allocate(const TensorMeta& meta) {
  if (meta.dtype != comm::DataType::kFloat32) {
    return absl::InvalidArgumentError("test allocator: float32 only");
  }
  return MakeFloats(meta.shape, 0);
}

// A run of one receive from `peer`, of the transfer a send of `type` makes.
std::vector<IncomingTransfer> ReceiveOne(int peer, pipeline::ActionType type, int stage,
                                         int microbatch) {
  IncomingTransfer receive;
  receive.peer = peer;
  receive.expected.type = type;
  receive.expected.stage = stage;
  receive.expected.microbatch = microbatch;
  receive.allocate = Allocate;
  std::vector<IncomingTransfer> receives;
  receives.push_back(std::move(receive));
  return receives;
}

class TransferTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto world = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
    ASSERT_TRUE(world.ok()) << world.status();
    world_ = std::move(world).value().release();
    world_->set_timeout(absl::Seconds(20));
  }
  static comm::Communicator* world_;
};
comm::Communicator* TransferTest::world_ = nullptr;

TEST(TransferHeaderTest, EncodeDecodeRoundTrip) {
  TransferHeader h;
  h.type = pipeline::ActionType::kSendGradient;
  h.stage = 7;
  h.microbatch = 12;
  h.replica = 1;
  h.tensors = {{{2, 3, 4}, comm::DataType::kFloat32}, {{5}, comm::DataType::kInt64}};
  auto words = h.Encode();
  ASSERT_TRUE(words.ok());
  auto back = TransferHeader::Decode(*words);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->type, h.type);
  EXPECT_EQ(back->stage, 7);
  EXPECT_EQ(back->microbatch, 12);
  EXPECT_EQ(back->replica, 1);
  ASSERT_EQ(back->tensors.size(), 2u);
  EXPECT_EQ(back->tensors[0], h.tensors[0]);
  EXPECT_EQ(back->tensors[1], h.tensors[1]);
  EXPECT_EQ(back->Describe(), "sG7.12r1 [2x3x4 float32, 5 int64]");
}

TEST(TransferHeaderTest, RejectsOversizedAndGarbage) {
  TransferHeader h;
  h.tensors.resize(kMaxTensorsPerTransfer + 1);
  EXPECT_EQ(h.Encode().status().code(), absl::StatusCode::kInvalidArgument);
  h.tensors = {{std::vector<int64_t>(kMaxTensorDims + 1, 1), comm::DataType::kFloat32}};
  EXPECT_EQ(h.Encode().status().code(), absl::StatusCode::kInvalidArgument);
  TransferHeader::Words garbage{};
  garbage.fill(3);
  EXPECT_EQ(TransferHeader::Decode(garbage).status().code(), absl::StatusCode::kDataLoss);
}

// Neighbours that send to each other at the same moment (1F1B's steady state), large
// messages, one batch each: no deadlock, the data arrives, the second exchange uses the cached
// shapes (no header), and a receive is complete only once waited for.
TEST_F(TransferTest, BatcherExchangesBetweenNeighboursAtOnce) {
  auto dup = world_->Split(/*color=*/0, /*key=*/world_->rank());
  ASSERT_TRUE(dup.ok()) << dup.status();
  comm::Communicator& comm = **dup;
  const int peer = 1 - comm.rank();
  TransferBatcher batcher(comm, comm, /*header_tag=*/1, /*payload_tag=*/2);
  constexpr int64_t kLarge = int64_t{4} << 20;  // 16 MiB of float32
  for (int round = 0; round < 3; ++round) {
    OutgoingTransfer send;
    send.peer = peer;
    send.header.type = comm.rank() == 0 ? pipeline::ActionType::kSendActivation
                                        : pipeline::ActionType::kSendGradient;
    send.header.stage = comm.rank() == 0 ? 0 : 1;
    send.header.microbatch = round;
    send.tensors = {MakeFloats({kLarge}, 1000.0f * comm.rank() + round),
                    MakeFloats({3, 5}, -1.0f * round)};
    std::vector<OutgoingTransfer> sends;
    sends.push_back(std::move(send));
    auto posted = batcher.Post(
        std::move(sends),
        ReceiveOne(peer,
                   comm.rank() == 0 ? pipeline::ActionType::kSendGradient
                                    : pipeline::ActionType::kSendActivation,
                   /*stage=*/comm.rank() == 0 ? 1 : 0, /*microbatch=*/round));
    ASSERT_TRUE(posted.ok()) << posted.status();
    ASSERT_EQ(posted->received.size(), 1u);
    ASSERT_NE(posted->sends, nullptr);
    auto got = posted->received[0].Take();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 2u);
    const float* large = static_cast<const float*>((*got)[0].buffer.data);
    EXPECT_EQ(large[0], 1000.0f * peer + round);
    EXPECT_EQ(large[kLarge - 1], 1000.0f * peer + round + static_cast<float>(kLarge - 1));
    EXPECT_EQ((*got)[1].meta.shape, (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(static_cast<const float*>((*got)[1].buffer.data)[14], -1.0f * round + 14);
    EXPECT_TRUE(posted->sends->Wait().ok());
  }
  // A sender whose shapes change after the first exchange is told so (nothing is posted).
  OutgoingTransfer changed;
  changed.peer = peer;
  changed.header.type = comm.rank() == 0 ? pipeline::ActionType::kSendActivation
                                         : pipeline::ActionType::kSendGradient;
  changed.header.stage = comm.rank() == 0 ? 0 : 1;
  changed.tensors = {MakeFloats({7}, 0)};
  std::vector<OutgoingTransfer> sends;
  sends.push_back(std::move(changed));
  auto refused = batcher.Post(std::move(sends), {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("keep their shapes"), std::string::npos)
      << refused.status();
  EXPECT_TRUE(world_->Barrier()->Wait().ok());
}

// GPipe's turn from forward to backward: rank 0's last activation send and first gradient
// receive form one run, and rank 1 can send that gradient only after it has the activation.
// The send must go out before rank 0 waits for the gradient's header.
TEST_F(TransferTest, BatcherSendsBeforeWaitingForAHeader) {
  auto dup = world_->Split(/*color=*/0, /*key=*/world_->rank());
  ASSERT_TRUE(dup.ok()) << dup.status();
  comm::Communicator& comm = **dup;
  TransferBatcher batcher(comm, comm, /*header_tag=*/1, /*payload_tag=*/2);
  auto activation = [](int microbatch) {
    OutgoingTransfer send;
    send.peer = 1;
    send.header.type = pipeline::ActionType::kSendActivation;
    send.header.stage = 0;
    send.header.microbatch = microbatch;
    send.tensors = {MakeFloats({64}, 10.0f * microbatch)};
    return send;
  };
  if (comm.rank() == 0) {
    std::vector<OutgoingTransfer> first;
    first.push_back(activation(0));
    auto posted = batcher.Post(std::move(first), {});
    ASSERT_TRUE(posted.ok()) << posted.status();
    // The run: the second activation (shape cached) and the first gradient (header needed).
    std::vector<OutgoingTransfer> sends;
    sends.push_back(activation(1));
    auto run = batcher.Post(std::move(sends),
                            ReceiveOne(/*peer=*/1, pipeline::ActionType::kSendGradient,
                                       /*stage=*/1, /*microbatch=*/0));
    ASSERT_TRUE(run.ok()) << run.status();
    auto got = run->received[0].Take();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(static_cast<const float*>((*got)[0].buffer.data)[0], 20.0f);
    EXPECT_TRUE(posted->sends->Wait().ok());
    EXPECT_TRUE(run->sends->Wait().ok());
  } else if (comm.rank() == 1) {
    float sum = 0;
    for (int m = 0; m < 2; ++m) {
      auto posted = batcher.Post({}, ReceiveOne(/*peer=*/0, pipeline::ActionType::kSendActivation,
                                                /*stage=*/0, /*microbatch=*/m));
      ASSERT_TRUE(posted.ok()) << posted.status();
      auto got = posted->received[0].Take();
      ASSERT_TRUE(got.ok()) << got.status();
      sum += static_cast<const float*>((*got)[0].buffer.data)[0];
    }
    OutgoingTransfer gradient;
    gradient.peer = 0;
    gradient.header.type = pipeline::ActionType::kSendGradient;
    gradient.header.stage = 1;
    gradient.header.microbatch = 0;
    gradient.tensors = {MakeFloats({8}, 2.0f * sum)};  // 2 * (0 + 10)
    std::vector<OutgoingTransfer> sends;
    sends.push_back(std::move(gradient));
    auto posted = batcher.Post(std::move(sends), {});
    ASSERT_TRUE(posted.ok()) << posted.status();
    EXPECT_TRUE(posted->sends->Wait().ok());
  }
  EXPECT_TRUE(world_->Barrier()->Wait().ok());
}

// The first exchange of a kind checks the sender's identity against the receiver's.
TEST_F(TransferTest, BatcherFirstExchangeCatchesProgramsOutOfStep) {
  auto dup = world_->Split(/*color=*/0, /*key=*/world_->rank());
  ASSERT_TRUE(dup.ok()) << dup.status();
  comm::Communicator& comm = **dup;
  TransferBatcher batcher(comm, comm, 1, 2);
  if (comm.rank() == 0) {
    OutgoingTransfer send;
    send.peer = 1;
    send.header.type = pipeline::ActionType::kSendActivation;
    send.header.stage = 0;
    send.header.microbatch = 2;
    send.tensors = {MakeFloats({4}, 0)};
    std::vector<OutgoingTransfer> sends;
    sends.push_back(std::move(send));
    auto posted = batcher.Post(std::move(sends), {});
    ASSERT_TRUE(posted.ok()) << posted.status();
    EXPECT_TRUE(posted->sends->Wait().ok());
  } else {
    auto posted = batcher.Post({}, ReceiveOne(/*peer=*/0, pipeline::ActionType::kSendActivation,
                                              /*stage=*/0, /*microbatch=*/3));
    EXPECT_EQ(posted.status().code(), absl::StatusCode::kInternal);
    EXPECT_NE(posted.status().message().find("expected sA0.3"), std::string::npos)
        << posted.status();
    // Drain the payload.
    Tensor sink = MakeFloats({4}, 0);
    EXPECT_TRUE(comm.Recv(sink.buffer, 0, 2)->Wait().ok());
  }
  EXPECT_TRUE(world_->Barrier()->Wait().ok());
}

// A header that never arrives: the wait times out with an error naming the transfer expected.
TEST_F(TransferTest, BatcherReceiveTimesOutNamingTheTransfer) {
  // On a private duplicate, aborted afterwards: the receive that timed out stays posted.
  auto dup = world_->Split(/*color=*/0, /*key=*/world_->rank());
  ASSERT_TRUE(dup.ok()) << dup.status();
  if (world_->rank() == 1) {
    (*dup)->set_timeout(absl::Milliseconds(300));
    TransferBatcher batcher(**dup, **dup, /*header_tag=*/1, /*payload_tag=*/2);
    auto posted = batcher.Post({}, ReceiveOne(/*peer=*/0, pipeline::ActionType::kSendGradient,
                                              /*stage=*/2, /*microbatch=*/0));
    EXPECT_EQ(posted.status().code(), absl::StatusCode::kDeadlineExceeded) << posted.status();
    EXPECT_NE(posted.status().message().find("sG2.0"), std::string::npos) << posted.status();
  }
  (*dup)->Abort(absl::CancelledError("test over"));
  EXPECT_TRUE(world_->Barrier()->Wait().ok());
}

}  // namespace
}  // namespace tandem::runtime
