// Discrete-event timing of a schedule's programs.
//
// Compute actions take their stage's cost; a send is non-blocking and its data arrives
// latency + bytes / bandwidth after it is issued (zero when ranks are equal); a receive waits
// for that arrival. GradientSync starts an asynchronous synchronisation of its stage that
// takes `grad_sync_seconds[stage]`; OptimizerStep waits for all of the rank's syncs and takes
// `optimizer_seconds`. The result is what the runtime should measure for the same costs.
//
// Busy time counts compute only (F, B, Bi, W). A schedule that splits backward runs Bi in
// `backward_seconds` and W in `weight_seconds` (each in half of `backward_seconds` when
// `weight_seconds` is 0, i.e. the costs do not split it); one that does not runs B in their
// sum. Links are not shared (no contention between concurrent transfers).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/trace.h"
#include "pipeline/schedule.h"

namespace tandem::pipeline {
namespace internal {
struct EmittedActions;
}  // namespace internal

// Cost of one stage (one chunk with interleaving/waves) for one micro-batch, in seconds.
struct StageCost {
  double forward_seconds = 0;
  double backward_seconds = 0;  // full backward; or the input-gradient part if weight > 0
  double weight_seconds = 0;    // weight-gradient part; 0 = not split in the costs
  double activation_bytes = 0;  // output bytes crossing to the next stage (and its gradient)
  // Activation memory stashed per micro-batch, in units of one p-th of the model's
  // activation for one micro-batch (1 for a plain stage, 1/v for a chunk). Used for peaks.
  double stash_units = 1;
};

struct CostModel {
  std::vector<StageCost> stages;  // one per stage of the pipeline (size = NumStages())
  double p2p_latency_seconds = 0;
  double p2p_bandwidth_bytes_per_second = 0;  // 0 = infinite
  std::vector<double> grad_sync_seconds;      // per stage; empty = 0
  double optimizer_seconds = 0;

  // Uniform costs for one full stage (1/p of the model) split over the schedule's chunks:
  // each of NumStages() stages gets forward * p / NumStages(), etc. As `tandem schedule`
  // --forward/--backward/--weight.
  static CostModel Uniform(const ScheduleSpec& spec, double forward, double backward,
                           double weight = 0);

  // Heterogeneous costs: one entry per stage of the pipeline (NumStages(); with chunks, the
  // virtual stages in pipeline order). `weight` and `activation_bytes` may be empty (zeros).
  // stash_units default to p / NumStages() (a chunk's share). InvalidArgument names the array
  // and the stage for a wrong length or a negative or non-finite value.
  static absl::StatusOr<CostModel> FromStageCosts(const ScheduleSpec& spec,
                                                  const std::vector<double>& forward,
                                                  const std::vector<double>& backward,
                                                  const std::vector<double>& weight = {},
                                                  const std::vector<double>& activation_bytes = {});

  // The `--costs FILE` format: {"forward": [...], "backward": [...], optional "weight",
  // "activation_bytes", "stash_units" (arrays, one per stage), "latency_seconds",
  // "bandwidth_bytes_per_second", "grad_sync_seconds" (array), "optimizer_seconds"}. Times in
  // seconds. Errors name `where` and the field.
  static absl::StatusOr<CostModel> FromJson(const nlohmann::json& j, const ScheduleSpec& spec,
                                            absl::string_view where = "costs");

  // Checks sizes against `num_stages` and that every number is finite and non-negative.
  absl::Status Check(int num_stages) const;
};

// Trace lanes ("tid") used by the simulator.
inline constexpr int kTraceLaneCompute = 0;
inline constexpr int kTraceLaneWait = 1;     // a receive waiting for its data
inline constexpr int kTraceLaneTransfer = 2; // a message in flight (on the sender's row)
inline constexpr int kTraceLaneSync = 3;     // gradient synchronisation

struct SimulationResult {
  double makespan_seconds = 0;
  std::vector<double> busy_seconds;  // per rank: compute time
  std::vector<double> idle_seconds;  // per rank: makespan - busy
  double bubble_ratio = 0;           // 1 - sum(busy) / (ranks * makespan)
  // Peak stashed activations per rank in units of one p-th of the model's activation for one
  // micro-batch (a forward adds its stage's stash_units, the matching backward (or W when
  // split) frees them).
  std::vector<double> peak_activations;
  int64_t simulated_actions = 0;
  ChromeTrace trace;  // filled when SimulationOptions::record_trace
};

// The category of an action's trace events ("forward", "backward-input", "send", ...).
absl::string_view TraceCategory(ActionType type);

// One interval of a simulated timeline: what `rank` does for its program's action `step`
// on `lane` (kTraceLane*) from `start_seconds` for `duration_seconds`.
struct SimulatedInterval {
  int rank = 0;
  int lane = kTraceLaneCompute;
  int64_t step = 0;
  double start_seconds = 0;
  double duration_seconds = 0;
};

struct SimulationOptions {
  bool record_trace = false;
  // Called with every interval of the timeline when set, each rank's in its program's order
  // (ranks interleave): a timeline streamed this way is never held (see tandem schedule's
  // --trace and --svg). Independent of record_trace.
  std::function<void(const SimulatedInterval&)> on_interval;
};

// InvalidArgument when costs do not match the schedule; FailedPrecondition on a deadlock.
absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const CostModel& costs,
                                          const SimulationOptions& options = {});

// A schedule prepared for repeated simulation (the planner tries many cost models on one
// schedule): the channels between ranks, found by the first run, are kept, so Run() costs
// O(actions) and holds only the messages in flight, never a copy of the programs (at
// p=1024, m=4096 those are 10^8 actions). Refers to `schedule`, which must outlive it. Not
// thread-safe; use one per thread. Malformed programs (a stage or peer out of range, sends
// never received) are InvalidArgument from Run.
class ScheduleSimulator {
 public:
  static absl::StatusOr<ScheduleSimulator> Create(const Schedule& schedule);

  absl::StatusOr<SimulationResult> Run(const CostModel& costs,
                                       const SimulationOptions& options = {});

  // The same run over actions taken as they are emitted, never held (pipeline/streamed.h):
  // Start, Take for every batch, Finish after the last. Each rank's actions must come in its
  // program's order and every receive after its send, so that no rank ever waits. The result
  // equals Run's on the whole programs (each rank's sums are taken in program order either
  // way). The schedule given to Create then has one empty program per rank. Take fails with
  // FailedPrecondition on a receive that comes before its send (the run is then over).
  absl::Status Start(const CostModel& costs);
  absl::Status Take(const internal::EmittedActions& batch);
  absl::StatusOr<SimulationResult> Finish();

  ScheduleSimulator(ScheduleSimulator&&) noexcept;
  ScheduleSimulator& operator=(ScheduleSimulator&&) noexcept;
  ~ScheduleSimulator();

 private:
  // What a run keeps between hand-overs: the per-stage tables, each rank's clock and stash,
  // and the result so far.
  struct RunState;

  absl::Status Start(const CostModel& costs, const SimulationOptions& options);
  // Runs every rank that can move until each waits for a message or ends.
  absl::Status Drain();
  // What becomes of action `op`, step k of rank r, run at time t. kMayWait: some rank may
  // wait on a receive (not when actions are taken as they are emitted).
  enum class Outcome { kDone, kWaits, kBadStage, kBadPeer };
  struct Clock;
  struct StageCosts;
  template <bool kTrace, bool kMayWait, typename Record, typename Woken>
  Outcome Execute(Clock& clock, const StageCosts* stages, int r, int64_t k, const Action& op,
                  double& t, double& busy, Record& record, Woken& woken);
  // The result once every rank has ended.
  absl::StatusOr<SimulationResult> Result();

  // One end of a channel (the messages from one rank to another, FIFO) on a rank.
  struct Peer {
    int32_t channel;
    int16_t rank;  // the other end (< kMaxRanks)
    bool send;     // this rank sends on it
  };
  ScheduleSimulator();

  // The arrival times of the messages of one channel sent and not yet received, in order: a
  // ring whose capacity (a power of two) doubles when full. The first few sit in the ring's
  // own cache line (a pipeline keeps one or two messages in flight per channel).
  struct alignas(64) InFlight {
    static constexpr uint32_t kLocal = 4;
    uint32_t head = 0;
    uint32_t size = 0;
    uint32_t mask = kLocal - 1;
    double local[kLocal];
    std::unique_ptr<double[]> grown;  // the ring once it holds more than kLocal
    bool empty() const { return size == 0; }
    double* ring() { return grown ? grown.get() : local; }
    void push(double arrival) {
      if (size > mask) Grow();
      ring()[(head + size) & mask] = arrival;
      ++size;
    }
    double pop() {
      const double arrival = ring()[head];
      head = (head + 1) & mask;
      --size;
      return arrival;
    }
    void Grow();
  };
  // A rank's ends of channels: a pipeline rank has a few neighbours, kept inline so that
  // finding one reads one cache line; more spill into `more`.
  static constexpr int kInlinePeers = 4;
  struct alignas(64) PeerList {
    int count = 0;
    Peer inline_peers[kInlinePeers];
    std::vector<Peer> more;
  };

  // A new channel from one rank to another; its id.
  int AddChannel(int from, int to);
  // The channel on which `rank` sends to (send) or receives from `peer`; -1 if none yet.
  int ChannelOf(int rank, int peer, bool send) const {
    const PeerList& list = rank_peers_[rank];
    const int inline_count = list.count < kInlinePeers ? list.count : kInlinePeers;
    for (int j = 0; j < inline_count; ++j) {
      const Peer& p = list.inline_peers[j];
      if (p.rank == peer && p.send == send) return p.channel;
    }
    for (const Peer& p : list.more) {
      if (p.rank == peer && p.send == send) return p.channel;
    }
    return -1;
  }

  const Schedule* schedule_ = nullptr;
  std::vector<PeerList> rank_peers_;  // per rank
  int num_channels_ = 0;
  // Scratch reused between runs.
  std::vector<InFlight> in_flight_;  // per channel
  std::vector<int64_t> blocked_on_;  // per rank: the channel it waits on
  std::vector<int> worklist_;
  std::unique_ptr<RunState> run_;  // between Start and Finish
};

// A simulated timeline written to a file as a Chrome trace while it is simulated (give Add
// as SimulationOptions::on_interval): the events record_trace would hold, never held. At
// p=1024, m=4096 a trace is gigabytes of JSON; as a ChromeTrace it would be tens.
class SimulatedTraceFile {
 public:
  static absl::StatusOr<SimulatedTraceFile> Open(const std::string& path,
                                                 const Schedule& schedule);
  void Add(const SimulatedInterval& interval);
  // Finishes the file; until then nothing is at its path.
  absl::Status Close();
  int64_t bytes() const { return writer_.bytes(); }

 private:
  SimulatedTraceFile(TraceFileWriter writer, const Schedule& schedule)
      : writer_(std::move(writer)), schedule_(&schedule) {}
  TraceFileWriter writer_;
  const Schedule* schedule_;
  std::string name_;  // scratch
};


}  // namespace tandem::pipeline
