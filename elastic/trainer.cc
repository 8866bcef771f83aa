#include "elastic/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <iostream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "comm/buffer.h"
#include "comm/keep_alive.h"
#include "comm/mpi/mpi_communicator.h"
#include "elastic/internal/fault_injection.h"
#include "common/logging.h"
#include "common/status.h"
#include "pipeline/plan.h"
#include "runtime/checkpoint.h"
#include "runtime/control.h"
#include "runtime/stage_checkpoint.h"

namespace tandem::elastic {
namespace {

using internal::KillingStage;
using internal::KillPoint;
using internal::KillSelf;
using internal::ParseKill;

constexpr int kMoveTag = 21;  // state moves on the survivors' communicator (size, then bytes)

// Ends this rank at once, after printing `line` and running `before_exit` with it: for a
// rank that MPI holds in a call nothing can interrupt.
[[noreturn]] void EndStuckRank(const std::string& line,
                               const std::function<void(const std::string&)>& before_exit) {
  TANDEM_LOG(ERROR) << line;
  if (before_exit) before_exit(line);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

// Ends this rank when its training thread stays past a deadline inside an MPI call that
// nothing can interrupt: building a communicator one of whose members died (Open MPI 4.1 gives
// out communicator IDs one creation at a time and fails none, so the creation, and every later
// one in the process, waits for ever), or starting processes that never join. Armed with a
// deadline and the line to print; disarmed once the thread is out of such calls.
class StuckWatchdog {
 public:
  StuckWatchdog() : thread_([this] { Loop(); }) {}
  ~StuckWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  StuckWatchdog(const StuckWatchdog&) = delete;
  StuckWatchdog& operator=(const StuckWatchdog&) = delete;

  // Replaces what was armed before.
  void Arm(absl::Duration timeout, std::string line) {
    const absl::Time deadline = absl::Now() + timeout;
    std::lock_guard<std::mutex> lock(mu_);
    deadline_ = deadline;
    line_ = std::move(line);
    cv_.notify_all();
  }
  void Disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    deadline_ = absl::InfiniteFuture();
  }
  // Runs with the line just before the rank ends (ElasticOptions::on_fatal).
  void set_before_exit(std::function<void(const std::string&)> before_exit) {
    std::lock_guard<std::mutex> lock(mu_);
    before_exit_ = std::move(before_exit);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (deadline_ == absl::InfiniteFuture()) {
        cv_.wait(lock);
        continue;
      }
      if (absl::Now() >= deadline_) EndStuckRank(line_, before_exit_);
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  absl::Time deadline_ = absl::InfiniteFuture();
  std::string line_;
  std::function<void(const std::string&)> before_exit_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is initialised
};

std::string Ranks(const std::vector<int>& ranks) {
  return ranks.empty() ? "none" : absl::StrJoin(ranks, ", ");
}

nlohmann::json LayoutToJson(const JobLayout& layout) {
  nlohmann::json pipelines = nlohmann::json::array();
  for (const JobPipeline& p : layout.pipelines) {
    nlohmann::json stages = nlohmann::json::array();
    for (const LayerRange& r : p.stages) stages.push_back({r.first_layer, r.end_layer});
    pipelines.push_back({{"ranks", p.ranks},
                         {"stages", stages},
                         {"microbatches", p.microbatches},
                         {"first_microbatch", p.first_microbatch}});
  }
  return {{"pipelines", pipelines},
          {"idle_ranks", layout.idle_ranks},
          {"global_microbatches", layout.global_microbatches},
          {"tensor_parallel", layout.tensor_parallel}};
}

JobLayout LayoutFromJson(const nlohmann::json& j) {
  JobLayout layout;
  for (const nlohmann::json& p : j.at("pipelines")) {
    JobPipeline jp;
    jp.ranks = p.at("ranks").get<std::vector<int>>();
    for (const nlohmann::json& r : p.at("stages")) {
      jp.stages.push_back({r.at(0).get<int>(), r.at(1).get<int>()});
    }
    jp.microbatches = p.at("microbatches").get<int64_t>();
    jp.first_microbatch = p.at("first_microbatch").get<int64_t>();
    layout.pipelines.push_back(std::move(jp));
  }
  layout.idle_ranks = j.at("idle_ranks").get<std::vector<int>>();
  layout.global_microbatches = j.at("global_microbatches").get<int64_t>();
  layout.tensor_parallel = j.value("tensor_parallel", 1);
  return layout;
}

}  // namespace

// ---- the trainer -----------------------------------------------------------------------

// What a rank reads from a checkpoint: its layers' state and the step to resume at.
struct CheckpointedLayers {
  int64_t step = 0;
  std::string folder;
  std::map<std::string, runtime::ParameterState> parameters;
};

struct ElasticTrainer::State {
  std::unique_ptr<comm::Communicator> base;     // the job's first communicator
  std::unique_ptr<comm::Communicator> shrunk;   // the survivors' (after a failure)
  comm::Communicator* current = nullptr;        // base or shrunk
  std::vector<int> live;                        // job rank of each rank of `current`
  int me = 0;                                   // job rank
  planner::TemplateSet templates;
  runtime::StageFactory factory;
  ElasticOptions options;
  KillPoint kill;
  bool late_commit_injected = false;  // `late-commit` acts once (not again on the redo)
  JobLayout layout;

  // One configuration's objects.
  std::unique_ptr<Membership> membership;
  std::unique_ptr<comm::Communicator> everyone;  // duplicate of current: the final barrier
  std::unique_ptr<comm::Communicator> training;  // ranks with a stage: the commit all-reduce
  std::unique_ptr<comm::Communicator> pipeline;  // this rank's pipeline
  struct Segment {
    GradientSegment segment;
    std::unique_ptr<comm::Communicator> comm;
    int index = 0;  // among all segments of the layout
  };
  std::vector<Segment> segments;  // those this rank holds, in layer order
  std::vector<GradientSegment> all_segments;
  // Between a failure and the new engines (possibly over several re-formations, when ranks die
  // during one): this rank's parameters, the layout they follow and the iteration to resume.
  bool reforming = false;
  std::vector<int> reform_dead;  // every rank that died since the last configuration ran
  std::function<void(int64_t)> on_checkpoint;
  std::map<std::string, runtime::ParameterState> held_state;
  JobLayout held_layout;
  int64_t held_next = 0;
  // A duplicate of `current` for the re-formation's and Configure's collectives, so that a
  // death aborts them too.
  std::unique_ptr<comm::Communicator> config;
  int64_t first_iteration = 0;
  int64_t end_iteration = 0;  // options.steps, or first_iteration when past it
  int64_t saved_step = -1;    // the last checkpoint written (-1 also after a re-formation)
  // The end agreed at a commit after a stop request (-1: none); forgotten by a re-formation.
  int64_t stop_end = -1;
  int64_t stopped_at = -1;
  int64_t job_end() const {
    return stop_end >= 0 ? std::min(stop_end, end_iteration) : end_iteration;
  }
  // Growth: the iteration the job grows before, and by how many nodes (agreed at a commit, or
  // the same on every survivor after a recovery with replace_lost; -1, 0: none). grow_now: the
  // nodes every rank agreed on at the end of Train (0: the job ended).
  int64_t grow_at = -1;
  int grow_nodes = 0;
  int grow_now = 0;
  int64_t grow_iteration = 0;  // where training resumes after that growth
  int next_job_rank = 0;   // the job rank the next started process gets
  int starting_ranks = 0;  // the job's size at its start (replace_lost grows back to it)
  // While processes are being started: a death cannot interrupt MPI_Comm_spawn, so the
  // membership's failure notice ends this rank instead.
  std::atomic<bool> growing{false};
  // While Configure builds communicators and engines (see AbortAll).
  std::atomic<bool> building{false};
  StuckWatchdog watchdog;
  int64_t train_end() const {
    return grow_at >= 0 ? std::min(grow_at, job_end()) : job_end();
  }
  // Tensor parallelism: this rank's group (named by its first rank) and offset in it.
  int tp() const { return std::max(1, options.tensor_parallel); }
  int group() const { return me - me % tp(); }
  int lane() const { return me % tp(); }
  bool GroupLive(int first) const {
    for (int t = 0; t < tp(); ++t) {
      if (std::find(live.begin(), live.end(), first + t) == live.end()) return false;
    }
    return true;
  }
  // The live ranks' whole nodes, each as the first ranks of its tensor-parallel groups (the
  // templates' devices); a node that lost a rank is left out.
  std::vector<std::vector<int>> LiveNodes() const {
    const int dpn = std::max(1, options.devices_per_node);
    std::map<int, std::vector<int>> by_node;
    for (int r : live) by_node[r / dpn].push_back(r);
    std::vector<std::vector<int>> nodes;
    for (auto& [node, ranks] : by_node) {
      if (static_cast<int>(ranks.size()) != dpn) continue;
      std::sort(ranks.begin(), ranks.end());
      nodes.emplace_back();
      for (int r : ranks) {
        if (r % tp() == 0) nodes.back().push_back(r);
      }
    }
    return nodes;
  }
  std::unique_ptr<runtime::Engine> engine;
  int pipeline_index = -1;
  bool reporter = false;
  bool has_last_result = false;
  runtime::IterationResult last_result;  // this rank's last completed iteration

  // What the membership's thread aborts when a failure starts an agreement.
  std::mutex abort_mu;
  bool aborted = false;
  absl::Status abort_reason;

  void AbortAll(const absl::Status& reason) {
    if (growing.load()) {
      EndStuckRank(absl::StrCat("elastic: rank ", me, ": a rank died while the job was "
                                "starting new processes, which MPI cannot interrupt; ending "
                                "this rank (", reason.message(), ")"),
                   options.on_fatal);
    }
    // The training thread now leaves its waits (aborted below) for the agreement, unless it is
    // inside a communicator's creation that the dead rank was part of. While it builds
    // communicators that is bounded like the shrink; otherwise like any wait (--timeout): it
    // may be busy in a long computation or a checkpoint write.
    const absl::Duration bound =
        building.load() ? options.agreement_timeout : options.engine.timeout;
    watchdog.Arm(bound,
                 absl::StrCat("elastic: rank ", me, ": ", reason.message(), "; this rank did "
                              "not reach the agreement within ", absl::FormatDuration(bound),
                              ": it waits inside MPI for the dead rank (a communicator was "
                              "being built with it), which MPI cannot interrupt; ending this "
                              "rank"));
    std::lock_guard<std::mutex> lock(abort_mu);
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

  // Drops one configuration's objects (after an abort: nothing waits for the dead).
  void TearDown() {
    std::unique_ptr<runtime::Engine> old_engine;
    std::vector<Segment> old_segments;
    std::unique_ptr<comm::Communicator> a, b, c;
    {
      std::lock_guard<std::mutex> lock(abort_mu);
      old_engine = std::move(engine);
      old_segments = std::move(segments);
      a = std::move(everyone);
      b = std::move(training);
      c = std::move(pipeline);
    }
    old_engine.reset();
    old_segments.clear();
  }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> SplitRegistered(int color, int key) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c, config->Split(color, key));
    if (c != nullptr) c->set_timeout(options.engine.timeout);
    return c;
  }

  // `committed`: the iteration committed everywhere (the new membership's starting value).
  absl::Status StartMembership(int64_t committed);
  absl::Status Configure(const std::map<std::string, runtime::ParameterState>* import,
                         int64_t iteration);
  runtime::StageFactory PipelineFactory(const JobPipeline& p);
  absl::StatusOr<double> SyncGradients(runtime::Engine& engine);
  absl::Status SumOverJob(int64_t iteration, std::array<double, 3>& sums);
  absl::Status Train(const std::function<void(const ElasticIteration&)>& on_iteration);
  absl::Status SaveCheckpoint(int64_t step);
  // `value` reduced over the survivors (the re-formation's communicator).
  absl::StatusOr<double> OverSurvivors(double value, comm::ReduceOp op) {
    auto buffer = std::make_shared<double>(value);
    const absl::Status reduced =
        config->AllReduce(runtime::DoubleBuffer(buffer.get(), 1), op)->Wait();
    if (!reduced.ok()) {
      comm::KeepAliveAfterAbort(buffer);  // the library may still write into it
      return Annotate(reduced, "reducing over the survivors");
    }
    return *buffer;
  }
  // The layers this rank runs under `layout`, read from the checkpoint at `root`.
  absl::StatusOr<CheckpointedLayers> ReadCheckpoint(const std::string& root) const;
  absl::Status Reconfigure(const MembershipDecision& decision,
                           const std::function<void(const ElasticIteration&)>& on_iteration,
                           const std::function<void(const Reconfiguration&)>& on_reconfiguration);
  // The re-instantiation on the live ranks' whole nodes, from what `old_layout` held (nothing
  // when `restore`): at least `min_pipelines` pipelines where the nodes allow, else one.
  absl::StatusOr<ElasticPlan> PlanOnLiveNodes(const JobLayout& old_layout, bool restore,
                                              int min_pipelines) const;
  // 4. and 5. of a re-formation: the state moves of `plan` between the live ranks, then the
  // engines at iteration `next`. Fills the report's moves.
  absl::Status MoveStateAndConfigure(const ElasticPlan& plan, int64_t next,
                                     Reconfiguration& report);
  // Starts `nodes` nodes' worth of new ranks and re-forms the job with them.
  absl::Status Grow(int nodes,
                    const std::function<void(const Reconfiguration&)>& on_reconfiguration);
  // After a re-formation onto `live`: with replace_lost, grow back after one iteration.
  void ScheduleReplacement(int64_t next);
  // What a started rank needs (JoinRequest::state): the layout held before the growth, the
  // ranks after it, the iteration to resume.
  std::string JoinState(const std::vector<int>& added) const;
  absl::Status ReadJoinState(const std::string& text, std::vector<int>& added);
  // The end of a growth, on the old ranks and the started ones alike (the state moves and the
  // engines of a re-formation).
  absl::Status FinishGrowth(Reconfiguration& report, absl::Time start,
                            const std::function<void(const Reconfiguration&)>& on_done);
  ElasticIteration Report(const runtime::IterationResult& r) const {
    ElasticIteration e;
    e.result = r;
    e.reporter = reporter;
    e.pipelines = static_cast<int>(layout.pipelines.size());
    e.ranks = 0;
    for (const JobPipeline& p : layout.pipelines) {
      e.ranks += static_cast<int>(p.ranks.size()) * layout.tensor_parallel;
    }
    return e;
  }
};

absl::Status ElasticTrainer::State::StartMembership(int64_t committed) {
  {
    std::lock_guard<std::mutex> lock(abort_mu);
    aborted = false;
    abort_reason = absl::OkStatus();
  }
  TANDEM_ASSIGN_OR_RETURN(membership,
                          Membership::Start(*current, options.membership,
                                            [this](const absl::Status& why) { AbortAll(why); },
                                            committed));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c,
                          current->Split(0, current->rank()));
  c->set_timeout(options.engine.timeout);
  std::lock_guard<std::mutex> lock(abort_mu);
  config = std::move(c);
  if (aborted) config->Abort(abort_reason);
  return absl::OkStatus();
}

runtime::StageFactory ElasticTrainer::State::PipelineFactory(const JobPipeline& p) {
  const int64_t offset = p.first_microbatch * options.microbatch_size;
  const int loss_microbatches = static_cast<int>(options.global_microbatches);
  return [this, offset, loss_microbatches](const runtime::StageSpec& spec)
             -> absl::StatusOr<std::unique_ptr<runtime::Stage>> {
    runtime::StageSpec s = spec;
    s.sample_offset = offset;
    s.loss_microbatches = loss_microbatches;
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Stage> stage, factory(s));
    if (kill.InStage(me)) {
      stage = std::make_unique<KillingStage>(std::move(stage), kill, me);
    }
    return stage;
  };
}

absl::StatusOr<double> ElasticTrainer::State::SyncGradients(runtime::Engine& e) {
  if (kill.Hits(me, e.iteration(), "sync")) KillSelf(me, e.iteration(), "sync");
  std::vector<runtime::ParameterView> params = e.LocalParameters();
  // Gradients cross pipelines through host memory: on a device, copied there and back.
  const std::vector<runtime::DeviceOps*> ops = e.LocalParameterOps();
  std::vector<int> layer_of(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(layer_of[i], LayerOfParameter(params[i].name));
  }
  double norm = 0;
  for (Segment& seg : segments) {
    std::vector<size_t> members;
    int64_t count = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (layer_of[i] >= seg.segment.layers.first_layer &&
          layer_of[i] < seg.segment.layers.end_layer) {
        members.push_back(i);
        count += params[i].grad.count;
      }
    }
    // On the heap: after an abort the library may still write into it (then it is kept alive).
    auto buffer = std::make_shared<std::vector<float>>(static_cast<size_t>(count));
    std::vector<float>& flat = *buffer;
    int64_t at = 0;
    for (size_t i : members) {
      TANDEM_RETURN_IF_ERROR(ops[i]->CopyToHost(
          flat.data() + at, static_cast<const float*>(params[i].grad.data), params[i].grad.count));
      at += params[i].grad.count;
    }
    if (seg.comm != nullptr && seg.comm->size() > 1 && count > 0) {
      const absl::Status reduced =
          seg.comm->AllReduce(comm::CpuBuffer(flat.data(), count), comm::ReduceOp::kSum)
              ->Wait();
      if (!reduced.ok()) {
        comm::KeepAliveAfterAbort(buffer);
        return Annotate(reduced, absl::StrCat("summing the gradients of layers [",
                                              seg.segment.layers.first_layer, ", ",
                                              seg.segment.layers.end_layer, ") over ranks ",
                                              Ranks(seg.segment.ranks)));
      }
      at = 0;
      for (size_t i : members) {
        TANDEM_RETURN_IF_ERROR(ops[i]->CopyFromHost(static_cast<float*>(params[i].grad.data),
                                                    flat.data() + at, params[i].grad.count));
        at += params[i].grad.count;
      }
    }
    // Each segment's norm counted once: by its lowest group, each shard by its own rank and a
    // parameter every rank of the group holds whole by the first.
    if (seg.segment.ranks.front() == group()) {
      at = 0;
      for (size_t i : members) {
        if (lane() == 0 || !params[i].tensor_parallel_replicated) {
          for (int64_t k = 0; k < params[i].grad.count; ++k) {
            const double g = flat[static_cast<size_t>(at + k)];
            norm += g * g;
          }
        }
        at += params[i].grad.count;
      }
    }
  }
  return norm;
}

absl::Status ElasticTrainer::State::SumOverJob(int64_t iteration, std::array<double, 3>& sums) {
  // The three sums, and the number of ranks asked to stop: every rank learns a stop request at
  // the same commit.
  const bool stop = options.stop_requested != nullptr && options.stop_requested->load();
  const bool grow = options.grow_requested != nullptr && options.grow_requested->load() > 0;
  auto buffer = std::make_shared<std::array<double, 5>>(std::array<double, 5>{
      sums[0], sums[1], sums[2], stop ? 1.0 : 0.0, grow ? 1.0 : 0.0});
  const absl::Status reduced =
      training->AllReduce(runtime::DoubleBuffer(buffer->data(), 5), comm::ReduceOp::kSum)->Wait();
  if (!reduced.ok()) {
    comm::KeepAliveAfterAbort(buffer);
    return reduced;
  }
  sums = {(*buffer)[0], (*buffer)[1], (*buffer)[2]};
  if ((*buffer)[3] > 0 && stop_end < 0) stop_end = iteration + 1;
  if ((*buffer)[4] > 0 && grow_at < 0) {
    grow_at = iteration + 1;
    grow_nodes = 1;
  }
  if (!late_commit_injected && kill.Hits(me, iteration, "late-commit")) {
    late_commit_injected = true;
    // Fault injection, not a death: this rank records its commit only once the survivors have
    // decided (or after 30 s), as a rank descheduled at this point could.
    (void)membership->AwaitDecision(absl::Seconds(30));
    TANDEM_LOG(WARNING) << "fault injection: rank " << me << " records the commit of iteration "
                        << iteration << " after the agreement";
  }
  const bool counted = membership->SetCommitted(iteration, sums);
  if (kill.Hits(me, iteration, "commit")) KillSelf(me, iteration, "commit");
  if (!counted) {
    // An agreement began before this rank committed: the survivors' decision says whether
    // this step counts (then the recovery applies it) or is redone.
    return absl::AbortedError(absl::StrCat("rank ", me, ": an agreement began before iteration ",
                                           iteration, " committed here"));
  }
  return absl::OkStatus();
}

absl::Status ElasticTrainer::State::Configure(
    const std::map<std::string, runtime::ParameterState>* import, int64_t iteration) {
  building.store(true);
  struct BuildingScope {
    std::atomic<bool>& flag;
    ~BuildingScope() { flag.store(false); }
  } building_scope{building};
  pipeline_index = -1;
  int stage_index = 0;
  for (size_t i = 0; i < layout.pipelines.size(); ++i) {
    const JobPipeline& p = layout.pipelines[i];
    for (size_t s = 0; s < p.ranks.size(); ++s) {
      if (p.ranks[s] == group()) {
        pipeline_index = static_cast<int>(i);
        stage_index = static_cast<int>(s);
      }
    }
  }
  reporter = !layout.pipelines.empty() && layout.pipelines[0].ranks[0] == me;
  const int my_rank = current->rank();
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> all, SplitRegistered(0, my_rank));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> train,
                          SplitRegistered(pipeline_index >= 0 ? 0 : -1, my_rank));
  // A pipeline's ranks stage by stage, the ranks of a stage's tensor-parallel group together
  // (the engine's plan below places them so).
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> pipe,
                          SplitRegistered(pipeline_index, stage_index * tp() + lane()));
  TANDEM_ASSIGN_OR_RETURN(std::vector<GradientSegment> segs,
                          GradientSegments(layout, options.num_layers));
  std::vector<Segment> mine;
  for (size_t i = 0; i < segs.size(); ++i) {
    const GradientSegment& g = segs[i];
    // One communicator per offset in the groups: each rank sums its own shards.
    const bool member = std::binary_search(g.ranks.begin(), g.ranks.end(), group());
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c,
                            SplitRegistered(member ? lane() : -1, my_rank));
    if (member) mine.push_back({g, std::move(c), static_cast<int>(i)});
  }
  all_segments = segs;
  {
    std::lock_guard<std::mutex> lock(abort_mu);
    everyone = std::move(all);
    training = std::move(train);
    pipeline = std::move(pipe);
    segments = std::move(mine);
    if (aborted) return abort_reason;
  }
  if (pipeline_index < 0) return absl::OkStatus();

  const JobPipeline& p = layout.pipelines[static_cast<size_t>(pipeline_index)];
  const int stages = static_cast<int>(p.ranks.size());
  pipeline::Plan plan;
  plan.model = options.model;
  plan.num_layers = options.num_layers;
  plan.world_size = stages;
  plan.data_parallel = 1;
  plan.pipeline_parallel = stages;
  plan.schedule.kind = options.schedule;
  plan.schedule.num_ranks = stages;
  plan.schedule.num_microbatches = static_cast<int>(p.microbatches);
  plan.microbatch_size = options.microbatch_size;
  plan.mesh.emplace_back();
  for (int s = 0; s < stages; ++s) {
    plan.mesh[0].push_back(s);
    pipeline::PlanStage st;
    st.first_layer = p.stages[static_cast<size_t>(s)].first_layer;
    st.end_layer = p.stages[static_cast<size_t>(s)].end_layer;
    st.ranks = {s};
    plan.stages.push_back(st);
  }
  plan.algorithm = "elastic";
  if (tp() > 1) {
    TANDEM_ASSIGN_OR_RETURN(plan, pipeline::WithTensorParallel(std::move(plan), tp()));
  }
  runtime::EngineOptions eo = options.engine;
  eo.heartbeat_timeout = absl::ZeroDuration();  // the membership watches every rank
  eo.job.ranks = 0;
  for (const JobPipeline& q : layout.pipelines) {
    eo.job.ranks += static_cast<int>(q.ranks.size()) * tp();
  }
  eo.job.sync_gradients = [this](runtime::Engine& e) { return SyncGradients(e); };
  eo.job.sum_over_job = [this](int64_t it, std::array<double, 3>& sums) {
    return SumOverJob(it, sums);
  };
  eo.job.sum_evaluation = [this](double& loss) {
    auto buffer = std::make_shared<double>(loss);
    const absl::Status reduced =
        training->AllReduce(runtime::DoubleBuffer(buffer.get(), 1), comm::ReduceOp::kSum)->Wait();
    if (!reduced.ok()) {
      comm::KeepAliveAfterAbort(buffer);
      return reduced;
    }
    loss = *buffer;
    return absl::OkStatus();
  };
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> built,
                          runtime::Engine::Create(plan, pipeline.get(), PipelineFactory(p), eo));
  if (import != nullptr) {
    std::vector<runtime::ParameterState> state;
    for (const auto& [name, s] : *import) state.push_back(s);
    TANDEM_RETURN_IF_ERROR(built->ImportState(state));
  }
  built->set_iteration(iteration);
  std::lock_guard<std::mutex> lock(abort_mu);
  engine = std::move(built);
  if (aborted) {
    engine->Abort(abort_reason);
    return abort_reason;
  }
  return absl::OkStatus();
}

absl::Status ElasticTrainer::State::Train(
    const std::function<void(const ElasticIteration&)>& on_iteration) {
  stopped_at = -1;
  int grow = 0;
  if (engine != nullptr) {
    while (engine->iteration() < train_end()) {
      TANDEM_ASSIGN_OR_RETURN(runtime::IterationResult r, engine->RunIteration());
      TANDEM_RETURN_IF_ERROR(runtime::CheckLossIsFinite(r));
      last_result = r;
      has_last_result = true;
      const int64_t done = r.iteration + 1;
      if (on_iteration) on_iteration(Report(r));
      if (runtime::EvaluationDue(done, job_end(), options.eval_every)) {
        // A death during it is recovered like one during an iteration; this validation loss
        // is then not reported.
        TANDEM_ASSIGN_OR_RETURN(const double loss, engine->Evaluate(options.eval_batches));
        if (options.on_evaluation) options.on_evaluation(done, loss, reporter);
      }
      if (!options.checkpoint_dir.empty() &&
          runtime::CheckpointDue(done, job_end(), options.checkpoint_every)) {
        TANDEM_RETURN_IF_ERROR(SaveCheckpoint(done));
      }
    }
    // A death during the final checkpoint: the survivors write it again.
    if (!options.checkpoint_dir.empty() && saved_step != job_end() &&
        engine->iteration() == job_end()) {
      TANDEM_RETURN_IF_ERROR(SaveCheckpoint(job_end()));
    }
    if (engine->iteration() >= job_end() && job_end() < end_iteration) stopped_at = job_end();
    if (grow_at >= 0 && engine->iteration() == grow_at && grow_at < job_end()) grow = grow_nodes;
  } else if (kill.Idle(me)) {
    KillSelf(me, -1, "idle");
  }
  // Everyone, idle ranks included, meets here and learns whether the job grows now (the
  // training ranks agreed on it at a commit) or ends; a failure meanwhile aborts the wait.
  // (The iteration too, which idle ranks do not know.)
  auto next = std::make_shared<std::array<double, 2>>(std::array<double, 2>{
      static_cast<double>(grow),
      engine != nullptr ? static_cast<double>(engine->iteration()) : -1.0});
  comm::WorkPtr done = everyone->AllReduce(runtime::DoubleBuffer(next->data(), 2),
                                           comm::ReduceOp::kMax);
  while (!done->Test()) absl::SleepFor(absl::Milliseconds(5));
  if (!done->error().ok()) {
    comm::KeepAliveAfterAbort(next);
    return done->error();
  }
  grow_now = static_cast<int>((*next)[0]);
  grow_iteration = static_cast<int64_t>((*next)[1]);
  grow_at = -1;
  grow_nodes = 0;
  return absl::OkStatus();
}

// The partition a checkpoint of the job follows: one stage per gradient segment (a plan of
// one pipeline, which is how any run reads it back).
pipeline::Plan SegmentPlan(const std::vector<GradientSegment>& segments,
                           const ElasticOptions& options) {
  pipeline::Plan plan;
  const int n = static_cast<int>(segments.size());
  plan.model = options.model;
  plan.num_layers = options.num_layers;
  plan.world_size = n;
  plan.pipeline_parallel = n;
  plan.schedule.kind = pipeline::ScheduleKind::kGPipe;
  plan.schedule.num_ranks = n;
  plan.schedule.num_microbatches = 1;
  plan.microbatch_size = options.microbatch_size;
  plan.mesh.emplace_back();
  for (int s = 0; s < n; ++s) {
    plan.mesh[0].push_back(s);
    pipeline::PlanStage st;
    st.first_layer = segments[static_cast<size_t>(s)].layers.first_layer;
    st.end_layer = segments[static_cast<size_t>(s)].layers.end_layer;
    st.ranks = {s};
    plan.stages.push_back(st);
  }
  plan.algorithm = "elastic checkpoint (one stage per run of layers with the same holders)";
  return plan;
}

absl::Status ElasticTrainer::State::SaveCheckpoint(int64_t step) {
  // Whole parameters (tensor-parallel shards gathered over their group): the checkpoint loads
  // onto any layout.
  TANDEM_ASSIGN_OR_RETURN(std::vector<runtime::ParameterState> state, engine->ExportWholeState());
  if (kill.Hits(me, step, "checkpoint")) KillSelf(me, step, "checkpoint");
  std::vector<runtime::CheckpointShard> shards;
  for (const Segment& seg : segments) {
    if (seg.segment.ranks.front() != me) continue;  // its lowest holder writes it
    std::vector<runtime::ParameterState> parameters;
    for (const runtime::ParameterState& p : state) {
      TANDEM_ASSIGN_OR_RETURN(int layer, LayerOfParameter(p.name));
      if (layer >= seg.segment.layers.first_layer && layer < seg.segment.layers.end_layer) {
        parameters.push_back(p);
      }
    }
    shards.push_back(runtime::ShardOf(seg.index, seg.segment.layers.first_layer,
                                      seg.segment.layers.end_layer, parameters));
  }
  const pipeline::Plan plan = SegmentPlan(all_segments, options);
  runtime::CheckpointScope scope;
  scope.control = training.get();
  scope.plan = &plan;
  scope.num_stages = static_cast<int>(all_segments.size());
  scope.optimizer = options.engine.optimizer;
  scope.run = options.engine.checkpoint_run;
  TANDEM_RETURN_IF_ERROR(Annotate(runtime::SaveShardsStep(options.checkpoint_dir, options.model,
                                                          step, options.keep_checkpoints, scope,
                                                          shards),
                                  absl::StrCat("checkpoint of step ", step)));
  saved_step = step;
  if (on_checkpoint && reporter) on_checkpoint(step);
  return absl::OkStatus();
}

absl::StatusOr<CheckpointedLayers> ElasticTrainer::State::ReadCheckpoint(
    const std::string& root) const {
  CheckpointedLayers out;
  TANDEM_ASSIGN_OR_RETURN(out.folder, runtime::ResolveCheckpoint(root));
  for (const JobPipeline& p : layout.pipelines) {
    for (size_t s = 0; s < p.ranks.size(); ++s) {
      if (p.ranks[s] != group()) continue;
      TANDEM_ASSIGN_OR_RETURN(
          runtime::CheckpointState saved,
          runtime::ReadCheckpointState(out.folder, options.model, options.num_layers,
                                       options.engine.optimizer, p.stages[s].first_layer,
                                       p.stages[s].end_layer));
      out.step = saved.step;
      out.parameters = std::move(saved.parameters);
      return out;
    }
  }
  // An idle rank reads only the step.
  TANDEM_ASSIGN_OR_RETURN(runtime::CheckpointManifest manifest,
                          runtime::ReadManifest(out.folder));
  out.step = manifest.step;
  return out;
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
  if (kill.Hits(me, next, "shrink")) KillSelf(me, next, "shrink");
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
  if (kill.Hits(me, next, "reform")) KillSelf(me, next, "reform");

  // 2. The committed step, applied everywhere; then this rank's state, by parameter name
  // (both local). A re-formation cut short by a further death keeps what the first one
  // exported.
  if (!reforming) {
    held_state.clear();
    held_layout = layout;
    held_next = next;
    if (engine != nullptr) {
      if (engine->step_pending() && engine->iteration() == decision.committed_iteration) {
        TANDEM_ASSIGN_OR_RETURN(runtime::IterationResult r,
                                engine->ApplyCommittedStep(decision.committed_sums));
        report.applied_committed_step = true;
        last_result = r;
        has_last_result = true;
        if (on_iteration) on_iteration(Report(r));
      }
      if (engine->iteration() != held_next) {
        return absl::InternalError(absl::StrCat(
            "rank ", me, " is at iteration ", engine->iteration(),
            " but the survivors resume at ", held_next, " (committed ",
            decision.committed_iteration, ")"));
      }
      if (kill.Hits(me, next, "export")) KillSelf(me, next, "export");
      TANDEM_ASSIGN_OR_RETURN(std::vector<runtime::ParameterState> state, engine->ExportState());
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
  {
    // Layers with no live holder cannot be copied from anyone: say so before planning.
    std::vector<bool> covered(static_cast<size_t>(options.num_layers), false);
    for (const auto& [r, ranges] : HeldUnder(old_layout)) {
      if (!GroupLive(r)) continue;
      for (const LayerRange& range : ranges) {
        for (int l = range.first_layer; l < range.end_layer; ++l) covered[static_cast<size_t>(l)] = true;
      }
    }
    std::vector<std::string> lost;
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
    absl::StatusOr<CheckpointedLayers> read = ReadCheckpoint(options.checkpoint_dir);
    TANDEM_RETURN_IF_ERROR(runtime::AgreeOnSuccess(
        current,
        Annotate(read.status(), absl::StrCat("rank ", me, ": restoring lost layers from ",
                                             options.checkpoint_dir)),
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
  std::vector<std::shared_ptr<std::string>> outgoing;
  std::vector<std::shared_ptr<int64_t>> sizes;
  std::vector<comm::WorkPtr> sends;
  for (const LayerMove& m : plan.moves.moves) {
    if (m.source_rank != group()) continue;  // each rank sends its own shards
    std::vector<runtime::ParameterState> layer_state;
    for (const std::string& name : names_of_layer[m.layer]) layer_state.push_back(held.at(name));
    auto bytes = std::make_shared<std::string>(EncodeState(layer_state));
    auto size = std::make_shared<int64_t>(static_cast<int64_t>(bytes->size()));
    const int peer = rank_in_current(m.destination_rank + lane());
    sends.push_back(config->Send(comm::CpuBuffer(size.get(), 1), peer, kMoveTag));
    sends.push_back(config->Send(comm::MakeBuffer(bytes->data(), static_cast<int64_t>(bytes->size()),
                                                 comm::DataType::kUInt8),
                                  peer, kMoveTag));
    outgoing.push_back(bytes);
    sizes.push_back(size);
  }
  for (const LayerMove& m : plan.moves.moves) {
    if (m.destination_rank != group()) continue;
    const int peer = rank_in_current(m.source_rank + lane());
    auto size_buffer = std::make_shared<int64_t>(0);
    const absl::Status sized =
        config->Recv(comm::CpuBuffer(size_buffer.get(), 1), peer, kMoveTag)->Wait();
    if (!sized.ok()) {
      comm::KeepAliveAfterAbort(size_buffer);
      for (auto& b : outgoing) comm::KeepAliveAfterAbort(b);
      for (auto& b : sizes) comm::KeepAliveAfterAbort(b);
    }
    TANDEM_RETURN_IF_ERROR(Annotate(
        sized, absl::StrCat("receiving layer ", m.layer, " from rank ", m.source_rank + lane())));
    const int64_t size = *size_buffer;
    // On the heap: after an abort the library may still write into it (then it is kept alive).
    auto incoming = std::make_shared<std::string>(static_cast<size_t>(size), '\0');
    std::string& bytes = *incoming;
    const absl::Status received =
        config->Recv(comm::MakeBuffer(bytes.data(), size, comm::DataType::kUInt8), peer, kMoveTag)->Wait();
    if (!received.ok()) {
      comm::KeepAliveAfterAbort(incoming);
      for (auto& b : outgoing) comm::KeepAliveAfterAbort(b);
      for (auto& b : sizes) comm::KeepAliveAfterAbort(b);
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
      for (auto& b : outgoing) comm::KeepAliveAfterAbort(b);
      for (auto& b : sizes) comm::KeepAliveAfterAbort(b);
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

void ElasticTrainer::State::ScheduleReplacement(int64_t next) {
  if (!options.replace_lost || options.spawn_command.empty()) return;
  const int dpn = std::max(1, options.devices_per_node);
  std::map<int, int> per_node;
  for (int r : live) ++per_node[r / dpn];
  int whole = 0;
  for (const auto& [node, count] : per_node) whole += count == dpn ? 1 : 0;
  const int lost = starting_ranks / dpn - whole;
  if (lost <= 0) return;
  grow_at = next + 1;  // the same on every rank: all resume at `next`
  grow_nodes = lost;
}

std::string ElasticTrainer::State::JoinState(const std::vector<int>& added) const {
  std::vector<int> after = live;
  after.insert(after.end(), added.begin(), added.end());
  const nlohmann::json j = {{"next_iteration", held_next},
                            {"first_iteration", first_iteration},
                            {"end_iteration", end_iteration},
                            {"live", after},
                            {"added", added},
                            {"next_job_rank", next_job_rank + static_cast<int>(added.size())},
                            {"starting_ranks", starting_ranks},
                            {"num_layers", options.num_layers},
                            {"layout", LayoutToJson(held_layout)}};
  return j.dump();
}

absl::Status ElasticTrainer::State::ReadJoinState(const std::string& text,
                                                  std::vector<int>& added) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return absl::DataLossError("the job's state for a started rank is not JSON");
  try {
    held_next = j.at("next_iteration").get<int64_t>();
    first_iteration = j.at("first_iteration").get<int64_t>();
    end_iteration = j.at("end_iteration").get<int64_t>();
    live = j.at("live").get<std::vector<int>>();
    added = j.at("added").get<std::vector<int>>();
    next_job_rank = j.at("next_job_rank").get<int>();
    starting_ranks = j.at("starting_ranks").get<int>();
    held_layout = LayoutFromJson(j.at("layout"));
    const int layers = j.at("num_layers").get<int>();
    if (layers != options.num_layers ||
        held_layout.global_microbatches != options.global_microbatches) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this rank's model has ", options.num_layers, " layers and a global batch of ",
          options.global_microbatches, " micro-batches; the job it joins has ", layers, " and ",
          held_layout.global_microbatches, ": it must run the job's command"));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("the job's state for a started rank: ", e.what()));
  }
  if (static_cast<int>(live.size()) != current->size()) {
    return absl::InternalError(absl::StrCat("the job names ", live.size(), " ranks but ",
                                            current->size(), " joined"));
  }
  return absl::OkStatus();
}

absl::Status ElasticTrainer::State::Grow(
    int nodes, const std::function<void(const Reconfiguration&)>& on_reconfiguration) {
  const absl::Time start = absl::Now();
  if (options.grow_requested != nullptr) {
    // This growth answers one request of this rank's, if it made any.
    int pending = options.grow_requested->load();
    while (pending > 0 && !options.grow_requested->compare_exchange_weak(pending, pending - 1)) {
    }
  }
  const bool first = current->rank() == 0;
  auto* mpi = dynamic_cast<comm::MpiCommunicator*>(current);
  if (options.spawn_command.empty() || mpi == nullptr) {
    if (first) {
      TANDEM_LOG(WARNING) << "elastic: the job cannot grow while it runs ("
                          << (mpi == nullptr ? "its communicator is not MPI's"
                                             : "no command to start ranks with")
                          << "); training goes on with " << current->size() << " rank(s)";
    }
    return absl::OkStatus();
  }
  const int dpn = std::max(1, options.devices_per_node);
  const int count = nodes * dpn;
  const int64_t next = grow_iteration;
  if (engine != nullptr && engine->iteration() != next) {
    return absl::InternalError(absl::StrCat("rank ", me, " is at iteration ", engine->iteration(),
                                            " but the job grows before ", next));
  }
  // This rank's state, before anything changes (a failed start leaves the engines running).
  std::map<std::string, runtime::ParameterState> state;
  if (engine != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<runtime::ParameterState> exported, engine->ExportState());
    for (runtime::ParameterState& p : exported) {
      std::string name = p.name;
      state.emplace(std::move(name), std::move(p));
    }
  }
  if (first) {
    std::cout << "elastic: starting " << count << " new rank(s) (" << nodes
              << " node(s)) before iteration " << next + 1 << " ..." << std::endl;
  }
  growing.store(true);
  // Started processes that never join (a crash before MPI_Intercomm_merge) would leave this
  // rank in MPI for ever: past the agreement timeout it ends with an error instead.
  watchdog.Arm(options.agreement_timeout,
               absl::StrCat("elastic: rank ", me, ": the ranks started to grow the job did not "
                            "join within ", absl::FormatDuration(options.agreement_timeout),
                            "; ending this rank"));
  absl::StatusOr<std::unique_ptr<comm::MpiCommunicator>> merged =
      mpi->SpawnAndMerge(options.spawn_command, count);
  if (!merged.ok()) {
    growing.store(false);
    watchdog.Disarm();
    if (first) {
      TANDEM_LOG(WARNING) << "elastic: could not start new ranks (" << merged.status().message()
                          << "); training goes on with " << current->size() << " rank(s)";
    }
    return absl::OkStatus();
  }
  Reconfiguration report;
  report.spawn_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  // The old ranks' membership ends together; the merged communicator gets a new one.
  membership->Leave();
  membership.reset();
  growing.store(false);
  watchdog.Disarm();
  TearDown();
  held_state = std::move(state);
  held_layout = layout;
  held_next = next;
  reforming = true;
  std::vector<int> added;
  for (int i = 0; i < count; ++i) added.push_back(next_job_rank + i);
  (*merged)->set_timeout(options.engine.timeout);
  TANDEM_RETURN_IF_ERROR(
      Annotate(runtime::BroadcastString(**merged, options.join_payload).status(),
               "sending the job's set-up to the started ranks"));
  TANDEM_RETURN_IF_ERROR(Annotate(runtime::BroadcastString(**merged, JoinState(added)).status(),
                                  "sending the job's state to the started ranks"));
  std::unique_ptr<comm::Communicator> previous = std::move(shrunk);
  if (previous != nullptr) previous->Abort(absl::CancelledError("replaced by the grown job's"));
  shrunk = *std::move(merged);
  current = shrunk.get();
  live.insert(live.end(), added.begin(), added.end());
  next_job_rank += count;
  TANDEM_RETURN_IF_ERROR(StartMembership(next - 1));
  report.added = added;
  report.shrink_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  TANDEM_RETURN_IF_ERROR(FinishGrowth(report, start, on_reconfiguration));
  previous.reset();
  return absl::OkStatus();
}

absl::Status ElasticTrainer::State::FinishGrowth(
    Reconfiguration& report, absl::Time start,
    const std::function<void(const Reconfiguration&)>& on_done) {
  const int64_t next = held_next;
  const absl::Time planning = absl::Now();
  TANDEM_ASSIGN_OR_RETURN(ElasticPlan plan,
                          PlanOnLiveNodes(held_layout, /*restore=*/false, options.min_pipelines));
  TANDEM_ASSIGN_OR_RETURN(layout, LayoutFromPlan(plan, live, tp()));
  report.plan = Describe(plan);
  report.layout = Describe(layout);
  report.plan_seconds = absl::ToDoubleSeconds(absl::Now() - planning);
  TANDEM_RETURN_IF_ERROR(MoveStateAndConfigure(plan, next, report));
  report.live = live;
  report.committed_iteration = next - 1;
  report.resume_iteration = next;
  report.rebuild_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  report.reporter = reporter;
  if (on_done) on_done(report);
  return absl::OkStatus();
}

bool StartedByARunningJob() { return comm::MpiCommunicator::Spawned(); }

absl::StatusOr<JoinRequest> AcceptJoin(absl::Duration timeout) {
  TANDEM_ASSIGN_OR_RETURN(comm::CommOptions options, comm::CommOptions::FromEnvironment());
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::MpiCommunicator> merged,
                          comm::MpiCommunicator::JoinParents(options));
  merged->set_timeout(timeout);
  JoinRequest request;
  TANDEM_ASSIGN_OR_RETURN(request.payload, runtime::BroadcastString(*merged, ""));
  TANDEM_ASSIGN_OR_RETURN(request.state, runtime::BroadcastString(*merged, ""));
  request.job = std::move(merged);
  return request;
}

ElasticTrainer::ElasticTrainer(std::unique_ptr<State> state) : state_(std::move(state)) {}

ElasticTrainer::~ElasticTrainer() {
  if (state_ == nullptr) return;
  state_->membership.reset();
  state_->TearDown();
}

const JobLayout& ElasticTrainer::layout() const { return state_->layout; }
int ElasticTrainer::job_rank() const { return state_->me; }
int64_t ElasticTrainer::first_iteration() const { return state_->first_iteration; }
int64_t ElasticTrainer::end_iteration() const { return state_->end_iteration; }
int64_t ElasticTrainer::stopped_at() const { return state_->stopped_at; }

namespace {

absl::Status CheckOptions(const comm::Communicator* world, const runtime::StageFactory& factory,
                          ElasticOptions& options) {
  if (world == nullptr) return absl::InvalidArgumentError("elastic: no communicator");
  if (!factory) return absl::InvalidArgumentError("elastic: no stage factory");
  if (options.schedule != pipeline::ScheduleKind::kGPipe &&
      options.schedule != pipeline::ScheduleKind::k1F1B &&
      options.schedule != pipeline::ScheduleKind::kZBH1) {
    return absl::InvalidArgumentError(
        "elastic training runs the GPipe, 1F1B and ZB-H1 schedules (the templates give each "
        "rank one contiguous run of layers; interleaved, Chimera, Hanayo and ZB-V place "
        "several on a rank)");
  }
  if (options.num_layers <= 0 || options.global_microbatches <= 0 || options.steps < 0) {
    return absl::InvalidArgumentError("elastic: layers, global micro-batches and steps needed");
  }
  if (options.tensor_parallel < 1 ||
      std::max(1, options.devices_per_node) % options.tensor_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "elastic: tensor-parallel groups of ", options.tensor_parallel, " must fill nodes of ",
        std::max(1, options.devices_per_node), " ranks (a group stays inside one node)"));
  }
  if (options.kill.empty()) {
    const char* env = std::getenv("TANDEM_ELASTIC_KILL");
    if (env != nullptr) options.kill = env;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Join(
    JoinRequest request, planner::TemplateSet templates, runtime::StageFactory factory,
    ElasticOptions options, std::function<void(const Reconfiguration&)> on_joined) {
  const absl::Time start = absl::Now();
  TANDEM_RETURN_IF_ERROR(CheckOptions(request.job.get(), factory, options));
  auto state = std::make_unique<State>();
  TANDEM_ASSIGN_OR_RETURN(state->kill, ParseKill(options.kill));
  state->base = std::move(request.job);
  state->current = state->base.get();
  state->templates = std::move(templates);
  state->factory = std::move(factory);
  state->options = std::move(options);
  state->watchdog.set_before_exit(state->options.on_fatal);
  State& s = *state;
  s.base->set_timeout(s.options.engine.timeout);
  std::vector<int> added;
  TANDEM_RETURN_IF_ERROR(s.ReadJoinState(request.state, added));
  s.me = s.live[static_cast<size_t>(s.current->rank())];
  s.reforming = true;
  TANDEM_RETURN_IF_ERROR(s.StartMembership(s.held_next - 1));
  Reconfiguration report;
  report.added = added;
  report.shrink_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  TANDEM_RETURN_IF_ERROR(s.FinishGrowth(report, start, on_joined));
  return std::unique_ptr<ElasticTrainer>(new ElasticTrainer(std::move(state)));
}

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Create(
    std::unique_ptr<comm::Communicator> world, planner::TemplateSet templates,
    runtime::StageFactory factory, ElasticOptions options) {
  TANDEM_RETURN_IF_ERROR(CheckOptions(world.get(), factory, options));
  auto state = std::make_unique<State>();
  TANDEM_ASSIGN_OR_RETURN(state->kill, ParseKill(options.kill));
  state->base = std::move(world);
  state->current = state->base.get();
  state->me = state->base->rank();
  for (int r = 0; r < state->base->size(); ++r) state->live.push_back(r);
  state->starting_ranks = state->base->size();
  state->next_job_rank = state->base->size();
  state->templates = std::move(templates);
  state->factory = std::move(factory);
  state->options = std::move(options);
  state->watchdog.set_before_exit(state->options.on_fatal);
  State& s = *state;
  s.base->set_timeout(s.options.engine.timeout);

  // The first layout: every node, at least min_pipelines pipelines (checked the same way on
  // every rank: the inputs are identical).
  const int dpn = std::max(1, s.options.devices_per_node);
  if (s.base->size() % dpn != 0) {
    return absl::InvalidArgumentError(absl::StrCat("elastic: ", s.base->size(),
                                                   " ranks are not whole nodes of ", dpn));
  }
  ReinstantiationInput input;
  input.nodes = s.LiveNodes();
  input.global_microbatches = s.options.global_microbatches;
  input.min_pipelines = s.options.min_pipelines;
  input.layer_state_bytes = s.options.layer_state_bytes;
  absl::Status local = [&]() -> absl::Status {
    TANDEM_ASSIGN_OR_RETURN(ElasticPlan plan, PlanReinstantiation(s.templates, input));
    TANDEM_ASSIGN_OR_RETURN(s.layout, LayoutFromPlan(plan, s.live, s.tp()));
    return absl::OkStatus();
  }();
  TANDEM_RETURN_IF_ERROR(runtime::AgreeOnSuccess(s.base.get(), local, "the elastic layout"));
  CheckpointedLayers resumed;
  if (!s.options.resume.empty()) {
    absl::StatusOr<CheckpointedLayers> read = s.ReadCheckpoint(s.options.resume);
    TANDEM_RETURN_IF_ERROR(runtime::AgreeOnSuccess(
        s.base.get(),
        Annotate(read.status(), absl::StrCat("rank ", s.me, ": resuming from ",
                                             s.options.resume)),
        "resuming from the checkpoint"));
    resumed = *std::move(read);
    s.first_iteration = resumed.step;
  }
  // --steps is the run's total: a resumed run goes on to it (and does nothing past it).
  s.end_iteration = std::max(s.first_iteration, s.options.steps);
  TANDEM_RETURN_IF_ERROR(s.StartMembership(s.first_iteration - 1));
  TANDEM_RETURN_IF_ERROR(
      s.Configure(s.options.resume.empty() ? nullptr : &resumed.parameters, s.first_iteration));
  return std::unique_ptr<ElasticTrainer>(new ElasticTrainer(std::move(state)));
}

absl::Status ElasticTrainer::Run(std::function<void(const ElasticIteration&)> on_iteration,
                                 std::function<void(const Reconfiguration&)> on_reconfiguration,
                                 std::function<void(int64_t step)> on_checkpoint) {
  State& s = *state_;
  s.on_checkpoint = std::move(on_checkpoint);
  absl::Status failure = s.Train(on_iteration);
  for (;;) {
    if (failure.ok() && s.grow_now > 0) {
      const absl::Status grown = s.Grow(std::exchange(s.grow_now, 0), on_reconfiguration);
      if (!grown.ok()) {
        // A death after the started ranks joined: agree and re-form as after any failure.
        if (s.membership == nullptr) return Annotate(grown, "elastic: growing the job");
        failure = grown;
        continue;
      }
      failure = s.Train(on_iteration);
      continue;
    }
    if (failure.ok()) {
      s.membership->Leave();
      return absl::OkStatus();
    }
    if (!s.membership->in_agreement()) s.membership->RequestAgreement(failure);
    TANDEM_ASSIGN_OR_RETURN(MembershipDecision decision,
                            s.membership->AwaitDecision(s.options.agreement_timeout));
    s.watchdog.Disarm();  // this thread is out of MPI's uninterruptible calls
    if (decision.dead.empty()) {
      return Annotate(failure, "elastic: an operation failed and no rank died");
    }
    std::vector<int> dead;
    for (int r : decision.dead) dead.push_back(s.live[static_cast<size_t>(r)]);
    const absl::Status reformed = s.Reconfigure(decision, on_iteration, on_reconfiguration);
    if (!reformed.ok()) {
      // A further death during the re-formation: agree again and start it over.
      if (s.membership != nullptr && s.membership->in_agreement()) {
        failure = reformed;
        continue;
      }
      return Annotate(reformed, absl::StrCat("elastic: rank ", s.me,
                                             " re-forming the job without rank(s) ",
                                             Ranks(dead)));
    }
    failure = s.Train(on_iteration);
  }
}

}  // namespace tandem::elastic
