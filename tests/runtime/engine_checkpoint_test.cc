// Engine checkpoints under mpirun with emulated stages: resuming gives the same parameters as
// an uninterrupted run (optimizer state included), and missing, corrupt or mismatched
// checkpoints fail on every rank with a clear error.
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "pipeline/plan.h"
#include "runtime/checkpoint.h"
#include "runtime/emulated_stage.h"
#include "runtime/engine.h"

namespace tandem::runtime {
namespace {

constexpr int kLayers = 8;
constexpr int64_t kParameters = 12;
constexpr char kModel[] = "emulated L=8";

comm::Communicator* World() {
  static comm::Communicator* world = [] {
    auto w = comm::CreateWorldCommunicator(comm::BackendKind::kMpi);
    if (!w.ok()) {
      ADD_FAILURE() << w.status();
      return static_cast<comm::Communicator*>(nullptr);
    }
    (*w)->set_timeout(absl::Seconds(60));
    return w.value().release();
  }();
  return world;
}

// A fresh folder made by rank 0, its name broadcast to every rank.
std::string SharedTempDir() {
  char path[256] = {};
  if (World()->rank() == 0) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "tandem_engine_ckpt_XXXXXX").string();
    std::strncpy(path, pattern.c_str(), sizeof(path) - 1);
    if (mkdtemp(path) == nullptr) ADD_FAILURE() << "mkdtemp failed";
  }
  comm::Buffer b;
  b.data = path;
  b.count = sizeof(path);
  b.dtype = comm::DataType::kUInt8;
  EXPECT_TRUE(World()->Broadcast(b, /*root=*/0)->Wait().ok());
  return path;
}

StageFactory Factory() {
  return [](const StageSpec& spec) -> absl::StatusOr<std::unique_ptr<Stage>> {
    EmulatedStageOptions o = EmulatedStageOptionsFor(spec);
    o.activation_elements = 4;
    o.parameter_elements = kParameters;
    return std::unique_ptr<Stage>(new EmulatedStage(o));
  };
}

pipeline::Plan MakePlan(pipeline::ScheduleKind kind, int data_parallel) {
  pipeline::ScheduleSpec spec;
  spec.kind = kind;
  spec.num_ranks = World()->size() / data_parallel;
  spec.num_microbatches = 4;
  auto plan = pipeline::MakeUniformPlan(kLayers, spec, data_parallel, 1);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

EngineOptions Options(runtime::OptimizerConfig optimizer, runtime::GradSyncStrategy sync) {
  EngineOptions o;
  o.optimizer = optimizer;
  o.grad_sync = sync;
  o.lr_schedule.base_lr = 0.05;
  o.lr_schedule.warmup_steps = 2;
  o.timeout = absl::Seconds(60);
  return o;
}

// Parameters of every local stage, flattened in local-stage order.
std::vector<float> LocalParameters(Engine& engine) {
  std::vector<float> out;
  for (const LocalStageId& id : engine.local_stages()) {
    auto* stage = static_cast<EmulatedStage*>(engine.stage(id.replica, id.stage));
    out.insert(out.end(), stage->parameters().begin(), stage->parameters().end());
  }
  return out;
}

void ResumeMatchesUninterrupted(pipeline::ScheduleKind kind, int data_parallel,
                                runtime::OptimizerConfig optimizer, runtime::GradSyncStrategy sync) {
  SCOPED_TRACE(absl::StrCat(pipeline::ScheduleKindName(kind), " D=", data_parallel, " ",
                            runtime::OptimizerName(optimizer.kind), " ",
                            runtime::GradSyncStrategyName(sync)));
  const std::string dir = SharedTempDir();
  const pipeline::Plan plan = MakePlan(kind, data_parallel);
  constexpr int kBefore = 3;
  constexpr int kAfter = 3;

  auto full = Engine::Create(plan, World(), Factory(), Options(optimizer, sync));
  ASSERT_TRUE(full.ok()) << full.status();
  for (int i = 0; i < kBefore; ++i) {
    auto r = (*full)->RunIteration();
    ASSERT_TRUE(r.ok()) << r.status();
  }
  ASSERT_TRUE((*full)->SaveCheckpoint(dir, kModel).ok());
  std::vector<double> losses;
  for (int i = 0; i < kAfter; ++i) {
    auto r = (*full)->RunIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss);
  }
  ASSERT_TRUE((*full)->Flush().ok());
  const std::vector<float> expected = LocalParameters(**full);

  auto resumed = Engine::Create(plan, World(), Factory(), Options(optimizer, sync));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  absl::Status loaded = (*resumed)->LoadCheckpoint(dir, kModel);
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ((*resumed)->iteration(), kBefore);
  for (int i = 0; i < kAfter; ++i) {
    auto r = (*resumed)->RunIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->iteration, kBefore + i);
    EXPECT_DOUBLE_EQ(r->loss, losses[i]);
  }
  ASSERT_TRUE((*resumed)->Flush().ok());
  const std::vector<float> got = LocalParameters(**resumed);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "element " << i;

  // The shards carry the optimizer state (a resume that dropped it would step from a zero
  // momentum / moment estimate and miss the parameters above).
  auto folder = ResolveCheckpoint(dir);
  ASSERT_TRUE(folder.ok()) << folder.status();
  auto manifest = ReadManifest(*folder);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  auto shard = ReadShard(*folder, *manifest->FindShard(0, 0));
  ASSERT_TRUE(shard.ok()) << shard.status();
  const char* buffer =
      optimizer.kind == runtime::OptimizerKind::kAdamW ? "exp_avg" : "momentum_buffer";
  bool found = false;
  for (const ShardTensor& t : shard->tensors) {
    if (t.name.find(buffer) != std::string::npos && t.count == kParameters) found = true;
  }
  EXPECT_TRUE(found) << "no " << buffer << " in the shard of stage 0";
  EXPECT_TRUE(World()->Barrier()->Wait().ok());
  if (World()->rank() == 0) tandem::RemoveAll(dir).IgnoreError();
}

TEST(EngineCheckpointTest, ResumeMatchesUninterruptedSgdMomentum) {
  ResumeMatchesUninterrupted(pipeline::ScheduleKind::k1F1B, 1, runtime::OptimizerConfig::Sgd(0.9),
                             runtime::GradSyncStrategy::kAllReduce);
}

TEST(EngineCheckpointTest, ResumeMatchesUninterruptedAdamWDear) {
  const int dp = World()->size() >= 4 ? 2 : 1;
  ResumeMatchesUninterrupted(pipeline::ScheduleKind::k1F1B, dp, runtime::OptimizerConfig::AdamW(),
                             runtime::GradSyncStrategy::kDeAR);
  ResumeMatchesUninterrupted(pipeline::ScheduleKind::kChimera, 1, runtime::OptimizerConfig::AdamW(),
                             runtime::GradSyncStrategy::kAllReduce);
}

// The elastic layer's state move: ExportState from one engine, ImportState into a fresh one at
// the same iteration continues exactly as the first (parameters and optimizer state).
TEST(EngineStateTest, ExportImportContinuesExactly) {
  const pipeline::Plan plan = MakePlan(pipeline::ScheduleKind::k1F1B, 1);
  const EngineOptions options =
      Options(runtime::OptimizerConfig::AdamW(), runtime::GradSyncStrategy::kAllReduce);
  auto first = Engine::Create(plan, World(), Factory(), options);
  ASSERT_TRUE(first.ok()) << first.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*first)->RunIteration().ok());
  EXPECT_FALSE((*first)->step_pending());
  // No step waits to be applied after a complete iteration.
  EXPECT_EQ((*first)->ApplyCommittedStep({0, 0, 0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto state = (*first)->ExportState();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_FALSE(state->empty());
  for (const ParameterState& p : *state) {
    EXPECT_EQ(p.optimizer.steps, 3) << p.name;
    EXPECT_FALSE(p.optimizer.buffers.empty()) << p.name;
  }

  // The first engine goes on alone; the second is made after it is gone (one engine at a time).
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i) {
    auto r = (*first)->RunIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss);
  }
  ASSERT_TRUE((*first)->Flush().ok());
  const std::vector<float> expected = LocalParameters(**first);
  const int64_t resume_at = (*first)->iteration() - 3;
  first->reset();

  auto second = Engine::Create(plan, World(), Factory(), options);
  ASSERT_TRUE(second.ok()) << second.status();
  // A missing parameter is refused, naming it.
  std::vector<ParameterState> partial(state->begin() + 1, state->end());
  absl::Status refused = (*second)->ImportState(partial);
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  ASSERT_TRUE((*second)->ImportState(*state).ok());
  (*second)->set_iteration(resume_at);
  for (int i = 0; i < 3; ++i) {
    auto r = (*second)->RunIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->iteration, resume_at + i);
    EXPECT_DOUBLE_EQ(r->loss, losses[i]);
  }
  ASSERT_TRUE((*second)->Flush().ok());
  EXPECT_EQ(LocalParameters(**second), expected);
}

class EngineCheckpointErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = SharedTempDir();
    plan_ = MakePlan(pipeline::ScheduleKind::k1F1B, 1);
    auto engine = Engine::Create(plan_, World(), Factory(),
                                 Options(runtime::OptimizerConfig::Sgd(0.9),
                                         runtime::GradSyncStrategy::kAllReduce));
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->RunIteration().ok());
    ASSERT_TRUE((*engine)->SaveCheckpoint(dir_, kModel).ok());
    auto folder = ResolveCheckpoint(dir_);
    ASSERT_TRUE(folder.ok()) << folder.status();
    step_dir_ = *folder;
    EXPECT_EQ(step_dir_, dir_ + "/" + StepFolderName(1));
  }
  void TearDown() override {
    EXPECT_TRUE(World()->Barrier()->Wait().ok());
    if (World()->rank() == 0) tandem::RemoveAll(dir_).IgnoreError();
  }
  absl::Status Load(const std::string& dir, const std::string& model,
                    runtime::OptimizerConfig optimizer = runtime::OptimizerConfig::Sgd(0.9)) {
    auto engine = Engine::Create(plan_, World(), Factory(),
                                 Options(optimizer, runtime::GradSyncStrategy::kAllReduce));
    EXPECT_TRUE(engine.ok()) << engine.status();
    return (*engine)->LoadCheckpoint(dir, model);
  }
  // Rank 0 changes the checkpoint; everyone waits for it.
  template <typename F>
  void OnRankZero(F change) {
    if (World()->rank() == 0) change();
    EXPECT_TRUE(World()->Barrier()->Wait().ok());
  }

  std::string dir_;       // the checkpoint root
  std::string step_dir_;  // its step folder of the save in SetUp
  pipeline::Plan plan_;
};

TEST_F(EngineCheckpointErrorTest, CompleteCheckpointLoads) {
  EXPECT_TRUE(Load(dir_, kModel).ok());
}

TEST_F(EngineCheckpointErrorTest, MissingFolderFailsEveryRank) {
  absl::Status s = Load(dir_ + "/nonexistent", kModel);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("manifest.json"), std::string::npos) << s;
}

TEST_F(EngineCheckpointErrorTest, HalfWrittenCheckpointIsNotLoaded) {
  // A save that crashed after its shards: no manifest.
  OnRankZero([&] { ASSERT_TRUE(RemoveManifest(step_dir_).ok()); });
  EXPECT_EQ(Load(dir_, kModel).code(), absl::StatusCode::kNotFound);
}

TEST_F(EngineCheckpointErrorTest, CorruptShardFailsItsRanksAndTheOthersWithItsCode) {
  OnRankZero([&] {
    const std::string path = step_dir_ + "/" + ShardFileName(1, 0, 1);
    auto contents = ReadFile(path);
    ASSERT_TRUE(contents.ok());
    (*contents)[contents->size() - 2] ^= 0x10;
    ASSERT_TRUE(WriteFileAtomically(path, *contents).ok());
  });
  absl::Status s = Load(dir_, kModel);
  if (World()->rank() == 1) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("checksum"), std::string::npos) << s;
  } else {
    // Every rank exits as the failing one does (bad input: exit 2 everywhere).
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  }
}

// Every parameter's shape is recorded (the emulated stage's flat one); a recorded shape that
// does not fit the stage's parameter is refused naming both, even with the right element count.
TEST_F(EngineCheckpointErrorTest, ShapesAreRecordedAndAnotherShapeIsRefused) {
  const std::string file = ShardFileName(1, 0, 1);
  OnRankZero([&] {
    auto manifest = ReadManifest(step_dir_);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    auto shard = ReadShard(step_dir_, *manifest->FindShard(1, 0));
    ASSERT_TRUE(shard.ok()) << shard.status();
    const ShardTensor* weight = shard->Find("param:stage1.weight");
    ASSERT_NE(weight, nullptr);
    ASSERT_EQ(weight->shape, std::vector<int64_t>{weight->count});
    ASSERT_EQ(weight->count % 2, 0);
    for (ShardTensor& t : shard->tensors) {
      if (t.name == "param:stage1.weight") t.shape = {2, t.count / 2};
    }
    auto record = WriteShard(step_dir_, *shard);
    ASSERT_TRUE(record.ok()) << record.status();
    for (ShardRecord& r : manifest->shards) {
      if (r.stage == 1) r = *record;
    }
    ASSERT_TRUE(WriteManifest(step_dir_, *manifest).ok());
  });
  absl::Status s = Load(dir_, kModel);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  if (World()->rank() == 1) {
    EXPECT_NE(s.message().find("'stage1.weight' has shape [2, "), std::string::npos) << s;
  }
}

TEST_F(EngineCheckpointErrorTest, MissingShardNamesTheFile) {
  OnRankZero([&] { std::filesystem::remove(step_dir_ + "/" + ShardFileName(0, 0, 1)); });
  absl::Status s = Load(dir_, kModel);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(ShardFileName(0, 0, 1)), std::string::npos) << s;
}

// A save interrupted at any moment (here: its partial folder half written, a temporary file
// left beside it) leaves the previous checkpoint loadable; the next save cleans up, switches
// `latest` and keeps the newest two step folders.
TEST_F(EngineCheckpointErrorTest, InterruptedSaveLeavesThePreviousCheckpointLoadable) {
  const std::string partial = dir_ + "/" + PartialFolderName(2);
  const std::string stray = dir_ + "/" + ShardFileName(0, 0, 1) + ".tmp.12345";
  OnRankZero([&] {
    ASSERT_TRUE(EnsureDirectory(partial).ok());
    ASSERT_TRUE(WriteFileAtomically(partial + "/" + ShardFileName(0, 0, 1), "half").ok());
    ASSERT_TRUE(WriteFileAtomically(stray, "half").ok());
  });
  {
    auto engine = Engine::Create(plan_, World(), Factory(),
                                 Options(runtime::OptimizerConfig::Sgd(0.9),
                                         runtime::GradSyncStrategy::kAllReduce));
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->LoadCheckpoint(dir_, kModel).ok());
    EXPECT_EQ((*engine)->iteration(), 1);
    for (int step = 2; step <= 4; ++step) {
      ASSERT_TRUE((*engine)->RunIteration().ok());
      ASSERT_TRUE((*engine)->SaveCheckpoint(dir_, kModel).ok());
    }
  }
  EXPECT_FALSE(std::filesystem::exists(partial));
  EXPECT_FALSE(std::filesystem::exists(stray));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/" + StepFolderName(2)));  // pruned (keep 2)
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/" + StepFolderName(3)));
  auto latest = ResolveCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, dir_ + "/" + StepFolderName(4));
  auto engine = Engine::Create(plan_, World(), Factory(),
                               Options(runtime::OptimizerConfig::Sgd(0.9),
                                       runtime::GradSyncStrategy::kAllReduce));
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->LoadCheckpoint(dir_, kModel).ok());
  EXPECT_EQ((*engine)->iteration(), 4);
  // A step folder given directly loads that step.
  auto older = Engine::Create(plan_, World(), Factory(),
                              Options(runtime::OptimizerConfig::Sgd(0.9),
                                      runtime::GradSyncStrategy::kAllReduce));
  ASSERT_TRUE(older.ok());
  ASSERT_TRUE((*older)->LoadCheckpoint(dir_ + "/" + StepFolderName(3), kModel).ok());
  EXPECT_EQ((*older)->iteration(), 3);
}

TEST_F(EngineCheckpointErrorTest, LatestNamingSomethingElseIsRefused) {
  OnRankZero([&] {
    ASSERT_TRUE(WriteFileAtomically(dir_ + "/" + kLatestFileName, "../../etc\n").ok());
  });
  absl::Status s = Load(dir_, kModel);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("latest"), std::string::npos) << s;
}

TEST_F(EngineCheckpointErrorTest, OtherModelOrOptimizerIsRejected) {
  absl::Status s = Load(dir_, "another model");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("another model"), std::string::npos) << s;
  s = Load(dir_, kModel, runtime::OptimizerConfig::AdamW());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("adamw"), std::string::npos) << s;
}

}  // namespace
}  // namespace tandem::runtime
