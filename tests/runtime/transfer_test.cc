// Activation/gradient transfers with shape headers, under mpirun -np 2.
#include "runtime/transfer.h"

#include <memory>
#include <vector>

#include "comm/backend.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

constexpr int kTag = 5;

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

TEST_F(TransferTest, ShapesTravelWithTheData) {
  ASSERT_EQ(world_->size(), 2);
  TransferHeader h;
  h.type = pipeline::ActionType::kSendActivation;
  h.stage = 0;
  h.microbatch = 3;
  if (world_->rank() == 0) {
    // Two transfers of different shapes back to back: FIFO order keeps them apart.
    auto first = SendTensors(*world_, 1, kTag, h, {MakeFloats({2, 5}, 10)});
    ASSERT_TRUE(first.ok()) << first.status();
    h.microbatch = 4;
    auto second = SendTensors(*world_, 1, kTag, h, {MakeFloats({3}, 100), MakeFloats({1, 1}, 7)});
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_TRUE(first->Wait().ok());
    EXPECT_TRUE(second->Wait().ok());
  } else {
    auto got = ReceiveTensors(*world_, 0, kTag, h, Allocate);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ((*got)[0].meta.shape, (std::vector<int64_t>{2, 5}));
    EXPECT_FLOAT_EQ(static_cast<float*>((*got)[0].buffer.data)[9], 19.0f);
    h.microbatch = 4;
    auto got2 = ReceiveTensors(*world_, 0, kTag, h, Allocate);
    ASSERT_TRUE(got2.ok()) << got2.status();
    ASSERT_EQ(got2->size(), 2u);
    EXPECT_FLOAT_EQ(static_cast<float*>((*got2)[0].buffer.data)[2], 102.0f);
    EXPECT_EQ((*got2)[1].meta.shape, (std::vector<int64_t>{1, 1}));
  }
}

TEST_F(TransferTest, MismatchedTransferIsAnErrorNamingBoth) {
  TransferHeader sent;
  sent.type = pipeline::ActionType::kSendActivation;
  sent.stage = 1;
  sent.microbatch = 2;
  if (world_->rank() == 0) {
    auto send = SendTensors(*world_, 1, kTag, sent, {MakeFloats({4}, 0)});
    ASSERT_TRUE(send.ok());
    EXPECT_TRUE(send->Wait().ok());
  } else {
    TransferHeader expected = sent;
    expected.microbatch = 3;
    auto got = ReceiveTensors(*world_, 0, kTag, expected, Allocate);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
    EXPECT_NE(got.status().message().find("expected sA1.3"), std::string::npos) << got.status();
    EXPECT_NE(got.status().message().find("received sA1.2"), std::string::npos) << got.status();
    // Drain the payload so the next test starts clean.
    Tensor sink = MakeFloats({4}, 0);
    EXPECT_TRUE(world_->Recv(sink.buffer, 0, kTag)->Wait().ok());
  }
}

TEST_F(TransferTest, ReceiveTimesOutNamingTheTransfer) {
  // On a private duplicate, aborted afterwards: the receive that timed out stays posted.
  auto dup = world_->Split(/*color=*/0, /*key=*/world_->rank());
  ASSERT_TRUE(dup.ok()) << dup.status();
  TransferHeader h;
  h.type = pipeline::ActionType::kSendGradient;
  h.stage = 2;
  h.microbatch = 0;
  if (world_->rank() == 1) {
    (*dup)->set_timeout(absl::Milliseconds(300));
    auto got = ReceiveTensors(**dup, 0, kTag, h, Allocate);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
    EXPECT_NE(got.status().message().find("sG2.0"), std::string::npos) << got.status();
  }
  (*dup)->Abort(absl::CancelledError("test over"));
  EXPECT_TRUE(world_->Barrier()->Wait().ok());
}

}  // namespace
}  // namespace tandem::runtime
