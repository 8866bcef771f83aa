// NCCL backend tests: every collective and data type, grouped sends and receives, splits,
// shrink and abort. They need a GPU per rank, or ranks sharing a GPU in NCCL's multi-rank mode
// (NCCL >= 2.30 loaded at run time, comm::SharedGpuOverNccl); elsewhere they skip with the
// reason (no CUDA device; an older NCCL and fewer GPUs than ranks).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "comm/buffer.h"
#include "comm/dtype.h"
#include "comm/internal/work_util.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/nccl/nccl_communicator.h"
#include "gtest/gtest.h"
#include "tests/comm/comm_test_util.h"

namespace tandem::comm {
namespace {

using testing::GetElement;
using testing::OwnedBuffer;
using testing::SetElement;

// The NCCL world, or the reason it cannot exist here (then tests skip).
struct NcclWorld {
  std::unique_ptr<MpiCommunicator> cpu;
  std::unique_ptr<NcclCommunicator> nccl;
  std::string skip_reason;
  bool shared = false;  // ranks share GPUs (NCCL's multi-rank mode)
};

NcclCommunicator* g_world_nccl = nullptr;  // World().nccl once made

NcclWorld& World() {
  static NcclWorld* world = [] {
    auto* w = new NcclWorld;
    auto cpu = MpiCommunicator::World();
    if (!cpu.ok()) {
      w->skip_reason = cpu.status().ToString();
      return w;
    }
    w->cpu = std::move(cpu).value();
    auto mode = CommOptions::FromEnvironment();
    if (!mode.ok() || !NcclCanRun(*w->cpu, mode->shared_gpu, &w->skip_reason)) {
      if (!mode.ok()) w->skip_reason = mode.status().ToString();
      return w;
    }
    const int devices = CudaDeviceCount();
    w->shared = devices < w->cpu->size();
    if (w->cpu->rank() == 0) {
      std::printf("NCCL %s loaded; %d ranks on %d GPU(s)%s\n",
                  NcclVersionName(NcclRuntimeVersion()).c_str(), w->cpu->size(),
                  std::min(devices, w->cpu->size()),
                  w->shared ? " (sharing: NCCL's multi-rank mode)" : "");
    }
    CommOptions options;
    options.timeout = absl::Seconds(60);
    options.verify_collectives = true;  // the mismatch tests need the debug check
    auto nccl = NcclCommunicator::Create(*w->cpu, options);
    if (!nccl.ok()) {
      ADD_FAILURE() << nccl.status();
      w->skip_reason = nccl.status().ToString();
      return w;
    }
    w->nccl = std::move(nccl).value();
    g_world_nccl = w->nccl.get();
    return w;
  }();
  return *world;
}

// A failed check may leave an NCCL kernel waiting for a peer that moved on; the buffers freed
// at the end of the test (cudaFree waits for the device) would then hang the run instead of
// failing it. The first failure aborts the world communicator (its kernels stop), so the
// remaining checks fail fast.
class AbortOnFailure : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed() && g_world_nccl != nullptr) {
      g_world_nccl->Abort(absl::AbortedError("a check of this test failed"));
    }
  }
};
const bool kAbortOnFailure = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new AbortOnFailure);
  return true;
}();

#define SKIP_WITHOUT_GPU()                                            \
  if (World().nccl == nullptr) GTEST_SKIP() << World().skip_reason;   \
  NcclCommunicator& nccl = *World().nccl

// Device copy of a host buffer, freed at scope exit.
struct DeviceBuffer {
  void* data = nullptr;
  Buffer buffer;
  DeviceBuffer(const Buffer& host, int device) {
    cudaSetDevice(device);
    cudaMalloc(&data, std::max<size_t>(host.bytes(), 1));
    if (host.bytes() > 0) cudaMemcpy(data, host.data, host.bytes(), cudaMemcpyHostToDevice);
    buffer = MakeBuffer(data, host.count, host.dtype, Device::Cuda(device));
  }
  void CopyTo(const Buffer& host) const {
    if (host.bytes() > 0) cudaMemcpy(host.data, data, host.bytes(), cudaMemcpyDeviceToHost);
  }
  ~DeviceBuffer() { cudaFree(data); }
};

double Value(int rank, int64_t i) { return static_cast<double>((rank + 1) * (i % 7 + 1) % 13); }

TEST(NcclTest, CollectivesMatchSequentialReference) {
  SKIP_WITHOUT_GPU();
  const int n = nccl.size();
  // Sums of integers up to 12 a rank: exact in every type, int8 included (up to 8 ranks).
  for (DataType type : {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16,
                        DataType::kFloat16, DataType::kInt8, DataType::kUInt8, DataType::kInt32,
                        DataType::kInt64}) {
    const int64_t several_mb = (3 << 20) / static_cast<int64_t>(SizeOf(type)) + 1;
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{5 * n + 3}, several_mb}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(type), " count ", count));
      OwnedBuffer host(type, count);
      for (int64_t i = 0; i < count; ++i) SetElement(host.buffer, i, Value(nccl.rank(), i));
      // All-reduce.
      {
        DeviceBuffer device(host.buffer, nccl.device());
        ASSERT_TRUE(nccl.AllReduce(device.buffer)->Wait().ok());
        OwnedBuffer result(type, count);
        device.CopyTo(result.buffer);
        int64_t wrong = 0;
        for (int64_t i = 0; i < count; ++i) {
          double expected = 0;
          for (int r = 0; r < n; ++r) expected += Value(r, i);
          wrong += GetElement(result.buffer, i) != expected;
        }
        EXPECT_EQ(wrong, 0) << "all_reduce";
      }
      // Reduce-scatter (unequal shards when count % n != 0) and all-gather back.
      {
        const ShardRange shard = Shard(count, n, nccl.rank());
        DeviceBuffer input(host.buffer, nccl.device());
        OwnedBuffer shard_host(type, shard.count);
        DeviceBuffer output(shard_host.buffer, nccl.device());
        ASSERT_TRUE(nccl.ReduceScatter(input.buffer, output.buffer)->Wait().ok());
        output.CopyTo(shard_host.buffer);
        int64_t wrong = 0;
        for (int64_t i = 0; i < shard.count; ++i) {
          double expected = 0;
          for (int r = 0; r < n; ++r) expected += Value(r, shard.offset + i);
          wrong += GetElement(shard_host.buffer, i) != expected;
        }
        EXPECT_EQ(wrong, 0) << "reduce_scatter";
        OwnedBuffer gathered(type, count);
        DeviceBuffer gathered_device(gathered.buffer, nccl.device());
        ASSERT_TRUE(nccl.AllGather(output.buffer, gathered_device.buffer)->Wait().ok());
        gathered_device.CopyTo(gathered.buffer);
        wrong = 0;
        for (int64_t i = 0; i < count; ++i) {
          double expected = 0;
          for (int r = 0; r < n; ++r) expected += Value(r, i);
          wrong += GetElement(gathered.buffer, i) != expected;
        }
        EXPECT_EQ(wrong, 0) << "all_gather";
      }
      // Broadcast from the last rank.
      {
        DeviceBuffer device(host.buffer, nccl.device());
        ASSERT_TRUE(nccl.Broadcast(device.buffer, n - 1)->Wait().ok());
        OwnedBuffer result(type, count);
        device.CopyTo(result.buffer);
        int64_t wrong = 0;
        for (int64_t i = 0; i < count; ++i) wrong += GetElement(result.buffer, i) != Value(n - 1, i);
        EXPECT_EQ(wrong, 0) << "broadcast";
      }
    }
  }
  ASSERT_TRUE(nccl.Barrier()->Wait().ok());
}

TEST(NcclTest, OperationsAreOrderedAfterTheCallersStream) {
  SKIP_WITHOUT_GPU();
  // The caller's stream uploads 64 MiB (pinned, asynchronous) and the reduce-scatter reads it
  // right away: without the event ordering it would see the stale (zero) device memory.
  constexpr int64_t kCount = 16 << 20;
  cudaSetDevice(nccl.device());
  cudaStream_t caller;
  ASSERT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, kCount * sizeof(float)), cudaSuccess);
  for (int64_t i = 0; i < kCount; ++i) pinned[i] = static_cast<float>(i % 1000);
  float* input = nullptr;
  float* output = nullptr;
  const ShardRange shard = Shard(kCount, nccl.size(), nccl.rank());
  ASSERT_EQ(cudaMalloc(&input, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&output, shard.count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(input, 0, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  nccl.set_caller_stream(caller);
  ASSERT_EQ(cudaMemcpyAsync(input, pinned, kCount * sizeof(float), cudaMemcpyHostToDevice, caller),
            cudaSuccess);
  WorkPtr work = nccl.ReduceScatter(MakeBuffer(input, kCount, DataType::kFloat32,
                                               Device::Cuda(nccl.device())),
                                    MakeBuffer(output, shard.count, DataType::kFloat32,
                                               Device::Cuda(nccl.device())));
  // The download on the caller's stream waits for the collective on the device.
  ASSERT_TRUE(NcclCommunicator::OrderAfter(work, caller).ok());
  std::vector<float> result(shard.count);
  ASSERT_EQ(cudaMemcpyAsync(result.data(), output, shard.count * sizeof(float),
                            cudaMemcpyDeviceToHost, caller),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
  int64_t wrong = 0;
  for (int64_t i = 0; i < shard.count; ++i) {
    wrong += result[i] != static_cast<float>(((shard.offset + i) % 1000) * nccl.size());
  }
  EXPECT_EQ(wrong, 0);
  ASSERT_TRUE(work->Wait().ok());
  nccl.set_caller_stream(nullptr);
  cudaFree(input);
  cudaFree(output);
  cudaFreeHost(pinned);
  cudaStreamDestroy(caller);
}

TEST(NcclTest, BadInputGivesStatuses) {
  SKIP_WITHOUT_GPU();
  float host[4] = {0, 0, 0, 0};
  absl::Status status = nccl.AllReduce(CpuBuffer(host, 4))->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("mpi backend"), std::string::npos) << status;
  DeviceBuffer device(CpuBuffer(host, 4), nccl.device());
  status = nccl.Send(device.buffer, 0, /*tag=*/3)->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tag"), std::string::npos) << status;
  status = nccl.Send(device.buffer, nccl.size())->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  Buffer wrong_device = device.buffer;
  wrong_device.device.index = nccl.device() + 1;
  EXPECT_EQ(nccl.AllReduce(wrong_device)->Wait().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclTest, SplitGroupsAndAbortRefusesLaterWork) {
  SKIP_WITHOUT_GPU();
  auto split = nccl.Split(/*color=*/0, /*key=*/-nccl.rank());
  ASSERT_TRUE(split.ok()) << split.status();
  std::unique_ptr<Communicator> group = std::move(split).value();
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->size(), nccl.size());
  EXPECT_EQ(group->rank(), nccl.size() - 1 - nccl.rank());
  float host[3] = {1, 2, 3};
  DeviceBuffer device(CpuBuffer(host, 3), nccl.device());
  ASSERT_TRUE(group->AllReduce(device.buffer)->Wait().ok());
  device.CopyTo(CpuBuffer(host, 3));
  EXPECT_EQ(host[2], 3.0f * nccl.size());
  group->Abort(absl::UnavailableError("test abort"));
  const absl::Status after = group->AllReduce(device.buffer)->Wait();
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(after.message().find("test abort"), std::string::npos) << after;
}

TEST(NcclTest, MaximumMinimumAndAverageReduceElementwise) {
  SKIP_WITHOUT_GPU();
  const int n = nccl.size();
  constexpr int64_t kCount = 1000;
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAverage}) {
    SCOPED_TRACE(internal::ReduceOpName(op));
    std::vector<float> host(kCount);
    for (int64_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(Value(nccl.rank(), i));
    DeviceBuffer device(CpuBuffer(host.data(), kCount), nccl.device());
    ASSERT_TRUE(nccl.AllReduce(device.buffer, op)->Wait().ok());
    device.CopyTo(CpuBuffer(host.data(), kCount));
    int64_t wrong = 0;
    for (int64_t i = 0; i < kCount; ++i) {
      double expected = op == ReduceOp::kMin ? 1e9 : op == ReduceOp::kMax ? -1e9 : 0;
      for (int r = 0; r < n; ++r) {
        const double v = Value(r, i);
        expected = op == ReduceOp::kMin ? std::min(expected, v)
                   : op == ReduceOp::kMax ? std::max(expected, v)
                                          : expected + v / n;
      }
      wrong += std::abs(host[i] - expected) > 1e-5 * std::max(1.0, std::abs(expected));
    }
    EXPECT_EQ(wrong, 0);
  }
}

// Every rank sends to both ring neighbours and receives from both in one batch (one NCCL group):
// with two ranks the neighbours send to each other at once, several MiB each way, which
// deadlocks unless the sends and receives are grouped.
TEST(NcclTest, GroupedSendsAndReceivesToBothNeighboursAtOnce) {
  SKIP_WITHOUT_GPU();
  const int n = nccl.size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (nccl.rank() + 1) % n, previous = (nccl.rank() + n - 1) % n;
  for (int64_t count : {int64_t{1}, int64_t{4099}, int64_t{3} << 20}) {
    SCOPED_TRACE(absl::StrCat("count ", count));
    std::vector<float> mine(count);
    for (int64_t i = 0; i < count; ++i) mine[i] = static_cast<float>(nccl.rank() * 1000 + i % 997);
    DeviceBuffer to_next(CpuBuffer(mine.data(), count), nccl.device());
    DeviceBuffer to_previous(CpuBuffer(mine.data(), count), nccl.device());
    std::vector<float> zeros(count, 0.0f);
    DeviceBuffer from_next(CpuBuffer(zeros.data(), count), nccl.device());
    DeviceBuffer from_previous(CpuBuffer(zeros.data(), count), nccl.device());
    std::vector<PointToPoint> batch = {
        {PointToPoint::Kind::kSend, to_next.buffer, next, 0},
        {PointToPoint::Kind::kSend, to_previous.buffer, previous, 0},
        {PointToPoint::Kind::kRecv, from_next.buffer, next, 0},
        {PointToPoint::Kind::kRecv, from_previous.buffer, previous, 0},
    };
    if (n == 2) batch = {batch[0], batch[2]};  // one neighbour, both ways
    ASSERT_TRUE(nccl.SendRecvBatch(batch)->Wait().ok());
    std::vector<float> got(count);
    from_next.CopyTo(CpuBuffer(got.data(), count));
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) wrong += got[i] != static_cast<float>(next * 1000 + i % 997);
    EXPECT_EQ(wrong, 0) << "from the next rank";
    if (n > 2) {
      from_previous.CopyTo(CpuBuffer(got.data(), count));
      wrong = 0;
      for (int64_t i = 0; i < count; ++i) {
        wrong += got[i] != static_cast<float>(previous * 1000 + i % 997);
      }
      EXPECT_EQ(wrong, 0) << "from the previous rank";
    }
  }
  // Single sends and receives posted back to back, each rank's send before its receive, in
  // rank order (rank 0 sends first): small messages, as a pipeline's first exchange.
  float value = static_cast<float>(nccl.rank() + 1);
  DeviceBuffer out(CpuBuffer(&value, 1), nccl.device());
  float zero = 0;
  DeviceBuffer in(CpuBuffer(&zero, 1), nccl.device());
  WorkPtr send, receive;
  if (nccl.rank() % 2 == 0) {
    send = nccl.Send(out.buffer, next);
    receive = nccl.Recv(in.buffer, previous);
  } else {
    receive = nccl.Recv(in.buffer, previous);
    send = nccl.Send(out.buffer, next);
  }
  ASSERT_TRUE(send->Wait().ok());
  ASSERT_TRUE(receive->Wait().ok());
  in.CopyTo(CpuBuffer(&zero, 1));
  EXPECT_EQ(zero, static_cast<float>(previous + 1));
}

// Every rank sends to both ring neighbours, each in a batch of its own, before it receives
// from them (two ranks: each sends to the other first, as Chimera's opposite pipelines do),
// 12 MiB a message, more than NCCL's buffers. On one communicator NCCL holds a rank's stream in
// its send until the peer's receive runs, and that receive is queued behind the peer's own
// send: a deadlock. With a link per ordered pair (ConnectPeers) each send waits only for its
// own receive.
TEST(NcclTest, SendsBeforeReceivesInBothDirectionsCompleteOverPairLinks) {
  SKIP_WITHOUT_GPU();
  const int n = nccl.size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  if (!CommOptions::FromEnvironment()->nccl_pair_links) {
    GTEST_SKIP() << "TANDEM_COMM_NCCL_LINKS=0: no links, this pattern deadlocks";
  }
  constexpr int64_t kCount = 3 << 20;
  const int next = (nccl.rank() + 1) % n, previous = (nccl.rank() + n - 1) % n;
  auto values = [](int rank) {
    std::vector<float> v(kCount);
    for (int64_t i = 0; i < kCount; ++i) v[i] = static_cast<float>(rank * 1000 + i % 997);
    return v;
  };
  std::vector<float> mine = values(nccl.rank()), zeros(kCount, 0.0f);
  // Declared before the communicator, so freed after it (a stuck transfer is aborted first).
  DeviceBuffer to_next(CpuBuffer(mine.data(), kCount), nccl.device());
  DeviceBuffer to_previous(CpuBuffer(mine.data(), kCount), nccl.device());
  DeviceBuffer from_next(CpuBuffer(zeros.data(), kCount), nccl.device());
  DeviceBuffer from_previous(CpuBuffer(zeros.data(), kCount), nccl.device());
  auto split = nccl.Split(/*color=*/0, nccl.rank());  // links are made once a communicator
  ASSERT_TRUE(split.ok()) << split.status();
  Communicator& group = **split;
  ASSERT_TRUE(group.ConnectPeers({next, previous}).ok());
  EXPECT_EQ(group.ConnectPeers({next}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(nccl.ConnectPeers({n}).code(), absl::StatusCode::kInvalidArgument);
  WorkPtr sends[2] = {group.Send(to_next.buffer, next), group.Send(to_previous.buffer, previous)};
  WorkPtr receives[2] = {group.Recv(from_previous.buffer, previous),
                         group.Recv(from_next.buffer, next)};
  for (WorkPtr& work : sends) ASSERT_TRUE(work->Wait().ok()) << work->Describe();
  for (WorkPtr& work : receives) ASSERT_TRUE(work->Wait().ok()) << work->Describe();
  std::vector<float> got(kCount);
  for (const auto& [buffer, peer] : {std::make_pair(&from_previous, previous),
                                     std::make_pair(&from_next, next)}) {
    buffer->CopyTo(CpuBuffer(got.data(), kCount));
    EXPECT_EQ(got, values(peer)) << "from rank " << peer;
  }
  // Collectives still run on the group's own communicator.
  float one = 1;
  DeviceBuffer sum(CpuBuffer(&one, 1), nccl.device());
  ASSERT_TRUE(group.AllReduce(sum.buffer)->Wait().ok());
  sum.CopyTo(CpuBuffer(&one, 1));
  EXPECT_EQ(one, static_cast<float>(n));
}

TEST(NcclTest, SplitIntoHalvesReducesWithinEachHalf) {
  SKIP_WITHOUT_GPU();
  const int n = nccl.size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int color = nccl.rank() % 2;
  auto split = nccl.Split(color, nccl.rank());
  ASSERT_TRUE(split.ok()) << split.status();
  std::unique_ptr<Communicator> half = std::move(split).value();
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->size(), (n + 1 - color) / 2);
  double expected = 0;
  for (int r = color; r < n; r += 2) expected += r + 1;
  for (DataType type : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64}) {
    OwnedBuffer host(type, 3);
    for (int64_t i = 0; i < 3; ++i) SetElement(host.buffer, i, nccl.rank() + 1);
    DeviceBuffer device(host.buffer, nccl.device());
    ASSERT_TRUE(half->AllReduce(device.buffer)->Wait().ok());
    device.CopyTo(host.buffer);
    EXPECT_EQ(GetElement(host.buffer, 2), expected) << DataTypeName(type);
  }
  // A rank left out (colour -1) gets no communicator, and the others still reduce.
  auto partial = nccl.Split(nccl.rank() == 0 ? -1 : 0, nccl.rank());
  ASSERT_TRUE(partial.ok()) << partial.status();
  if (nccl.rank() == 0) {
    EXPECT_EQ(*partial, nullptr);
  } else {
    ASSERT_NE(*partial, nullptr);
    EXPECT_EQ((*partial)->size(), n - 1);
    float one = 1;
    DeviceBuffer device(CpuBuffer(&one, 1), nccl.device());
    ASSERT_TRUE((*partial)->AllReduce(device.buffer)->Wait().ok());
    device.CopyTo(CpuBuffer(&one, 1));
    EXPECT_EQ(one, static_cast<float>(n - 1));
  }
}

// Shrink without a failure: the last rank is left out (it does not take part), the others get a
// communicator without it that reduces, and the parent keeps working for everyone afterwards.
TEST(NcclTest, ShrinkLeavesARankOutAndTheRestReduce) {
  SKIP_WITHOUT_GPU();
  const int n = nccl.size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int left_out = n - 1;
  if (nccl.rank() != left_out) {
    auto shrunk = nccl.Shrink({left_out});
    if (absl::IsUnimplemented(shrunk.status())) GTEST_SKIP() << shrunk.status();
    ASSERT_TRUE(shrunk.ok()) << shrunk.status();
    std::unique_ptr<Communicator> rest = std::move(shrunk).value();
    ASSERT_EQ(rest->size(), n - 1);
    EXPECT_EQ(rest->rank(), nccl.rank());
    float value = static_cast<float>(nccl.rank() + 1);
    DeviceBuffer device(CpuBuffer(&value, 1), nccl.device());
    ASSERT_TRUE(rest->AllReduce(device.buffer)->Wait().ok());
    device.CopyTo(CpuBuffer(&value, 1));
    EXPECT_EQ(value, static_cast<float>((n - 1) * n / 2));
  }
  float one = 1;
  DeviceBuffer device(CpuBuffer(&one, 1), nccl.device());
  ASSERT_TRUE(nccl.AllReduce(device.buffer)->Wait().ok());
  device.CopyTo(CpuBuffer(&one, 1));
  EXPECT_EQ(one, static_cast<float>(n));
}

TEST(NcclTest, BackendTableCreatesNcclOrSaysWhyNot) {
  // Runs everywhere: without a GPU the factory must fail with a clear status, not crash.
  if (World().cpu == nullptr) GTEST_SKIP() << World().skip_reason;
  if (World().nccl == nullptr) {
    auto created = CreateNcclCommunicator(*World().cpu, CommOptions());
    ASSERT_FALSE(created.ok());
    EXPECT_NE(created.status().message().find("CUDA"), std::string::npos) << created.status();
    GTEST_SKIP() << World().skip_reason;
  }
  EXPECT_EQ(World().nccl->backend(), "nccl");
}

}  // namespace
}  // namespace tandem::comm
