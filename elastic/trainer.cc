// The elastic trainer: creation (Create, Join), a configuration's communicators and engine
// (Configure), the training loop (Train) and the loop around it that recovers and grows (Run).
// Its other jobs are in trainer_*.cc, sharing elastic/internal/trainer_state.h.
#include "elastic/trainer.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/keep_alive.h"
#include "common/status.h"
#include "elastic/internal/trainer_state.h"
#include "pipeline/plan.h"
#include "runtime/checkpoint.h"
#include "runtime/control.h"

namespace tandem::elastic {
namespace internal {

std::string Ranks(const std::vector<int>& ranks) {
  return ranks.empty() ? "none" : absl::StrJoin(ranks, ", ");
}

}  // namespace internal

using internal::Ranks;

absl::Status ElasticTrainer::State::StartMembership(int64_t committed) {
  {
    absl::MutexLock lock(&abort_mu);
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
  absl::MutexLock lock(&abort_mu);
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
      stage = std::make_unique<internal::KillingStage>(std::move(stage), kill, me);
    }
    return stage;
  };
}

void ElasticTrainer::State::TearDown() {
  std::unique_ptr<runtime::Engine> old_engine;
  std::vector<Segment> old_segments;
  std::unique_ptr<comm::Communicator> a, b, c;
  {
    absl::MutexLock lock(&abort_mu);
    old_engine = std::move(engine);
    old_segments = std::move(segments);
    a = std::move(everyone);
    b = std::move(training);
    c = std::move(pipeline);
  }
  old_engine.reset();
  old_segments.clear();
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> ElasticTrainer::State::SplitRegistered(
    int color, int key) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c,
                          configured().config->Split(color, key));
  if (c != nullptr) c->set_timeout(options.engine.timeout);
  return c;
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
  comm::Communicator* const pipeline_comm = pipe.get();  // the engine's (it outlives it)
  {
    absl::MutexLock lock(&abort_mu);
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
  eo.job.sum_evaluation = [this](double& loss) { return SumEvaluation(loss); };
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> built,
                          runtime::Engine::Create(plan, pipeline_comm, PipelineFactory(p), eo));
  if (import != nullptr) {
    std::vector<runtime::ParameterState> state;
    for (const auto& [name, s] : *import) state.push_back(s);
    TANDEM_RETURN_IF_ERROR(built->ImportState(state));
  }
  built->set_iteration(iteration);
  absl::MutexLock lock(&abort_mu);
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
  runtime::Engine* const running = configured().engine;
  if (running != nullptr) {
    while (running->iteration() < train_end()) {
      TANDEM_ASSIGN_OR_RETURN(runtime::IterationResult r, running->RunIteration());
      TANDEM_RETURN_IF_ERROR(runtime::CheckLossIsFinite(r));
      last_result = r;
      has_last_result = true;
      const int64_t done = r.iteration + 1;
      if (on_iteration) on_iteration(Report(r));
      if (runtime::EvaluationDue(done, job_end(), options.eval_every)) {
        // A death during it is recovered like one during an iteration; this validation loss
        // is then not reported.
        TANDEM_ASSIGN_OR_RETURN(const double loss, running->Evaluate(options.eval_batches));
        if (options.on_evaluation) options.on_evaluation(done, loss, reporter);
      }
      if (!options.checkpoint_dir.empty() &&
          runtime::CheckpointDue(done, job_end(), options.checkpoint_every)) {
        TANDEM_RETURN_IF_ERROR(SaveCheckpoint(done));
      }
    }
    // A death during the final checkpoint: the survivors write it again.
    if (!options.checkpoint_dir.empty() && saved_step != job_end() &&
        running->iteration() == job_end()) {
      TANDEM_RETURN_IF_ERROR(SaveCheckpoint(job_end()));
    }
    if (running->iteration() >= job_end() && job_end() < end_iteration) stopped_at = job_end();
    if (grow_at >= 0 && running->iteration() == grow_at && grow_at < job_end()) grow = grow_nodes;
  } else if (kill.Idle(me)) {
    internal::KillSelf(me, -1, "idle");
  }
  // Everyone, idle ranks included, meets here and learns whether the job grows now (the
  // training ranks agreed on it at a commit) or ends; a failure meanwhile aborts the wait.
  // (The iteration too, which idle ranks do not know.)
  auto next = std::make_shared<std::array<double, 2>>(std::array<double, 2>{
      static_cast<double>(grow),
      running != nullptr ? static_cast<double>(running->iteration()) : -1.0});
  comm::WorkPtr done = configured().everyone->AllReduce(
      runtime::DoubleBuffer(next->data(), 2), comm::ReduceOp::kMax);
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
  TANDEM_ASSIGN_OR_RETURN(state->kill, internal::ParseKill(options.kill));
  state->base = std::move(request.job);
  state->current = state->base.get();
  state->templates = std::move(templates);
  state->factory = std::move(factory);
  state->options = std::move(options);
  state->watchdog.set_before_exit(state->options.on_fatal);
  State& s = *state;
  s.base->set_timeout(s.options.engine.timeout);
  std::vector<int> added;
  double spawn_seconds = 0;
  TANDEM_RETURN_IF_ERROR(s.ReadJoinState(request.state, added, spawn_seconds));
  s.me = s.live[static_cast<size_t>(s.current->rank())];
  s.reforming = true;
  TANDEM_RETURN_IF_ERROR(s.StartMembership(s.held_next - 1));
  Reconfiguration report;
  report.added = added;
  report.spawn_seconds = spawn_seconds;
  report.shrink_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  TANDEM_RETURN_IF_ERROR(s.FinishGrowth(report, start, on_joined));
  return std::unique_ptr<ElasticTrainer>(new ElasticTrainer(std::move(state)));
}

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Create(
    std::unique_ptr<comm::Communicator> world, planner::TemplateSet templates,
    runtime::StageFactory factory, ElasticOptions options) {
  TANDEM_RETURN_IF_ERROR(CheckOptions(world.get(), factory, options));
  auto state = std::make_unique<State>();
  TANDEM_ASSIGN_OR_RETURN(state->kill, internal::ParseKill(options.kill));
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
  internal::CheckpointedLayers resumed;
  if (!s.options.resume.empty()) {
    absl::StatusOr<internal::CheckpointedLayers> read = s.ReadCheckpoint(s.options.resume);
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
      const absl::Status grown = s.Grow(s.current,
                                       std::exchange(s.grow_now, 0), on_reconfiguration);
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
