// The elastic job's growth while it runs: at an iteration boundary agreed at a commit every
// rank takes part in starting new processes (MPI_Comm_spawn) and merging with them, the
// started processes join (AcceptJoin, ElasticTrainer::Join), and the job re-forms on the larger
// set of nodes with no step lost or repeated (elastic/trainer.h).
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/mpi/mpi_communicator.h"
#include "common/logging.h"
#include "common/status.h"
#include "elastic/internal/trainer_state.h"
#include "nlohmann/json.hpp"
#include "runtime/control.h"

namespace tandem::elastic {
namespace {

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

std::string ElasticTrainer::State::JoinState(const std::vector<int>& added,
                                            double spawn_seconds) const {
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
                            {"spawn_seconds", spawn_seconds},
                            {"layout", LayoutToJson(held_layout)}};
  return j.dump();
}

absl::Status ElasticTrainer::State::ReadJoinState(const std::string& text,
                                                  std::vector<int>& added,
                                                  double& spawn_seconds) {
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
    spawn_seconds = j.at("spawn_seconds").get<double>();
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
    comm::Communicator* spawner, int nodes,
    const std::function<void(const Reconfiguration&)>& on_reconfiguration) {
  const absl::Time start = absl::Now();
  if (options.grow_requested != nullptr) {
    // This growth answers one request of this rank's, if it made any.
    int pending = options.grow_requested->load();
    while (pending > 0 && !options.grow_requested->compare_exchange_weak(pending, pending - 1)) {
    }
  }
  const bool first = current->rank() == 0;
  if (options.spawn_command.empty()) {
    if (first) {
      TANDEM_LOG(WARNING) << "elastic: the job cannot grow while it runs (no command to start "
                          << "ranks with); training goes on with " << current->size()
                          << " rank(s)";
    }
    return absl::OkStatus();
  }
  const int dpn = std::max(1, options.devices_per_node);
  const int count = nodes * dpn;
  const int64_t next = grow_iteration;
  runtime::Engine* const running = configured().engine;
  if (running != nullptr && running->iteration() != next) {
    return absl::InternalError(absl::StrCat("rank ", me, " is at iteration ", running->iteration(),
                                            " but the job grows before ", next));
  }
  // This rank's state, before anything changes (a failed start leaves the engines running).
  std::map<std::string, runtime::ParameterState> state;
  if (running != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<runtime::ParameterState> exported,
                            running->ExportState());
    for (runtime::ParameterState& p : exported) {
      std::string name = p.name;
      state.emplace(std::move(name), std::move(p));
    }
  }
  // A rank that dies while the new processes start cannot be survived (MPI cannot interrupt
  // the spawn): the job's state is saved first, so that it resumes from this step.
  if (!options.checkpoint_dir.empty() && running != nullptr && saved_step != next) {
    TANDEM_RETURN_IF_ERROR(SaveCheckpoint(next));
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
                            "; ending this rank", ResumeHint()));
  absl::StatusOr<std::unique_ptr<comm::Communicator>> merged =
      spawner->SpawnAndMerge(options.spawn_command, count);
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
  TANDEM_RETURN_IF_ERROR(Annotate(runtime::BroadcastString(**merged, JoinState(added, report.spawn_seconds)).status(),
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

std::string ElasticTrainer::State::ResumeHint() const {
  if (options.checkpoint_dir.empty() || saved_step < 0) {
    return "; no checkpoint of the job to resume from (--checkpoint-dir)";
  }
  return absl::StrCat("; the checkpoint of step ", saved_step, " in ", options.checkpoint_dir,
                      " resumes the job (--resume ", options.checkpoint_dir, ")");
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

}  // namespace tandem::elastic
