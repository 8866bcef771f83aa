#include "pipeline/validator.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::pipeline {
namespace {

constexpr int kUnassigned = -1;

// A transfer waiting on a channel for its counterpart.
struct Posted {
  int rank;
  int step;
};

// Transfers from one rank to another, matched in order (FIFO per direction).
struct Channel {
  int from = 0;
  int to = 0;
  std::vector<Posted> sends;  // posted, not yet matched (from `head_send` on)
  std::vector<Posted> recvs;
  size_t head_send = 0;
  size_t head_recv = 0;
};

class Validator {
 public:
  Validator(const Schedule& schedule, const ValidationOptions& options)
      : s_(schedule),
        options_(options),
        num_ranks_(schedule.placement.num_ranks),
        num_stages_(schedule.placement.num_stages),
        num_replicas_(schedule.placement.NumReplicas()),
        m_(schedule.spec.num_microbatches),
        split_(schedule.spec.SplitsBackward()) {}

  absl::Status Run() {
    TANDEM_RETURN_IF_ERROR(CheckShape());
    TANDEM_RETURN_IF_ERROR(AssignReplicas());
    Allocate();
    TANDEM_RETURN_IF_ERROR(Execute());
    return CheckComplete();
  }

 private:
  const Action& At(int rank, int step) const { return s_.programs[rank][step]; }

  absl::Status Error(int rank, int step, absl::string_view message) const {
    const auto& program = s_.programs[rank];
    std::string what = step < static_cast<int>(program.size())
                           ? absl::StrCat(" (", ToString(program[step]), ")")
                           : std::string(" (end of program)");
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " step ", step, what, ": ",
                                                   message));
  }

  // Rank of (replica, stage); valid once CheckShape has checked the placement.
  int RankOf(int replica, int stage) const {
    return rank_of_[static_cast<size_t>(replica) * num_stages_ + stage];
  }

  size_t Index(int replica, int stage, int mb) const {
    return (static_cast<size_t>(replica) * num_stages_ + stage) * m_ + mb;
  }

  absl::Status CheckShape() {
    const Placement& pl = s_.placement;
    if (static_cast<int>(s_.programs.size()) != num_ranks_) {
      return absl::InvalidArgumentError(absl::StrCat("schedule has ", s_.programs.size(),
                                                     " programs for ", num_ranks_, " ranks"));
    }
    if (num_replicas_ < 1 || num_stages_ < 1 || m_ < 1) {
      return absl::InvalidArgumentError("schedule has no replicas, stages or micro-batches");
    }
    for (int replica = 0; replica < num_replicas_; ++replica) {
      if (static_cast<int>(pl.stage_to_rank[replica].size()) != num_stages_) {
        return absl::InvalidArgumentError(
            absl::StrCat("placement replica ", replica, " maps ",
                         pl.stage_to_rank[replica].size(), " stages, expected ", num_stages_));
      }
      for (int stage = 0; stage < num_stages_; ++stage) {
        int r = pl.stage_to_rank[replica][stage];
        if (r < 0 || r >= num_ranks_) {
          return absl::InvalidArgumentError(absl::StrCat(
              "placement puts replica ", replica, " stage ", stage, " on rank ", r,
              " outside [0, ", num_ranks_, ")"));
        }
      }
    }
    // The placement is sound: flatten it for the lookups per action.
    rank_of_.resize(static_cast<size_t>(num_replicas_) * num_stages_);
    for (int replica = 0; replica < num_replicas_; ++replica) {
      for (int stage = 0; stage < num_stages_; ++stage) {
        rank_of_[static_cast<size_t>(replica) * num_stages_ + stage] =
            pl.stage_to_rank[replica][stage];
      }
    }
    for (int r = 0; r < num_ranks_; ++r) {
      const auto& program = s_.programs[r];
      for (int step = 0; step < static_cast<int>(program.size()); ++step) {
        const Action& a = program[step];
        if (a.type == ActionType::kOptimizerStep) continue;
        if (a.replica < 0 || a.replica >= num_replicas_) return Error(r, step, "bad replica");
        if (a.stage < 0 || a.stage >= num_stages_) return Error(r, step, "bad stage");
        if (a.type != ActionType::kGradientSync && (a.microbatch < 0 || a.microbatch >= m_)) {
          return Error(r, step, absl::StrCat("micro-batch outside [0, ", m_, ")"));
        }
        if (IsTransfer(a.type)) {
          TANDEM_RETURN_IF_ERROR(CheckTransferEnds(r, step, a));
        } else if (RankOf(a.replica, a.stage) != r) {
          return Error(r, step, absl::StrCat("stage ", a.stage, " (replica ", a.replica,
                                             ") is placed on rank ",
                                             RankOf(a.replica, a.stage)));
        }
      }
    }
    return absl::OkStatus();
  }

  // The sender and receiver ranks a transfer must have.
  absl::Status CheckTransferEnds(int r, int step, const Action& a) const {
    const bool activation =
        a.type == ActionType::kSendActivation || a.type == ActionType::kRecvActivation;
    const int neighbour = activation ? a.stage + 1 : a.stage - 1;
    if (neighbour < 0 || neighbour >= num_stages_) {
      return Error(r, step, activation ? "the last stage has no activation to send"
                                       : "the first stage has no input gradient to send");
    }
    const int producer = RankOf(a.replica, a.stage);
    const int consumer = RankOf(a.replica, neighbour);
    const bool send =
        a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient;
    const int self = send ? producer : consumer;
    const int peer = send ? consumer : producer;
    if (self != r) {
      return Error(r, step, absl::StrCat("belongs on rank ", self));
    }
    if (a.peer != peer) {
      return Error(r, step, absl::StrCat("peer should be rank ", peer));
    }
    if (producer == consumer) {
      return Error(r, step, "neighbouring stages on the same rank need no transfer");
    }
    return absl::OkStatus();
  }

  // Each micro-batch belongs to the replica of its first forward.
  absl::Status AssignReplicas() {
    replica_of_.assign(m_, kUnassigned);
    for (int r = 0; r < num_ranks_; ++r) {
      const auto& program = s_.programs[r];
      for (int step = 0; step < static_cast<int>(program.size()); ++step) {
        const Action& a = program[step];
        if (!IsCompute(a.type) && !IsTransfer(a.type)) continue;
        int& owner = replica_of_[a.microbatch];
        if (owner == kUnassigned) owner = a.replica;
        if (owner != a.replica) {
          return Error(r, step, absl::StrCat("micro-batch ", a.microbatch,
                                             " is run by replicas ", owner, " and ",
                                             a.replica));
        }
      }
    }
    expected_per_replica_.assign(num_replicas_, 0);
    for (int mb = 0; mb < m_; ++mb) {
      if (replica_of_[mb] == kUnassigned) {
        return absl::InvalidArgumentError(
            absl::StrCat("micro-batch ", mb, " is never run by any rank"));
      }
      ++expected_per_replica_[replica_of_[mb]];
    }
    return absl::OkStatus();
  }

  void Allocate() {
    const size_t triples = static_cast<size_t>(num_replicas_) * num_stages_ * m_;
    forward_.assign(triples, 0);
    backward_.assign(triples, 0);  // B or Bi
    weight_.assign(triples, 0);
    activation_sent_.assign(triples, 0);
    activation_arrived_.assign(triples, 0);
    gradient_sent_.assign(triples, 0);
    gradient_arrived_.assign(triples, 0);
    finished_backwards_.assign(static_cast<size_t>(num_replicas_) * num_stages_, 0);
    synced_.assign(static_cast<size_t>(num_replicas_) * num_stages_, 0);
    pc_.assign(num_ranks_, 0);
    outstanding_.assign(num_ranks_, 0);
    group_end_.assign(num_ranks_, -1);
    peer_channels_.assign(num_ranks_, {});
  }

  // Channel of transfers from `from` to `to`. Each rank talks to few peers: a short list per
  // rank is searched first, the map only for ranks with many peers.
  int ChannelId(int from, int to) {
    std::vector<std::pair<int, int>>& known = peer_channels_[from];
    for (const auto& [peer, id] : known) {
      if (peer == to) return id;
    }
    const int64_t key = static_cast<int64_t>(from) * num_ranks_ + to;
    auto [it, inserted] = channel_ids_.try_emplace(key, static_cast<int>(channels_.size()));
    if (inserted) {
      Channel c;
      c.from = from;
      c.to = to;
      channels_.push_back(std::move(c));
    }
    if (known.size() < kPeersPerRankListed) known.emplace_back(to, it->second);
    return it->second;
  }

  // Checks a compute action's inputs and records its effect.
  absl::Status RunCompute(int r, int step, const Action& a) {
    const size_t i = Index(a.replica, a.stage, a.microbatch);
    switch (a.type) {
      case ActionType::kForward: {
        if (forward_[i]) return Error(r, step, "forward runs twice");
        if (a.stage > 0) {
          const size_t prev = Index(a.replica, a.stage - 1, a.microbatch);
          const bool local = RankOf(a.replica, a.stage - 1) == r;
          if (local ? !forward_[prev] : !activation_arrived_[prev]) {
            return Error(r, step,
                         absl::StrCat("needs the activation of stage ", a.stage - 1,
                                      " for micro-batch ", a.microbatch,
                                      local ? ", not computed yet" : ", not received yet"));
          }
        }
        forward_[i] = 1;
        return absl::OkStatus();
      }
      case ActionType::kBackward:
      case ActionType::kBackwardInput: {
        if (split_ && a.type == ActionType::kBackward) {
          return Error(r, step, "this schedule splits backward: expected Bi and W");
        }
        if (!split_ && a.type == ActionType::kBackwardInput) {
          return Error(r, step, "this schedule does not split backward: expected B");
        }
        if (backward_[i]) return Error(r, step, "backward runs twice");
        if (!forward_[i]) return Error(r, step, "backward before its forward");
        if (a.stage + 1 < num_stages_) {
          const size_t next = Index(a.replica, a.stage + 1, a.microbatch);
          const bool local = RankOf(a.replica, a.stage + 1) == r;
          if (local ? !backward_[next] : !gradient_arrived_[next]) {
            return Error(r, step,
                         absl::StrCat("needs the gradient from stage ", a.stage + 1,
                                      " for micro-batch ", a.microbatch,
                                      local ? ", not computed yet" : ", not received yet"));
          }
        }
        backward_[i] = 1;
        if (!split_) ++finished_backwards_[a.replica * num_stages_ + a.stage];
        return absl::OkStatus();
      }
      case ActionType::kBackwardWeight: {
        if (!split_) return Error(r, step, "this schedule does not split backward: expected B");
        if (weight_[i]) return Error(r, step, "weight gradient runs twice");
        if (!backward_[i]) return Error(r, step, "weight gradient before its Bi");
        weight_[i] = 1;
        ++finished_backwards_[a.replica * num_stages_ + a.stage];
        return absl::OkStatus();
      }
      default:
        return absl::InternalError("not a compute action");
    }
  }

  // Records a send's data as available on the receiver once matched.
  void Deliver(const Action& send) {
    const size_t i = Index(send.replica, send.stage, send.microbatch);
    if (send.type == ActionType::kSendActivation) {
      activation_arrived_[i] = 1;
    } else {
      gradient_arrived_[i] = 1;
    }
  }

  // Matches posted sends and receives on a channel in order. Wakes ranks whose groups finish.
  absl::Status Match(int channel_id) {
    Channel& c = channels_[channel_id];
    while (c.head_send < c.sends.size() && c.head_recv < c.recvs.size()) {
      const Posted send = c.sends[c.head_send++];
      const Posted recv = c.recvs[c.head_recv++];
      const Action& sa = At(send.rank, send.step);
      const Action& ra = At(recv.rank, recv.step);
      const bool same_kind =
          (sa.type == ActionType::kSendActivation) == (ra.type == ActionType::kRecvActivation);
      if (!same_kind || sa.stage != ra.stage || sa.microbatch != ra.microbatch ||
          sa.replica != ra.replica) {
        return Error(recv.rank, recv.step,
                     absl::StrCat("does not match the peer's next send ", ToString(sa),
                                  " (rank ", send.rank, " step ", send.step,
                                  "): transfers between two ranks must be in the same order"));
      }
      Deliver(sa);
      Complete(recv.rank);
      if (options_.grouped_rendezvous) Complete(send.rank);
    }
    // Keep only what is still unmatched, so the queues stay short.
    if (c.head_send == c.sends.size()) {
      c.sends.clear();
      c.head_send = 0;
    }
    if (c.head_recv == c.recvs.size()) {
      c.recvs.clear();
      c.head_recv = 0;
    }
    return absl::OkStatus();
  }

  void Complete(int rank) {
    if (--outstanding_[rank] == 0 && rank != advancing_) {
      pc_[rank] = group_end_[rank];
      worklist_.push_back(rank);
    }
  }

  absl::Status Post(int r, int step, const Action& a) {
    const bool send =
        a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient;
    const size_t i = Index(a.replica, a.stage, a.microbatch);
    if (send) {
      if (a.type == ActionType::kSendActivation) {
        if (!forward_[i]) return Error(r, step, "sends an activation not computed yet");
        if (activation_sent_[i]) return Error(r, step, "activation sent twice");
        activation_sent_[i] = 1;
      } else {
        if (!backward_[i]) return Error(r, step, "sends a gradient not computed yet");
        if (gradient_sent_[i]) return Error(r, step, "gradient sent twice");
        gradient_sent_[i] = 1;
      }
      int id = ChannelId(r, a.peer);
      channels_[id].sends.push_back({r, step});
      if (options_.grouped_rendezvous) ++outstanding_[r];
      touched_.push_back(id);
    } else {
      int id = ChannelId(a.peer, r);
      channels_[id].recvs.push_back({r, step});
      ++outstanding_[r];
      touched_.push_back(id);
    }
    return absl::OkStatus();
  }

  // Runs rank r until it blocks or ends.
  absl::Status Advance(int r) {
    const auto& program = s_.programs[r];
    const int size = static_cast<int>(program.size());
    while (pc_[r] < size && outstanding_[r] == 0) {
      const int step = pc_[r];
      const Action& a = program[step];
      if (IsCompute(a.type)) {
        TANDEM_RETURN_IF_ERROR(RunCompute(r, step, a));
        ++pc_[r];
      } else if (IsTransfer(a.type)) {
        // A group: one transfer, or with grouped_rendezvous the maximal run of transfers.
        int end = step + 1;
        if (options_.grouped_rendezvous) {
          while (end < size && IsTransfer(program[end].type)) ++end;
        }
        group_end_[r] = end;
        touched_.clear();
        for (int k = step; k < end; ++k) TANDEM_RETURN_IF_ERROR(Post(r, k, program[k]));
        // Matching may complete groups of peers (they go on the worklist) and this one.
        advancing_ = r;
        for (int id : touched_) TANDEM_RETURN_IF_ERROR(Match(id));
        advancing_ = -1;
        if (outstanding_[r] > 0) return absl::OkStatus();  // blocked until matched
        pc_[r] = end;
      } else if (a.type == ActionType::kGradientSync) {
        const int key = a.replica * num_stages_ + a.stage;
        if (synced_[key]) return Error(r, step, "gradient sync of this stage runs twice");
        if (finished_backwards_[key] != expected_per_replica_[a.replica]) {
          return Error(r, step, absl::StrCat("gradient sync before ",
                                             FirstMissingBackward(a.replica, a.stage), " (",
                                             finished_backwards_[key], " of ",
                                             expected_per_replica_[a.replica],
                                             " backward passes of the stage done)"));
        }
        synced_[key] = 1;
        ++pc_[r];
      } else {  // kOptimizerStep
        if (step != size - 1) return Error(r, step, "optimizer step must be the last action");
        for (const auto& [replica, stage] : s_.placement.StagesOf(r)) {
          if (!synced_[replica * num_stages_ + stage]) {
            return Error(r, step, absl::StrCat("optimizer step before the gradient sync of stage ",
                                               stage, replica ? " replica 1" : ""));
          }
        }
        ++pc_[r];
      }
    }
    return absl::OkStatus();
  }

  // Name of the first backward action of (replica, stage) that has not run.
  std::string FirstMissingBackward(int replica, int stage) const {
    for (int mb = 0; mb < m_; ++mb) {
      if (replica_of_[mb] != replica) continue;
      const size_t i = Index(replica, stage, mb);
      Action missing;
      missing.stage = stage;
      missing.microbatch = mb;
      missing.replica = replica;
      if (!backward_[i]) {
        missing.type = split_ ? ActionType::kBackwardInput : ActionType::kBackward;
      } else if (split_ && !weight_[i]) {
        missing.type = ActionType::kBackwardWeight;
      } else {
        continue;
      }
      return ToString(missing);
    }
    return "?";
  }

  // The first transfer of rank r's open group that no peer has matched.
  int FirstUnmatched(int r) const {
    int first = group_end_[r];
    for (const Channel& c : channels_) {
      for (size_t k = c.head_send; k < c.sends.size(); ++k) {
        if (c.sends[k].rank == r && c.sends[k].step >= pc_[r]) first = std::min(first, c.sends[k].step);
      }
      for (size_t k = c.head_recv; k < c.recvs.size(); ++k) {
        if (c.recvs[k].rank == r && c.recvs[k].step >= pc_[r]) first = std::min(first, c.recvs[k].step);
      }
    }
    return first < group_end_[r] ? first : pc_[r];
  }

  absl::Status Execute() {
    for (int r = num_ranks_ - 1; r >= 0; --r) worklist_.push_back(r);
    while (!worklist_.empty()) {
      int r = worklist_.back();
      worklist_.pop_back();
      TANDEM_RETURN_IF_ERROR(Advance(r));
    }
    // Deadlock: ranks left with an unmatched group.
    for (int r = 0; r < num_ranks_; ++r) {
      if (pc_[r] >= static_cast<int>(s_.programs[r].size())) continue;
      const int step = FirstUnmatched(r);
      const Action& a = At(r, step);
      const int peer = a.peer;
      std::string peer_state =
          pc_[peer] >= static_cast<int>(s_.programs[peer].size())
              ? absl::StrCat("rank ", peer, " has finished")
              : absl::StrCat("rank ", peer, " waits at step ", pc_[peer], " (",
                             ToString(At(peer, pc_[peer])), ")");
      const bool send =
          a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient;
      return Error(r, step,
                   absl::StrCat("deadlock: ",
                                send ? "waiting for a receive that never comes"
                                     : "waiting for a send that never comes",
                                "; ", peer_state));
    }
    // Sends nobody received.
    for (const Channel& c : channels_) {
      if (c.head_send < c.sends.size()) {
        const Posted& p = c.sends[c.head_send];
        return Error(p.rank, p.step, "sent but never received");
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckComplete() {
    const Placement& pl = s_.placement;
    for (int mb = 0; mb < m_; ++mb) {
      const int replica = replica_of_[mb];
      for (int stage = 0; stage < num_stages_; ++stage) {
        const size_t i = Index(replica, stage, mb);
        const int r = pl.RankOf(replica, stage);
        const int end = static_cast<int>(s_.programs[r].size());
        Action missing;
        missing.stage = stage;
        missing.microbatch = mb;
        missing.replica = replica;
        if (!forward_[i]) {
          missing.type = ActionType::kForward;
        } else if (!backward_[i]) {
          missing.type = split_ ? ActionType::kBackwardInput : ActionType::kBackward;
        } else if (split_ && !weight_[i]) {
          missing.type = ActionType::kBackwardWeight;
        } else {
          continue;
        }
        return Error(r, end, absl::StrCat("missing ", ToString(missing)));
      }
    }
    for (int r = 0; r < num_ranks_; ++r) {
      const auto& program = s_.programs[r];
      const int end = static_cast<int>(program.size());
      for (const auto& [replica, stage] : pl.StagesOf(r)) {
        if (!synced_[replica * num_stages_ + stage]) {
          return Error(r, end, absl::StrCat("missing gradient sync of stage ", stage,
                                            replica ? " replica 1" : ""));
        }
      }
      if (program.empty() || program.back().type != ActionType::kOptimizerStep) {
        return Error(r, end, "missing optimizer step");
      }
    }
    return absl::OkStatus();
  }

  const Schedule& s_;
  const ValidationOptions options_;
  const int num_ranks_, num_stages_, num_replicas_, m_;
  const bool split_;

  std::vector<int> rank_of_;  // [replica * num_stages + stage]
  std::vector<int> replica_of_;
  std::vector<int> expected_per_replica_;
  std::vector<uint8_t> forward_, backward_, weight_;
  std::vector<uint8_t> activation_sent_, activation_arrived_, gradient_sent_, gradient_arrived_;
  std::vector<int> finished_backwards_;
  std::vector<uint8_t> synced_;
  std::vector<int> pc_, outstanding_, group_end_;
  std::vector<int> worklist_;
  int advancing_ = -1;  // the rank whose group is being posted
  std::vector<int> touched_;
  std::vector<Channel> channels_;
  absl::flat_hash_map<int64_t, int> channel_ids_;
  static constexpr size_t kPeersPerRankListed = 8;
  std::vector<std::vector<std::pair<int, int>>> peer_channels_;  // per sender: (receiver, id)
};

}  // namespace

absl::Status ValidateSchedule(const Schedule& schedule) {
  return ValidateSchedule(schedule, ValidationOptions{});
}

absl::Status ValidateSchedule(const Schedule& schedule, const ValidationOptions& options) {
  return Validator(schedule, options).Run();
}

}  // namespace tandem::pipeline
