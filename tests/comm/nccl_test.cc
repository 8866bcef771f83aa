// NCCL backend tests. They need one GPU per rank: without a CUDA device they skip with the
// reason; with one GPU the np=1 run exercises every operation and the stream ordering (NCCL
// refuses two ranks on one GPU, so multi-rank runs need as many GPUs).
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "comm/buffer.h"
#include "comm/dtype.h"
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
};

NcclWorld& World() {
  static NcclWorld* world = [] {
    auto* w = new NcclWorld;
    auto cpu = MpiCommunicator::World();
    if (!cpu.ok()) {
      w->skip_reason = cpu.status().ToString();
      return w;
    }
    w->cpu = std::move(cpu).value();
    std::string why;
    const int devices = CudaDeviceCount(&why);
    // Every rank must agree to skip, or the others would wait in NCCL initialisation.
    int64_t usable = devices >= w->cpu->size() ? 1 : 0;
    if (!w->cpu->AllReduce(CpuBuffer(&usable, 1), ReduceOp::kMin)->Wait().ok() || !usable) {
      w->skip_reason = devices == 0 ? absl::StrCat("no CUDA device: ", why)
                                    : absl::StrCat("needs one GPU per rank (", devices,
                                                   " visible here, ", w->cpu->size(), " ranks)");
      return w;
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
    return w;
  }();
  return *world;
}

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
  for (DataType type : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16,
                        DataType::kInt32, DataType::kInt64}) {
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
