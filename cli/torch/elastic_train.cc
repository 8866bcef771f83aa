#include "cli/torch/elastic_train.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Parallel.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/torch/model_flags.h"
#include "cli/torch/train_reporter.h"
#include "common/printable.h"
#include "common/status.h"
#include "common/trace.h"
#include "common/units.h"
#include "elastic/agreement.h"
#include "elastic/internal/fault_injection.h"
#include "elastic/trainer.h"
#include "nlohmann/json.hpp"
#include "pipeline/profile.h"
#include "planner/cluster.h"
#include "planner/layer_chain.h"
#include "planner/templates.h"
#include "runtime/control.h"

namespace tandem::cli {
namespace {

bool lost_ranks = false;

// SIGUSR1 asks the job to stop at its next commit with a checkpoint (ElasticOptions::
// stop_requested): a scheduler resizes a job that way, resuming it on other ranks.
std::atomic<bool> stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);
extern "C" void OnStopSignal(int) { stop_requested.store(true); }

// SIGUSR2 asks the job to grow by a node (ElasticOptions::grow_requested); mpirun forwards it
// to every rank, and all of them asking at one commit count once.
std::atomic<int> grow_requested{0};
static_assert(std::atomic<int>::is_always_lock_free);
extern "C" void OnGrowSignal(int) { grow_requested.fetch_add(1); }

// This process's command line, to start more ranks of the same job (argv[0] made absolute).
std::vector<std::string> OwnCommand() {
  std::vector<std::string> argv;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) argv.push_back(arg);
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (argv.empty() || error) return {};
  argv[0] = exe.string();
  // Started through a shell that ignores SIGUSR1 and SIGUSR2 before it execs the program (an
  // ignored signal stays ignored across exec): mpirun forwards a scheduler's next request to
  // every process of the job, the one starting too, which would die of it while LibTorch
  // loads, before it catches them, and the job would wait for it in vain. "$0" "$@" are the
  // program and its arguments as they are, never parsed by the shell.
  argv.insert(argv.begin(), {"/bin/sh", "-c", "trap '' USR1 USR2; exec \"$0\" \"$@\""});
  return argv;
}

// What a started rank needs to build the job's templates (rank 0's profile and the node count
// the templates were made for) and to compute as the others do (their CPU threads).
struct TemplateInputs {
  std::string profile;  // JSON
  int ranks = 0;
  int threads = 0;
};

std::string EncodeTemplateInputs(const TemplateInputs& t) {
  return nlohmann::json{{"profile", t.profile}, {"ranks", t.ranks}, {"threads", t.threads}}
      .dump();
}

absl::StatusOr<TemplateInputs> DecodeTemplateInputs(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("profile") || !j.contains("ranks") ||
      !j["profile"].is_string() || !j["ranks"].is_number_integer()) {
    return absl::DataLossError("the running job sent no profile to build its templates from");
  }
  return TemplateInputs{j["profile"].get<std::string>(), j["ranks"].get<int>(),
                        j.value("threads", 0)};
}

struct Templates {
  planner::TemplateSet set;
  std::vector<double> layer_state_bytes;
};

// The job's pipeline templates, the same on every rank for the same inputs.
absl::StatusOr<Templates> BuildTemplates(const ElasticRun& run, const TemplateInputs& inputs,
                                         int64_t global_microbatches, bool print) {
  TANDEM_ASSIGN_OR_RETURN(pipeline::Profile profile,
                          pipeline::ProfileFromJson(nlohmann::json::parse(inputs.profile), "profile"));
  TANDEM_ASSIGN_OR_RETURN(planner::LayerChain chain, planner::LayerChain::FromProfile(profile));
  const ElasticSettings& elastic = run.options.elastic_settings;
  if (inputs.ranks % elastic.devices_per_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat(inputs.ranks, " ranks are not whole nodes of ",
                                                   elastic.devices_per_node,
                                                   " (--devices-per-node)"));
  }
  // With tensor parallelism the templates' devices are the tensor-parallel groups, each with
  // the memory of its ranks together (the layers' costs are the unsharded profile's: the
  // partition does not change when every stage is T times faster).
  const int t = std::max(1, run.options.tensor_parallel);
  TANDEM_ASSIGN_OR_RETURN(planner::ClusterSpec cluster,
                          planner::MakeCluster(inputs.ranks / t, elastic.devices_per_node / t,
                                               elastic.device_memory_bytes * t,
                                               {/*bandwidth=*/10e9}));
  planner::TemplateOptions template_options;
  template_options.microbatches = static_cast<int>(
      std::max<int64_t>(1, global_microbatches / elastic.min_pipelines));
  template_options.microbatch_size = run.options.microbatch_size;
  const absl::Time t0 = absl::Now();
  Templates out;
  TANDEM_ASSIGN_OR_RETURN(out.set,
                          planner::GeneratePipelineTemplates(chain, cluster, template_options));
  if (print) {
    std::cout << absl::StrFormat(
                     "elastic: %d pipeline template(s) for %d..%d node(s) of %d device(s)%s, "
                     "in %.1f ms",
                     out.set.templates.size(), out.set.min_nodes,
                     out.set.templates.empty() ? 0 : out.set.templates.back().nodes,
                     elastic.devices_per_node / t,
                     t > 1 ? absl::StrCat(" (tensor-parallel groups of ", t, " ranks)") : "",
                     absl::ToDoubleMilliseconds(absl::Now() - t0))
              << std::endl;
  }
  out.layer_state_bytes = elastic::LayerStateBytes(chain);
  return out;
}

// What the ranks alive at the end of the start-up share: the profile and the templates made
// from it, and their communicator.
struct StartedJob {
  TemplateInputs inputs;
  Templates templates;
  std::unique_ptr<comm::Communicator> job;  // the survivors (world ranks in order); null: this
                                            // rank was left out (its node lost a rank)
  std::vector<int> dead;                    // world ranks that died while the job started
};

// The start-up of a job, surviving deaths: rank 0 profiles the model, every rank receives the
// profile and builds the templates for the ranks there are. A membership (elastic/agreement.h)
// watches the ranks all along: when one dies (or stops: it is killed), the exchange is aborted,
// the survivors agree on who is left, shrink their communicator (leaving out, whole, the nodes
// that lost a rank) and start again, the lowest survivor profiling if the profile died with
// rank 0 (a rank that profiled keeps its profile). `started` ends the plain start-up watch,
// which would end the job at the first death.
absl::StatusOr<StartedJob> StartSurvivingDeaths(const ElasticRun& run, int64_t global_microbatches,
                                                const std::function<void()>& started) {
  comm::Communicator& world = *run.world;
  const TrainOptions& train = run.options;
  const ElasticSettings& elastic = train.elastic_settings;
  elastic::MembershipOptions membership_options;
  membership_options.heartbeat_timeout = elastic.heartbeat_timeout;
  TANDEM_ASSIGN_OR_RETURN(elastic::internal::KillPoint kill,
                          elastic::internal::ParseKill(std::getenv("TANDEM_ELASTIC_KILL") != nullptr
                                                           ? std::getenv("TANDEM_ELASTIC_KILL")
                                                           : ""));
  const int me = world.rank();
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> current, world.Split(0, me));
  current->set_timeout(train.engine.timeout);
  std::vector<int> live(static_cast<size_t>(world.size()));  // world rank of each of current's
  for (size_t i = 0; i < live.size(); ++i) live[i] = static_cast<int>(i);
  StartedJob out;
  std::string profile;  // this rank's own, once it profiled
  started();            // the membership watches from here
  for (;;) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> exchange,
                            current->Split(0, current->rank()));
    comm::Communicator* aborted_on_failure = exchange.get();
    TANDEM_ASSIGN_OR_RETURN(
        std::unique_ptr<elastic::Membership> membership,
        elastic::Membership::Start(*current, membership_options,
                                   [aborted_on_failure](const absl::Status& why) {
                                     aborted_on_failure->Abort(why);
                                   }));
    if (kill.Hits(me, 0, "profiling")) elastic::internal::KillSelf(me, 0, "profiling");
    absl::Status local = absl::OkStatus();
    if (current->rank() == 0 && profile.empty()) {
      std::cout << "elastic: profiling the model (micro-batch " << train.microbatch_size
                << ") on rank " << me << " ..." << std::endl;
      auto profiled = runtime::libtorch::ProfileModel(*run.model, *run.data, run.profiler);
      if (profiled.ok()) {
        profile = pipeline::ToJson(*profiled).dump();
      } else {
        local = profiled.status();
      }
    }
    absl::Status status = runtime::AgreeOnSuccess(exchange.get(), local, "profiling");
    if (status.ok()) {
      auto text = runtime::BroadcastString(*exchange, profile);
      status = text.status();
      if (text.ok()) {
        out.inputs.profile = *std::move(text);
        out.inputs.ranks = current->size();
        out.inputs.threads = at::get_num_threads();
        if (kill.Hits(me, 0, "templates")) elastic::internal::KillSelf(me, 0, "templates");
        auto templates = BuildTemplates(run, out.inputs, global_microbatches,
                                        current->rank() == 0);
        // Every rank past its templates before the membership ends (a collective: a death
        // now is noticed like any other).
        status = runtime::AgreeOnSuccess(exchange.get(), templates.status(), "templates");
        if (status.ok()) {
          membership->Leave();
          out.templates = *std::move(templates);
          out.job = std::move(current);
          return out;
        }
      }
    }
    if (!membership->in_agreement()) {
      membership->Leave();
      return status;  // a failure, not a death: it ends the job
    }
    TANDEM_ASSIGN_OR_RETURN(elastic::MembershipDecision decision,
                            membership->AwaitDecision(elastic.agreement_timeout));
    membership.reset();
    std::vector<int> dead_now;
    for (int r : decision.dead) dead_now.push_back(live[static_cast<size_t>(r)]);
    out.dead.insert(out.dead.end(), dead_now.begin(), dead_now.end());
    // Nodes that lost a rank are left out whole: their other ranks end here.
    std::set<int> broken_nodes;
    for (int r : dead_now) broken_nodes.insert(r / elastic.devices_per_node);
    std::vector<int> leaving;  // ranks of `current`
    std::vector<int> survivors;
    for (size_t i = 0; i < live.size(); ++i) {
      if (broken_nodes.count(live[i] / elastic.devices_per_node) > 0) {
        leaving.push_back(static_cast<int>(i));
      } else {
        survivors.push_back(live[i]);
      }
    }
    if (me == survivors.front() || (survivors.empty() && me == live.front())) {
      std::cout << "elastic: rank(s) " << absl::StrJoin(dead_now, ", ")
                << " died while the job started; starting on the " << survivors.size()
                << " rank(s) left (" << absl::StrJoin(survivors, ", ")
                << "), numbered 0.." << static_cast<int>(survivors.size()) - 1
                << " from here on in messages, logs and fault injection" << std::endl;
    }
    if (broken_nodes.count(me / elastic.devices_per_node) > 0) {
      std::cout << "elastic: rank " << me << " leaves the job: its node lost a rank while the "
                << "job started" << std::endl;
      current->Abort(absl::CancelledError("left out of the job"));
      current.release();  // survivors' probes may still reach it
      return out;
    }
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> shrunk, current->Shrink(leaving));
    shrunk->set_timeout(train.engine.timeout);
    // The survivors' probes may still reach the old one: aborted, it stays allocated.
    current->Abort(absl::CancelledError("replaced by the survivors'"));
    current.release();
    current = std::move(shrunk);
    live = std::move(survivors);
  }
}

// The job's timeline on this rank's clock (seconds since the trainer started): one lane of
// iterations, one of recovery phases. Every rank keeps it, so whichever rank reports at the end
// writes the whole run.
class JobTimeline {
 public:
  static constexpr int kIterationLane = 0;
  static constexpr int kRecoveryLane = 1;

  JobTimeline() : start_(absl::Now()) {
    trace_.NameProcess(0, "elastic job");
    trace_.NameThread(0, kIterationLane, "iterations");
    trace_.NameThread(0, kRecoveryLane, "recovery");
  }

  void Iteration(const elastic::ElasticIteration& e) {
    // A new reporter reports the committed iteration again after a recovery: it ran once.
    if (e.result.iteration == last_iteration_) return;
    last_iteration_ = e.result.iteration;
    const double end = Now();
    trace_.Add({.name = absl::StrCat("iteration ", e.result.iteration + 1),
                .category = "iteration",
                .tid = kIterationLane,
                .start_seconds = end - e.result.seconds,
                .duration_seconds = e.result.seconds,
                .args = {{"iteration", e.result.iteration},
                         {"loss", e.result.loss},
                         {"pipelines", e.pipelines},
                         {"ranks", e.ranks}}});
    if (first_step_after_.has_value()) {
      // From the end of the re-formation to the end of the first iteration after it.
      trace_.Add({.name = "first step after",
                  .category = "recovery",
                  .tid = kRecoveryLane,
                  .start_seconds = *first_step_after_,
                  .duration_seconds = end - *first_step_after_,
                  .args = {{"iteration", e.result.iteration}}});
      first_step_after_.reset();
    }
  }

  // Called right after the re-formation: its phases are laid out backwards from now, in the
  // order the trainer runs them (detection, agreement, then shrink, re-plan, state, engines).
  void Recovery(const elastic::Reconfiguration& c) {
    const double end = Now();
    const double reform_start = end - c.rebuild_seconds;
    const double agree_start = reform_start - c.agree_seconds;
    const nlohmann::json args = {{"dead", c.dead},
                                 {"live", c.live},
                                 {"committed_iteration", c.committed_iteration},
                                 {"bytes_moved", c.bytes_moved},
                                 {"layout", c.layout}};
    auto add = [&](const std::string& name, double start, double seconds) {
      AddPhase(name, "recovery", start, seconds, args);
    };
    add(absl::StrCat("detection (rank ", absl::StrJoin(c.dead, ", "), ")"),
        agree_start - c.detection_seconds, c.detection_seconds);
    add("agreement", agree_start, c.agree_seconds);
    double at = reform_start;
    for (const auto& [name, seconds] :
         {std::pair<const char*, double>{"shrink", c.shrink_seconds},
          {"re-plan", c.plan_seconds},
          {c.restored_step >= 0 ? "restore from checkpoint" : "state copy", c.move_seconds},
          {"engines", c.build_seconds}}) {
      add(name, at, seconds);
      at += seconds;
    }
    first_step_after_ = end;
  }

  // A growth: starting the new ranks, then the re-formation's parts.
  void Growth(const elastic::Reconfiguration& c) {
    const double end = Now();
    double at = end - c.rebuild_seconds;
    const nlohmann::json args = {{"added", c.added},
                                 {"live", c.live},
                                 {"bytes_moved", c.bytes_moved},
                                 {"layout", c.layout}};
    const double joining = std::max(0.0, c.shrink_seconds - c.spawn_seconds);
    for (const auto& [name, seconds] :
         {std::pair<std::string, double>{absl::StrCat("start rank(s) ", absl::StrJoin(c.added, ", ")),
                                         c.spawn_seconds},
          {"join", joining},
          {"re-plan", c.plan_seconds},
          {"state copy", c.move_seconds},
          {"engines", c.build_seconds}}) {
      AddPhase(name, "growth", at, seconds, args);
      at += seconds;
    }
    first_step_after_ = end;
  }

  absl::Status Write(const std::string& path) const { return trace_.WriteFile(path); }

 private:
  double Now() const { return absl::ToDoubleSeconds(absl::Now() - start_); }
  // One phase of a recovery or a growth on the recovery lane.
  void AddPhase(const std::string& name, const char* category, double start, double seconds,
                const nlohmann::json& args) {
    trace_.Add({.name = name,
                .category = category,
                .tid = kRecoveryLane,
                .start_seconds = start,
                .duration_seconds = std::max(0.0, seconds),
                .args = args});
  }

  absl::Time start_;
  ChromeTrace trace_;
  std::optional<double> first_step_after_;
  int64_t last_iteration_ = -1;
};

// A recovery's or a growth's log event: what both share (the re-formation's parts).
nlohmann::json ReformationEvent(const char* kind, const elastic::Reconfiguration& c) {
  return {{"event", kind},
          {"live", c.live},
          {"resume_iteration", c.resume_iteration + 1},
          {"replan_seconds", c.plan_seconds},
          {"state_copy_seconds", c.move_seconds},
          {"build_seconds", c.build_seconds},
          {"reform_seconds", c.rebuild_seconds},
          {"bytes_moved", c.bytes_moved},
          {"layout", c.layout},
          {"unix_time", absl::ToUnixMicros(absl::Now()) * 1e-6}};
}

absl::Status RunElastic(const ElasticRun& run, const std::function<void()>& started);

}  // namespace

bool ElasticJobLostRanks() { return lost_ranks; }

void CatchElasticSignals() {
  std::signal(SIGUSR1, OnStopSignal);
  std::signal(SIGUSR2, OnGrowSignal);
}

bool ElasticJoining() { return elastic::StartedByARunningJob(); }

absl::Status RunElasticTraining(const ElasticRun& run, const std::function<void()>& started) {
  // Under `mpirun --enable-recovery` Open MPI 4.1's mpirun exits 0 whatever the ranks do, so
  // the log says how the job ended: {"event": "finished"} or {"event": "failed"} per failing
  // rank.
  absl::Status status = RunElastic(run, started);
  if (!status.ok()) {
    (void)AppendLogEvent(run.options.log_json, {{"event", "failed"},
                                                {"rank", run.world->rank()},
                                                {"error", Printable(status.message())}});
  }
  return status;
}

namespace {

absl::Status RunElastic(const ElasticRun& run, const std::function<void()>& started) {
  comm::Communicator& world = *run.world;
  const int rank = world.rank();
  const TrainOptions& train = run.options;
  const ElasticSettings& elastic = train.elastic_settings;
  if (train.global_batch <= 0 || train.global_batch % train.microbatch_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--elastic needs --global-batch, a multiple of --microbatch-size (",
        train.microbatch_size, ")"));
  }
  const int64_t global_microbatches = train.global_batch / train.microbatch_size;
  // Under Open MPI, a death ends the whole job unless mpirun keeps the survivors running.
  const char* launcher = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* recovery = std::getenv("OMPI_MCA_orte_enable_recovery");
  if (world.size() > 1 && launcher != nullptr &&
      (recovery == nullptr || std::string(recovery) != "1")) {
    return absl::InvalidArgumentError(
        "--elastic needs `mpirun --enable-recovery ...`: without it Open MPI ends every rank "
        "when one dies, and there is nothing to recover");
  }

  // A rank started by the running job to grow it: the job sends what it needs.
  const bool joining = elastic::StartedByARunningJob();
  std::optional<elastic::JoinRequest> join;
  TemplateInputs inputs;
  Templates templates;
  std::unique_ptr<comm::Communicator> job;
  int died_at_start = 0;
  if (joining) {
    started();
    TANDEM_ASSIGN_OR_RETURN(elastic::JoinRequest request, elastic::AcceptJoin(train.engine.timeout));
    TANDEM_ASSIGN_OR_RETURN(inputs, DecodeTemplateInputs(request.payload));
    join = std::move(request);
    // The job's ranks' CPU threads (this process counted only the ranks started with it).
    const char* set = std::getenv("OMP_NUM_THREADS");
    if ((set == nullptr || *set == '\0') && inputs.threads > 0) {
      at::set_num_threads(std::min(inputs.threads, UsableCores()));
    }
    TANDEM_ASSIGN_OR_RETURN(templates,
                            BuildTemplates(run, inputs, global_microbatches, /*print=*/false));
  } else {
    // The profile (rank 0), then the same templates on every rank, surviving deaths.
    TANDEM_ASSIGN_OR_RETURN(StartedJob started_job,
                            StartSurvivingDeaths(run, global_microbatches, started));
    died_at_start = static_cast<int>(started_job.dead.size());
    if (died_at_start > 0) lost_ranks = true;  // MPI_Finalize would wait for them
    if (started_job.job == nullptr) return absl::OkStatus();  // left out with its node
    inputs = std::move(started_job.inputs);
    templates = std::move(started_job.templates);
    job = std::move(started_job.job);
  }

  // What this rank reports while it is the job's reporter (the first rank of the first
  // pipeline, which a failure may change), and the first error writing the log.
  TrainReporter reporter(train.log_json);
  absl::Status log_status = absl::OkStatus();
  elastic::ElasticOptions options;
  options.on_evaluation = [&](int64_t iteration, double loss, bool reports) {
    if (reports && log_status.ok()) log_status = reporter.Validation(iteration, loss);
  };
  options.engine = train.engine;
  options.schedule = train.schedule.value_or(pipeline::ScheduleKind::k1F1B);
  options.model = run.model_text;
  options.num_layers = run.model->num_layers();
  options.microbatch_size = train.microbatch_size;
  options.global_microbatches = global_microbatches;
  options.devices_per_node = elastic.devices_per_node;
  options.tensor_parallel = train.tensor_parallel;
  // Deaths while the job started spent failures it was to survive: it starts as after as
  // many recoveries, planned to survive the rest.
  options.min_pipelines = std::max(1, elastic.min_pipelines - died_at_start);
  options.steps = train.steps;
  options.membership.heartbeat_timeout = elastic.heartbeat_timeout;
  options.agreement_timeout = elastic.agreement_timeout;
  // A rank that ends itself (stuck inside MPI after a death) logs its failure as any other.
  options.on_fatal = [log = train.log_json, rank](const std::string& line) {
    (void)AppendLogEvent(log, {{"event", "failed"}, {"rank", rank}, {"error", line}});
  };
  options.layer_state_bytes = templates.layer_state_bytes;
  options.checkpoint_dir = train.checkpoint_dir;
  options.checkpoint_every = train.checkpoint_every;
  options.keep_checkpoints = train.engine.keep_checkpoints;
  options.resume = train.resume;
  options.eval_every = train.eval_every;
  options.eval_batches = train.eval_batches;
  options.stop_requested = &stop_requested;
  options.grow_requested = &grow_requested;
  options.replace_lost = elastic.replace_lost;
  options.spawn_command = OwnCommand();
  options.join_payload = EncodeTemplateInputs(inputs);
  CatchElasticSignals();
  std::unique_ptr<elastic::ElasticTrainer> trainer;
  std::optional<elastic::Reconfiguration> joined;
  // This rank in the job (the world's, unless ranks died while the job started).
  const int job_rank = job != nullptr ? job->rank() : rank;
  if (joining) {
    lost_ranks = true;  // connected to ranks that may end first
    TANDEM_ASSIGN_OR_RETURN(
        trainer, elastic::ElasticTrainer::Join(std::move(*join), std::move(templates.set),
                                               run.factory, std::move(options),
                                               [&](const elastic::Reconfiguration& c) {
                                                 joined = c;
                                               }));
  } else {
    TANDEM_ASSIGN_OR_RETURN(
        trainer, elastic::ElasticTrainer::Create(std::move(job), std::move(templates.set),
                                                 run.factory, std::move(options)));
  }
  const int first_reporter = trainer->layout().pipelines.empty()
                                 ? -1
                                 : trainer->layout().pipelines[0].ranks[0];
  if (job_rank == first_reporter && !joining) {
    std::cout << "elastic: " << elastic::Describe(trainer->layout())
              << " (global batch " << train.global_batch << ": " << global_microbatches
              << " micro-batches of " << train.microbatch_size << ")" << std::endl;
    TANDEM_RETURN_IF_ERROR(reporter.StartLog());
    if (!train.resume.empty()) {
      std::cout << "resumed from " << train.resume << " after iteration "
                << trainer->first_iteration() << std::endl;
    }
  }
  const double tokens = static_cast<double>(train.global_batch) * run.tokens_per_sample;
  int reconfigurations = 0;
  double last_loss = 0;
  int64_t last_iteration = -1;
  JobTimeline timeline;
  auto on_iteration = [&](const elastic::ElasticIteration& e) {
    timeline.Iteration(e);
    last_loss = e.result.loss;
    last_iteration = e.result.iteration;
    if (!e.reporter) {
      reporter.StopReporting();
      return;
    }
    const runtime::IterationResult& r = e.result;
    ProgressLine line;
    line.iteration = r.iteration + 1;
    line.end = trainer->end_iteration();
    line.loss = r.loss;
    line.seconds = r.seconds;
    line.tokens_per_second = r.seconds > 0 ? tokens / r.seconds : 0.0;
    line.grad_norm = r.grad_norm;
    line.learning_rate = r.learning_rate;
    line.pipelines = e.pipelines;
    line.ranks = e.ranks;
    if (log_status.ok()) log_status = reporter.Iteration(line);
  };
  int growths = 0;
  auto on_reconfiguration = [&](const elastic::Reconfiguration& c) {
    lost_ranks = true;
    if (!c.added.empty()) {
      timeline.Growth(c);
      ++growths;
      if (!c.reporter) return;
      nlohmann::json event = ReformationEvent("growth", c);
      event["added"] = c.added;
      event["spawn_seconds"] = c.spawn_seconds;
      const std::string text = absl::StrFormat(
          "elastic: rank(s) %s started and joined in %.3f s; re-formed in %.3f s (plan %.3f s, "
          "state %.3f s, engines %.3f s; %s of state copied): %s; resuming at iteration %d",
          absl::StrJoin(c.added, ", "), c.spawn_seconds, c.rebuild_seconds, c.plan_seconds,
          c.move_seconds, c.build_seconds, FormatBytes(c.bytes_moved), c.layout,
          c.resume_iteration + 1);
      if (log_status.ok()) log_status = reporter.Reformation(text, std::move(event));
      return;
    }
    timeline.Recovery(c);
    ++reconfigurations;
    if (!c.reporter) return;
    nlohmann::json event = ReformationEvent("recovery", c);
    event["dead"] = c.dead;
    event["committed_iteration"] = c.committed_iteration + 1;
    event["detection_seconds"] = c.detection_seconds;
    event["agreement_seconds"] = c.agree_seconds;
    event["shrink_seconds"] = c.shrink_seconds;
    event["restored_step"] = c.restored_step;
    const std::string received =
        c.restored_step >= 0
            ? absl::StrCat(c.layers_received, " parameter(s) read from the checkpoint here")
            : absl::StrCat(FormatBytes(c.bytes_moved), " of state copied");
    std::string text = absl::StrFormat(
        "elastic: rank(s) %s died; %d survivor(s) agreed in %.3f s (found dead after %.2f s of "
        "silence) that iteration %d is the last committed; re-formed in %.3f s (plan %.3f s, "
        "state %.3f s, engines %.3f s; %s): %s; resuming at iteration %d",
        absl::StrJoin(c.dead, ", "), c.live.size(), c.agree_seconds, c.detection_seconds,
        c.committed_iteration + 1, c.rebuild_seconds, c.plan_seconds, c.move_seconds,
        c.build_seconds, received, c.layout, c.resume_iteration + 1);
    if (c.restored_step >= 0) {
      absl::StrAppend(&text, "\nelastic: no survivor held some layers: every rank rolled back to "
                             "the checkpoint of step ",
                      c.restored_step, " in ", train.checkpoint_dir);
    }
    if (log_status.ok()) log_status = reporter.Reformation(text, std::move(event));
  };
  auto on_checkpoint = [&](int64_t step) {
    if (log_status.ok()) log_status = reporter.Checkpoint(train.checkpoint_dir, step);
  };
  if (joined.has_value()) on_reconfiguration(*joined);
  TANDEM_RETURN_IF_ERROR(trainer->Run(on_iteration, on_reconfiguration, on_checkpoint));
  TANDEM_RETURN_IF_ERROR(log_status);
  if (trainer->layout().pipelines.empty() ||
      trainer->layout().pipelines[0].ranks[0] == trainer->job_rank()) {
    nlohmann::json finished = {{"event", "finished"},
                               {"iterations", last_iteration + 1},
                               {"reconfigurations", reconfigurations},
                               {"growths", growths},
                               {"final_loss", last_loss},
                               {"unix_time", absl::ToUnixMicros(absl::Now()) * 1e-6}};
    if (trainer->stopped_at() >= 0) {
      // Stopped on request (SIGUSR1) before --steps: `--resume` continues at this step.
      finished["stopped"] = true;
      std::cout << "stopped on request after iteration " << trainer->stopped_at()
                << (train.checkpoint_dir.empty()
                        ? std::string(" (no --checkpoint-dir: nothing saved)")
                        : absl::StrCat(" (checkpoint of step ", trainer->stopped_at(), " in ",
                                       train.checkpoint_dir, ")"))
                << std::endl;
    }
    if (!train.timeline.empty()) {
      TANDEM_RETURN_IF_ERROR(timeline.Write(train.timeline));
      std::cout << "timeline: " << train.timeline << " (" << reconfigurations
                << " recovery(ies) beside the iterations)" << std::endl;
    }
    RunSummary summary;
    summary.iterations = last_iteration + 1;
    summary.final_loss = last_loss;
    summary.reconfigurations = reconfigurations;
    summary.growths = growths;
    summary.layout = elastic::Describe(trainer->layout());
    TANDEM_RETURN_IF_ERROR(reporter.Finish(summary, std::move(finished)));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::cli
