// The engine under mpirun with emulated-compute stages: every schedule runs to completion with
// the data-flow checksum checked at every stage, losses and parameter updates equal the
// closed-form values, and stashing follows the schedule. Runs with 2 and 4 ranks.
#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/backend.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "pipeline/generators.h"
#include "pipeline/plan.h"
#include "pipeline/torch_csv.h"
#include "runtime/emulated_stage.h"
#include "runtime/timeline.h"
#include "tests/support/delegating_device_ops.h"

namespace tandem::runtime {
namespace {

constexpr int kLayers = 16;
constexpr int64_t kParameters = 10;
constexpr int64_t kActivationElements = 8;
constexpr double kLearningRate = 0.5;

comm::Communicator* World() {
  static comm::Communicator* world = [] {
    auto w = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
    if (!w.ok()) {
      ADD_FAILURE() << w.status();
      return static_cast<comm::Communicator*>(nullptr);
    }
    return w.value().release();
  }();
  return world;
}

struct Case {
  pipeline::ScheduleKind kind;
  int chunks = 1;
  int waves = 1;
  int data_parallel = 1;
  int microbatches = 8;
};

std::string Name(const Case& c) {
  return absl::StrCat(pipeline::ScheduleKindName(c.kind), " D=", c.data_parallel,
                      " m=", c.microbatches);
}

absl::StatusOr<pipeline::Plan> PlanFor(const Case& c, int world_size) {
  pipeline::ScheduleSpec spec;
  spec.kind = c.kind;
  spec.num_ranks = world_size / c.data_parallel;
  spec.num_microbatches = c.microbatches;
  spec.chunks = c.chunks;
  spec.waves = c.waves;
  return pipeline::MakeUniformPlan(kLayers, spec, c.data_parallel, /*microbatch_size=*/1);
}

EmulatedStageOptions EmulatedOptions(const StageSpec& spec, double forward_seconds,
                                     double backward_seconds, double weight_seconds) {
  EmulatedStageOptions o = EmulatedStageOptionsFor(spec);
  o.forward_seconds = forward_seconds;
  o.backward_seconds = backward_seconds;
  o.weight_seconds = weight_seconds;
  o.activation_elements = kActivationElements;
  o.parameter_elements = kParameters;
  return o;
}

StageFactory EmulatedFactory(double forward_seconds, double backward_seconds,
                             double weight_seconds) {
  return [=](const StageSpec& spec) -> absl::StatusOr<std::unique_ptr<Stage>> {
    return std::unique_ptr<Stage>(
        new EmulatedStage(EmulatedOptions(spec, forward_seconds, backward_seconds,
                                          weight_seconds)));
  };
}

// Mean loss of the global batch at `iteration`, from the emulated stage's formula.
double ExpectedLoss(int64_t iteration, int data_parallel, int microbatches) {
  double sum = 0;
  for (int d = 0; d < data_parallel; ++d) {
    for (int m = 0; m < microbatches; ++m) sum += EmulatedStage::LossValue(iteration, d, m);
  }
  return sum / (data_parallel * microbatches);
}

// The synchronised gradient of stage s (every element): summed over the global batch.
double ExpectedGradient(int64_t iteration, int stage, int data_parallel, int microbatches) {
  double sum = 0;
  for (int d = 0; d < data_parallel; ++d) {
    for (int m = 0; m < microbatches; ++m) {
      sum += EmulatedStage::WeightGradientValue(iteration, d, stage, m);
    }
  }
  return sum;
}

EngineOptions SgdOptions(runtime::GradSyncStrategy strategy) {
  EngineOptions o;
  o.grad_sync = strategy;
  o.optimizer = runtime::OptimizerConfig::Sgd(/*momentum=*/0.0);
  o.lr_schedule.base_lr = kLearningRate;
  o.timeout = absl::Seconds(60);
  return o;
}

// Runs `iterations` of a case and checks loss, norm and every local parameter.
// With `schedule`, the engine runs those programs (the plan is made for their spec).
void RunAndCheck(const Case& c, runtime::GradSyncStrategy strategy, int iterations,
                 double clip_norm = 0,
                 std::shared_ptr<const pipeline::Schedule> schedule = nullptr) {
  SCOPED_TRACE(Name(c) + " sync " + runtime::GradSyncStrategyName(strategy));
  comm::Communicator* world = World();
  ASSERT_NE(world, nullptr);
  auto plan = schedule != nullptr
                  ? pipeline::MakeUniformPlan(kLayers, schedule->spec, c.data_parallel,
                                              /*microbatch_size=*/1)
                  : PlanFor(c, world->size());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EngineOptions options = SgdOptions(strategy);
  options.clip_norm = clip_norm;
  options.schedule = std::move(schedule);
  auto engine = Engine::Create(*plan, world, EmulatedFactory(0, 0, 0), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int num_stages = plan->schedule.NumStages();
  std::vector<double> expected_param(num_stages, 1.0);
  for (int it = 0; it < iterations; ++it) {
    auto result = (*engine)->RunIteration();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->iteration, it);
    EXPECT_NEAR(result->loss, ExpectedLoss(it, c.data_parallel, c.microbatches), 1e-9);
    double squared = 0;
    for (int s = 0; s < num_stages; ++s) {
      const double g = ExpectedGradient(it, s, c.data_parallel, c.microbatches);
      squared += kParameters * g * g;
    }
    const double norm = std::sqrt(squared);
    EXPECT_NEAR(result->grad_norm, norm, 1e-6 * norm);
    const double coefficient = clip_norm > 0 ? std::min(1.0, clip_norm / (norm + 1e-6)) : 1.0;
    EXPECT_NEAR(result->clip_coefficient, coefficient, 1e-12);
    for (int s = 0; s < num_stages; ++s) {
      expected_param[s] -= kLearningRate * coefficient *
                           ExpectedGradient(it, s, c.data_parallel, c.microbatches);
    }
  }
  // DeAR leaves the all-gather of the last step in flight: flush first.
  ASSERT_TRUE((*engine)->Flush().ok());
  for (const LocalStageId& id : (*engine)->local_stages()) {
    auto* stage = static_cast<EmulatedStage*>((*engine)->stage(id.replica, id.stage));
    ASSERT_NE(stage, nullptr);
    for (float p : stage->parameters()) {
      EXPECT_NEAR(p, expected_param[id.stage], 1e-5)
          << "stage " << id.stage << " replica " << id.replica;
    }
  }
}

TEST(EngineTest, EverySchedulePipelineOnly) {
  const int p = World()->size();
  std::vector<Case> cases = {
      {pipeline::ScheduleKind::kGPipe},
      {pipeline::ScheduleKind::k1F1B},
      {pipeline::ScheduleKind::kInterleaved, /*chunks=*/2},
      {pipeline::ScheduleKind::kChimera},
      {pipeline::ScheduleKind::kHanayo, 1, /*waves=*/1},
      {pipeline::ScheduleKind::kZBH1},
      {pipeline::ScheduleKind::kZBV},
      {pipeline::ScheduleKind::kDualPipeV},
      // Fewer micro-batches than a multiple of p, and fewer than p.
      {pipeline::ScheduleKind::k1F1B, 1, 1, 1, /*microbatches=*/p + 1},
      {pipeline::ScheduleKind::kInterleaved, 2, 1, 1, /*microbatches=*/p + 2},
  };
  // DualPipe: an even number of ranks.
  if (p % 2 == 0) cases.push_back({pipeline::ScheduleKind::kDualPipe});
  for (const Case& c : cases) RunAndCheck(c, runtime::GradSyncStrategy::kAllReduce, 2);
}

// Programs given explicitly (EngineOptions::schedule) run like generated ones: a custom
// schedule (the kind a torch CSV reads as) with ZB-V's programs, and one with interleaved's.
TEST(EngineTest, ExplicitProgramsRunLikeGeneratedOnes) {
  const int p = World()->size();
  for (bool wave : {true, false}) {
    pipeline::ScheduleSpec generated_spec;
    generated_spec.kind =
        wave ? pipeline::ScheduleKind::kZBV : pipeline::ScheduleKind::kInterleaved;
    generated_spec.num_ranks = p;
    generated_spec.num_microbatches = 8;
    generated_spec.chunks = 2;
    auto generated = pipeline::GenerateSchedule(generated_spec);
    ASSERT_TRUE(generated.ok()) << generated.status();
    pipeline::Schedule custom = *generated;
    custom.spec.kind = pipeline::ScheduleKind::kCustom;
    custom.spec.wave_placement = wave;
    Case c{pipeline::ScheduleKind::kCustom, /*chunks=*/2};
    RunAndCheck(c, runtime::GradSyncStrategy::kAllReduce, 2, /*clip_norm=*/0,
                std::make_shared<const pipeline::Schedule>(custom));
  }
}

// Schedules written by torch.distributed.pipelining (tests/data/torch_schedules), both forms,
// for this world size: losses and parameters equal the closed form.
TEST(EngineTest, TorchWrittenSchedulesRun) {
  const int p = World()->size();
  const std::string here = __FILE__;
  const std::string data = here.substr(0, here.rfind('/')) + "/../data/torch_schedules/";
  int ran = 0;
  for (const char* name :
       {"interleaved1f1b_p2_m6", "loopedbfs_p2_m4", "zbv_p2_m4", "interleaved1f1b_p4_m8",
        "interleavedzb_p4_m8", "zbv_p4_m8", "dualpipev_p4_m8"}) {
    for (const char* suffix : {".csv", "_comms.csv"}) {
      auto schedule = pipeline::ReadTorchCsvSchedule(data + name + suffix);
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      if (schedule->spec.num_ranks != p) continue;
      SCOPED_TRACE(std::string(name) + suffix);
      Case c{pipeline::ScheduleKind::kCustom, schedule->spec.chunks, 1, 1,
             schedule->spec.num_microbatches};
      RunAndCheck(c, runtime::GradSyncStrategy::kAllReduce, 2, /*clip_norm=*/0,
                  std::make_shared<const pipeline::Schedule>(*std::move(schedule)));
      ++ran;
    }
  }
  if (p == 2 || p == 4) EXPECT_GE(ran, 6);
}

TEST(EngineTest, ExplicitProgramsMustBeThePlansSchedule) {
  comm::Communicator* world = World();
  ASSERT_NE(world, nullptr);
  auto plan = PlanFor({pipeline::ScheduleKind::k1F1B}, world->size());
  ASSERT_TRUE(plan.ok()) << plan.status();
  pipeline::ScheduleSpec other = plan->schedule;
  other.kind = pipeline::ScheduleKind::kGPipe;
  auto gpipe = pipeline::GenerateSchedule(other);
  ASSERT_TRUE(gpipe.ok());
  EngineOptions options = SgdOptions(runtime::GradSyncStrategy::kAllReduce);
  options.schedule = std::make_shared<const pipeline::Schedule>(*gpipe);
  auto engine = Engine::Create(*plan, world, EmulatedFactory(0, 0, 0), options);
  ASSERT_FALSE(engine.ok());
  EXPECT_TRUE(absl::StrContains(engine.status().message(), "is not the plan's"))
      << engine.status();
}

TEST(EngineTest, DataParallelTimesPipeline) {
  if (World()->size() < 4) GTEST_SKIP() << "needs 4 ranks";
  std::vector<Case> cases = {
      {pipeline::ScheduleKind::k1F1B, 1, 1, /*data_parallel=*/2},
      {pipeline::ScheduleKind::kChimera, 1, 1, 2},
      {pipeline::ScheduleKind::kInterleaved, 2, 1, 2},
      {pipeline::ScheduleKind::kZBH1, 1, 1, 2},
      {pipeline::ScheduleKind::kGPipe, 1, 1, /*data_parallel=*/4},
  };
  for (const Case& c : cases) {
    RunAndCheck(c, runtime::GradSyncStrategy::kAllReduce, 2);
    RunAndCheck(c, runtime::GradSyncStrategy::kDeAR, 2);
  }
}

TEST(EngineTest, DearMatchesClosedForm) {
  RunAndCheck({pipeline::ScheduleKind::k1F1B}, runtime::GradSyncStrategy::kDeAR, 3);
  RunAndCheck({pipeline::ScheduleKind::kChimera}, runtime::GradSyncStrategy::kDeAR, 3);
}

TEST(EngineTest, ClippingUsesTheGlobalNorm) {
  // A clip norm well below the gradient norm: every stage is scaled by the same coefficient.
  RunAndCheck({pipeline::ScheduleKind::k1F1B}, runtime::GradSyncStrategy::kAllReduce, 2,
              /*clip_norm=*/0.01);
  RunAndCheck({pipeline::ScheduleKind::kInterleaved, 2}, runtime::GradSyncStrategy::kDeAR, 2,
              /*clip_norm=*/0.01);
}

TEST(EngineTest, StashingFollowsTheSchedule) {
  comm::Communicator* world = World();
  const int p = world->size();
  constexpr int kMicrobatches = 8;
  for (auto kind : {pipeline::ScheduleKind::kGPipe, pipeline::ScheduleKind::k1F1B}) {
    Case c{kind};
    c.microbatches = kMicrobatches;
    auto plan = PlanFor(c, p);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto engine = Engine::Create(*plan, world, EmulatedFactory(0, 0, 0),
                                 SgdOptions(runtime::GradSyncStrategy::kAllReduce));
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->RunIteration().ok());
    const int q = (*engine)->pipeline_position();
    auto* stage = static_cast<EmulatedStage*>((*engine)->stage(0, q));
    ASSERT_NE(stage, nullptr);
    // GPipe stashes every micro-batch; 1F1B at most p - q on position q.
    const int expected =
        kind == pipeline::ScheduleKind::kGPipe ? kMicrobatches : std::min(kMicrobatches, p - q);
    EXPECT_EQ(stage->peak_stashed_microbatches(), expected)
        << pipeline::ScheduleKindName(kind) << " position " << q;
    EXPECT_EQ(stage->stashed_microbatches(), 0);
  }
}

TEST(EngineTest, TimingsAndTimelineCoverEveryAction) {
  comm::Communicator* world = World();
  auto plan = PlanFor({pipeline::ScheduleKind::k1F1B}, world->size());
  ASSERT_TRUE(plan.ok());
  EngineOptions options = SgdOptions(runtime::GradSyncStrategy::kAllReduce);
  options.record_timeline = true;
  constexpr double kForward = 0.004;
  constexpr double kBackward = 0.008;
  auto engine = Engine::Create(*plan, world, EmulatedFactory(kForward, kBackward, 0), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto result = (*engine)->RunIteration();
  ASSERT_TRUE(result.ok()) << result.status();
  const auto& program = (*engine)->schedule().programs[(*engine)->pipeline_position()];
  ASSERT_EQ(result->timings.size(), program.size());
  int forwards = 0;
  for (const ActionTiming& t : result->timings) {
    EXPECT_LE(t.start_seconds, t.end_seconds);
    if (t.action.type == pipeline::ActionType::kForward) {
      ++forwards;
      EXPECT_GE(t.end_seconds - t.start_seconds, kForward * 0.9);
    }
  }
  EXPECT_EQ(forwards, plan->schedule.num_microbatches);
  EXPECT_GE(result->compute_seconds, 8 * (kForward + kBackward) * 0.9);
  EXPECT_GT(result->bubble_ratio, 0.0);
  EXPECT_LT(result->bubble_ratio, 1.0);
  EXPECT_EQ((*engine)->timeline().events().size(), program.size());
  auto merged = (*engine)->GatherTimeline();
  ASSERT_TRUE(merged.ok()) << merged.status();
  int64_t total = 0;
  for (int q = 0; q < world->size(); ++q) total += (*engine)->schedule().programs[q].size();
  if (world->rank() == 0) EXPECT_EQ(static_cast<int64_t>(merged->events().size()), total);
  // The measured costs feed the simulator; its prediction lands beside the measurement.
  auto timings = (*engine)->GatherTimings(result->timings);
  ASSERT_TRUE(timings.ok()) << timings.status();
  if (world->rank() == 0) {
    ASSERT_EQ(static_cast<int>(timings->size()), world->size());
    for (int q = 0; q < world->size(); ++q) {
      EXPECT_EQ((*timings)[q].size(), (*engine)->schedule().programs[q].size()) << "rank " << q;
    }
    auto costs = MeasuredCosts(*timings, plan->schedule);
    ASSERT_TRUE(costs.ok()) << costs.status();
    EXPECT_GE(costs->stages[0].forward_seconds, kForward * 0.9);
    EXPECT_GE(costs->stages[0].backward_seconds, kBackward * 0.9);
    EXPECT_GT(costs->optimizer_seconds, 0.0);  // the iteration's tail is measured too
    auto range = IterationRange(*timings);
    ASSERT_TRUE(range.ok());
    // The simulator with the measured costs predicts the measured iteration (a loose sanity
    // bound on a shared machine; the figure itself is runtime_emulated_bench's).
    const double measured = range->end_seconds - range->start_seconds;
    auto simulated = pipeline::Simulate((*engine)->schedule(), *costs);
    ASSERT_TRUE(simulated.ok());
    EXPECT_NEAR(simulated->makespan_seconds / measured, 1.0, 0.5);
    auto predicted = AddPrediction((*engine)->schedule(), *costs, range->start_seconds,
                                   &*merged);
    ASSERT_TRUE(predicted.ok()) << predicted.status();
    EXPECT_GT(predicted->makespan_seconds, (kForward + kBackward) * 8 * 0.9);
    EXPECT_GT(static_cast<int64_t>(merged->events().size()), total);
  } else {
    EXPECT_TRUE(merged->events().empty());
  }
}

// A stage on an emulated asynchronous device: Forward and Backward launch work that takes the
// device `seconds` and return at once, as a GPU stage does; Synchronize waits for it.
class AsyncDeviceOps final : public DelegatingDeviceOps {
 public:
  void Launch(double seconds) {
    const absl::Time now = absl::Now();
    busy_until_ = std::max(busy_until_, now) + absl::Seconds(seconds);
  }
  absl::Status Synchronize() override {
    ++synchronizations;
    absl::SleepFor(busy_until_ - absl::Now());
    return absl::OkStatus();
  }
  int synchronizations = 0;

 private:
  absl::Time busy_until_ = absl::InfinitePast();
};

class AsyncEmulatedStage final : public EmulatedStage {
 public:
  AsyncEmulatedStage(const EmulatedStageOptions& options, double forward, double backward)
      : EmulatedStage(options), forward_(forward), backward_(backward) {}
  absl::StatusOr<std::vector<Tensor>> Forward(int microbatch,
                                              std::vector<Tensor> inputs) override {
    ops_.Launch(forward_);
    return EmulatedStage::Forward(microbatch, std::move(inputs));
  }
  absl::StatusOr<std::vector<Tensor>> Backward(int microbatch,
                                               std::vector<Tensor> output_grads) override {
    ops_.Launch(backward_);
    return EmulatedStage::Backward(microbatch, std::move(output_grads));
  }
  DeviceOps* device_ops() override { return &ops_; }

 private:
  double forward_, backward_;
  AsyncDeviceOps ops_;
};

// A recorded iteration times what the device spends, not the launch: with the timeline on,
// each forward's timing covers its device time; without it, a forward returns when launched.
TEST(EngineTest, RecordedIterationsTimeTheDevicesWork) {
  comm::Communicator* world = World();
  auto plan = PlanFor({pipeline::ScheduleKind::k1F1B}, world->size());
  ASSERT_TRUE(plan.ok());
  constexpr double kForward = 0.004;
  constexpr double kBackward = 0.008;
  for (bool record : {false, true}) {
    EngineOptions options = SgdOptions(runtime::GradSyncStrategy::kAllReduce);
    options.record_timeline = record;
    // The host's part takes no time; the device's is launched and waited for.
    auto factory = [&](const StageSpec& spec) -> absl::StatusOr<std::unique_ptr<Stage>> {
      return std::unique_ptr<Stage>(
          new AsyncEmulatedStage(EmulatedOptions(spec, 0, 0, 0), kForward, kBackward));
    };
    auto engine = Engine::Create(*plan, world, factory, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto result = (*engine)->RunIteration();
    ASSERT_TRUE(result.ok()) << result.status();
    double slowest_forward = 0;
    for (const ActionTiming& t : result->timings) {
      if (t.action.type == pipeline::ActionType::kForward) {
        slowest_forward = std::max(slowest_forward, t.end_seconds - t.start_seconds);
      }
    }
    if (record) {
      EXPECT_GE(slowest_forward, kForward * 0.9);
      EXPECT_GE(result->compute_seconds, 8 * (kForward + kBackward) * 0.9);
    } else {
      EXPECT_LT(slowest_forward, kForward * 0.5);  // launched, not finished
    }
  }
}

// Records the order of the optimizer step and of the reads of the norm and the loss, as a
// device whose norm and loss travel to the host asynchronously would see them.
class StepOrderDeviceOps final : public DelegatingDeviceOps {
 public:
  explicit StepOrderDeviceOps(std::vector<std::string>* log) : log_(log) {}
  absl::StatusOr<double> TakeSquaredNorm() override {
    log_->push_back("take norm");
    return DelegatingDeviceOps::TakeSquaredNorm();
  }
  absl::StatusOr<bool> StartTakingSquaredNorm() override {
    log_->push_back("start norm");
    return true;  // one stage a rank here: the CPU loops' running norm is this stage's alone
  }
  absl::StatusOr<std::unique_ptr<DeviceOptimizer>> NewOptimizer(
      const OptimizerConfig& config, std::vector<int64_t> counts) override {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DeviceOptimizer> inner,
                            DelegatingDeviceOps::NewOptimizer(config, std::move(counts)));
    return std::unique_ptr<DeviceOptimizer>(new Logged(std::move(inner), log_));
  }

 private:
  class Logged final : public DeviceOptimizer {
   public:
    Logged(std::unique_ptr<DeviceOptimizer> inner, std::vector<std::string>* log)
        : inner_(std::move(inner)), log_(log) {}
    absl::Status Step(int first_span, absl::Span<float* const> params,
                      absl::Span<float* const> grads, double lr, double grad_scale) override {
      log_->push_back("step");
      return inner_->Step(first_span, params, grads, lr, grad_scale);
    }
    const std::vector<int64_t>& counts() const override { return inner_->counts(); }
    int64_t steps() const override { return inner_->steps(); }
    void set_steps(int64_t steps) override { inner_->set_steps(steps); }
    std::vector<std::string> BufferNames() const override { return inner_->BufferNames(); }
    absl::StatusOr<float*> StateBuffer(int span, absl::string_view name, bool create) override {
      return inner_->StateBuffer(span, name, create);
    }
    absl::Status ResetStateBuffer(int span, absl::string_view name) override {
      return inner_->ResetStateBuffer(span, name);
    }

   private:
    std::unique_ptr<DeviceOptimizer> inner_;
    std::vector<std::string>* log_;
  };
  std::vector<std::string>* log_;
};

class StepOrderStage final : public EmulatedStage {
 public:
  explicit StepOrderStage(const EmulatedStageOptions& options)
      : EmulatedStage(options), ops_(&log) {}
  absl::Status StartReadingIterationLoss() override {
    log.push_back("start loss");
    return absl::OkStatus();
  }
  double IterationLoss() const override {
    log.push_back("read loss");
    return EmulatedStage::IterationLoss();
  }
  DeviceOps* device_ops() override { return &ops_; }
  mutable std::vector<std::string> log;

 private:
  StepOrderDeviceOps ops_;
};

// Without clipping the step does not need the norm: it is queued before the loss and the norm
// are read (a GPU computes it while they travel to the host). With clipping the reads come
// first. Loss and norm are the same either way.
TEST(EngineTest, WithoutClippingTheStepIsQueuedBeforeTheLossAndNormAreRead) {
  comm::Communicator* world = World();
  auto plan = PlanFor({pipeline::ScheduleKind::k1F1B}, world->size());
  ASSERT_TRUE(plan.ok());
  std::vector<double> losses, norms;
  for (double clip : {0.0, 1e9}) {
    EngineOptions options = SgdOptions(runtime::GradSyncStrategy::kAllReduce);
    options.clip_norm = clip;  // 1e9: clipping on, never binding
    StepOrderStage* stage = nullptr;
    bool last_stage = false;
    auto factory = [&](const StageSpec& spec) -> absl::StatusOr<std::unique_ptr<Stage>> {
      auto made = std::make_unique<StepOrderStage>(EmulatedOptions(spec, 0, 0, 0));
      stage = made.get();
      last_stage = spec.is_last();
      return std::unique_ptr<Stage>(std::move(made));
    };
    auto engine = Engine::Create(*plan, world, factory, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_NE(stage, nullptr);
    auto result = (*engine)->RunIteration();
    ASSERT_TRUE(result.ok()) << result.status();
    losses.push_back(result->loss);
    norms.push_back(result->grad_norm);
    const std::vector<std::string>& log = stage->log;
    const auto step = std::find(log.begin(), log.end(), "step");
    ASSERT_NE(step, log.end()) << absl::StrJoin(log, ", ");
    const auto last_take = std::find(log.rbegin(), log.rend(), "take norm");
    ASSERT_NE(last_take, log.rend()) << absl::StrJoin(log, ", ");
    const bool norm_after_step = last_take.base() - 1 > step;
    EXPECT_EQ(norm_after_step, clip == 0) << absl::StrJoin(log, ", ");
    const auto read = std::find(log.begin(), log.end(), "read loss");
    EXPECT_EQ(read != log.end(), last_stage) << absl::StrJoin(log, ", ");
    if (last_stage) EXPECT_EQ(read > step, clip == 0) << absl::StrJoin(log, ", ");
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(norms[0], norms[1]);
  EXPECT_GT(norms[0], 0);
}

TEST(EngineTest, PlanForAnotherWorldSizeFailsOnEveryRank) {
  comm::Communicator* world = World();
  Case c{pipeline::ScheduleKind::k1F1B};
  auto plan = PlanFor(c, world->size() * 2);
  ASSERT_TRUE(plan.ok());
  auto engine = Engine::Create(*plan, world, EmulatedFactory(0, 0, 0),
                               SgdOptions(runtime::GradSyncStrategy::kAllReduce));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
  EXPECT_NE(engine.status().message().find("this run has"), std::string::npos)
      << engine.status();
}

TEST(EngineTest, FactoryFailureOnOneRankFailsEveryRank) {
  comm::Communicator* world = World();
  auto plan = PlanFor({pipeline::ScheduleKind::k1F1B}, world->size());
  ASSERT_TRUE(plan.ok());
  StageFactory good = EmulatedFactory(0, 0, 0);
  StageFactory factory = [&](const StageSpec& spec) -> absl::StatusOr<std::unique_ptr<Stage>> {
    if (spec.stage == 1) return absl::InvalidArgumentError("stage 1 cannot be built");
    return good(spec);
  };
  auto engine = Engine::Create(*plan, world, factory,
                               SgdOptions(runtime::GradSyncStrategy::kAllReduce));
  ASSERT_FALSE(engine.ok());
  if (world->rank() == 1) {
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
  } else {
    // The failing rank's code everywhere: bad input exits 2 on every rank.
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
    EXPECT_NE(engine.status().message().find("rank 1"), std::string::npos) << engine.status();
  }
}

}  // namespace
}  // namespace tandem::runtime
