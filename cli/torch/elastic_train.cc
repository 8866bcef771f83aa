#include "cli/torch/elastic_train.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
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
#include "common/status.h"
#include "common/trace.h"
#include "common/units.h"
#include "elastic/trainer.h"
#include "nlohmann/json.hpp"
#include "pipeline/profile.h"
#include "planner/cluster.h"
#include "planner/layer_chain.h"
#include "planner/templates.h"
#include "runtime/control.h"

namespace tandem::cli {
namespace {

// Rank 0's profile, as JSON, on every rank (size, then bytes).
absl::StatusOr<std::string> BroadcastText(comm::Communicator& world, std::string text) {
  int64_t size = static_cast<int64_t>(text.size());
  TANDEM_RETURN_IF_ERROR(world.Broadcast({&size, 1, comm::DataType::kInt64}, 0)->Wait());
  text.resize(static_cast<size_t>(size));
  TANDEM_RETURN_IF_ERROR(
      world.Broadcast({text.data(), size, comm::DataType::kUInt8}, 0)->Wait());
  return text;
}

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
  if (inputs.ranks % run.devices_per_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat(inputs.ranks, " ranks are not whole nodes of ",
                                                   run.devices_per_node,
                                                   " (--devices-per-node)"));
  }
  // With tensor parallelism the templates' devices are the tensor-parallel groups, each with
  // the memory of its ranks together (the layers' costs are the unsharded profile's: the
  // partition does not change when every stage is T times faster).
  const int t = std::max(1, run.tensor_parallel);
  TANDEM_ASSIGN_OR_RETURN(planner::ClusterSpec cluster,
                          planner::MakeCluster(inputs.ranks / t, run.devices_per_node / t,
                                               run.device_memory_bytes * t,
                                               {/*bandwidth=*/10e9}));
  planner::TemplateOptions template_options;
  template_options.microbatches = static_cast<int>(
      std::max<int64_t>(1, global_microbatches / run.min_pipelines));
  template_options.microbatch_size = run.microbatch_size;
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
                     run.devices_per_node / t,
                     t > 1 ? absl::StrCat(" (tensor-parallel groups of ", t, " ranks)") : "",
                     absl::ToDoubleMilliseconds(absl::Now() - t0))
              << std::endl;
  }
  out.layer_state_bytes = elastic::LayerStateBytes(chain);
  return out;
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
          {"resume_iteration", c.resume_iteration},
          {"replan_seconds", c.plan_seconds},
          {"state_copy_seconds", c.move_seconds},
          {"build_seconds", c.build_seconds},
          {"reform_seconds", c.rebuild_seconds},
          {"bytes_moved", c.bytes_moved},
          {"layout", c.layout},
          {"unix_time", absl::ToUnixMicros(absl::Now()) * 1e-6}};
}

// Appends one JSON object to the log (when there is one).
void AppendEvent(const std::string& log, const nlohmann::json& line) {
  if (log.empty()) return;
  std::ofstream out(log, std::ios::app);
  out << line.dump() << "\n";
}

absl::Status RunElastic(const ElasticRun& run, const std::function<void()>& started);

}  // namespace

bool ElasticJobLostRanks() { return lost_ranks; }

bool ElasticJoining() { return elastic::StartedByARunningJob(); }

absl::Status RunElasticTraining(const ElasticRun& run, const std::function<void()>& started) {
  // Under `mpirun --enable-recovery` Open MPI 4.1's mpirun exits 0 whatever the ranks do, so
  // the log says how the job ended: {"event": "finished"} or {"event": "failed"} per failing
  // rank.
  absl::Status status = RunElastic(run, started);
  if (!status.ok()) {
    AppendEvent(run.log_json, {{"event", "failed"},
                               {"rank", run.world->rank()},
                               {"error", std::string(status.message())}});
  }
  return status;
}

namespace {

absl::Status RunElastic(const ElasticRun& run, const std::function<void()>& started) {
  comm::Communicator& world = *run.world;
  const int rank = world.rank();
  if (run.global_batch <= 0 || run.global_batch % run.microbatch_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--elastic needs --global-batch, a multiple of --microbatch-size (", run.microbatch_size,
        ")"));
  }
  if (run.min_pipelines < 1) {
    return absl::InvalidArgumentError("--elastic-min-pipelines must be at least 1");
  }
  const int64_t global_microbatches = run.global_batch / run.microbatch_size;
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
  if (joining) {
    started();
    TANDEM_ASSIGN_OR_RETURN(elastic::JoinRequest request, elastic::AcceptJoin(run.engine.timeout));
    TANDEM_ASSIGN_OR_RETURN(inputs, DecodeTemplateInputs(request.payload));
    join = std::move(request);
    // The job's ranks' CPU threads (this process counted only the ranks started with it).
    const char* set = std::getenv("OMP_NUM_THREADS");
    if ((set == nullptr || *set == '\0') && inputs.threads > 0) {
      at::set_num_threads(std::min(inputs.threads, UsableCores()));
    }
  } else {
    // The profile (rank 0), then the same templates on every rank.
    std::string text;
    absl::Status local = absl::OkStatus();
    if (rank == 0) {
      std::cout << "elastic: profiling the model (micro-batch " << run.microbatch_size
                << ") on rank 0 ..." << std::endl;
      auto profile = runtime::libtorch::ProfileModel(*run.model, *run.data, run.profiler);
      if (profile.ok()) {
        text = pipeline::ToJson(*profile).dump();
      } else {
        local = profile.status();
      }
    }
    TANDEM_RETURN_IF_ERROR(runtime::AgreeOnSuccess(&world, local, "profiling"));
    TANDEM_ASSIGN_OR_RETURN(inputs.profile, BroadcastText(world, text));
    inputs.ranks = world.size();
    inputs.threads = at::get_num_threads();
  }
  TANDEM_ASSIGN_OR_RETURN(Templates templates,
                          BuildTemplates(run, inputs, global_microbatches, rank == 0 && !joining));

  elastic::ElasticOptions options;
  options.engine = run.engine;
  options.schedule = run.schedule;
  options.model = run.model_text;
  options.num_layers = run.model->num_layers();
  options.microbatch_size = run.microbatch_size;
  options.global_microbatches = global_microbatches;
  options.devices_per_node = run.devices_per_node;
  options.tensor_parallel = run.tensor_parallel;
  options.min_pipelines = run.min_pipelines;
  options.steps = run.steps;
  options.membership.heartbeat_timeout = run.heartbeat_timeout;
  options.agreement_timeout = run.agreement_timeout;
  // A rank that ends itself (stuck inside MPI after a death) logs its failure as any other.
  options.on_fatal = [log = run.log_json, rank](const std::string& line) {
    AppendEvent(log, {{"event", "failed"}, {"rank", rank}, {"error", line}});
  };
  options.layer_state_bytes = templates.layer_state_bytes;
  options.checkpoint_dir = run.checkpoint_dir;
  options.checkpoint_every = run.checkpoint_every;
  options.keep_checkpoints = run.keep_checkpoints;
  options.resume = run.resume;
  options.stop_requested = &stop_requested;
  options.grow_requested = &grow_requested;
  options.replace_lost = run.replace_lost;
  options.spawn_command = OwnCommand();
  options.join_payload = EncodeTemplateInputs(inputs);
  std::signal(SIGUSR1, OnStopSignal);
  std::signal(SIGUSR2, OnGrowSignal);
  std::unique_ptr<elastic::ElasticTrainer> trainer;
  std::optional<elastic::Reconfiguration> joined;
  if (joining) {
    lost_ranks = true;  // connected to ranks that may end first
    TANDEM_ASSIGN_OR_RETURN(
        trainer, elastic::ElasticTrainer::Join(std::move(*join), std::move(templates.set),
                                               run.factory, std::move(options),
                                               [&](const elastic::Reconfiguration& c) {
                                                 joined = c;
                                               }));
  } else {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> job, world.Split(0, rank));
    started();  // the membership watches the ranks from here
    TANDEM_ASSIGN_OR_RETURN(
        trainer, elastic::ElasticTrainer::Create(std::move(job), std::move(templates.set),
                                                 run.factory, std::move(options)));
  }
  const int reporter = trainer->layout().pipelines.empty()
                           ? -1
                           : trainer->layout().pipelines[0].ranks[0];
  if (rank == reporter && !joining) {
    std::cout << "elastic: " << elastic::Describe(trainer->layout())
              << " (global batch " << run.global_batch << ": " << global_microbatches
              << " micro-batches of " << run.microbatch_size << ")" << std::endl;
    if (!run.log_json.empty()) std::ofstream(run.log_json, std::ios::trunc).flush();
    if (!run.resume.empty()) {
      std::cout << "resumed from " << run.resume << " at iteration "
                << trainer->first_iteration() + 1 << std::endl;
    }
  }
  const double tokens = static_cast<double>(run.global_batch) * run.tokens_per_sample;
  int reconfigurations = 0;
  double last_loss = 0;
  int64_t last_iteration = -1;
  absl::Status log_status = absl::OkStatus();
  // The log keeps one line per completed iteration: a reporter that takes over from a dead one
  // first reads where it stopped, and iterations run again after a roll-back are not repeated.
  int64_t last_logged = -1;
  bool log_read = false;
  auto append = [&](const nlohmann::json& line) {
    if (run.log_json.empty()) return;
    std::ofstream out(run.log_json, std::ios::app);
    out << line.dump() << "\n";
    out.flush();
    if (!out) log_status = absl::InternalError(absl::StrCat("writing ", run.log_json));
  };
  // A recovery's event, written once the first iteration after it has completed.
  std::optional<nlohmann::json> pending_recovery;
  JobTimeline timeline;
  auto on_iteration = [&](const elastic::ElasticIteration& e) {
    timeline.Iteration(e);
    last_loss = e.result.loss;
    last_iteration = e.result.iteration;
    if (!e.reporter) return;
    const runtime::IterationResult& r = e.result;
    std::cout << absl::StrFormat(
                     "iter %4d/%d  loss %.5f  %8.1f ms  %9.0f tokens/s  %d pipeline(s) on %d "
                     "rank(s)",
                     r.iteration + 1, trainer->end_iteration(), r.loss, r.seconds * 1e3,
                     r.seconds > 0 ? tokens / r.seconds : 0.0, e.pipelines, e.ranks)
              << std::endl;
    if (run.log_json.empty()) return;
    if (!log_read) {
      log_read = true;
      std::ifstream in(run.log_json);
      std::string text;
      while (std::getline(in, text)) {
        const nlohmann::json line = nlohmann::json::parse(text, nullptr, false);
        if (line.is_object() && line.contains("iteration") && !line.contains("event")) {
          last_logged = std::max<int64_t>(last_logged, line["iteration"].get<int64_t>());
        }
      }
    }
    if (pending_recovery.has_value()) {
      (*pending_recovery)["first_step_after_iteration"] = r.iteration;
      (*pending_recovery)["first_step_after_seconds"] = r.seconds;
      append(*pending_recovery);
      pending_recovery.reset();
    }
    if (r.iteration <= last_logged) return;  // run again after a roll-back: logged already
    last_logged = r.iteration;
    nlohmann::json line = {{"iteration", r.iteration},
                           {"loss", r.loss},
                           {"iteration_ms", r.seconds * 1e3},
                           {"tokens_per_second", r.seconds > 0 ? tokens / r.seconds : 0.0},
                           {"grad_norm", r.grad_norm},
                           {"learning_rate", r.learning_rate},
                           {"pipelines", e.pipelines},
                           {"ranks", e.ranks},
                           {"unix_time", absl::ToUnixMicros(absl::Now()) * 1e-6}};
    append(line);
  };
  int growths = 0;
  auto on_reconfiguration = [&](const elastic::Reconfiguration& c) {
    lost_ranks = true;
    if (!c.added.empty()) {
      timeline.Growth(c);
      ++growths;
      if (!c.reporter) return;
      pending_recovery = ReformationEvent("growth", c);
      (*pending_recovery)["added"] = c.added;
      (*pending_recovery)["spawn_seconds"] = c.spawn_seconds;
      std::cout << absl::StrFormat(
                       "elastic: rank(s) %s started and joined in %.3f s; re-formed in %.3f s "
                       "(plan %.3f s, state %.3f s, engines %.3f s; %s of state copied): %s; "
                       "resuming at iteration %d",
                       absl::StrJoin(c.added, ", "), c.spawn_seconds, c.rebuild_seconds,
                       c.plan_seconds, c.move_seconds, c.build_seconds,
                       FormatBytes(c.bytes_moved), c.layout, c.resume_iteration + 1)
                << std::endl;
      return;
    }
    timeline.Recovery(c);
    ++reconfigurations;
    if (!c.reporter) return;
    pending_recovery = ReformationEvent("recovery", c);
    nlohmann::json& event = *pending_recovery;
    event["dead"] = c.dead;
    event["committed_iteration"] = c.committed_iteration;
    event["detection_seconds"] = c.detection_seconds;
    event["agreement_seconds"] = c.agree_seconds;
    event["shrink_seconds"] = c.shrink_seconds;
    event["restored_step"] = c.restored_step;
    const std::string received =
        c.restored_step >= 0
            ? absl::StrCat(c.layers_received, " parameter(s) read from the checkpoint here")
            : absl::StrCat(FormatBytes(c.bytes_moved), " of state copied");
    std::cout << absl::StrFormat(
                     "elastic: rank(s) %s died; %d survivor(s) agreed in %.3f s (found dead "
                     "after %.2f s of silence) that iteration %d is the last committed; "
                     "re-formed in %.3f s (plan %.3f s, state %.3f s, engines %.3f s; %s): %s; "
                     "resuming at iteration %d",
                     absl::StrJoin(c.dead, ", "), c.live.size(), c.agree_seconds,
                     c.detection_seconds, c.committed_iteration + 1, c.rebuild_seconds,
                     c.plan_seconds, c.move_seconds, c.build_seconds, received, c.layout,
                     c.resume_iteration + 1)
              << std::endl;
    if (c.restored_step >= 0) {
      std::cout << "elastic: no survivor held some layers: every rank rolled back to the "
                   "checkpoint of step "
                << c.restored_step << " in " << run.checkpoint_dir << std::endl;
    }
  };
  auto on_checkpoint = [&](int64_t step) {
    std::cout << "checkpoint: " << run.checkpoint_dir << " (step " << step << ")" << std::endl;
    append(nlohmann::json{{"event", "checkpoint"}, {"step", step}});
  };
  if (joined.has_value()) on_reconfiguration(*joined);
  TANDEM_RETURN_IF_ERROR(trainer->Run(on_iteration, on_reconfiguration, on_checkpoint));
  if (pending_recovery.has_value()) append(*pending_recovery);  // nothing ran after it
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
                << (run.checkpoint_dir.empty()
                        ? std::string(" (no --checkpoint-dir: nothing saved)")
                        : absl::StrCat(" (checkpoint of step ", trainer->stopped_at(), " in ",
                                       run.checkpoint_dir, ")"))
                << std::endl;
    }
    AppendEvent(run.log_json, finished);
    if (!run.timeline.empty()) {
      TANDEM_RETURN_IF_ERROR(timeline.Write(run.timeline));
      std::cout << "timeline: " << run.timeline << " (" << reconfigurations
                << " recovery(ies) beside the iterations)" << std::endl;
    }
    std::cout << absl::StrFormat(
                     "trained to iteration %d elastically: final loss %.5f, %d "
                     "reconfiguration(s), %d growth(s), %s",
                     last_iteration + 1, last_loss, reconfigurations, growths,
                     elastic::Describe(trainer->layout()))
              << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::cli
