// The elastic trainer's recovery: when a rank dies the survivors abort their engines
// (AbortAll, on the membership's thread), agree on the live ranks and the committed iteration,
// then re-form the job on the training thread (Reconfigure): the committed step applied
// everywhere, the survivors' communicator, the templates re-instantiated on the live nodes, the
// missing layers' state copied from surviving holders (or the whole job rolled back to its
// checkpoint), new engines at the iteration after the committed one (elastic/trainer.h).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/buffer.h"
#include "comm/keep_alive.h"
#include "common/status.h"
#include "elastic/internal/trainer_state.h"
#include "runtime/control.h"

namespace tandem::elastic {

using internal::Ranks;

void ElasticTrainer::State::AbortAll(const absl::Status& reason) {
  if (growing.load()) {
    internal::EndStuckRank(absl::StrCat("elastic: rank ", me, ": a rank died while the job was "
                                        "starting new processes, which MPI cannot interrupt; "
                                        "ending this rank (", reason.message(), ")",
                                        ResumeHint()),
                           options.on_fatal);
  }
  // The training thread now leaves its waits (aborted below) for the agreement, unless it is
  // inside a communicator's creation that the dead rank was part of. While it builds
  // communicators that is bounded like the shrink; otherwise like any wait (--timeout): it may
  // be busy in a long computation or a checkpoint write.
  const absl::Duration bound =
      building.load() ? options.agreement_timeout : options.engine.timeout;
  watchdog.Arm(bound,
               absl::StrCat("elastic: rank ", me, ": ", reason.message(), "; this rank did "
                            "not reach the agreement within ", absl::FormatDuration(bound),
                            ": it waits inside MPI for the dead rank (a communicator was "
                            "being built with it), which MPI cannot interrupt; ending this "
                            "rank"));
  absl::MutexLock lock(&abort_mu);
  if (!aborted) abort_reason = reason;
  aborted = true;
  if (engine != nullptr) engine->Abort(reason);
  for (comm::Communicator* c : {everyone.get(), training.get(), pipeline.get(), config.get()}) {
    if (c != nullptr) c->Abort(reason);
  }
  for (Segment& s : segments) {
    if (s.comm != nullptr) s.comm->Abort(reason);
  }
}

absl::StatusOr<double> ElasticTrainer::State::OverSurvivors(double value, comm::ReduceOp op) {
  auto buffer = std::make_shared<double>(value);
  const absl::Status reduced =
      configured().config->AllReduce(runtime::DoubleBuffer(buffer.get(), 1), op)->Wait();
  if (!reduced.ok()) {
    comm::KeepAliveAfterAbort(buffer);  // the library may still write into it
    return Annotate(reduced, "reducing over the survivors");
  }
  return *buffer;
}

absl::Status ElasticTrainer::State::Reconfigure(
    const MembershipDecision& decision,
    const std::function<void(const ElasticIteration&)>& on_iteration,
    const std::function<void(const Reconfiguration&)>& on_reconfiguration) {
  const absl::Time start = absl::Now();
  absl::Time mark = start;
  auto lap = [&mark]() {
    const absl::Time now = absl::Now();
    const double seconds = absl::ToDoubleSeconds(now - mark);
    mark = now;
    return seconds;
  };
  Reconfiguration report;
  stop_end = -1;  // some survivors may not have seen the commit that agreed it
  grow_at = -1;   // nor a growth agreed at it
  grow_nodes = 0;
  for (int r : decision.live) report.live.push_back(live[static_cast<size_t>(r)]);
  if (!reforming) reform_dead.clear();
  for (int r : decision.dead) reform_dead.push_back(live[static_cast<size_t>(r)]);
  report.dead = reform_dead;
  std::sort(report.dead.begin(), report.dead.end());
  report.committed_iteration = decision.committed_iteration;
  report.detection_seconds = decision.detection_seconds;
  report.agree_seconds = decision.seconds;
  if (reforming && decision.committed_iteration + 1 != held_next) {
    return absl::InternalError(absl::StrCat("rank ", me, " resumes at ", held_next,
                                            " but the survivors agreed on ",
                                            decision.committed_iteration + 1));
  }
  const int64_t next = reforming ? held_next : decision.committed_iteration + 1;
  report.resume_iteration = next;
  membership.reset();

  // 1. The survivors' communicator, first thing after the decision; nodes that lost a rank
  // are left out whole. No membership watches the survivors until it is built: a survivor that
  // dies now leaves the others inside MPI_Comm_create_group, which only the watchdog ends, so
  // everything that can wait (the committed step, the state export, the engines' end) waits
  // until the new membership watches.
  watchdog.Arm(options.agreement_timeout,
               absl::StrCat("elastic: rank ", me, ": the survivors' communicator was not built "
                            "within ", absl::FormatDuration(options.agreement_timeout),
                            ": a survivor died while it was being built, which MPI cannot "
                            "interrupt (docs/elastic.md, limits); ending this rank"));
  if (kill.Hits(me, next, "shrink")) internal::KillSelf(me, next, "shrink");
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> survivors,
                          current->Shrink(decision.dead));
  survivors->set_timeout(options.engine.timeout);
  std::unique_ptr<comm::Communicator> previous = std::move(shrunk);
  // Survivors' probes may still reach it; aborted, it stays allocated.
  if (previous != nullptr) previous->Abort(absl::CancelledError("replaced by the survivors'"));
  shrunk = std::move(survivors);
  current = shrunk.get();
  live = report.live;
  // The iteration to resume travels with the next agreement, should a rank die before the
  // new engines run.
  TANDEM_RETURN_IF_ERROR(StartMembership(next - 1));
  watchdog.Disarm();  // the new membership watches from here (AbortAll arms it again)
  if (kill.Hits(me, next, "reform")) internal::KillSelf(me, next, "reform");

  // 2. The committed step, applied everywhere; then this rank's state, by parameter name
  // (both local). A re-formation cut short by a further death keeps what the first one
  // exported.
  if (!reforming) {
    held_state.clear();
    held_layout = layout;
    held_next = next;
    runtime::Engine* const old_engine = configured().engine;
    if (old_engine != nullptr) {
      if (old_engine->step_pending() && old_engine->iteration() == decision.committed_iteration) {
        TANDEM_ASSIGN_OR_RETURN(runtime::IterationResult r,
                                old_engine->ApplyCommittedStep(decision.committed_sums));
        report.applied_committed_step = true;
        last_result = r;
        has_last_result = true;
        if (on_iteration) on_iteration(Report(r));
      }
      if (old_engine->iteration() != held_next) {
        return absl::InternalError(absl::StrCat(
            "rank ", me, " is at iteration ", old_engine->iteration(),
            " but the survivors resume at ", held_next, " (committed ",
            decision.committed_iteration, ")"));
      }
      if (kill.Hits(me, next, "export")) internal::KillSelf(me, next, "export");
      TANDEM_ASSIGN_OR_RETURN(std::vector<runtime::ParameterState> state,
                              old_engine->ExportState());
      for (runtime::ParameterState& p : state) {
        std::string name = p.name;
        held_state.emplace(std::move(name), std::move(p));
      }
    }
    reforming = true;
  }
  const JobLayout old_layout = held_layout;
  TearDown();
  lap();  // the committed step and this rank's state export count with the shrink
  report.shrink_seconds = absl::ToDoubleSeconds(mark - start);

  // 3. The new layout, computed identically on every survivor.
  bool restore = false;
  std::vector<std::string> lost;
  {
    // Layers with no live holder cannot be copied from anyone: say so before planning.
    std::vector<bool> covered(static_cast<size_t>(options.num_layers), false);
    for (const auto& [r, ranges] : HeldUnder(old_layout)) {
      if (!GroupLive(r)) continue;
      for (const LayerRange& range : ranges) {
        for (int l = range.first_layer; l < range.end_layer; ++l) {
          covered[static_cast<size_t>(l)] = true;
        }
      }
    }
    for (int l = 0; l < options.num_layers; ++l) {
      if (!covered[static_cast<size_t>(l)]) lost.push_back(absl::StrCat(l));
    }
    if (!lost.empty() && options.checkpoint_dir.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no surviving rank holds layer(s) ", absl::StrJoin(lost, ", "), " (ranks ",
          Ranks(report.dead), " died) and the job has no checkpoint to restore them from: "
          "run with more pipelines (--elastic-min-pipelines) or --checkpoint-dir"));
    }
    restore = !lost.empty();
  }
  TANDEM_ASSIGN_OR_RETURN(ElasticPlan plan, PlanOnLiveNodes(old_layout, restore, 1));
  TANDEM_ASSIGN_OR_RETURN(layout, LayoutFromPlan(plan, live, tp()));
  report.plan = Describe(plan);
  report.layout = Describe(layout);
  report.plan_seconds = lap();
  if (restore) {
    // Layers no survivor holds: the whole job rolls back to the latest checkpoint.
    absl::StatusOr<internal::CheckpointedLayers> read = ReadCheckpoint(options.checkpoint_dir);
    TANDEM_RETURN_IF_ERROR(runtime::AgreeOnSuccess(
        current,
        Annotate(read.status(),
                 absl::StrCat("rank ", me, ": no surviving rank holds layer(s) ",
                              absl::StrJoin(lost, ", "), " (ranks ", Ranks(report.dead),
                              " died), and restoring them from ", options.checkpoint_dir,
                              " failed")),
        "restoring from the checkpoint"));
    report.restored_step = read->step;
    report.resume_iteration = read->step;
    report.layers_received = static_cast<int64_t>(read->parameters.size());
    report.move_seconds = lap();
    TANDEM_ASSIGN_OR_RETURN(report.detection_seconds,
                            OverSurvivors(report.detection_seconds, comm::ReduceOp::kMax));
    previous.reset();
    TANDEM_RETURN_IF_ERROR(Configure(&read->parameters, read->step));
    report.build_seconds = lap();
    report.rebuild_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    report.reporter = reporter;
    reforming = false;
    held_state.clear();
    saved_step = -1;
    has_last_result = false;  // iterations after the checkpoint run again
    ScheduleReplacement(read->step);
    if (on_reconfiguration) on_reconfiguration(report);
    return absl::OkStatus();
  }

  // 4. and 5. State moves from surviving holders, then new engines at the iteration after the
  // committed one.
  const int old_reporter = old_layout.pipelines.empty() ? -1 : old_layout.pipelines[0].ranks[0];
  TANDEM_RETURN_IF_ERROR(MoveStateAndConfigure(plan, next, report));
  // The detection as the first survivor to notice saw it (others learned it from that one).
  TANDEM_ASSIGN_OR_RETURN(report.detection_seconds,
                          OverSurvivors(report.detection_seconds, comm::ReduceOp::kMax));
  previous.reset();
  // A new reporter whose predecessor died reports the committed iteration again: the dead one
  // may have died before it did (a reader keeps the last line of each iteration).
  if (reporter && old_reporter != me && has_last_result &&
      last_result.iteration == decision.committed_iteration &&
      std::find(report.dead.begin(), report.dead.end(), old_reporter) != report.dead.end() &&
      on_iteration) {
    on_iteration(Report(last_result));
  }
  report.rebuild_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  report.reporter = reporter;
  ScheduleReplacement(next);
  if (on_reconfiguration) on_reconfiguration(report);
  return absl::OkStatus();
}

absl::StatusOr<ElasticPlan> ElasticTrainer::State::PlanOnLiveNodes(const JobLayout& old_layout,
                                                                   bool restore,
                                                                   int min_pipelines) const {
  ReinstantiationInput input;
  input.nodes = LiveNodes();
  if (!restore) input.held = HeldUnder(old_layout);  // else everything comes from the checkpoint
  input.global_microbatches = options.global_microbatches;
  input.min_pipelines = std::max(1, min_pipelines);
  input.layer_state_bytes = options.layer_state_bytes;
  absl::StatusOr<ElasticPlan> plan = PlanReinstantiation(templates, input);
  if (!plan.ok() && absl::IsFailedPrecondition(plan.status()) && input.min_pipelines > 1) {
    input.min_pipelines = 1;  // the nodes cannot hold that many pipelines: as many as fit
    plan = PlanReinstantiation(templates, input);
  }
  return plan;
}

absl::Status ElasticTrainer::State::MoveStateAndConfigure(const ElasticPlan& plan, int64_t next,
                                                          Reconfiguration& report) {
  absl::Time mark = absl::Now();
  std::map<std::string, runtime::ParameterState>& held = held_state;
  std::map<int, std::vector<std::string>> names_of_layer;
  for (const auto& [name, p] : held) {
    TANDEM_ASSIGN_OR_RETURN(int layer, LayerOfParameter(name));
    names_of_layer[layer].push_back(name);
  }
  auto rank_in_current = [&](int job_rank) -> int {
    auto it = std::find(live.begin(), live.end(), job_rank);
    return it == live.end() ? -1 : static_cast<int>(it - live.begin());
  };
  comm::Communicator& survivors = *configured().config;
  std::vector<std::shared_ptr<std::string>> outgoing;
  std::vector<std::shared_ptr<int64_t>> sizes;
  std::vector<comm::WorkPtr> sends;
  // After a failed transfer the sends may still be read from: their buffers are kept alive.
  auto keep_sends_alive = [&] {
    for (auto& b : outgoing) comm::KeepAliveAfterAbort(b);
    for (auto& b : sizes) comm::KeepAliveAfterAbort(b);
  };
  for (const LayerMove& m : plan.moves.moves) {
    if (m.source_rank != group()) continue;  // each rank sends its own shards
    std::vector<runtime::ParameterState> layer_state;
    for (const std::string& name : names_of_layer[m.layer]) layer_state.push_back(held.at(name));
    auto bytes = std::make_shared<std::string>(EncodeState(layer_state));
    auto size = std::make_shared<int64_t>(static_cast<int64_t>(bytes->size()));
    const int peer = rank_in_current(m.destination_rank + lane());
    sends.push_back(survivors.Send(comm::CpuBuffer(size.get(), 1), peer, internal::kMoveTag));
    sends.push_back(survivors.Send(
        comm::MakeBuffer(bytes->data(), static_cast<int64_t>(bytes->size()),
                         comm::DataType::kUInt8),
        peer, internal::kMoveTag));
    outgoing.push_back(bytes);
    sizes.push_back(size);
  }
  for (const LayerMove& m : plan.moves.moves) {
    if (m.destination_rank != group()) continue;
    const int peer = rank_in_current(m.source_rank + lane());
    auto size_buffer = std::make_shared<int64_t>(0);
    const absl::Status sized =
        survivors.Recv(comm::CpuBuffer(size_buffer.get(), 1), peer, internal::kMoveTag)->Wait();
    if (!sized.ok()) {
      comm::KeepAliveAfterAbort(size_buffer);
      keep_sends_alive();
    }
    TANDEM_RETURN_IF_ERROR(Annotate(
        sized, absl::StrCat("receiving layer ", m.layer, " from rank ", m.source_rank + lane())));
    const int64_t size = *size_buffer;
    // On the heap: after an abort the library may still write into it (then it is kept alive).
    auto incoming = std::make_shared<std::string>(static_cast<size_t>(size), '\0');
    std::string& bytes = *incoming;
    const absl::Status received =
        survivors
            .Recv(comm::MakeBuffer(bytes.data(), size, comm::DataType::kUInt8), peer,
                  internal::kMoveTag)
            ->Wait();
    if (!received.ok()) {
      comm::KeepAliveAfterAbort(incoming);
      keep_sends_alive();
    }
    TANDEM_RETURN_IF_ERROR(Annotate(
        received,
        absl::StrCat("receiving layer ", m.layer, " from rank ", m.source_rank + lane())));
    TANDEM_ASSIGN_OR_RETURN(std::vector<runtime::ParameterState> state, DecodeState(bytes));
    for (runtime::ParameterState& s : state) {
      std::string name = s.name;
      held[name] = std::move(s);
    }
    ++report.layers_received;
    report.bytes_received += static_cast<double>(size);
  }
  for (const comm::WorkPtr& w : sends) {
    const absl::Status sent = w->Wait();
    if (!sent.ok()) {
      keep_sends_alive();
      return Annotate(sent, "sending layer state");
    }
  }
  // The job's total, for the report (every live rank takes part).
  TANDEM_ASSIGN_OR_RETURN(report.bytes_moved,
                          OverSurvivors(report.bytes_received, comm::ReduceOp::kSum));
  const absl::Time moved = absl::Now();
  report.move_seconds = absl::ToDoubleSeconds(moved - mark);
  TANDEM_RETURN_IF_ERROR(Configure(&held, next));
  report.build_seconds = absl::ToDoubleSeconds(absl::Now() - moved);
  reforming = false;
  held_state.clear();
  saved_step = -1;
  return absl::OkStatus();
}

}  // namespace tandem::elastic
