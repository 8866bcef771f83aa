// Elastic training: a job that survives the death of ranks without restarting (Oobleck, Jang
// et al., SOSP 2023, on the runtime's engine).
//
// The job is a set of linear pipelines made from the planner's templates (planner/templates.h)
// by the instantiation (elastic/instantiation.h). A template stage of c devices becomes c
// pipelines that share its layers; each pipeline runs its own runtime::Engine on its own
// communicator with its own micro-batch count, so pipelines of different shapes train one
// model. The engines are tied together through runtime::JobHooks: after each engine's backward
// the gradients of every layer are summed over all ranks holding it (one all-reduce per run of
// layers held by the same ranks, in layer order), and the loss and norm are summed over the
// job. That last all-reduce is the commit point: once it has completed anywhere, every rank
// has its synchronised gradients, and the step is applied.
//
// Failures. A Membership (elastic/agreement.h) watches every rank. When a rank dies the
// survivors abort their engines, agree on the live ranks and on the highest committed
// iteration (with its sums), and then:
//   1. a survivor that had not applied the committed step applies it (ApplyCommittedStep with
//      the agreed sums), so the step is applied on every survivor or on none;
//   2. the communicator is shrunk to the survivors; nodes that lost a rank are dropped whole;
//   3. the templates are re-instantiated on the live nodes (PlanReinstantiation: batch
//      redistributed so the global batch is unchanged, ranks assigned to keep the most state
//      in place);
//   4. every layer a rank now needs and did not hold is copied from a surviving holder:
//      parameters and optimizer state (moments, step counts);
//   5. new engines are built and the next iteration after the committed one runs again.
// The learning-rate schedule and the data follow the iteration counter and each pipeline's
// share of the global batch, so training continues as if nothing had happened (up to the order
// of floating-point sums). A layer with no surviving copy ends the job with an error naming it,
// unless a checkpoint of the job exists: then every rank rolls back to it.
//
// Growth. The job also grows while it runs (ElasticOptions::spawn_command): at an iteration
// boundary agreed at a commit (a rank asked for a node, ElasticOptions::grow_requested; or,
// with replace_lost, the first iteration after a recovery) every rank takes part in starting
// new processes (MPI_Comm_spawn) and merging with them (MPI_Intercomm_merge); the started
// processes call Join. Job ranks of new processes continue after the highest ever used, so a
// node is still job rank / devices_per_node. The templates are re-instantiated on the larger
// set of nodes and the new ranks receive their layers' parameters and optimizer state from
// the ranks that hold them, as after a failure; no step is lost or repeated. A rank that dies
// while processes are being started ends the job (MPI_Comm_spawn cannot be interrupted).
//
// Tensor parallelism (ElasticOptions::tensor_parallel = T): every stage runs on a group of T
// consecutive ranks of one node, and the layer above plans groups as devices. A rank sums its
// shards' gradients with the ranks at the same offset of the other groups holding the layers,
// and receives its shard of moved layers from the rank at its offset in the source group; a
// rank that dies takes its group (its node) with it. Checkpoints hold whole parameters.
//
// Stages on a device (CUDA) sum gradients across pipelines through host copies over MPI (the
// stage's DeviceOps copy them out and back); their own engines use NCCL or host staging as
// any engine does, rebuilt from scratch at every re-formation.
//
// Limits: schedules GPipe, 1F1B and ZB-H1 (the templates give a rank one contiguous run of
// layers).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "elastic/agreement.h"
#include "elastic/instantiation.h"
#include "pipeline/schedule.h"
#include "planner/templates.h"
#include "runtime/engine.h"

namespace tandem::elastic {

// One linear pipeline of the job: stage s runs layers stages[s] on rank ranks[s] (ranks of the
// job's first communicator, which name ranks for the job's whole life).
struct JobPipeline {
  std::vector<int> ranks;
  std::vector<LayerRange> stages;
  int64_t microbatches = 0;
  int64_t first_microbatch = 0;  // its share of the global batch starts here
};

struct JobLayout {
  std::vector<JobPipeline> pipelines;
  std::vector<int> idle_ranks;  // live ranks without a stage (spare nodes)
  int64_t global_microbatches = 0;
  // Tensor parallelism: every stage runs on `tensor_parallel` consecutive job ranks, named in
  // `pipelines` by the first of them (a multiple of tensor_parallel). The templates, the
  // instantiation and the state moves see each such group as one device; each rank of a group
  // holds its shard of the group's layers, and the rank at offset t of one group exchanges
  // gradients and state with the ranks at offset t of the others.
  int tensor_parallel = 1;
};

// The pipelines of an elastic plan: template stage of c ranks -> c pipelines, the template's
// micro-batches split among them as evenly as possible (earlier ones get one more); a pipeline
// left without a micro-batch is not formed and its ranks are idle. With tensor_parallel > 1 the
// plan's ranks are the first ranks of tensor-parallel groups (JobLayout::tensor_parallel).
absl::StatusOr<JobLayout> LayoutFromPlan(const ElasticPlan& plan,
                                         const std::vector<int>& live_ranks,
                                         int tensor_parallel = 1);
// What each rank holds under `layout` (the next re-instantiation's HeldLayers).
HeldLayers HeldUnder(const JobLayout& layout);
std::string Describe(const JobLayout& layout);

// A run of layers with the ranks that hold all of it: gradients are summed over these ranks.
struct GradientSegment {
  LayerRange layers;
  std::vector<int> ranks;  // ascending
};
// The maximal runs of layers whose holders are the same, in layer order. InvalidArgument when
// some layer in [0, num_layers) has no holder.
absl::StatusOr<std::vector<GradientSegment>> GradientSegments(const JobLayout& layout,
                                                              int num_layers);

// Parameter states as bytes, to move layers between ranks.
std::string EncodeState(const std::vector<runtime::ParameterState>& state);
absl::StatusOr<std::vector<runtime::ParameterState>> DecodeState(const std::string& bytes);

// The model layer of a parameter named "layers.<index>.<name>" (runtime/torch/model.h);
// InvalidArgument for other names.
absl::StatusOr<int> LayerOfParameter(const std::string& name);

struct ElasticOptions {
  runtime::EngineOptions engine;  // its job hooks and heartbeat are the trainer's
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::k1F1B;  // GPipe, 1F1B, ZB-H1
  std::string model;  // description, for the engines' plans
  int num_layers = 0;
  int64_t microbatch_size = 1;
  int64_t global_microbatches = 0;  // the global batch, kept across failures
  int devices_per_node = 1;  // job ranks per node
  // Ranks per stage (Megatron tensor parallelism inside the stage): groups of this many
  // consecutive job ranks, inside a node (devices_per_node a multiple of it), are the
  // templates' devices; a group that loses a rank is lost whole. The templates must be made
  // for devices_per_node / tensor_parallel devices per node.
  int tensor_parallel = 1;
  int min_pipelines = 2;  // f + 1 at the start, to survive f failures
  int64_t steps = 0;      // the run's last iteration, counted from 1 (a resume goes on to it)
  MembershipOptions membership;
  // How long survivors wait for the agreement's decision; also the longest a rank stays inside
  // an MPI call nothing can interrupt (building the survivors' communicator, starting new
  // ranks, the new engines' communicators when a further death is noticed) before it ends
  // with an error naming the cause. (A rank elsewhere that does not reach the agreement ends
  // after engine.timeout.)
  absl::Duration agreement_timeout = absl::Seconds(60);
  std::vector<double> layer_state_bytes;  // per layer, for the rank assignment; empty: count
  // Checkpoints of the job (a root, as `tandem train --checkpoint-dir`): one shard per run of
  // layers held by the same ranks, written by the lowest of them, in the format any partition
  // loads (runtime/stage_checkpoint.h). Layers no survivor holds are restored from the latest
  // one, the whole job rolling back to its step. Empty: none.
  std::string checkpoint_dir;
  int checkpoint_every = 0;  // iterations; 0: at the end only
  int keep_checkpoints = 2;
  // A checkpoint root or step folder to start from, saved under any partition (elastic or
  // not, any world size). Empty: start from the model's initial values.
  std::string resume;
  // A request to stop early, set from a signal handler (`tandem train --elastic` sets it on
  // SIGUSR1; a cluster scheduler uses it to resize a job through a checkpoint). When it is true
  // on any training rank at a commit, every training rank learns it from that commit's
  // all-reduce: the job ends after that iteration as if it were the last (the checkpoint of its
  // step written, with a checkpoint_dir). A re-formation forgets an agreed stop; a flag still
  // set is carried by the next commit. Null: never.
  const std::atomic<bool>* stop_requested = nullptr;
  // Live growth. The command started ranks run (argv[0] the program; the same `tandem train`
  // as the job's). Empty: the job never grows while it runs.
  std::vector<std::string> spawn_command;
  // Nodes this rank asks to add (`tandem train --elastic` counts SIGUSR2). When any training
  // rank's count is positive at a commit, the job grows by one node (devices_per_node ranks)
  // after that iteration, and every rank's count drops by one. Null: no requests.
  std::atomic<int>* grow_requested = nullptr;
  // After a recovery, start new ranks for the nodes lost (back to the job's starting size)
  // once the survivors have run one iteration.
  bool replace_lost = false;
  // Runs (on another thread) just before this rank ends itself because a death left it inside
  // an MPI call nothing can interrupt (see agreement_timeout), with the line it prints, e.g. to
  // log the failure. Null: nothing.
  std::function<void(const std::string&)> on_fatal;
  // Validation: after every eval_every-th iteration (and the last) the pipelines evaluate
  // eval_batches validation batches (runtime::Engine::Evaluate; the stages' validation data)
  // and every training rank gets the job's mean loss, with the iteration (counted from 1) and
  // whether it reports. 0: never.
  int eval_every = 0;
  int64_t eval_batches = 1;
  std::function<void(int64_t iteration, double loss, bool reporter)> on_evaluation;
  // Handed to every started rank (JoinRequest::payload), e.g. what it needs to compute the
  // same templates.
  std::string join_payload;
  // Fault injection for tests: "RANK:ITERATION:POINT" kills (SIGKILL) job rank RANK at
  // ITERATION, POINT one of forward, backward, sync (before the gradient all-reduce across
  // pipelines), commit (right after the commit all-reduce, before the step is applied), idle
  // (an idle rank, while it waits), or grow (no death: the rank raises SIGUSR2 in forward, the
  // request `tandem train --elastic` turns into grow_requested). Empty: none.
  // TANDEM_ELASTIC_KILL in the environment sets it.
  std::string kill;
};

// What a rank learns at each iteration (the loss is the job's, the same on every rank).
struct ElasticIteration {
  runtime::IterationResult result;
  bool reporter = false;  // this rank reports for the job (the first rank of the first pipeline)
  int pipelines = 0;
  int ranks = 0;  // ranks training
};

struct Reconfiguration {
  std::vector<int> dead;     // job ranks
  std::vector<int> live;     // job ranks
  int64_t committed_iteration = -1;
  int64_t resume_iteration = 0;  // the next iteration to run
  bool applied_committed_step = false;  // this rank applied it late (ApplyCommittedStep)
  std::string layout;                    // Describe of the new layout
  std::string plan;                      // Describe of the elastic plan
  int64_t layers_received = 0;           // by this rank
  double bytes_received = 0;             // by this rank
  double bytes_moved = 0;                // by the whole job (state copied between ranks)
  // Times, on this rank: how long the first victim had been silent when this rank declared
  // it dead (0: others told it), the agreement, then the re-formation's parts.
  double detection_seconds = 0;
  double agree_seconds = 0;
  double shrink_seconds = 0;  // the survivors' communicator
  double plan_seconds = 0;    // re-instantiation (templates, batch, ranks, moves)
  double move_seconds = 0;    // state copied from survivors, or read from the checkpoint
  double build_seconds = 0;   // new communicators and engines
  double rebuild_seconds = 0;  // all of the re-formation
  bool reporter = false;
  // >= 0: no survivor held some layers; every rank rolled back to this checkpoint step.
  int64_t restored_step = -1;
  // A growth instead of a recovery: the job ranks started (dead is empty), and how long
  // starting them took (MPI_Comm_spawn until they joined; counted in shrink_seconds too).
  std::vector<int> added;
  double spawn_seconds = 0;
};

// What a process started by a growing job receives when it joins (ElasticTrainer::Join).
struct JoinRequest {
  std::unique_ptr<comm::Communicator> job;  // the job's ranks, then the started ones
  std::string payload;                      // the job's ElasticOptions::join_payload
  std::string state;                        // the trainer's (layout, iteration, ranks)
};

// Whether this process was started by a growing job (it must call AcceptJoin, then Join).
bool StartedByARunningJob();
// Collective with the job's ranks (inside their growth) and the other started processes.
absl::StatusOr<JoinRequest> AcceptJoin(absl::Duration timeout);

class ElasticTrainer {
 public:
  // Collective over `world` (every rank of the job; the trainer keeps it for its life).
  // `factory` builds the stages (it receives each pipeline's StageSpec with sample_offset and
  // loss_microbatches set). The templates must hold the model's layers and record their
  // micro-batches.
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> Create(
      std::unique_ptr<comm::Communicator> world, planner::TemplateSet templates,
      runtime::StageFactory factory, ElasticOptions options);
  // In a process started by a growing job: takes its part in the job. `templates`, `factory`
  // and `options` must be built as the job's ranks built theirs (options.resume and steps are
  // ignored: the job's state and iteration come with the request).
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> Join(
      JoinRequest request, planner::TemplateSet templates, runtime::StageFactory factory,
      ElasticOptions options, std::function<void(const Reconfiguration&)> on_joined = {});
  ~ElasticTrainer();

  // Trains until end_iteration(), surviving failures. Each rank's callbacks run on its training
  // thread. An error: the job cannot continue (no surviving copy of some layers, too few
  // ranks, this rank excluded, a failure that is not a death).
  // `on_checkpoint` runs on the reporting rank after each checkpoint written.
  absl::Status Run(std::function<void(const ElasticIteration&)> on_iteration,
                   std::function<void(const Reconfiguration&)> on_reconfiguration,
                   std::function<void(int64_t step)> on_checkpoint = {});

  const JobLayout& layout() const;
  int64_t first_iteration() const;  // where training starts (a resumed checkpoint's step)
  int64_t end_iteration() const;    // options.steps (first_iteration() when past it)
  // The iteration an agreed stop request (ElasticOptions::stop_requested) ended the job at, or
  // -1 when it ran to end_iteration().
  int64_t stopped_at() const;
  int job_rank() const;  // this rank in the job's first communicator

 private:
  struct State;
  explicit ElasticTrainer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tandem::elastic
