// A communicator that forwards every call to another one, which can be replaced between
// operations. For a group handed out before the communicator that should carry it exists: the
// engine gives its stages the tensor-parallel group on MPI when it builds them, and once it
// knows they run on a GPU per rank, points the same handle at an NCCL communicator over the
// same ranks.
//
// The handle does not own its target. Retarget only while no operation is being issued
// through it (the engine does it before the first iteration); Works already returned belong to
// the old target and complete there.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace tandem::comm {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(Communicator* target) : target_(target) {}

  Communicator* target() const { return target_; }
  // `target` must have the same rank and size as the current one.
  absl::Status Retarget(Communicator* target);

  int rank() const override { return target_->rank(); }
  int size() const override { return target_->size(); }
  std::string backend() const override { return target_->backend(); }
  const std::vector<int>& world_ranks() const override { return target_->world_ranks(); }

  WorkPtr Send(const Buffer& buffer, int peer, int tag = 0) override {
    return target_->Send(buffer, peer, tag);
  }
  WorkPtr Recv(const Buffer& buffer, int peer, int tag = 0) override {
    return target_->Recv(buffer, peer, tag);
  }
  WorkPtr AllReduce(const Buffer& buffer, ReduceOp op = ReduceOp::kSum) override {
    return target_->AllReduce(buffer, op);
  }
  WorkPtr ReduceScatter(const Buffer& input, const Buffer& output,
                        ReduceOp op = ReduceOp::kSum) override {
    return target_->ReduceScatter(input, output, op);
  }
  WorkPtr AllGather(const Buffer& input, const Buffer& output) override {
    return target_->AllGather(input, output);
  }
  WorkPtr Broadcast(const Buffer& buffer, int root) override {
    return target_->Broadcast(buffer, root);
  }
  WorkPtr Barrier() override { return target_->Barrier(); }
  WorkPtr SendRecvBatch(const std::vector<PointToPoint>& transfers) override {
    return target_->SendRecvBatch(transfers);
  }
  absl::Status ConnectPeers(const std::vector<int>& peers) override {
    return target_->ConnectPeers(peers);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    return target_->Split(color, key);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(
      const std::vector<int>& dead_ranks) override {
    return target_->Shrink(dead_ranks);
  }
  void Abort(const absl::Status& reason) override { target_->Abort(reason); }
  absl::StatusOr<std::vector<int>> DetectDeadRanks(absl::Duration timeout) override {
    return target_->DetectDeadRanks(timeout);
  }
  void set_timeout(absl::Duration timeout) override { target_->set_timeout(timeout); }
  std::shared_ptr<void> KeepProgressing() override { return target_->KeepProgressing(); }
  absl::Duration timeout() const override { return target_->timeout(); }

 private:
  Communicator* target_;
};

}  // namespace tandem::comm
