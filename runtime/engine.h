// Engine: runs one rank's share of a plan — its program from the schedule IR — iteration
// after iteration: forward and backward per micro-batch through runtime::Stage, activation
// and gradient transfers, gradient synchronisation (plain bucketed all-reduce or DeAR),
// gradient clipping by the global norm across all stages, and the optimizer step.
//
// Ranks, groups and peers. The plan's mesh puts this rank at data-parallel replica d and
// pipeline position q; it runs program q of the schedule generated from plan.schedule. A
// transfer's peer (a pipeline position) is the world rank mesh[d][peer]: transfers travel on
// the pipeline group of replica d (runtime/groups.h), whose ranks are the pipeline positions.
// Every stage s has a gradient group: the ranks holding a copy of s in every
// data-parallel replica and, for Chimera, in both pipeline replicas; its synchronisation sums
// the gradients of all copies, so copies stay identical. Transfers go as the IR groups them:
// each run of consecutive sends and receives of the program is one batch (one NCCL group);
// the first transfer of each kind carries a header with shapes and dtypes, which both ends
// then cache (runtime/transfer.h: no per-model code); a received tensor is waited for only
// when a computation first uses it.
//
// Losses and gradients. Each last stage's IterationLoss() is already scaled so that the sum
// over the world is the mean loss of the global batch, and its gradients likewise: gradient
// groups sum (never average). The loss and the squared gradient norm are summed over the
// world in one all-reduce at OptimizerStep; the clip coefficient is
// min(1, clip_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ computes it. That
// all-reduce comes before the step when the step needs the norm (clipping) or the job commits
// there (an elastic job: job.sum_over_job); otherwise the step is queued first, behind the
// backward on the device, and the loss and norm are read while it runs.
//
// Tied parameters (ParameterView::tied_owner: an LM head that is the token embedding, on the
// first and the last stage). At the optimizer step, before the gradient groups synchronise,
// the members' gradients are summed within each pipeline (host buffers over the pipeline
// group, so with tensor parallelism each lane sums its own vocabulary shard), so every member
// then takes the step a single process sharing one tensor takes; the copies are left out of
// the norm. The stages holding members hand their buckets to the synchroniser only then (no
// overlap with the backward for them). Any schedule works, also ones that put both ends on one
// rank (ZB-V, Hanayo: summed there without messages); elastic jobs (JobHooks) are refused.
//
// Collective contract: Create, RunIteration, Flush, SaveCheckpoint, LoadCheckpoint and
// GatherTimeline are collective over the world communicator (every rank calls them in the
// same order); the destructor waits (at most 10 s) for every rank's closing notice. Every wait has the communicator's timeout; an error names the rank, the
// iteration, the step of the program and the action ("rank 2 iteration 5 step 13 (rA1.3<1):
// ..."). After an error the engine must not be used again: the caller reports and exits.
//
// Failures reach every rank: a rank whose call fails sends its error to all others, whose
// communicators are then aborted by a watchdog thread, so their calls fail at once with
// "rank R failed: ..." (with that rank's status code). A rank that dies or is stopped
// without a word is noticed by the heartbeats within EngineOptions::heartbeat_timeout (2 s),
// a rank that hangs by its neighbours' timeouts, which then notify everyone. (Under plain
// mpirun, Open MPI ends the whole job as soon as a rank dies; `mpirun --enable-recovery` lets
// the survivors report.)
//
// Devices: training state stays on each stage's device. Gradient synchronisation and the
// optimizer run there through the stage's DeviceOps (runtime/device_ops.h; the CPU loops for
// CPU stages). Stages on the CPU exchange tensors and synchronise gradients over MPI. Stages
// on CUDA devices (every rank's, one device per rank) send payloads and synchronise gradients
// over NCCL on its own stream, with the shape headers over MPI; where ranks share a GPU (which
// NCCL refuses) payloads and gradients go over MPI through pinned host staging
// (comm/host_staged.h), with one notice. A build or a machine without CUDA never sees CUDA
// stages (the factory cannot make them).
//
// Threading: one thread drives an Engine; its watchdog thread only tests failure notices and
// aborts communicators.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/forwarding.h"
#include "runtime/grad_sync.h"
#include "runtime/optimizer.h"
#include "common/clock.h"
#include "common/trace.h"
#include "nlohmann/json.hpp"
#include "pipeline/plan.h"
#include "pipeline/schedule.h"
#include "runtime/failure_notices.h"
#include "runtime/lr_schedule.h"
#include "runtime/stage_checkpoint.h"
#include "runtime/stage.h"
#include "runtime/timeline.h"

namespace tandem::runtime {

// What a StageFactory is asked to build: one stage (or chunk) of one pipeline replica in one
// data-parallel replica. Layers [first_layer, end_layer) of the model; `recompute_layers`
// lists those whose activations the stage recomputes in backward instead of stashing.
struct StageSpec {
  int data_parallel_index = 0;
  int data_parallel = 1;
  int replica = 0;      // pipeline replica (Chimera: 0 or 1)
  int stage = 0;
  int num_stages = 1;
  int first_layer = 0;
  int end_layer = 0;
  std::vector<int> recompute_layers;
  // The stage scales each micro-batch's loss (and so its gradients) by
  // 1 / (num_microbatches * data_parallel): gradient groups sum, and the losses summed over
  // the world are the mean over the global batch.
  int num_microbatches = 1;     // per pipeline and iteration
  int64_t microbatch_size = 1;  // samples per micro-batch
  // A job of pipelines with different micro-batch counts (the elastic layer) sets these: the
  // first sample of this pipeline's share of the global batch (-1: data_parallel_index *
  // num_microbatches * microbatch_size) and the micro-batches of the whole global batch, over
  // which each loss is averaged (0: num_microbatches * data_parallel).
  int64_t sample_offset = -1;
  int loss_microbatches = 0;
  // Tensor parallelism of degree `tensor_parallel`: this rank's index in the stage's group
  // and the group's communicator (owned by the engine, alive as long as the stage). Every
  // rank of the group gets the same data (the same data_parallel_index).
  int tensor_parallel = 1;
  int tensor_parallel_index = 0;
  comm::Communicator* tensor_group = nullptr;
  // Experts spread over `expert_replicas` data-parallel replicas (EngineOptions::
  // expert_replicas): this replica's index among them and this rank's counterparts on them
  // (owned by the engine), in replica order.
  int expert_replicas = 1;
  int expert_replica = 0;
  comm::Communicator* expert_group = nullptr;
  bool is_first() const { return stage == 0; }
  bool is_last() const { return stage == num_stages - 1; }
};

using StageFactory = std::function<absl::StatusOr<std::unique_ptr<Stage>>(const StageSpec&)>;

// Hooks for a job made of several engines: the elastic layer runs one engine per pipeline,
// each on its own communicator, so that pipelines of different shapes (Oobleck's templates)
// train one model. Set both or neither.
struct JobHooks {
  // Called at the optimizer step after this rank's own gradient synchronisation: sums the
  // local stages' gradients with their copies held by the job's other engines and returns
  // this rank's share of the job's squared gradient norm (each parameter counted once).
  std::function<absl::StatusOr<double>(class Engine&)> sync_gradients;
  // Sums {loss, squared gradient norm, compute seconds} in place over every rank of the job
  // (instead of the engine's world). Once it has succeeded on any rank the iteration is
  // committed: every rank has synchronised its gradients and can apply the step.
  std::function<absl::Status(int64_t iteration, std::array<double, 3>& sums)> sum_over_job;
  int ranks = 0;  // ranks in the job (bubble estimate); 0: the engine's world
  // Sums an evaluation's loss in place over every rank of the job (Engine::Evaluate; null:
  // over the engine's world).
  std::function<absl::Status(double& loss)> sum_evaluation;
};

struct EngineOptions {
  runtime::GradSyncStrategy grad_sync = runtime::GradSyncStrategy::kAllReduce;
  int64_t bucket_bytes = runtime::kDefaultBucketBytes;
  // Gradients communicated as float32 or bfloat16 (GradSyncOptions::communication_type).
  comm::DataType gradient_communication = comm::DataType::kFloat32;
  runtime::OptimizerConfig optimizer;
  LrSchedule lr_schedule;  // learning rate per iteration (warm-up, cosine decay)
  double clip_norm = 0;    // <= 0: no clipping
  // Record this rank's timeline of each iteration (Engine::timeline). The device finishes each
  // action before its clock stops (see SynchronizeDevices): the recorded iteration loses the
  // overlap of launching and computing, so it runs a little slower than the others.
  bool record_timeline = false;
  // LoadCheckpoint: start the optimizer afresh from the saved parameters instead of requiring
  // the optimizer state the checkpoint should hold (runtime/stage_checkpoint.h).
  bool reset_optimizer = false;
  // Step folders a checkpoint root keeps (the newest; <= 0: all).
  int keep_checkpoints = 2;
  // Saved in every checkpoint's manifest as its `run` record (CheckpointManifest::run): what
  // the caller wants a resume to check (the front end: data set, learning-rate schedule).
  nlohmann::json checkpoint_run = nlohmann::json::object();
  // Timeout of every wait (transfers, synchronisation, collectives): a peer that hangs.
  absl::Duration timeout = absl::Seconds(300);
  // A peer whose heartbeats stop this long (killed, stopped) fails every rank
  // (runtime/failure_notices.h); zero: only the timeouts notice it.
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  Clock* clock = nullptr;  // null: RealClock
  JobHooks job;
  // The programs to run, when they are given explicitly rather than generated from the plan's
  // schedule spec: a custom schedule read from a file (pipeline/torch_csv.h) or one built by
  // hand. Its spec must equal plan.schedule (whose placement, PlacementFor, the plan's stages
  // follow) and it must pass the validator; every rank must be given the same schedule.
  std::shared_ptr<const pipeline::Schedule> schedule;
  // Expert parallelism across data-parallel replicas (runtime/torch/tensor_parallel.h,
  // TensorParallel::expert_replicas): every `expert_replicas` consecutive replicas share one
  // copy of each mixture's experts, each holding its share, and route their tokens to one
  // another. The stages' placed parameters (ParameterView::placed_over_replicas) are then
  // synchronised over the replicas holding the same experts (runtime/split_grad_sync.h), and
  // checkpoints gather them. Must divide the plan's data-parallel degree; not with JobHooks
  // (the elastic layer).
  int expert_replicas = 1;
};




struct IterationResult {
  int64_t iteration = 0;
  double loss = 0;             // mean loss of the global batch
  double seconds = 0;          // wall time of the iteration on this rank
  double grad_norm = 0;        // global gradient norm before clipping
  double clip_coefficient = 1;
  double learning_rate = 0;
  double compute_seconds = 0;        // this rank's forward/backward time
  double world_compute_seconds = 0;  // summed over all ranks
  // 1 - world compute / (ranks * seconds): the measured pipeline bubble (with this rank's
  // iteration time).
  double bubble_ratio = 0;
  std::vector<ActionTiming> timings;  // this rank's actions in program order
};

// OutOfRange naming the iteration when its loss is NaN or infinite: training diverged (or ran
// on damaged state) and every later step would be too. The loss is the world's, so every rank
// stops alike; callers stop before they log or save anything of that iteration.
absl::Status CheckLossIsFinite(const IterationResult& result);

// When a training run evaluates its validation loss (plain and elastic alike): after iteration
// `done` (counted from 1) when it is a multiple of `every`, and after the last, `end`; never
// when `every` is 0.
inline bool EvaluationDue(int64_t done, int64_t end, int every) {
  return every > 0 && (done % every == 0 || done == end);
}

// A stage this rank runs.
struct LocalStageId {
  int replica = 0;
  int stage = 0;
};

class Engine {
 public:
  // Collective. Checks the plan against the world (size, uniform mesh, no tensor
  // parallelism), generates the schedule, builds groups, stages and synchronisers.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const pipeline::Plan& plan,
                                                        comm::Communicator* world,
                                                        StageFactory factory,
                                                        EngineOptions options);
  ~Engine();

  // Runs iteration iteration() and advances it. Collective.
  absl::StatusOr<IterationResult> RunIteration();

  // The mean loss of validation batches [0, batches) (Stage::BeginEvaluation): every local
  // stage's forward of each micro-batch in the order the schedule runs them, without
  // gradients, then the world's sum (the job's, JobHooks::sum_evaluation). Parameters and
  // optimizer state are untouched; the iteration counter does not move. Collective.
  absl::StatusOr<double> Evaluate(int64_t batches);

  // Makes every local stage's parameters hold the last step's values (DeAR leaves all-gathers
  // in flight after a step). Collective over the gradient groups.
  absl::Status Flush();

  // Next iteration to run (the data position).
  int64_t iteration() const { return iteration_; }
  void set_iteration(int64_t iteration) { iteration_ = iteration; }

  // Aborts every communicator of the engine, from any thread: the training thread's waits end
  // at once with `reason`. The engine is then only good for ApplyCommittedStep, ExportState
  // and destruction, which does not wait for the other ranks.
  void Abort(const absl::Status& reason);
  // Whether the last RunIteration failed after the gradients were synchronised, while the
  // loss and norm were being summed over the job (a peer died there): the step may have been
  // committed elsewhere. ApplyCommittedStep then applies it with the sums the others got.
  bool step_pending() const { return step_pending_; }
  absl::StatusOr<IterationResult> ApplyCommittedStep(const std::array<double, 3>& sums);

  // Every local parameter's value and optimizer state, on the host (after Flush). Local.
  absl::StatusOr<std::vector<ParameterState>> ExportState();
  // ExportState with tensor-parallel shards gathered whole (collective over each stage's
  // tensor-parallel group; ExportState itself without tensor parallelism).
  absl::StatusOr<std::vector<ParameterState>> ExportWholeState();
  // Sets every local parameter's value and optimizer state by name; each local parameter
  // must be present with its size, or whole for a tensor-parallel shard (cut here). Local.
  absl::Status ImportState(const std::vector<ParameterState>& state);
  // Views of every local parameter (value and gradient on the stage's device), stage by
  // stage in the order the stages run them (forward).
  std::vector<ParameterView> LocalParameters() const;
  // The device operations of each of LocalParameters() (its stage's): copies of a value or a
  // gradient to and from the host go through them.
  std::vector<DeviceOps*> LocalParameterOps() const;

  // Writes a checkpoint of every stage as a new step folder of the root `dir` (created if
  // needed; runtime/checkpoint.h): shards by the lowest world rank holding each stage, the
  // manifest by rank 0, then `latest` switched to it. The previous checkpoint stays loadable
  // until this one is complete. Collective.
  absl::Status SaveCheckpoint(const std::string& dir, const std::string& model);
  // Loads parameters, optimizer state and the data position from the root `dir` (its latest
  // step) or from a step folder. The manifest's model and layer count must match; its stages
  // may split the layers differently (a checkpoint of another world size or plan loads).
  // Collective; an error on any rank fails every rank.
  absl::Status LoadCheckpoint(const std::string& dir, const std::string& model);

  // This rank's timeline (when EngineOptions::record_timeline): one process per rank, lanes
  // compute, send, receive and sync.
  const ChromeTrace& timeline() const { return timeline_; }
  void set_record_timeline(bool record) { options_.record_timeline = record; }
  // Collective: the timelines of all ranks merged on rank 0 (empty elsewhere).
  absl::StatusOr<ChromeTrace> GatherTimeline();
  // Collective: every rank's `timings` (e.g. IterationResult::timings, or several iterations'
  // concatenated) on rank 0, index = world rank (empty elsewhere).
  absl::StatusOr<WorldTimings> GatherTimings(const std::vector<ActionTiming>& timings);

  const pipeline::Plan& plan() const { return plan_; }
  const pipeline::Schedule& schedule() const { return schedule_; }
  int world_rank() const { return world_rank_; }
  // What carries this job's device buffers (transfers, gradients, tensor-parallel
  // collectives): "nccl", "mpi host staging", or "" for CPU stages.
  const std::string& device_backend() const { return device_backend_; }
  int data_parallel_index() const { return data_parallel_index_; }
  int pipeline_position() const { return pipeline_position_; }
  std::vector<LocalStageId> local_stages() const;
  // The stage object for (replica, stage) if this rank runs it, else null.
  Stage* stage(int replica, int stage);

 private:
  struct Local;
  struct Transfers;
  Engine() = default;

  absl::StatusOr<IterationResult> RunIterationInternal();
  absl::StatusOr<double> EvaluateInternal(int64_t batches);
  // Runs `program` (this rank's actions) to its end: transfers posted in batches, each
  // computation after its inputs arrived; timings into `result` (recorded where asked).
  absl::Status RunProgram(const std::vector<pipeline::Action>& program, IterationResult* result);
  absl::Status FlushInternal();
  absl::Status SaveCheckpointInternal(const std::string& dir, const std::string& model);
  absl::Status LoadCheckpointInternal(const std::string& dir, const std::string& model);
  absl::StatusOr<ChromeTrace> GatherTimelineInternal();
  absl::StatusOr<WorldTimings> GatherTimingsInternal(const std::vector<ActionTiming>& timings);
  // A failing public call tells every other rank (runtime/failure_notices.h).
  absl::Status Report(absl::Status status);
  void AbortCommunicators(const absl::Status& reason);
  CheckpointScope checkpoint_scope() const;
  std::vector<CheckpointedStage> checkpointed_stages() const;

  absl::Status Build(StageFactory factory);
  absl::Status Execute(const pipeline::Action& action, IterationResult* result);
  // Program[begin, end): a run of sends and receives, posted as one batch.
  absl::Status PostTransfers(const std::vector<pipeline::Action>& program, size_t begin,
                             size_t end);
  // Waits for the received tensors `action` consumes (before its clock starts).
  absl::Status WaitForInputs(const pipeline::Action& action);
  // Waits until this rank's devices have finished the work issued so far: a recorded
  // iteration (record_timeline) does so at its start and after each action, so its timings
  // are the device's (a GPU computes asynchronously to the host, whose clock would otherwise
  // stop when the work is launched) and the simulator is fed what the device spent.
  absl::Status SynchronizeDevices();
  absl::Status OptimizerStep(IterationResult* result);
  // Tied parameters (ParameterView::tied_owner): checks that every member of each group this
  // rank holds lies in a stage of the plan (at Build).
  absl::Status CheckTiedParameters();
  // Sums the gradients of every tied group over its members in this pipeline (the ranks
  // holding them exchange them over the pipeline group; members on one rank add locally), in
  // member order (ParameterView::tied_layers) on every rank so that all end bit-identical,
  // then hands the
  // holding stages' buckets to their synchronisers. At the optimizer step, before the norm.
  absl::Status SumTiedGradients();
  absl::Status ApplyStep(const std::array<double, 3>& sums, IterationResult* result);
  // The result's loss, norm, compute time, clipping coefficient and learning rate from the
  // world's sums.
  void FillStepResult(const std::array<double, 3>& sums, IterationResult* result) const;
  // Every local stage's optimizer step.
  absl::Status StepAll(double lr, double clip_coefficient);
  absl::Status WaitForParameters(Local* local);
  comm::Communicator* payload_p2p() const;
  Local* Find(int replica, int stage);
  absl::Status Fail(const absl::Status& status, int step, const pipeline::Action& action) const;
  void Record(const pipeline::Action& action, double start, double end);
  double Now() const;
  // Tensor parallelism: each local stage's parameters (values and optimizer state) whole,
  // gathered over its group (collective over tensor_group_).
  absl::StatusOr<std::vector<std::vector<ParameterState>>> WholeLocalState();

  pipeline::Plan plan_;
  pipeline::Schedule schedule_;
  // This rank's program reduced to its forwards and their activation transfers, for Evaluate
  // (made at its first call).
  std::vector<pipeline::Action> evaluation_program_;
  EngineOptions options_;
  Clock* clock_ = nullptr;
  comm::Communicator* world_ = nullptr;
  std::unique_ptr<comm::Communicator> control_;  // duplicate of the world: gathers
  std::unique_ptr<comm::Communicator> p2p_;      // pipeline group: transfers (headers)
  std::string device_backend_;                         // DeviceLinks::device_backend
  std::unique_ptr<comm::Communicator> nccl_world_;     // CUDA stages only
  std::unique_ptr<comm::Communicator> nccl_pipeline_;  // CUDA stages: transfer payloads
  int world_rank_ = 0;
  int data_parallel_index_ = 0;
  int pipeline_position_ = 0;
  // Tensor parallelism (plan_.tensor_parallel > 1): this rank's index in its stage's group, the
  // group on MPI (the engine's own gathers), the lane, every rank of the same index, over which
  // the pipelines and gradient groups are built as without it, and what the stages are given
  // (they keep its address: declared before locals_): the MPI group, or with a GPU per rank the
  // group's NCCL communicator.
  int tensor_parallel_index_ = 0;
  std::unique_ptr<comm::Communicator> tensor_group_;
  std::unique_ptr<comm::Communicator> lane_;
  std::unique_ptr<comm::Communicator> nccl_tensor_group_;
  std::unique_ptr<comm::ForwardingCommunicator> stage_tensor_group_;
  // Experts over replicas (options_.expert_replicas > 1): this rank's counterparts on the
  // replicas sharing its experts (the stages' all-to-all), and the same replicas' ranks of
  // this pipeline position (every lane: the checkpoint's gathers of the placed parameters).
  // Declared before locals_, whose stages keep the first's address.
  std::unique_ptr<comm::Communicator> expert_group_;
  std::unique_ptr<comm::Communicator> expert_block_;
  std::vector<std::unique_ptr<Local>> locals_;
  std::unique_ptr<Transfers> transfers_;
  int64_t iteration_ = 0;
  bool step_pending_ = false;
  double epoch_ = 0;
  ChromeTrace timeline_;
  // Keeps MPI progressing while this rank computes (Communicator::KeepProgressing): a peer's
  // transfer then never waits for this rank's next call into MPI.
  std::shared_ptr<void> background_progress_;
  std::unique_ptr<FailureNotices> notices_;  // declared last: its thread uses the members above
};

}  // namespace tandem::runtime
