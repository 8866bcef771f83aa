// The elastic trainer's shared state (internal to elastic/): what its parts, one file a job,
// share.
//   trainer.cc             creation, a configuration's communicators and engine, the loop
//   trainer_gradients.cc   the job hooks: gradients, loss and norm summed across pipelines
//   trainer_checkpoints.cc the job's checkpoints, written and read back
//   trainer_recovery.cc    after deaths: the abort, the survivors' communicator, the new
//                          layout, the state moves
//   trainer_growth.cc      starting ranks while the job runs, and a started rank's joining
//   trainer_watchdog.cc    ending a rank that MPI holds in a call nothing can interrupt
//
// Threads. The training thread (Create or Join, then Run) owns the state. The membership's
// thread (elastic/agreement.h) calls AbortAll when a failure starts an agreement: it aborts the
// current engine and the configuration's communicators, so every field AbortAll touches is
// guarded by abort_mu or is an atomic, except `me` and `options`, which do not change while a
// membership runs, and the watchdog, which locks itself. The training thread is the only one
// that replaces the guarded engine and communicators (always under abort_mu); it reads them
// through the accessors below, which take abort_mu for the read: what they return stays valid
// until this same thread replaces it (Configure, TearDown, StartMembership).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "elastic/agreement.h"
#include "elastic/instantiation.h"
#include "elastic/internal/fault_injection.h"
#include "elastic/trainer.h"
#include "pipeline/plan.h"
#include "planner/templates.h"
#include "runtime/engine.h"

namespace tandem::elastic {
namespace internal {

// State moves on the survivors' communicator (size, then bytes).
inline constexpr int kMoveTag = 21;

// "none" or "1, 4".
std::string Ranks(const std::vector<int>& ranks);

// Ends this rank at once, after printing `line` and running `before_exit` with it: for a rank
// that MPI holds in a call nothing can interrupt.
[[noreturn]] void EndStuckRank(const std::string& line,
                               const std::function<void(const std::string&)>& before_exit);

// Ends this rank when its training thread stays past a deadline inside an MPI call that
// nothing can interrupt: building a communicator one of whose members died (Open MPI 4.1 gives
// out communicator IDs one creation at a time and fails none, so the creation, and every later
// one in the process, waits for ever), or starting processes that never join. Armed with a
// deadline and the line to print; disarmed once the thread is out of such calls. Thread-safe.
class StuckWatchdog {
 public:
  StuckWatchdog();
  ~StuckWatchdog();
  StuckWatchdog(const StuckWatchdog&) = delete;
  StuckWatchdog& operator=(const StuckWatchdog&) = delete;

  // Replaces what was armed before.
  void Arm(absl::Duration timeout, std::string line) ABSL_LOCKS_EXCLUDED(mu_);
  void Disarm() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs with the line just before the rank ends (ElasticOptions::on_fatal).
  void set_before_exit(std::function<void(const std::string&)> before_exit)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  absl::CondVar cv_;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::string line_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> before_exit_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is initialised
};

// What a rank reads from a checkpoint: its layers' state and the step to resume at.
struct CheckpointedLayers {
  int64_t step = 0;
  std::string folder;
  std::map<std::string, runtime::ParameterState> parameters;
};

}  // namespace internal

struct ElasticTrainer::State {
  using ParameterStates = std::map<std::string, runtime::ParameterState>;

  // (Members are destroyed in reverse order: the engine before the communicators it uses.)
  std::unique_ptr<comm::Communicator> base;    // the job's first communicator
  std::unique_ptr<comm::Communicator> shrunk;  // the survivors' (after a failure), or grown
  comm::Communicator* current = nullptr;       // base or shrunk
  std::vector<int> live;                       // job rank of each rank of `current`
  int me = 0;                                  // job rank
  planner::TemplateSet templates;
  runtime::StageFactory factory;
  ElasticOptions options;
  internal::KillPoint kill;
  bool late_commit_injected = false;  // `late-commit` acts once (not again on the redo)
  JobLayout layout;

  // What the membership's thread aborts when a failure starts an agreement (AbortAll): the
  // fields guarded by abort_mu.
  absl::Mutex abort_mu;
  bool aborted ABSL_GUARDED_BY(abort_mu) = false;
  absl::Status abort_reason ABSL_GUARDED_BY(abort_mu);

  // One configuration's objects.
  std::unique_ptr<Membership> membership;
  std::unique_ptr<comm::Communicator> everyone ABSL_GUARDED_BY(abort_mu);  // the final barrier
  // Ranks with a stage: the commit all-reduce.
  std::unique_ptr<comm::Communicator> training ABSL_GUARDED_BY(abort_mu);
  std::unique_ptr<comm::Communicator> pipeline ABSL_GUARDED_BY(abort_mu);  // this rank's
  struct Segment {
    GradientSegment segment;
    std::unique_ptr<comm::Communicator> comm;
    int index = 0;  // among all segments of the layout
  };
  std::vector<Segment> segments ABSL_GUARDED_BY(abort_mu);  // those held here, in layer order
  std::vector<GradientSegment> all_segments;
  // Between a failure and the new engines (possibly over several re-formations, when ranks die
  // during one): this rank's parameters, the layout they follow and the iteration to resume.
  bool reforming = false;
  std::vector<int> reform_dead;  // every rank that died since the last configuration ran
  std::function<void(int64_t)> on_checkpoint;
  ParameterStates held_state;
  JobLayout held_layout;
  int64_t held_next = 0;
  // A duplicate of `current` for the re-formation's and Configure's collectives, so that a
  // death aborts them too.
  std::unique_ptr<comm::Communicator> config ABSL_GUARDED_BY(abort_mu);
  int64_t first_iteration = 0;
  int64_t end_iteration = 0;  // options.steps, or first_iteration when past it
  int64_t saved_step = -1;    // the last checkpoint written (-1 also after a re-formation)
  // The end agreed at a commit after a stop request (-1: none); forgotten by a re-formation.
  int64_t stop_end = -1;
  int64_t stopped_at = -1;
  // Growth: the iteration the job grows before, and by how many nodes (agreed at a commit, or
  // the same on every survivor after a recovery with replace_lost; -1, 0: none). grow_now: the
  // nodes every rank agreed on at the end of Train (0: the job ended).
  int64_t grow_at = -1;
  int grow_nodes = 0;
  int grow_now = 0;
  int64_t grow_iteration = 0;  // where training resumes after that growth
  int next_job_rank = 0;       // the job rank the next started process gets
  int starting_ranks = 0;      // the job's size at its start (replace_lost grows back to it)
  // While processes are being started: a death cannot interrupt MPI_Comm_spawn, so the
  // membership's failure notice ends this rank instead.
  std::atomic<bool> growing{false};
  // While Configure builds communicators and engines (see AbortAll).
  std::atomic<bool> building{false};
  internal::StuckWatchdog watchdog;
  std::unique_ptr<runtime::Engine> engine ABSL_GUARDED_BY(abort_mu);
  int pipeline_index = -1;
  bool reporter = false;
  bool has_last_result = false;
  runtime::IterationResult last_result;  // this rank's last completed iteration

  // The training thread's view of the guarded objects, read under abort_mu (null where there
  // is none).
  struct Configured {
    runtime::Engine* engine = nullptr;
    comm::Communicator* everyone = nullptr;
    comm::Communicator* training = nullptr;
    comm::Communicator* config = nullptr;
  };
  Configured configured() ABSL_LOCKS_EXCLUDED(abort_mu) {
    absl::MutexLock lock(&abort_mu);
    return {engine.get(), everyone.get(), training.get(), config.get()};
  }
  struct HeldSegment {
    GradientSegment segment;
    comm::Communicator* comm = nullptr;
    int index = 0;
  };
  std::vector<HeldSegment> held_segments() ABSL_LOCKS_EXCLUDED(abort_mu) {
    absl::MutexLock lock(&abort_mu);
    std::vector<HeldSegment> held;
    for (const Segment& s : segments) held.push_back({s.segment, s.comm.get(), s.index});
    return held;
  }

  int64_t job_end() const {
    return stop_end >= 0 ? std::min(stop_end, end_iteration) : end_iteration;
  }
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

  // ---- trainer.cc: configurations and the loop.
  // `committed`: the iteration committed everywhere (the new membership's starting value).
  absl::Status StartMembership(int64_t committed) ABSL_LOCKS_EXCLUDED(abort_mu);
  // The communicators and engine of `layout`, at `iteration`, with `import`'s state if given.
  absl::Status Configure(const ParameterStates* import, int64_t iteration)
      ABSL_LOCKS_EXCLUDED(abort_mu);
  // Drops one configuration's objects (after an abort: nothing waits for the dead).
  void TearDown() ABSL_LOCKS_EXCLUDED(abort_mu);
  absl::StatusOr<std::unique_ptr<comm::Communicator>> SplitRegistered(int color, int key);
  runtime::StageFactory PipelineFactory(const JobPipeline& p);
  absl::Status Train(const std::function<void(const ElasticIteration&)>& on_iteration);

  // ---- trainer_gradients.cc: the engines' job hooks (runtime::JobHooks).
  absl::StatusOr<double> SyncGradients(runtime::Engine& engine);
  absl::Status SumOverJob(int64_t iteration, std::array<double, 3>& sums);
  absl::Status SumEvaluation(double& loss);

  // ---- trainer_checkpoints.cc
  absl::Status SaveCheckpoint(int64_t step);
  // The layers this rank runs under `layout`, read from the checkpoint at `root`.
  absl::StatusOr<internal::CheckpointedLayers> ReadCheckpoint(const std::string& root) const;

  // ---- trainer_recovery.cc
  // The membership's failure callback (its thread): aborts this configuration's waits.
  void AbortAll(const absl::Status& reason) ABSL_LOCKS_EXCLUDED(abort_mu);
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
  // `value` reduced over the survivors (the re-formation's communicator).
  absl::StatusOr<double> OverSurvivors(double value, comm::ReduceOp op);

  // ---- trainer_growth.cc
  // Starts `nodes` nodes' worth of new ranks through `spawner` (Communicator::SpawnAndMerge
  // over `current`: every rank of the job takes part) and re-forms the job with them. No
  // spawn_command, or a backend that cannot start processes: the job goes on at its size (a
  // warning on its rank 0).
  absl::Status Grow(comm::Communicator* spawner, int nodes,
                    const std::function<void(const Reconfiguration&)>& on_reconfiguration);
  // For the lines of a rank that ends while new processes start (MPI cannot interrupt it):
  // "; the checkpoint of step N in DIR resumes the job (--resume DIR)", or that there is none.
  std::string ResumeHint() const;
  // After a re-formation onto `live`: with replace_lost, grow back after one iteration.
  void ScheduleReplacement(int64_t next);
  // What a started rank needs (JoinRequest::state): the layout held before the growth, the
  // ranks after it, the iteration to resume.
  // The job's state for ranks it started: `spawn_seconds` is how long starting them took (the
  // started ranks cannot measure it, and one of them may report the growth).
  std::string JoinState(const std::vector<int>& added, double spawn_seconds) const;
  absl::Status ReadJoinState(const std::string& text, std::vector<int>& added,
                             double& spawn_seconds);
  // The end of a growth, on the old ranks and the started ones alike (the state moves and the
  // engines of a re-formation).
  absl::Status FinishGrowth(Reconfiguration& report, absl::Time start,
                            const std::function<void(const Reconfiguration&)>& on_done);
};

}  // namespace tandem::elastic
