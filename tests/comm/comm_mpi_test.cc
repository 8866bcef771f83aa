// Multi-rank tests of the MPI backend against sequential references (run under mpirun with
// 2, 3 and 4 ranks).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "comm/buffer.h"
#include "comm/forwarding.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/ring.h"
#include "gtest/gtest.h"
#include "tests/comm/comm_test_util.h"

namespace tandem::comm {
namespace {

using testing::GetElement;
using testing::kAllTypes;
using testing::OwnedBuffer;
using testing::RoundTo;
using testing::SetElement;

constexpr absl::Duration kTestTimeout = absl::Seconds(30);

Communicator& World() {
  static std::unique_ptr<Communicator> world = [] {
    CommOptions options;
    options.timeout = kTestTimeout;
    options.verify_collectives = true;  // the mismatch tests need the debug check
    auto created = CreateWorldCommunicator(BackendKind::kMpi, options);
    if (!created.ok()) {
      ADD_FAILURE() << created.status();
      std::abort();
    }
    return std::move(created).value();
  }();
  return *world;
}

// Small integers: exact in every type, sums of up to 4 ranks stay exact (int8 included).
double Value(int rank, int64_t i) { return static_cast<double>((rank + 1) * (i % 7 + 1) % 13); }

// Element counts: empty, one, odd, not divisible by the group size, and several MB.
std::vector<int64_t> Counts(DataType type, int size) {
  const int64_t several_mb = (3 << 20) / static_cast<int64_t>(SizeOf(type)) + 1;
  return {0, 1, 7, 5 * size + 3, several_mb};
}

double Reduce(ReduceOp op, int size, int64_t i, DataType type) {
  double result = Value(0, i);
  for (int r = 1; r < size; ++r) {
    const double v = Value(r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: result += v; break;
      case ReduceOp::kMax: result = std::max(result, v); break;
      case ReduceOp::kMin: result = std::min(result, v); break;
    }
  }
  if (op == ReduceOp::kAverage) {
    // The backend averages in the buffer's type: round the sum, divide, round again.
    if (type == DataType::kFloat32) {
      return static_cast<float>(static_cast<float>(result) / static_cast<float>(size));
    }
    return RoundTo(type, RoundTo(type, result) / size);
  }
  return result;
}

bool IsFloat(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kBFloat16 ||
         t == DataType::kFloat16;
}

TEST(MpiCommunicatorTest, RankAndSizeMatchMpi) {
  Communicator& world = World();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world.rank(), rank);
  EXPECT_EQ(world.size(), size);
  EXPECT_EQ(world.backend(), "mpi");
  ASSERT_EQ(world.world_ranks().size(), static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) EXPECT_EQ(world.world_ranks()[r], r);
}

TEST(MpiCommunicatorTest, AllReduceMatchesSequentialReference) {
  Communicator& world = World();
  for (DataType type : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAverage}) {
      if (op == ReduceOp::kAverage && !IsFloat(type)) continue;
      for (int64_t count : Counts(type, world.size())) {
        SCOPED_TRACE(absl::StrCat(DataTypeName(type), " op ", static_cast<int>(op), " count ",
                                  count));
        OwnedBuffer data(type, count);
        for (int64_t i = 0; i < count; ++i) SetElement(data.buffer, i, Value(world.rank(), i));
        ASSERT_TRUE(world.AllReduce(data.buffer, op)->Wait().ok());
        int64_t wrong = 0;
        for (int64_t i = 0; i < count; ++i) {
          if (GetElement(data.buffer, i) != Reduce(op, world.size(), i, type)) ++wrong;
        }
        EXPECT_EQ(wrong, 0);
      }
    }
  }
}

// Inexact sums: every rank must still hold the same bits (replicas that drift apart would
// diverge in training), for the small-message recursive doubling and for libnbc's algorithms.
TEST(MpiCommunicatorTest, AllReduceGivesBitwiseEqualResultsOnEveryRank) {
  Communicator& world = World();
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{20000}}) {
    SCOPED_TRACE(absl::StrCat("count ", count));
    std::vector<float> data(count);
    for (int64_t i = 0; i < count; ++i) {
      data[i] = 1.0f / static_cast<float>(3 + world.rank() * 7 + i % 11);
    }
    ASSERT_TRUE(world.AllReduce(Buffer{data.data(), count, DataType::kFloat32})->Wait().ok());
    std::vector<float> all(count * world.size());
    MPI_Allgather(data.data(), static_cast<int>(count), MPI_FLOAT, all.data(),
                  static_cast<int>(count), MPI_FLOAT, MPI_COMM_WORLD);
    int64_t different = 0;
    for (int r = 0; r < world.size(); ++r) {
      different += std::memcmp(all.data() + r * count, data.data(), count * sizeof(float)) != 0;
    }
    EXPECT_EQ(different, 0);
  }
}

TEST(MpiCommunicatorTest, ReduceScatterMatchesSequentialReference) {
  Communicator& world = World();
  for (DataType type : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAverage}) {
      if (op == ReduceOp::kAverage && !IsFloat(type)) continue;
      for (int64_t count : Counts(type, world.size())) {
        SCOPED_TRACE(absl::StrCat(DataTypeName(type), " count ", count));
        const ShardRange shard = Shard(count, world.size(), world.rank());
        OwnedBuffer input(type, count);
        OwnedBuffer output(type, shard.count);
        for (int64_t i = 0; i < count; ++i) SetElement(input.buffer, i, Value(world.rank(), i));
        ASSERT_TRUE(world.ReduceScatter(input.buffer, output.buffer, op)->Wait().ok());
        int64_t wrong = 0;
        for (int64_t i = 0; i < shard.count; ++i) {
          if (GetElement(output.buffer, i) != Reduce(op, world.size(), shard.offset + i, type)) {
            ++wrong;
          }
        }
        EXPECT_EQ(wrong, 0);
      }
    }
  }
}

int OwnerOf(int64_t i, int64_t count, int size) {
  for (int r = 0; r < size; ++r) {
    const ShardRange s = Shard(count, size, r);
    if (i >= s.offset && i < s.offset + s.count) return r;
  }
  return -1;
}

TEST(MpiCommunicatorTest, AllGatherMatchesSequentialReference) {
  Communicator& world = World();
  for (DataType type : kAllTypes) {
    for (bool in_place : {false, true}) {
      for (int64_t count : Counts(type, world.size())) {
        SCOPED_TRACE(absl::StrCat(DataTypeName(type), " count ", count, " in place ", in_place));
        const ShardRange shard = Shard(count, world.size(), world.rank());
        OwnedBuffer output(type, count);
        OwnedBuffer separate(type, shard.count);
        Buffer input = in_place ? output.Slice(shard.offset, shard.count) : separate.buffer;
        for (int64_t i = 0; i < shard.count; ++i) {
          SetElement(input, i, Value(world.rank(), shard.offset + i));
        }
        ASSERT_TRUE(world.AllGather(input, output.buffer)->Wait().ok());
        int64_t wrong = 0;
        for (int64_t i = 0; i < count; ++i) {
          if (GetElement(output.buffer, i) != Value(OwnerOf(i, count, world.size()), i)) ++wrong;
        }
        EXPECT_EQ(wrong, 0);
      }
    }
  }
}

TEST(MpiCommunicatorTest, BroadcastFromEveryRoot) {
  Communicator& world = World();
  for (DataType type : kAllTypes) {
    for (int root = 0; root < world.size(); ++root) {
      for (int64_t count : Counts(type, world.size())) {
        OwnedBuffer data(type, count);
        for (int64_t i = 0; i < count; ++i) {
          SetElement(data.buffer, i, world.rank() == root ? Value(root, i) : 99);
        }
        ASSERT_TRUE(world.Broadcast(data.buffer, root)->Wait().ok());
        int64_t wrong = 0;
        for (int64_t i = 0; i < count; ++i) {
          if (GetElement(data.buffer, i) != Value(root, i)) ++wrong;
        }
        EXPECT_EQ(wrong, 0) << DataTypeName(type) << " root " << root << " count " << count;
      }
    }
  }
}

// The small broadcast's tree, for every group size it serves and every root: each rank but the
// root has one parent that lists it as a child; nobody sends more than two messages; every rank
// is reached from the root within ceil(log2(size)) hops; up to three ranks, the root sends to all.
TEST(BroadcastTreeTest, BinaryTreeReachesEveryRankOnceWithAtMostTwoSendsEach) {
  for (int size = 1; size <= mpi_internal::kSmallBroadcastMaxRanks; ++size) {
    for (int root = 0; root < size; ++root) {
      SCOPED_TRACE(absl::StrCat("size ", size, ", root ", root));
      std::vector<mpi_internal::BroadcastTree> trees;
      for (int rank = 0; rank < size; ++rank) trees.emplace_back(rank, size, root);
      int max_depth = 0;
      for (int rank = 0; rank < size; ++rank) {
        const mpi_internal::BroadcastTree& tree = trees[rank];
        EXPECT_LE(tree.num_children, 2);
        if (rank == root) {
          EXPECT_EQ(tree.parent, -1);
          if (size <= 3) EXPECT_EQ(tree.num_children, size - 1);
          continue;
        }
        ASSERT_GE(tree.parent, 0);
        ASSERT_LT(tree.parent, size);
        const mpi_internal::BroadcastTree& parent = trees[tree.parent];
        EXPECT_EQ(std::count(parent.children, parent.children + parent.num_children, rank), 1);
        int depth = 0;
        for (int r = rank; r != root && depth <= size; r = trees[r].parent) ++depth;
        max_depth = std::max(max_depth, depth);
      }
      int edges = 0;
      for (const auto& tree : trees) edges += tree.num_children;
      EXPECT_EQ(edges, size - 1);
      int log2_size = 0;
      while ((1 << log2_size) < size) ++log2_size;
      EXPECT_LE(max_depth, log2_size);
    }
  }
}

// A forwarding handle runs its operations on its target and, retargeted, on the new one; it
// refuses a target of another rank or size.
TEST(MpiCommunicatorTest, ForwardingHandleRunsOnItsTargetAndIsRetargeted) {
  Communicator& world = World();
  ForwardingCommunicator handle(&world);
  EXPECT_EQ(handle.rank(), world.rank());
  EXPECT_EQ(handle.size(), world.size());
  EXPECT_EQ(handle.backend(), "mpi");
  float x = static_cast<float>(world.rank() + 1);
  ASSERT_TRUE(handle.AllReduce(Buffer{&x, 1})->Wait().ok());
  const float sum = static_cast<float>(world.size() * (world.size() + 1) / 2);
  EXPECT_EQ(x, sum);

  auto copy = world.Split(/*color=*/0, /*key=*/world.rank());
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(handle.Retarget(copy->get()).ok());
  EXPECT_EQ(handle.target(), copy->get());
  // The handle's operations now run on the copy: a broadcast through it meets one issued on
  // the copy directly by the root.
  float y = world.rank() == 0 ? 42.0f : -1.0f;
  WorkPtr work = world.rank() == 0 ? (*copy)->Broadcast(Buffer{&y, 1}, 0)
                                   : handle.Broadcast(Buffer{&y, 1}, 0);
  ASSERT_TRUE(work->Wait().ok());
  EXPECT_EQ(y, 42.0f);

  auto half = world.Split(world.rank() % 2, world.rank());
  ASSERT_TRUE(half.ok()) << half.status();
  if (world.size() > 1) {
    const absl::Status refused = handle.Retarget(half->get());
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_NE(refused.message().find("group of"), std::string::npos) << refused;
    EXPECT_EQ(handle.target(), copy->get());
  }
  EXPECT_EQ(handle.Retarget(nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MpiCommunicatorTest, SendRecvRingForEveryType) {
  Communicator& world = World();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (world.rank() + 1) % world.size();
  const int prev = (world.rank() + world.size() - 1) % world.size();
  for (DataType type : kAllTypes) {
    for (int64_t count : Counts(type, world.size())) {
      OwnedBuffer out(type, count), in(type, count);
      for (int64_t i = 0; i < count; ++i) SetElement(out.buffer, i, Value(world.rank(), i));
      WorkPtr recv = world.Recv(in.buffer, prev, /*tag=*/5);
      WorkPtr send = world.Send(out.buffer, next, /*tag=*/5);
      ASSERT_TRUE(send->Wait().ok());
      ASSERT_TRUE(recv->Wait().ok());
      int64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i) {
        if (GetElement(in.buffer, i) != Value(prev, i)) ++wrong;
      }
      EXPECT_EQ(wrong, 0) << DataTypeName(type) << " count " << count;
    }
  }
}

TEST(MpiCommunicatorTest, SendRecvBatchExchangesWithBothNeighbours) {
  Communicator& world = World();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (world.rank() + 1) % world.size();
  const int prev = (world.rank() + world.size() - 1) % world.size();
  std::vector<int32_t> to_next(1000, world.rank()), to_prev(7, -world.rank());
  std::vector<int32_t> from_prev(1000, -1), from_next(7, -1);
  // What a pipeline stage does: activations forward, gradients backward, in one batch.
  WorkPtr batch = world.SendRecvBatch(
      {{PointToPoint::Kind::kRecv, CpuBuffer(from_prev.data(), 1000), prev, 0},
       {PointToPoint::Kind::kRecv, CpuBuffer(from_next.data(), 7), next, 1},
       {PointToPoint::Kind::kSend, CpuBuffer(to_next.data(), 1000), next, 0},
       {PointToPoint::Kind::kSend, CpuBuffer(to_prev.data(), 7), prev, 1}});
  ASSERT_TRUE(batch->Wait().ok());
  EXPECT_EQ(from_prev[999], prev);
  EXPECT_EQ(from_next[6], -next);
}

TEST(MpiCommunicatorTest, SplitOrdersByKeyAndReducesWithinGroup) {
  Communicator& world = World();
  const int color = world.rank() % 2;
  const int key = -world.rank();  // reverse order inside each group
  auto split = world.Split(color, key);
  ASSERT_TRUE(split.ok()) << split.status();
  std::unique_ptr<Communicator> group = std::move(split).value();
  ASSERT_NE(group, nullptr);
  std::vector<int> members;
  for (int r = world.size() - 1; r >= 0; --r) {
    if (r % 2 == color) members.push_back(r);
  }
  EXPECT_EQ(group->size(), static_cast<int>(members.size()));
  EXPECT_EQ(group->world_ranks(), members);
  EXPECT_EQ(group->world_ranks()[group->rank()], world.rank());
  int64_t value = world.rank() + 1;
  ASSERT_TRUE(group->AllReduce(Buffer{&value, 1, DataType::kInt64})->Wait().ok());
  int64_t expected = 0;
  for (int r : members) expected += r + 1;
  EXPECT_EQ(value, expected);

  // A negative colour leaves the rank out.
  auto partial = world.Split(world.rank() == 0 ? -1 : 0, 0);
  ASSERT_TRUE(partial.ok()) << partial.status();
  if (world.rank() == 0) {
    EXPECT_EQ(*partial, nullptr);
  } else {
    ASSERT_NE(*partial, nullptr);
    EXPECT_EQ((*partial)->size(), world.size() - 1);
  }
}

TEST(MpiCommunicatorTest, OutOfOrderCompletion) {
  Communicator& world = World();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  // Rank 1 sends tag 2 first and tag 1 only after rank 0 says so: rank 0's later receive
  // completes while the earlier one is still pending.
  int first = 0, second = 0, go = 1;
  if (world.rank() == 0) {
    WorkPtr recv_first = world.Recv(Buffer{&first, 1, DataType::kInt32}, 1, /*tag=*/1);
    WorkPtr recv_second = world.Recv(Buffer{&second, 1, DataType::kInt32}, 1, /*tag=*/2);
    ASSERT_TRUE(recv_second->Wait().ok());
    EXPECT_EQ(second, 22);
    EXPECT_FALSE(recv_first->Test());
    ASSERT_TRUE(world.Send(Buffer{&go, 1, DataType::kInt32}, 1, /*tag=*/3)->Wait().ok());
    ASSERT_TRUE(recv_first->Wait().ok());
    EXPECT_EQ(first, 11);
  } else if (world.rank() == 1) {
    second = 22;
    first = 11;
    ASSERT_TRUE(world.Send(Buffer{&second, 1, DataType::kInt32}, 0, 2)->Wait().ok());
    ASSERT_TRUE(world.Recv(Buffer{&go, 1, DataType::kInt32}, 0, 3)->Wait().ok());
    ASSERT_TRUE(world.Send(Buffer{&first, 1, DataType::kInt32}, 0, 1)->Wait().ok());
  }
  // Collectives waited on in reverse order of issue.
  std::vector<float> a(1000, 1.0f), b(3, 2.0f);
  WorkPtr wa = world.AllReduce(Buffer{a.data(), 1000, DataType::kFloat32});
  WorkPtr wb = world.AllReduce(Buffer{b.data(), 3, DataType::kFloat32});
  ASSERT_TRUE(wb->Wait().ok());
  ASSERT_TRUE(wa->Wait().ok());
  EXPECT_EQ(a[999], static_cast<float>(world.size()));
  EXPECT_EQ(b[0], 2.0f * world.size());
}

TEST(MpiCommunicatorTest, WaitTimesOutNamingOperationPeersAndSequence) {
  Communicator& world = World();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  auto split = world.Split(0, world.rank());
  ASSERT_TRUE(split.ok());
  std::unique_ptr<Communicator> group = std::move(split).value();
  // Rank 0 enters an all-reduce that the others join only after a barrier on `world`.
  double value = 1;
  if (world.rank() == 0) {
    WorkPtr work = group->AllReduce(Buffer{&value, 1, DataType::kFloat64});
    const absl::Status status = work->Wait(absl::Milliseconds(200));
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_NE(status.message().find("all_reduce #0"), std::string::npos) << status;
    EXPECT_NE(status.message().find(absl::StrCat("group of ", world.size())), std::string::npos)
        << status;
    EXPECT_FALSE(work->Test());
    ASSERT_TRUE(world.Barrier()->Wait().ok());
    ASSERT_TRUE(work->Wait().ok());
  } else {
    ASSERT_TRUE(world.Barrier()->Wait().ok());
    ASSERT_TRUE(group->AllReduce(Buffer{&value, 1, DataType::kFloat64})->Wait().ok());
  }
  EXPECT_EQ(value, world.size());

  // A receive nobody sends yet: the message names the peer.
  if (world.rank() == 0) {
    int x = 0;
    WorkPtr recv = group->Recv(Buffer{&x, 1, DataType::kInt32}, 1, /*tag=*/9);
    const absl::Status status = recv->Wait(absl::Milliseconds(100));
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_NE(status.message().find("from rank 1"), std::string::npos) << status;
    ASSERT_TRUE(world.Barrier()->Wait().ok());
    ASSERT_TRUE(recv->Wait().ok());
    EXPECT_EQ(x, 42);
  } else {
    ASSERT_TRUE(world.Barrier()->Wait().ok());
    if (world.rank() == 1) {
      int x = 42;
      ASSERT_TRUE(group->Send(Buffer{&x, 1, DataType::kInt32}, 0, 9)->Wait().ok());
    }
  }
  EXPECT_EQ(world.Barrier()->Wait(absl::InfiniteDuration()).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(world.Barrier()->Wait().ok());
}

TEST(MpiCommunicatorTest, MismatchedCollectivesFailOnEveryRankAndGroupRecovers) {
  Communicator& world = World();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<float> data(12, 1.0f);
  // Different counts.
  const int64_t count = world.rank() == 0 ? 10 : 12;
  absl::Status status = world.AllReduce(Buffer{data.data(), count, DataType::kFloat32})->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("element count"), std::string::npos) << status;
  // Different types.
  const DataType type = world.rank() == 0 ? DataType::kFloat32 : DataType::kInt32;
  status = world.AllReduce(Buffer{data.data(), 4, type})->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("data type"), std::string::npos) << status;
  // Different operations.
  status = world.rank() == 0 ? world.Broadcast(Buffer{data.data(), 4}, 0)->Wait()
                             : world.AllReduce(Buffer{data.data(), 4})->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  // Nothing was posted: the group is still consistent.
  std::fill(data.begin(), data.end(), 1.0f);
  ASSERT_TRUE(world.AllReduce(Buffer{data.data(), 12, DataType::kFloat32})->Wait().ok());
  EXPECT_EQ(data[11], static_cast<float>(world.size()));
}

TEST(MpiCommunicatorTest, MismatchedPointToPointSizes) {
  Communicator& world = World();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<float> small(5, 1.0f), large(10, 0.0f);
  if (world.rank() == 1) {
    ASSERT_TRUE(world.Send(Buffer{small.data(), 5}, 0, 7)->Wait().ok());
    ASSERT_TRUE(world.Send(Buffer{large.data(), 10}, 0, 8)->Wait().ok());
  } else if (world.rank() == 0) {
    absl::Status status = world.Recv(Buffer{large.data(), 10}, 1, 7)->Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("sent 5"), std::string::npos) << status;
    status = world.Recv(Buffer{small.data(), 5}, 1, 8)->Wait();
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.message().find("recv"), std::string::npos) << status;
  }
  ASSERT_TRUE(world.Barrier()->Wait().ok());
}

// Small receives whose message is already there complete when issued (no operation record):
// the data, the size check and the error's description must be those of the normal path.
TEST(MpiCommunicatorTest, ReceivesOfMessagesAlreadyThereCompleteWhenIssued) {
  Communicator& world = World();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<float> sent = {1, 2, 3, 4, 5}, received(5, 0.0f), too_large(10, 0.0f);
  if (world.rank() == 1) {
    ASSERT_TRUE(world.Send(Buffer{sent.data(), 5}, 0, 11)->Wait().ok());
    ASSERT_TRUE(world.Send(Buffer{sent.data(), 5}, 0, 12)->Wait().ok());
  }
  ASSERT_TRUE(world.Barrier()->Wait().ok());
  if (world.rank() == 0) {
    WorkPtr fits = world.Recv(Buffer{received.data(), 5}, 1, 11);
    ASSERT_TRUE(fits->Wait().ok());
    EXPECT_EQ(received, sent);
    EXPECT_NE(fits->Describe().find("recv"), std::string::npos) << fits->Describe();
    EXPECT_EQ(fits->Wait(absl::InfiniteDuration()).code(), absl::StatusCode::kInvalidArgument);
    WorkPtr mismatched = world.Recv(Buffer{too_large.data(), 10}, 1, 12);
    const absl::Status status = mismatched->Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("sent 5"), std::string::npos) << status;
    EXPECT_NE(status.message().find("recv #"), std::string::npos) << status;
    EXPECT_NE(status.message().find("from rank 1 tag 12"), std::string::npos) << status;
    EXPECT_EQ(mismatched->error().code(), absl::StatusCode::kInvalidArgument);
  }
  ASSERT_TRUE(world.Barrier()->Wait().ok());
}

// A small receive still pending after its test at issue is completed by whoever tests or waits
// on it (never queued for the progress thread): Test() alone completes it, and one dropped while
// pending keeps its place in MPI's matching order (handed to the progress side, not posted
// again), so the next message on its tag goes to the receive posted after it.
TEST(MpiCommunicatorTest, SmallReceivesCompleteThroughTestAloneAndMayBeDropped) {
  Communicator& world = World();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  auto split = world.Split(0, world.rank());
  ASSERT_TRUE(split.ok()) << split.status();
  std::unique_ptr<Communicator> group = std::move(split).value();
  int32_t tested = 0, dropped = 0, next = 0;
  int32_t values[3] = {7, 9, 8};
  WorkPtr by_test;
  if (group->rank() == 0) {
    by_test = group->Recv(Buffer{&tested, 1, DataType::kInt32}, 1, /*tag=*/31);
    WorkPtr gone = group->Recv(Buffer{&dropped, 1, DataType::kInt32}, 1, /*tag=*/32);
    EXPECT_FALSE(by_test->Test());
    EXPECT_FALSE(gone->Test());
    gone.reset();  // pending, nobody will wait on it
  }
  ASSERT_TRUE(world.Barrier()->Wait().ok());
  if (group->rank() == 1) {
    ASSERT_TRUE(group->Send(Buffer{&values[0], 1, DataType::kInt32}, 0, 31)->Wait().ok());
    ASSERT_TRUE(group->Send(Buffer{&values[1], 1, DataType::kInt32}, 0, 32)->Wait().ok());
    ASSERT_TRUE(group->Send(Buffer{&values[2], 1, DataType::kInt32}, 0, 32)->Wait().ok());
  }
  if (group->rank() == 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!by_test->Test() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(by_test->Test()) << "a small receive was not completed by Test() alone";
    EXPECT_TRUE(by_test->error().ok()) << by_test->error();
    EXPECT_EQ(tested, 7);
    ASSERT_TRUE(group->Recv(Buffer{&next, 1, DataType::kInt32}, 1, 32)->Wait().ok());
    EXPECT_EQ(next, 8) << "the dropped receive's message went to the receive posted after it";
  }
  ASSERT_TRUE(world.Barrier()->Wait().ok());
  if (group->rank() == 0) EXPECT_EQ(dropped, 9);
  // Background progress is a handle of the MPI backend, also through a forwarding handle.
  ForwardingCommunicator handle(group.get());
  EXPECT_NE(group->KeepProgressing(), nullptr);
  EXPECT_NE(handle.KeepProgressing(), nullptr);
}

TEST(MpiCommunicatorTest, BadArgumentsGiveStatusesNotCrashes) {
  Communicator& world = World();
  float x = 0;
  absl::Status status = world.Send(Buffer{&x, 1}, world.size(), 0)->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("invalid peer rank"), std::string::npos) << status;
  status = world.Recv(Buffer{&x, 1}, -1, 0)->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  status = world.Broadcast(Buffer{&x, 1}, world.size())->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("invalid root"), std::string::npos) << status;
  status = world.AllReduce(Buffer{&x, 1, DataType::kFloat32, Device::Cuda(0)})->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("nccl"), std::string::npos) << status;
  int32_t i = 0;
  status = world.AllReduce(Buffer{&i, 1, DataType::kInt32}, ReduceOp::kAverage)->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> full(10), wrong_shard(10);
  status = world.ReduceScatter(Buffer{full.data(), 10}, Buffer{wrong_shard.data(), 10})->Wait();
  if (world.size() > 1) EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  status = world.AllReduce(Buffer{nullptr, 4})->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(world.Shrink({world.rank()}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(world.Shrink({-3}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MpiCommunicatorTest, AbortFailsPendingAndLaterOperations) {
  Communicator& world = World();
  auto split = world.Split(0, world.rank());
  ASSERT_TRUE(split.ok());
  std::unique_ptr<Communicator> group = std::move(split).value();
  int x = 0;
  // A receive from self that nobody sends: pending until Abort.
  WorkPtr pending = group->Recv(Buffer{&x, 1, DataType::kInt32}, group->rank(), 77);
  EXPECT_FALSE(pending->Test());
  group->Abort(absl::UnavailableError("peer 3 died"));
  const absl::Status status = pending->Wait(absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("peer 3 died"), std::string::npos) << status;
  const absl::Status later = group->AllReduce(Buffer{&x, 1, DataType::kInt32})->Wait();
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(later.message().find("aborted"), std::string::npos) << later;
  EXPECT_EQ(group->Split(0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Messages that reach a rank after it dropped the communicator they were sent on (a peer's
// heartbeat, a transfer whose receive was never posted) must not reach the next communicator:
// an aborted communicator is never freed, so its context id is not reused. With the id reused,
// Open MPI filed the late messages under the new, smaller group and crashed on a sender index
// beyond it.
TEST(MpiCommunicatorTest, LateMessagesToADroppedCommunicatorDoNotReachItsSuccessor) {
  Communicator& world = World();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto split = world.Split(0, world.rank());
  ASSERT_TRUE(split.ok()) << split.status();
  std::unique_ptr<Communicator> dropped = std::move(split).value();
  if (world.rank() == 0) {
    dropped->Abort(absl::CancelledError("dropped while peers still send"));
    dropped.reset();
  }
  ASSERT_TRUE(world.Barrier()->Wait().ok());
  std::vector<int64_t> payload(4, 7);
  std::vector<WorkPtr> sends;
  if (world.rank() != 0) {
    for (int i = 0; i < 8; ++i) {
      sends.push_back(dropped->Send(Buffer{payload.data(), 4, DataType::kInt64}, 0, 5));
    }
    for (WorkPtr& send : sends) ASSERT_TRUE(send->Wait(absl::Seconds(10)).ok());
  }
  ASSERT_TRUE(world.Barrier()->Wait().ok());
  // Rank 0 alone, then everyone: new communicators that would take the dropped one's id.
  for (int round = 0; round < 2; ++round) {
    auto next = world.Split(round == 0 && world.rank() != 0 ? -1 : 0, world.rank());
    ASSERT_TRUE(next.ok()) << next.status();
    if (*next == nullptr) continue;
    int64_t value = 1;
    ASSERT_TRUE((*next)->AllReduce(Buffer{&value, 1, DataType::kInt64})->Wait().ok());
    EXPECT_EQ(value, (*next)->size());
    int64_t probe = 0;
    WorkPtr receive = (*next)->Recv(Buffer{&probe, 1, DataType::kInt64}, (*next)->rank(), 5);
    EXPECT_FALSE(receive->Wait(absl::Milliseconds(50)).ok()) << "a late message arrived here";
  }
  if (dropped != nullptr) dropped->Abort(absl::CancelledError("test over"));
}

TEST(MpiCommunicatorTest, OverlapProgressesWithoutWaiting) {
  // The progress thread completes an all-reduce while this thread does not call into the
  // communicator at all.
  Communicator& world = World();
  std::vector<float> data(1 << 18, 1.0f);
  WorkPtr work = world.AllReduce(Buffer{data.data(), static_cast<int64_t>(data.size())});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (data.back() != static_cast<float>(world.size()) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(data.back(), static_cast<float>(world.size()));
  ASSERT_TRUE(work->Wait().ok());
}

// A communicator over every rank without the signature check (the hot path users run); null
// (with the failure recorded) if it cannot be created. Collective over MPI_COMM_WORLD.
std::unique_ptr<MpiCommunicator> UncheckedWorld() {
  CommOptions options;
  options.timeout = kTestTimeout;
  options.verify_collectives = false;
  auto created = MpiCommunicator::FromMpiComm(MPI_COMM_WORLD, options);
  if (!created.ok()) {
    ADD_FAILURE() << created.status();
    return nullptr;
  }
  return std::move(created).value();
}

// Without the signature check the issuing thread posts collectives itself and waiters test
// their own requests: several collectives in flight, waited on in reverse order, across the
// sizes where the algorithms change (recursive doubling / direct reduce-scatter, libnbc, rings).
TEST(MpiCommunicatorTest, CollectivesPostedAtIssueWithoutSignatureChecks) {
  std::unique_ptr<MpiCommunicator> unchecked = UncheckedWorld();
  ASSERT_NE(unchecked, nullptr);
  MpiCommunicator& comm = *unchecked;
  const int n = comm.size();
  const int me = comm.rank();
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{2000}, int64_t{9000}, int64_t{300000}}) {
    SCOPED_TRACE(absl::StrCat("count ", count));
    const ShardRange shard = Shard(count, n, me);
    std::vector<float> reduced(count), input(count), scattered(std::max<int64_t>(shard.count, 1));
    std::vector<float> gathered(count), own(std::max<int64_t>(shard.count, 1)), broadcast(count);
    for (int64_t i = 0; i < count; ++i) {
      reduced[i] = input[i] = static_cast<float>(Value(me, i));
      broadcast[i] = me == n - 1 ? static_cast<float>(i % 97) : -1.0f;
    }
    for (int64_t i = 0; i < shard.count; ++i) own[i] = static_cast<float>(Value(me, shard.offset + i));
    std::vector<WorkPtr> works = {
        comm.AllReduce(Buffer{reduced.data(), count}),
        comm.ReduceScatter(Buffer{input.data(), count}, Buffer{scattered.data(), shard.count}),
        comm.AllGather(Buffer{own.data(), shard.count}, Buffer{gathered.data(), count}),
        comm.Broadcast(Buffer{broadcast.data(), count}, /*root=*/n - 1),
    };
    for (auto it = works.rbegin(); it != works.rend(); ++it) ASSERT_TRUE((*it)->Wait().ok());
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) {
      wrong += reduced[i] != static_cast<float>(Reduce(ReduceOp::kSum, n, i, DataType::kFloat32));
      wrong += gathered[i] != static_cast<float>(Value(OwnerOf(i, count, n), i));
      wrong += broadcast[i] != static_cast<float>(i % 97);
    }
    for (int64_t i = 0; i < shard.count; ++i) {
      wrong += scattered[i] !=
               static_cast<float>(Reduce(ReduceOp::kSum, n, shard.offset + i, DataType::kFloat32));
    }
    EXPECT_EQ(wrong, 0);
  }
}

// Small collectives whose peers' messages are already there complete when issued, on the
// issuing thread, without an operation record (averages, reduce-scatters, gathers, broadcasts
// as root and as receiver): their results must be those of the normal path, the average's
// division included (it was once skipped there). Every rank but `late` issues first; `late`
// issues once the others' messages left, and its operations usually complete at once.
TEST(MpiCommunicatorTest, SmallCollectivesThatCompleteWhenIssuedGiveFullResults) {
  std::unique_ptr<MpiCommunicator> unchecked = UncheckedWorld();
  ASSERT_NE(unchecked, nullptr);
  MpiCommunicator& comm = *unchecked;
  const int n = comm.size();
  const int me = comm.rank();
  constexpr int64_t kCount = 5;
  int completed_at_issue = 0;
  for (int round = 0; round < 3 * n; ++round) {
    const int late = round % n;
    const int root = (late + round / n) % n;  // the late rank is root, then receiver
    SCOPED_TRACE(absl::StrCat("late rank ", late, ", root ", root));
    const ShardRange shard = Shard(kCount, n, me);
    const int64_t shard_or_one = std::max<int64_t>(shard.count, 1);
    std::vector<float> averaged(kCount), input(kCount), scattered(shard_or_one);
    std::vector<float> own(shard_or_one), gathered(kCount), broadcast(kCount);
    for (int64_t i = 0; i < kCount; ++i) {
      averaged[i] = input[i] = static_cast<float>(Value(me, i));
      broadcast[i] = me == root ? static_cast<float>(i + 1) : -1.0f;
    }
    for (int64_t i = 0; i < shard.count; ++i) {
      own[i] = static_cast<float>(Value(me, shard.offset + i));
    }
    auto issue = [&] {
      return std::vector<WorkPtr>{
          comm.AllReduce(Buffer{averaged.data(), kCount}, ReduceOp::kAverage),
          comm.ReduceScatter(Buffer{input.data(), kCount}, Buffer{scattered.data(), shard.count},
                             ReduceOp::kAverage),
          comm.AllGather(Buffer{own.data(), shard.count}, Buffer{gathered.data(), kCount}),
          comm.Broadcast(Buffer{broadcast.data(), kCount}, root)};
    };
    std::vector<WorkPtr> works;
    if (me != late) works = issue();
    MPI_Barrier(MPI_COMM_WORLD);  // the others' operations are posted (their sends left)
    if (me == late) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      works = issue();
      for (const WorkPtr& work : works) {
        completed_at_issue += work->Describe().find("completed when issued") != std::string::npos;
      }
    }
    for (const WorkPtr& work : works) ASSERT_TRUE(work->Wait().ok()) << work->Describe();
    int64_t wrong = 0;
    for (int64_t i = 0; i < kCount; ++i) {
      wrong += averaged[i] !=
               static_cast<float>(Reduce(ReduceOp::kAverage, n, i, DataType::kFloat32));
      wrong += gathered[i] != static_cast<float>(Value(OwnerOf(i, kCount, n), i));
      wrong += broadcast[i] != static_cast<float>(i + 1);
    }
    for (int64_t i = 0; i < shard.count; ++i) {
      wrong += scattered[i] != static_cast<float>(Reduce(ReduceOp::kAverage, n,
                                                         shard.offset + i, DataType::kFloat32));
    }
    EXPECT_EQ(wrong, 0);
  }
  // Each rank was late three times, with four operations each: most complete when issued
  // (one that did not still gives its result through the normal path above).
  EXPECT_GT(completed_at_issue, 0) << "no operation of a late rank completed when issued";
}

// Many operations in flight at once, of every kind and across the sizes where the algorithms
// change (direct, recursive doubling, libnbc, rings), with point-to-point messages between
// them: every rank issues the same random sequence (a seed all ranks share), then waits on its
// operations in an order of its own, now and then sleeping first or polling with Test, so that
// some operations complete when issued, some on the engine's thread and some under another
// operation's wait. Every result must match its sequential reference.
void RunRandomMixOfOperations(Communicator& comm) {
  const int n = comm.size();
  const int me = comm.rank();
  const int next = (me + 1) % n, previous = (me + n - 1) % n;
  const std::vector<int64_t> counts = {1,    2,    3,    int64_t{n} - 1, n + 1, 64, 1000, 2047,
                                       2048, 2049, 8191, 8192,           8193,  40000};
  std::mt19937 shared(12345);              // the same operations on every rank
  std::mt19937 own(777 + 31 * static_cast<unsigned>(me));  // this rank's waits and delays
  enum Kind { kAllReduce, kAverage, kMax, kReduceScatter, kAllGather, kBroadcast, kExchange };
  struct Pending {
    Kind kind;
    int64_t count;
    int root = 0;
    std::vector<float> data, out;
    WorkPtr work, second;  // second: an exchange's send
  };
  int64_t wrong = 0, operations = 0;
  for (int round = 0; round < 100; ++round) {
    std::vector<Pending> pending(1 + shared() % 6);
    for (Pending& p : pending) {
      p.kind = static_cast<Kind>(shared() % 7);
      p.count = std::max<int64_t>(counts[shared() % counts.size()], 0);
      p.root = static_cast<int>(shared() % n);
    }
    if (own() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(own() % 3000));
    for (size_t k = 0; k < pending.size(); ++k) {
      Pending& p = pending[k];
      const int64_t count = p.count;
      const ShardRange shard = Shard(count, n, me);
      switch (p.kind) {
        case kAllReduce:
        case kAverage:
        case kMax:
          p.data.resize(count);
          for (int64_t i = 0; i < count; ++i) p.data[i] = static_cast<float>(Value(me, i));
          p.work = comm.AllReduce(Buffer{p.data.data(), count},
                                  p.kind == kAllReduce ? ReduceOp::kSum
                                  : p.kind == kAverage ? ReduceOp::kAverage
                                                       : ReduceOp::kMax);
          break;
        case kReduceScatter:
          p.data.resize(count);
          p.out.assign(std::max<int64_t>(shard.count, 1), -1.0f);
          for (int64_t i = 0; i < count; ++i) p.data[i] = static_cast<float>(Value(me, i));
          p.work = comm.ReduceScatter(Buffer{p.data.data(), count},
                                      Buffer{p.out.data(), shard.count});
          break;
        case kAllGather:
          p.data.resize(std::max<int64_t>(shard.count, 1));
          p.out.assign(count, -1.0f);
          for (int64_t i = 0; i < shard.count; ++i) {
            p.data[i] = static_cast<float>(Value(me, shard.offset + i));
          }
          p.work = comm.AllGather(Buffer{p.data.data(), shard.count},
                                  Buffer{p.out.data(), count});
          break;
        case kBroadcast:
          p.data.resize(count);
          for (int64_t i = 0; i < count; ++i) {
            p.data[i] = me == p.root ? static_cast<float>((i + round) % 101) : -1.0f;
          }
          p.work = comm.Broadcast(Buffer{p.data.data(), count}, p.root);
          break;
        case kExchange: {  // a ring shift: send to the next rank, receive from the previous
          p.data.resize(count);
          p.out.assign(count, -1.0f);
          for (int64_t i = 0; i < count; ++i) p.data[i] = static_cast<float>(Value(me, i + k));
          const int tag = static_cast<int>(100 * round + k);
          p.work = comm.Recv(Buffer{p.out.data(), count}, previous, tag);
          p.second = comm.Send(Buffer{p.data.data(), count}, next, tag);
          break;
        }
      }
    }
    // This rank's order of waits: a random permutation; some polled with Test first.
    std::vector<size_t> order(pending.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::shuffle(order.begin(), order.end(), own);
    for (size_t k : order) {
      Pending& p = pending[k];
      SCOPED_TRACE(absl::StrCat("round ", round, ", operation ", k, " (kind ", p.kind,
                                ", count ", p.count, ")"));
      if (own() % 3 == 0) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!p.work->Test() && std::chrono::steady_clock::now() < deadline) {
        }
      }
      ASSERT_TRUE(p.work->Wait().ok()) << p.work->Describe();
      if (p.second != nullptr) ASSERT_TRUE(p.second->Wait().ok()) << p.second->Describe();
      ++operations;
      const int64_t count = p.count;
      const ShardRange shard = Shard(count, n, me);
      switch (p.kind) {
        case kAllReduce:
        case kAverage:
        case kMax: {
          const ReduceOp op = p.kind == kAllReduce ? ReduceOp::kSum
                              : p.kind == kAverage ? ReduceOp::kAverage
                                                   : ReduceOp::kMax;
          for (int64_t i = 0; i < count; ++i) {
            wrong += p.data[i] != static_cast<float>(Reduce(op, n, i, DataType::kFloat32));
          }
          break;
        }
        case kReduceScatter:
          for (int64_t i = 0; i < shard.count; ++i) {
            wrong += p.out[i] != static_cast<float>(Reduce(ReduceOp::kSum, n, shard.offset + i,
                                                           DataType::kFloat32));
          }
          break;
        case kAllGather:
          for (int64_t i = 0; i < count; ++i) {
            wrong += p.out[i] != static_cast<float>(Value(OwnerOf(i, count, n), i));
          }
          break;
        case kBroadcast:
          for (int64_t i = 0; i < count; ++i) {
            wrong += p.data[i] != static_cast<float>((i + round) % 101);
          }
          break;
        case kExchange:
          for (int64_t i = 0; i < count; ++i) {
            wrong += p.out[i] != static_cast<float>(Value(previous, i + k));
          }
          break;
      }
    }
    ASSERT_EQ(wrong, 0) << "after round " << round;
  }
  EXPECT_GT(operations, 100);
}

// The hot path users run: collectives posted and small ones tested by the issuing thread.
TEST(MpiCommunicatorTest, RandomMixOfOperationsInFlightMatchesReferences) {
  std::unique_ptr<MpiCommunicator> unchecked = UncheckedWorld();
  ASSERT_NE(unchecked, nullptr);
  RunRandomMixOfOperations(*unchecked);
}

// With the signature check every collective goes through the progress side's queue first.
TEST(MpiCommunicatorTest, RandomMixOfOperationsInFlightWithSignatureChecksMatchesReferences) {
  RunRandomMixOfOperations(World());
}

// Growing a running job: every rank takes part in starting two more processes of this test
// program (they run just this test, and take the other branch), and the merged communicator
// has the old ranks first, in order, then the new ones; a sum over it counts everyone.
TEST(MpiCommunicatorTest, SpawnAndMergeAddsRanksToARunningJob) {
  Communicator& world = World();  // initialises MPI, in the started processes too
  constexpr int kStarted = 2;
  if (MpiCommunicator::Spawned()) {
    CommOptions options;  // as the parents' World(): they check collective signatures
    options.timeout = kTestTimeout;
    options.verify_collectives = true;
    auto merged = MpiCommunicator::JoinParents(options);
    ASSERT_TRUE(merged.ok()) << merged.status();
    EXPECT_EQ(world.size(), kStarted);
    EXPECT_GE((*merged)->rank(), (*merged)->size() - kStarted);
    int64_t one = 1;
    ASSERT_TRUE((*merged)->AllReduce(Buffer{&one, 1, DataType::kInt64})->Wait().ok());
    EXPECT_EQ(one, (*merged)->size());
    return;
  }
  auto* mpi = dynamic_cast<MpiCommunicator*>(&world);
  ASSERT_NE(mpi, nullptr);
  char self[4096];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(length, 0);
  self[length] = '\0';
  auto merged = mpi->SpawnAndMerge(
      {self, "--gtest_filter=MpiCommunicatorTest.SpawnAndMergeAddsRanksToARunningJob"}, kStarted);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ((*merged)->size(), world.size() + kStarted);
  EXPECT_EQ((*merged)->rank(), world.rank());
  // The started ranks are outside this process's MPI_COMM_WORLD.
  EXPECT_EQ((*merged)->world_ranks()[world.rank()], world.rank());
  EXPECT_EQ((*merged)->world_ranks().back(), -1);
  int64_t one = 1;
  ASSERT_TRUE((*merged)->AllReduce(Buffer{&one, 1, DataType::kInt64})->Wait().ok());
  EXPECT_EQ(one, world.size() + kStarted);
}

}  // namespace
}  // namespace tandem::comm
