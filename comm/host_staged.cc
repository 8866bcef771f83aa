#include "comm/host_staged.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/internal/work_util.h"
#include "common/status.h"

namespace tandem::comm {
namespace {

// Host staging buffers are reused: pinned allocations are slow, and a training iteration asks
// for the same sizes again and again. A buffer returns to the pool when its last user drops it.
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  explicit StagingPool(std::shared_ptr<DeviceCopier> copier) : copier_(std::move(copier)) {}

  absl::StatusOr<std::shared_ptr<void>> Acquire(int64_t bytes) {
    std::shared_ptr<void> memory;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        memory = std::move(it->second);
        free_.erase(it);
      }
    }
    if (memory == nullptr) {
      TANDEM_ASSIGN_OR_RETURN(memory, copier_->AllocateHost(bytes));
    }
    std::weak_ptr<StagingPool> pool = weak_from_this();
    void* data = memory.get();
    return std::shared_ptr<void>(data, [pool, memory, bytes](void*) mutable {
      if (auto alive = pool.lock()) alive->Release(bytes, std::move(memory));
    });
  }

  DeviceCopier& copier() { return *copier_; }

 private:
  void Release(int64_t bytes, std::shared_ptr<void> memory) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(bytes, std::move(memory));
  }

  std::shared_ptr<DeviceCopier> copier_;
  std::mutex mu_;
  std::multimap<int64_t, std::shared_ptr<void>> free_;
};

// A device buffer and its host stand-in.
struct Staged {
  Buffer device;                // the caller's buffer
  Buffer host;                  // what the inner communicator sees
  std::shared_ptr<void> memory;  // keeps the host copy alive
  bool copy_back = false;       // received into: copied to the device on completion
};

class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr inner, std::vector<Staged> staged, std::shared_ptr<StagingPool> pool)
      : inner_(std::move(inner)), staged_(std::move(staged)), pool_(std::move(pool)) {}

  bool Test() override {
    if (!inner_->Test()) return false;
    if (inner_->error().ok()) Finish().IgnoreError();
    return true;
  }
  absl::Status Wait(absl::Duration timeout) override {
    TANDEM_RETURN_IF_ERROR(inner_->Wait(timeout));
    return Finish();
  }
  absl::Status Wait() override {
    TANDEM_RETURN_IF_ERROR(inner_->Wait());
    return Finish();
  }
  absl::Status error() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finish_status_.ok()) return finish_status_;
    return inner_->error();
  }
  std::string Describe() const override { return inner_->Describe() + " (host-staged)"; }

 private:
  absl::Status Finish() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return finish_status_;
    finished_ = true;
    for (const Staged& s : staged_) {
      if (!s.copy_back || s.device.count == 0) continue;
      finish_status_ = pool_->copier().ToDevice(
          s.device.data, s.host.data, static_cast<int64_t>(s.device.bytes()),
          s.device.device);
      if (!finish_status_.ok()) break;
    }
    staged_.clear();  // the host copies go back to the pool
    return finish_status_;
  }

  WorkPtr inner_;
  std::mutex mu_;
  std::vector<Staged> staged_;
  std::shared_ptr<StagingPool> pool_;
  bool finished_ = false;
  absl::Status finish_status_;
};

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<StagingPool> pool)
      : inner_(std::move(inner)), pool_(std::move(pool)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend() + "+host-staging"; }
  const std::vector<int>& world_ranks() const override { return inner_->world_ranks(); }

  WorkPtr Send(const Buffer& buffer, int peer, int tag) override {
    return Run("send", {{buffer, /*in=*/true, /*out=*/false}},
               [&](std::vector<Buffer>& b) { return inner_->Send(b[0], peer, tag); });
  }
  WorkPtr Recv(const Buffer& buffer, int peer, int tag) override {
    return Run("recv", {{buffer, false, true}},
               [&](std::vector<Buffer>& b) { return inner_->Recv(b[0], peer, tag); });
  }
  WorkPtr AllReduce(const Buffer& buffer, ReduceOp op) override {
    return Run("all-reduce", {{buffer, true, true}},
               [&](std::vector<Buffer>& b) { return inner_->AllReduce(b[0], op); });
  }
  WorkPtr ReduceScatter(const Buffer& input, const Buffer& output, ReduceOp op) override {
    return Run("reduce-scatter", {{input, true, false}, {output, false, true}},
               [&](std::vector<Buffer>& b) { return inner_->ReduceScatter(b[0], b[1], op); });
  }
  WorkPtr AllGather(const Buffer& input, const Buffer& output) override {
    return Run("all-gather", {{input, true, false}, {output, false, true}},
               [&](std::vector<Buffer>& b) { return inner_->AllGather(b[0], b[1]); });
  }
  WorkPtr Broadcast(const Buffer& buffer, int root) override {
    return Run("broadcast", {{buffer, rank() == root, rank() != root}},
               [&](std::vector<Buffer>& b) { return inner_->Broadcast(b[0], root); });
  }
  WorkPtr Barrier() override { return inner_->Barrier(); }
  WorkPtr SendRecvBatch(const std::vector<PointToPoint>& transfers) override {
    std::vector<Use> uses;
    for (const PointToPoint& t : transfers) {
      const bool send = t.kind == PointToPoint::Kind::kSend;
      uses.push_back({t.buffer, send, !send});
    }
    return Run("send/recv batch", uses, [&](std::vector<Buffer>& b) {
      std::vector<PointToPoint> staged = transfers;
      for (size_t i = 0; i < staged.size(); ++i) staged[i].buffer = b[i];
      return inner_->SendRecvBatch(staged);
    });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> split, inner_->Split(color, key));
    if (split == nullptr) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(new HostStagedCommunicator(std::move(split), pool_));
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(
      const std::vector<int>& dead_ranks) override {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> shrunk, inner_->Shrink(dead_ranks));
    return std::unique_ptr<Communicator>(new HostStagedCommunicator(std::move(shrunk), pool_));
  }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }
  absl::StatusOr<std::vector<int>> DetectDeadRanks(absl::Duration timeout) override {
    return inner_->DetectDeadRanks(timeout);
  }
  void set_timeout(absl::Duration timeout) override { inner_->set_timeout(timeout); }
  std::shared_ptr<void> KeepProgressing() override { return inner_->KeepProgressing(); }
  absl::Duration timeout() const override { return inner_->timeout(); }

 private:
  struct Use {
    Buffer buffer;
    bool in = false;   // read by the operation: copied to the host first
    bool out = false;  // written by it: copied back to the device on completion
  };

  template <typename Issue>
  WorkPtr Run(const char* what, const std::vector<Use>& uses, Issue issue) {
    std::vector<Staged> staged;
    std::vector<Buffer> host;
    for (const Use& use : uses) {
      if (!pool_->copier().Stages(use.buffer.device) || use.buffer.count <= 0) {
        host.push_back(use.buffer);
        continue;
      }
      const int64_t bytes = static_cast<int64_t>(use.buffer.bytes());
      auto memory = pool_->Acquire(bytes);
      if (!memory.ok()) {
        return internal::MakeCompletedWork(Annotate(memory.status(), what), what);
      }
      Staged s;
      s.device = use.buffer;
      s.host = use.buffer;
      s.host.data = memory->get();
      s.host.device = Device::Cpu();
      s.memory = *std::move(memory);
      s.copy_back = use.out;
      if (use.in) {
        const absl::Status copied =
            pool_->copier().ToHost(s.host.data, use.buffer.data, bytes, use.buffer.device);
        if (!copied.ok()) {
          return internal::MakeCompletedWork(
              Annotate(copied, absl::StrCat(what, ": staging to the host")), what);
        }
      }
      host.push_back(s.host);
      staged.push_back(std::move(s));
    }
    WorkPtr inner = issue(host);
    if (staged.empty()) return inner;
    return std::make_shared<StagedWork>(std::move(inner), std::move(staged), pool_);
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<StagingPool> pool_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NewHostStagedCommunicator(
    std::unique_ptr<Communicator> inner, std::shared_ptr<DeviceCopier> copier) {
  if (inner == nullptr || copier == nullptr) {
    return absl::InvalidArgumentError("host-staged communicator: no inner communicator or copier");
  }
  auto pool = std::make_shared<StagingPool>(std::move(copier));
  return std::unique_ptr<Communicator>(new HostStagedCommunicator(std::move(inner), pool));
}

}  // namespace tandem::comm
