// Host staging (comm/host_staged.h) over real MPI, with a test copier standing in for the GPU:
// "device" buffers are host memory marked Device::Cuda(0), and the copier shifts every value by
// kShift on the way to the host and back on the way to the device. A receiver reading a host
// buffer therefore sees shifted values exactly when the sender's device buffer went through
// staging; device-to-device round trips must come back unchanged.
#include <memory>
#include <numeric>
#include <vector>

#include "comm/backend.h"
#include "comm/host_staged.h"
#include "gtest/gtest.h"

namespace tandem::comm {
namespace {

constexpr float kShift = 1000.0f;

// A fake device copier (test only): host memory plays the device, the shift marks the copies.
class ShiftingCopier : public DeviceCopier {
 public:
  absl::StatusOr<std::shared_ptr<void>> AllocateHost(int64_t bytes) override {
    ++allocations;
    return std::shared_ptr<void>(new char[static_cast<size_t>(bytes)],
                                 [](void* p) { delete[] static_cast<char*>(p); });
  }
  absl::Status ToHost(void* host, const void* device, int64_t bytes, const Device&) override {
    ++to_host;
    const float* from = static_cast<const float*>(device);
    float* to = static_cast<float*>(host);
    for (int64_t i = 0; i < bytes / 4; ++i) to[i] = from[i] + kShift;
    return absl::OkStatus();
  }
  absl::Status ToDevice(void* device, const void* host, int64_t bytes, const Device&) override {
    ++to_device;
    const float* from = static_cast<const float*>(host);
    float* to = static_cast<float*>(device);
    for (int64_t i = 0; i < bytes / 4; ++i) to[i] = from[i] - kShift;
    return absl::OkStatus();
  }
  int allocations = 0, to_host = 0, to_device = 0;
};

Communicator& World() {
  static std::unique_ptr<Communicator> world = [] {
    CommOptions options;
    options.timeout = absl::Seconds(30);
    auto created = CreateWorldCommunicator(BackendKind::kMpi, options);
    if (!created.ok()) {
      ADD_FAILURE() << created.status();
      std::abort();
    }
    return std::move(created).value();
  }();
  return *world;
}

Buffer Floats(std::vector<float>& v, Device device) {
  Buffer b;
  b.data = v.data();
  b.count = static_cast<int64_t>(v.size());
  b.dtype = DataType::kFloat32;
  b.device = device;
  return b;
}

struct Staged {
  std::shared_ptr<ShiftingCopier> copier = std::make_shared<ShiftingCopier>();
  std::unique_ptr<Communicator> comm;
};

Staged MakeStaged() {
  Staged s;
  auto inner = World().Split(/*color=*/0, /*key=*/World().rank());
  EXPECT_TRUE(inner.ok()) << inner.status();
  auto staged = NewHostStagedCommunicator(std::move(inner).value(), s.copier);
  EXPECT_TRUE(staged.ok()) << staged.status();
  s.comm = std::move(staged).value();
  return s;
}

TEST(HostStagedTest, DeviceSendsAreStagedAndDeviceReceivesCopiedBack) {
  if (World().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Staged s = MakeStaged();
  const int rank = s.comm->rank();
  std::vector<float> device(64), host(64);
  if (rank == 0) {
    std::iota(device.begin(), device.end(), 0.0f);
    ASSERT_TRUE(s.comm->Send(Floats(device, Device::Cuda(0)), 1, 7)->Wait().ok());
    ASSERT_TRUE(s.comm->Send(Floats(device, Device::Cuda(0)), 1, 8)->Wait().ok());
    EXPECT_EQ(s.copier->to_host, 2);
    EXPECT_EQ(s.copier->to_device, 0);
  } else if (rank == 1) {
    // Into host memory: the staged (shifted) values, no copy on this side.
    ASSERT_TRUE(s.comm->Recv(Floats(host, Device::Cpu()), 0, 7)->Wait().ok());
    EXPECT_EQ(host[5], 5.0f + kShift);
    EXPECT_EQ(s.copier->to_device, 0);
    // Into device memory: copied back (unshifted) before Wait returns.
    ASSERT_TRUE(s.comm->Recv(Floats(device, Device::Cuda(0)), 0, 8)->Wait().ok());
    EXPECT_EQ(device[63], 63.0f);
    EXPECT_EQ(s.copier->to_device, 1);
  }
}

TEST(HostStagedTest, AllReduceAndBatchesOfDeviceBuffers) {
  if (World().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Staged s = MakeStaged();
  const int rank = s.comm->rank();
  const int size = s.comm->size();
  std::vector<float> grads(1000, static_cast<float>(rank + 1));
  ASSERT_TRUE(s.comm->AllReduce(Floats(grads, Device::Cuda(0)), ReduceOp::kSum)->Wait().ok());
  // Each rank's values went up shifted; the sum came back shifted down once.
  const float expected = static_cast<float>(size * (size + 1) / 2) + (size - 1) * kShift;
  EXPECT_EQ(grads[0], expected);
  EXPECT_EQ(grads[999], expected);

  // Neighbours exchanging device buffers in one batch (a pipeline's steady state).
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  std::vector<float> out(4096, static_cast<float>(rank)), in(4096, -1.0f);
  std::vector<PointToPoint> batch(2);
  batch[0].kind = PointToPoint::Kind::kSend;
  batch[0].buffer = Floats(out, Device::Cuda(0));
  batch[0].peer = next;
  batch[0].tag = 3;
  batch[1].kind = PointToPoint::Kind::kRecv;
  batch[1].buffer = Floats(in, Device::Cuda(0));
  batch[1].peer = previous;
  batch[1].tag = 3;
  ASSERT_TRUE(s.comm->SendRecvBatch(batch)->Wait().ok());
  EXPECT_EQ(in[0], static_cast<float>(previous));
  EXPECT_EQ(in[4095], static_cast<float>(previous));
  EXPECT_EQ(out[0], static_cast<float>(rank));  // the source is left as it was
}

}  // namespace
}  // namespace tandem::comm
