// DeAR against the plain bucketed all-reduce (and both against a sequential reference that
// averages every rank's gradient itself), under mpirun with 2, 3 and 4 ranks.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "comm/buffer.h"
#include "runtime/grad_sync.h"
#include "tests/support/delegating_device_ops.h"
#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

using namespace ::tandem::comm;  // Buffer, Communicator and the MPI backend

constexpr int kSteps = 20;
constexpr double kRelativeTolerance = 1e-6;
// Parameter sizes in backward order (odd sizes, one larger than small buckets, a scalar).
const std::vector<int64_t> kSizes = {1000, 37, 4096, 1, 513, 20000, 3};

Communicator& World() {
  static std::unique_ptr<Communicator> world = [] {
    CommOptions options;
    options.timeout = absl::Seconds(60);
    auto created = CreateWorldCommunicator(BackendKind::kMpi, options);
    if (!created.ok()) std::abort();
    return std::move(created).value();
  }();
  return *world;
}

// A model's parameters and gradients; identical initial values on every rank.
struct Model {
  std::vector<std::vector<float>> values, grads;
  explicit Model(const std::vector<int64_t>& sizes) {
    for (size_t p = 0; p < sizes.size(); ++p) {
      values.emplace_back(sizes[p]);
      grads.emplace_back(sizes[p], 0.0f);
      for (int64_t i = 0; i < sizes[p]; ++i) {
        values[p][i] = static_cast<float>(std::sin(0.37 * i + 1.3 * p) + 0.1 * p);
      }
    }
  }
  std::vector<SyncParameter> Views() {
    std::vector<SyncParameter> views;
    for (size_t p = 0; p < values.size(); ++p) {
      views.push_back({absl::StrCat("layer", p, ".weight"),
                       CpuBuffer(values[p].data(), static_cast<int64_t>(values[p].size())),
                       CpuBuffer(grads[p].data(), static_cast<int64_t>(grads[p].size()))});
    }
    return views;
  }
};

// Rank r's gradient at `step`: depends on the parameters, as a real one does. It is rounded
// to a multiple of 2^-12 (magnitude below 8), so sums over up to 4 ranks are exact in float32
// whatever order MPI's all-reduce or reduce-scatter adds them in: DeAR and the all-reduce then
// see identical averages, and any difference in the parameters comes from the algorithms.
float Gradient(int rank, int step, size_t p, int64_t i, float value) {
  constexpr double kGrid = 4096.0;
  const double g = 0.1 * value + std::cos(0.11 * i + 0.7 * rank + 0.31 * step + p);
  return static_cast<float>(std::round(g * kGrid) / kGrid);
}

void ComputeGradients(Model& model, int rank, int step) {
  for (size_t p = 0; p < model.values.size(); ++p) {
    for (size_t i = 0; i < model.values[p].size(); ++i) {
      model.grads[p][i] = Gradient(rank, step, p, static_cast<int64_t>(i), model.values[p][i]);
    }
  }
}

double LearningRate(int step) { return 0.05 * (1.0 - 0.02 * step); }

// One training iteration through `sync`, with clipping at `max_norm` (0: none). Returns the
// global gradient norm the group agreed on.
double Iterate(GradientSync& sync, Model& model, Communicator& group, int step,
               double max_norm = 0) {
  // Forward: wait for each parameter's all-gather, first layers (last registered) first.
  for (int p = sync.num_parameters() - 1; p >= 0; --p) {
    EXPECT_TRUE(sync.WaitForParameters(p).ok());
  }
  ComputeGradients(model, group.rank(), step);
  for (int p = 0; p < sync.num_parameters(); ++p) EXPECT_TRUE(sync.GradReady(p).ok());
  EXPECT_TRUE(sync.FinishBackward().ok());
  double norm_squared = sync.LocalGradNormSquared();
  EXPECT_TRUE(group.AllReduce(CpuBuffer(&norm_squared, 1))->Wait().ok());
  const double norm = std::sqrt(norm_squared);
  const double scale = max_norm > 0 && norm > max_norm ? max_norm / norm : 1.0;
  EXPECT_TRUE(sync.Step(LearningRate(step), scale).ok());
  return norm;
}

// The sequential reference: the average of all ranks' gradients, computed here.
struct Reference {
  Model model{kSizes};
  std::vector<std::unique_ptr<OptimizerState>> states;
  explicit Reference(const OptimizerConfig& config) {
    for (int64_t size : kSizes) states.push_back(std::make_unique<OptimizerState>(config, size));
  }
  double Iterate(int group_size, int step, double max_norm = 0) {
    double norm_squared = 0;
    std::vector<std::vector<float>> average(kSizes.size());
    for (size_t p = 0; p < kSizes.size(); ++p) {
      average[p].resize(kSizes[p]);
      for (int64_t i = 0; i < kSizes[p]; ++i) {
        double sum = 0;
        for (int r = 0; r < group_size; ++r) {
          sum += Gradient(r, step, p, i, model.values[p][i]);
        }
        average[p][i] = static_cast<float>(sum / group_size);
        norm_squared += static_cast<double>(average[p][i]) * average[p][i];
      }
    }
    const double norm = std::sqrt(norm_squared);
    const double scale = max_norm > 0 && norm > max_norm ? max_norm / norm : 1.0;
    for (size_t p = 0; p < kSizes.size(); ++p) {
      EXPECT_TRUE(states[p]->Step(absl::MakeSpan(model.values[p]), average[p], LearningRate(step),
                                  scale).ok());
    }
    return norm;
  }
};

// Relative difference, with values below `floor` in magnitude compared absolutely (scaled by
// `floor`).
double MaxRelativeDifference(const Model& a, const Model& b, double floor = 1e-3) {
  double worst = 0;
  for (size_t p = 0; p < a.values.size(); ++p) {
    for (size_t i = 0; i < a.values[p].size(); ++i) {
      const double x = a.values[p][i], y = b.values[p][i];
      worst = std::max(worst, std::fabs(x - y) / std::max(floor, std::fabs(y)));
    }
  }
  return worst;
}

GradSyncOptions Options(GradSyncStrategy strategy, int64_t bucket_bytes,
                        const OptimizerConfig& optimizer) {
  GradSyncOptions options;
  options.strategy = strategy;
  options.bucket_bytes = bucket_bytes;
  options.optimizer = optimizer;
  return options;
}

struct Case {
  const char* name;
  OptimizerConfig optimizer;
  int64_t bucket_bytes;
};

class DearVersusAllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(DearVersusAllReduceTest, ParametersAgreeAfterTwentySteps) {
  Communicator& world = World();
  const Case& c = GetParam();
  Model plain_model(kSizes), dear_model(kSizes);
  auto plain = GradientSync::Create(
      world, plain_model.Views(), Options(GradSyncStrategy::kAllReduce, c.bucket_bytes, c.optimizer));
  auto dear = GradientSync::Create(
      world, dear_model.Views(), Options(GradSyncStrategy::kDeAR, c.bucket_bytes, c.optimizer));
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(dear.ok()) << dear.status();
  Reference reference(c.optimizer);
  constexpr double kMaxNorm = 40.0;  // clips in the first steps
  int clipped = 0;
  for (int step = 0; step < kSteps; ++step) {
    const double plain_norm = Iterate(**plain, plain_model, world, step, kMaxNorm);
    const double dear_norm = Iterate(**dear, dear_model, world, step, kMaxNorm);
    const double reference_norm = reference.Iterate(world.size(), step, kMaxNorm);
    EXPECT_NEAR(plain_norm, reference_norm, 1e-5 * reference_norm) << "step " << step;
    EXPECT_NEAR(dear_norm, reference_norm, 1e-5 * reference_norm) << "step " << step;
    if (reference_norm > kMaxNorm) ++clipped;
  }
  EXPECT_GT(clipped, 0) << "the clipping path was not exercised";
  ASSERT_TRUE((*dear)->Flush().ok());
  EXPECT_LT(MaxRelativeDifference(dear_model, plain_model), kRelativeTolerance);
  // The reference averages in double: float32 rounding differs, so compare as allclose with
  // rtol = atol = 1e-5.
  EXPECT_LT(MaxRelativeDifference(plain_model, reference.model, /*floor=*/1.0), 1e-5);
  // The parameters moved: the comparison is not between two untouched models.
  EXPECT_GT(MaxRelativeDifference(plain_model, Model(kSizes)), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    BucketSizes, DearVersusAllReduceTest,
    ::testing::Values(Case{"sgd_per_parameter", OptimizerConfig::Sgd(0.9, 1e-3), 1},
                      Case{"sgd_16KiB", OptimizerConfig::Sgd(0.9, 1e-3), 16 << 10},
                      Case{"sgd_one_bucket", OptimizerConfig::Sgd(0.9, 1e-3), kDefaultBucketBytes},
                      Case{"adamw_per_parameter", OptimizerConfig::AdamW(0.01), 1},
                      Case{"adamw_16KiB", OptimizerConfig::AdamW(0.01), 16 << 10},
                      Case{"adamw_one_bucket", OptimizerConfig::AdamW(0.01), kDefaultBucketBytes}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(DearTest, PackedParametersChangeOnlyWhenTheirAllGatherIsWaitedFor) {
  Communicator& world = World();
  Model model(kSizes);
  auto dear = GradientSync::Create(
      world, model.Views(), Options(GradSyncStrategy::kDeAR, 16 << 10, OptimizerConfig::Sgd(0.0)));
  ASSERT_TRUE(dear.ok()) << dear.status();
  // 16 KiB buckets: {0, 1, 2}, {3, 4, 5}, {6}. Separate vectors are not adjacent, so the first
  // two buckets are packed; the third holds one parameter and runs in place.
  ASSERT_EQ((*dear)->num_buckets(), 3);
  const int probe = 4;  // bucket 1
  const int other = 0;  // bucket 0
  ASSERT_FALSE((*dear)->BucketInPlace((*dear)->BucketOf(probe)));
  ASSERT_FALSE((*dear)->BucketInPlace((*dear)->BucketOf(other)));
  EXPECT_TRUE((*dear)->BucketInPlace((*dear)->BucketOf(6)));
  Iterate(**dear, model, world, 0);
  // Step returned with the all-gathers in flight: nothing was written into packed parameters.
  const Model before = model;
  ASSERT_TRUE((*dear)->WaitForParameters(probe).ok());
  EXPECT_NE(model.values[probe], before.values[probe]);
  EXPECT_NE(model.values[probe - 1], before.values[probe - 1]);  // same bucket
  EXPECT_EQ(model.values[other], before.values[other]);          // another bucket
  ASSERT_TRUE((*dear)->Flush().ok());
  EXPECT_NE(model.values[other], before.values[other]);
}

// Parameters laid out in one arena in registration (backward) order, as a runtime that
// allocates them together would: buckets then communicate without copies.
struct ArenaModel {
  std::vector<float> values, grads;
  std::vector<int64_t> offsets;
  ArenaModel() {
    Model init(kSizes);
    for (size_t p = 0; p < kSizes.size(); ++p) {
      offsets.push_back(static_cast<int64_t>(values.size()));
      values.insert(values.end(), init.values[p].begin(), init.values[p].end());
    }
    grads.assign(values.size(), 0.0f);
  }
  std::vector<SyncParameter> Views() {
    std::vector<SyncParameter> views;
    for (size_t p = 0; p < kSizes.size(); ++p) {
      views.push_back({absl::StrCat("layer", p, ".weight"),
                       CpuBuffer(values.data() + offsets[p], kSizes[p]),
                       CpuBuffer(grads.data() + offsets[p], kSizes[p])});
    }
    return views;
  }
  // The same iteration as Iterate() above, on the arena.
  void Iterate(GradientSync& sync, int rank, int step) {
    for (int p = sync.num_parameters() - 1; p >= 0; --p) {
      EXPECT_TRUE(sync.WaitForParameters(p).ok());
    }
    for (size_t p = 0; p < kSizes.size(); ++p) {
      for (int64_t i = 0; i < kSizes[p]; ++i) {
        grads[offsets[p] + i] = Gradient(rank, step, p, i, values[offsets[p] + i]);
      }
    }
    for (int p = 0; p < sync.num_parameters(); ++p) EXPECT_TRUE(sync.GradReady(p).ok());
    EXPECT_TRUE(sync.FinishBackward().ok());
    EXPECT_TRUE(sync.Step(LearningRate(step)).ok());
  }
};

TEST(DearTest, InPlaceBucketsMatchPackedOnes) {
  Communicator& world = World();
  const OptimizerConfig adamw = OptimizerConfig::AdamW(0.01);
  for (int64_t bucket_bytes : {int64_t{16} << 10, kDefaultBucketBytes}) {
    ArenaModel dear_arena, plain_arena;
    Model packed(kSizes);
    auto dear = GradientSync::Create(world, dear_arena.Views(),
                                     Options(GradSyncStrategy::kDeAR, bucket_bytes, adamw));
    auto plain = GradientSync::Create(world, plain_arena.Views(),
                                      Options(GradSyncStrategy::kAllReduce, bucket_bytes, adamw));
    auto reference = GradientSync::Create(world, packed.Views(),
                                          Options(GradSyncStrategy::kAllReduce, 1, adamw));
    ASSERT_TRUE(dear.ok() && plain.ok() && reference.ok());
    for (int b = 0; b < (*dear)->num_buckets(); ++b) {
      EXPECT_TRUE((*dear)->BucketInPlace(b)) << "bucket " << b;
      EXPECT_TRUE((*plain)->BucketInPlace(b)) << "bucket " << b;
    }
    for (int step = 0; step < kSteps; ++step) {
      dear_arena.Iterate(**dear, world.rank(), step);
      plain_arena.Iterate(**plain, world.rank(), step);
      Iterate(**reference, packed, world, step);
    }
    ASSERT_TRUE((*dear)->Flush().ok());
    double worst = 0;
    for (size_t p = 0; p < kSizes.size(); ++p) {
      for (int64_t i = 0; i < kSizes[p]; ++i) {
        const double expected = packed.values[p][i];
        const double scale = std::max(1e-3, std::fabs(expected));
        worst = std::max(worst, std::fabs(dear_arena.values[dear_arena.offsets[p] + i] - expected) / scale);
        worst = std::max(worst, std::fabs(plain_arena.values[plain_arena.offsets[p] + i] - expected) / scale);
      }
    }
    EXPECT_LT(worst, kRelativeTolerance) << "bucket bytes " << bucket_bytes;
  }
}

TEST(DearTest, OptimizerStateMovesBetweenBucketings) {
  // Five steps with one bucketing, state gathered, loaded into a synchroniser with another
  // bucketing, five more steps: equal to the all-reduce run throughout.
  Communicator& world = World();
  const OptimizerConfig adamw = OptimizerConfig::AdamW(0.01);
  Model plain_model(kSizes), dear_model(kSizes);
  auto plain = GradientSync::Create(world, plain_model.Views(),
                                    Options(GradSyncStrategy::kAllReduce, 1, adamw));
  auto dear = GradientSync::Create(world, dear_model.Views(),
                                   Options(GradSyncStrategy::kDeAR, 1, adamw));
  ASSERT_TRUE(plain.ok() && dear.ok());
  for (int step = 0; step < 5; ++step) {
    Iterate(**plain, plain_model, world, step);
    Iterate(**dear, dear_model, world, step);
  }
  auto state = (*dear)->GatherOptimizerState();
  ASSERT_TRUE(state.ok()) << state.status();
  auto plain_state = (*plain)->GatherOptimizerState();
  ASSERT_TRUE(plain_state.ok());
  ASSERT_EQ(state->size(), kSizes.size());
  for (size_t p = 0; p < kSizes.size(); ++p) {
    EXPECT_EQ((*state)[p].steps, 5);
    ASSERT_EQ((*state)[p].buffers.size(), 2u);
    EXPECT_EQ((*state)[p].buffers[0].first, "exp_avg");
    for (int64_t i = 0; i < kSizes[p]; ++i) {
      EXPECT_NEAR((*state)[p].buffers[1].second[i], (*plain_state)[p].buffers[1].second[i],
                  1e-6 * std::fabs((*plain_state)[p].buffers[1].second[i]) + 1e-12);
    }
  }
  auto rebucketed = GradientSync::Create(world, dear_model.Views(),
                                         Options(GradSyncStrategy::kDeAR, 16 << 10, adamw));
  ASSERT_TRUE(rebucketed.ok());
  ASSERT_TRUE((*rebucketed)->LoadOptimizerState(*state).ok());
  for (int step = 5; step < 10; ++step) {
    Iterate(**plain, plain_model, world, step);
    Iterate(**rebucketed, dear_model, world, step);
  }
  ASSERT_TRUE((*rebucketed)->Flush().ok());
  EXPECT_LT(MaxRelativeDifference(dear_model, plain_model), kRelativeTolerance);
  // A state for other parameters is refused.
  (*state)[0].name = "something.else";
  EXPECT_EQ((*rebucketed)->LoadOptimizerState(*state).code(), absl::StatusCode::kInvalidArgument);
}

TEST(DearTest, AutoBucketPicksOneCandidateEverywhereAndLosesNoUpdate) {
  Communicator& world = World();
  const OptimizerConfig sgd = OptimizerConfig::Sgd(0.9);
  Model plain_model(kSizes), dear_model(kSizes);
  auto plain = GradientSync::Create(world, plain_model.Views(),
                                    Options(GradSyncStrategy::kAllReduce, 1, sgd));
  GradSyncOptions options = Options(GradSyncStrategy::kDeAR, 0, sgd);
  options.auto_bucket = true;
  // The model holds about 100 KB: 1 MiB and 2 MiB both give one bucket, so 2 MiB is dropped.
  options.candidate_bucket_bytes = {1, 4 << 10, 64 << 10, 1 << 20, 2 << 20};
  options.tune_iterations = 2;
  auto dear = GradientSync::Create(world, dear_model.Views(), options);
  ASSERT_TRUE(plain.ok() && dear.ok());
  EXPECT_TRUE((*dear)->tuning());
  for (int step = 0; step < kSteps; ++step) {
    Iterate(**plain, plain_model, world, step);
    Iterate(**dear, dear_model, world, step);
  }
  EXPECT_FALSE((*dear)->tuning()) << (*dear)->TuningReport();
  const int64_t chosen = (*dear)->bucket_bytes();
  EXPECT_TRUE(chosen == 1 || chosen == 4 << 10 || chosen == 64 << 10 || chosen == 1 << 20)
      << chosen;
  EXPECT_EQ((*dear)->TuningReport().find("2.00 MiB:"), std::string::npos)
      << (*dear)->TuningReport();
  int64_t agree[2] = {chosen, -chosen};
  ASSERT_TRUE(world.AllReduce(CpuBuffer(agree, 2), ReduceOp::kMax)->Wait().ok());
  EXPECT_EQ(agree[0], -agree[1]) << "ranks chose different bucket sizes";
  EXPECT_NE((*dear)->TuningReport().find("->"), std::string::npos);
  ASSERT_TRUE((*dear)->Flush().ok());
  EXPECT_LT(MaxRelativeDifference(dear_model, plain_model), kRelativeTolerance);
}

// Gradients communicated in bfloat16: after one SGD step the parameters are within bfloat16's
// rounding of the float32 reference (each rank's gradient rounded to 8 significant bits, the
// sum rounded again at every addition), and they do differ from it (the gradients lie on a
// 2^-12 grid that bfloat16 cannot hold), for both strategies.
TEST(GradSyncTest, BFloat16CommunicationStaysWithinItsRounding) {
  Communicator& world = World();
  const OptimizerConfig sgd = OptimizerConfig::Sgd(/*momentum=*/0);
  for (GradSyncStrategy strategy : {GradSyncStrategy::kAllReduce, GradSyncStrategy::kDeAR}) {
    SCOPED_TRACE(GradSyncStrategyName(strategy));
    Model model(kSizes);
    GradSyncOptions options = Options(strategy, /*bucket_bytes=*/16 << 10, sgd);
    options.communication_type = DataType::kBFloat16;
    auto sync = GradientSync::Create(world, model.Views(), options);
    ASSERT_TRUE(sync.ok()) << sync.status();
    Iterate(**sync, model, world, /*step=*/0);
    ASSERT_TRUE((*sync)->Flush().ok());
    Reference reference(sgd);
    reference.Iterate(world.size(), /*step=*/0);
    // |g| < 1.2 on every rank: each rounding is at most 2^-9 x 2 of a partial sum below
    // 1.2 x ranks, with one rounding per rank and per addition; averaged over the ranks.
    const double bound = LearningRate(0) * 2 * world.size() * 1.2 * std::ldexp(1.0, -8);
    double worst = 0;
    for (size_t p = 0; p < kSizes.size(); ++p) {
      for (int64_t i = 0; i < kSizes[p]; ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(model.values[p][i] -
                                                              reference.model.values[p][i])));
      }
    }
    EXPECT_LE(worst, bound);
    EXPECT_GT(worst, 0) << "the gradients did not travel as bfloat16";
  }
  GradSyncOptions bad = Options(GradSyncStrategy::kAllReduce, 1 << 20, sgd);
  bad.communication_type = DataType::kInt32;
  Model model(kSizes);
  EXPECT_EQ(GradientSync::Create(world, model.Views(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GradSyncTest, GroupOfOneIsLocalAndMatchesTheOptimizerAlone) {
  Communicator& world = World();
  auto split = world.Split(/*color=*/world.rank(), /*key=*/0);
  ASSERT_TRUE(split.ok());
  std::unique_ptr<Communicator> alone = std::move(split).value();
  ASSERT_EQ(alone->size(), 1);
  for (GradSyncStrategy strategy : {GradSyncStrategy::kAllReduce, GradSyncStrategy::kDeAR}) {
    Model model(kSizes);
    auto sync = GradientSync::Create(*alone, model.Views(),
                                     Options(strategy, 16 << 10, OptimizerConfig::AdamW()));
    ASSERT_TRUE(sync.ok());
    Reference reference(OptimizerConfig::AdamW());
    for (int step = 0; step < 5; ++step) {
      // The reference averages over a "group" of one rank: rank 0's gradient; use rank 0's.
      for (int p = sync->get()->num_parameters() - 1; p >= 0; --p) {
        ASSERT_TRUE((*sync)->WaitForParameters(p).ok());
      }
      ComputeGradients(model, 0, step);
      ASSERT_TRUE((*sync)->FinishBackward().ok());
      ASSERT_TRUE((*sync)->Step(LearningRate(step)).ok());
      reference.Iterate(1, step);
    }
    ASSERT_TRUE((*sync)->Flush().ok());
    EXPECT_EQ(MaxRelativeDifference(model, reference.model), 0.0) << GradSyncStrategyName(strategy);
  }
}

// The CPU loops, counting the calls that average and add to the norm.
class CountingOps final : public DelegatingDeviceOps {
 public:
  int average_calls = 0;
  absl::Status AverageAndAddSquaredNorm(float* dst, const float* src, int64_t count,
                                        float divisor, bool divide, bool add_to_norm) override {
    ++average_calls;
    return DelegatingDeviceOps::AverageAndAddSquaredNorm(dst, src, count, divisor, divide,
                                                         add_to_norm);
  }
};

// The gradients of adjoining parameters (one arena, as a stage lays them out) are averaged and
// measured in one pass, not one per parameter; the norm still leaves out what it should.
TEST(GradSyncTest, AdjoiningGradientsAreAveragedAndMeasuredInOnePass) {
  Communicator& world = World();
  auto split = world.Split(/*color=*/world.rank(), /*key=*/0);
  ASSERT_TRUE(split.ok());
  std::unique_ptr<Communicator> alone = std::move(split).value();
  for (bool leave_one_out : {false, true}) {
    for (Communicator* group : {alone.get(), &world}) {
      ArenaModel arena;
      std::vector<SyncParameter> views = arena.Views();
      if (leave_one_out) views[3].counted_in_norm = false;
      CountingOps ops;
      GradSyncOptions options =
          Options(GradSyncStrategy::kAllReduce, 16 << 10, OptimizerConfig::Sgd(0.1));
      options.device_ops = &ops;
      auto sync = GradientSync::Create(*group, views, options);
      ASSERT_TRUE(sync.ok()) << sync.status();
      ASSERT_GT((*sync)->num_buckets(), 1);
      for (int p = 0; p < (*sync)->num_parameters(); ++p) {
        for (int64_t i = 0; i < kSizes[p]; ++i) {
          arena.grads[arena.offsets[p] + i] = Gradient(group->rank(), 0, p, i, 0.0f);
        }
      }
      ops.average_calls = 0;
      ASSERT_TRUE((*sync)->FinishBackward().ok());
      // Local: the counted runs; a group: one pass (the left-out parameter splits rank 0's
      // pass, which counts the norm, into three).
      const bool counts = group->size() == 1 || group->rank() == 0;
      EXPECT_EQ(ops.average_calls, leave_one_out && counts ? (group->size() == 1 ? 2 : 3) : 1)
          << "group of " << group->size() << (leave_one_out ? ", one left out" : "");
      double want = 0;
      for (int p = 0; p < (*sync)->num_parameters(); ++p) {
        if (leave_one_out && p == 3) continue;
        for (int64_t i = 0; i < kSizes[p]; ++i) {
          double average = 0;
          for (int r = 0; r < group->size(); ++r) {
            average += Gradient(group->size() == 1 ? group->rank() : r, 0, p, i, 0.0f);
          }
          average /= group->size();
          want += average * average;
        }
      }
      EXPECT_NEAR((*sync)->LocalGradNormSquared(), counts ? want : 0.0, 1e-9 * want);
    }
  }
}

TEST(GradSyncTest, MisuseAndMismatchesGiveStatuses) {
  Communicator& world = World();
  Model model(kSizes);
  auto sync = GradientSync::Create(world, model.Views(),
                                   Options(GradSyncStrategy::kDeAR, 1, OptimizerConfig::Sgd(0)));
  ASSERT_TRUE(sync.ok());
  EXPECT_EQ((*sync)->Step(0.1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*sync)->GradReady(99).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*sync)->GradReady(2).ok());
  const absl::Status twice = (*sync)->GradReady(2);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("layer2.weight"), std::string::npos) << twice;
  ASSERT_TRUE((*sync)->FinishBackward().ok());
  EXPECT_EQ((*sync)->FinishBackward().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*sync)->Step(0.1).ok());
  ASSERT_TRUE((*sync)->Flush().ok());

  if (world.size() > 1) {
    // Rank 0 registers a parameter of a different size.
    std::vector<int64_t> sizes = kSizes;
    if (world.rank() == 0) sizes[4] += 1;
    Model other(sizes);
    auto mismatched = GradientSync::Create(
        world, other.Views(), Options(GradSyncStrategy::kDeAR, 1, OptimizerConfig::Sgd(0)));
    EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(mismatched.status().message().find("layer4.weight"), std::string::npos)
        << mismatched.status();
    // And a different number of parameters.
    std::vector<int64_t> fewer = kSizes;
    if (world.rank() == 0) fewer.pop_back();
    Model fewer_model(fewer);
    auto short_list = GradientSync::Create(
        world, fewer_model.Views(), Options(GradSyncStrategy::kAllReduce, 1, OptimizerConfig::Sgd(0)));
    EXPECT_EQ(short_list.status().code(), absl::StatusCode::kInvalidArgument);
  }
  std::vector<float> v(4);
  std::vector<SyncParameter> cuda = {{"w", MakeBuffer(v.data(), 4, DataType::kFloat32, Device::Cuda(0)),
                                      MakeBuffer(v.data(), 4, DataType::kFloat32, Device::Cuda(0))}};
  // CUDA buffers with the default (CPU) device operations: refused, naming the device.
  auto on_cuda = GradientSync::Create(world, cuda, GradSyncOptions());
  EXPECT_EQ(on_cuda.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(on_cuda.status().message().find("cpu loops"), std::string::npos) << on_cuda.status();
  GradSyncOptions bad;
  bad.optimizer = OptimizerConfig::Sgd(2.0);
  EXPECT_EQ(GradientSync::Create(world, model.Views(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GradSyncTest, AssignBucketsFillsUpToTheThreshold) {
  // 4-byte floats: 100 elements = 400 bytes.
  EXPECT_EQ(AssignBuckets({100, 100, 100, 100}, 800), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(AssignBuckets({100, 100, 100, 100}, 1), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(AssignBuckets({1000, 1, 1}, 400), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(AssignBuckets({1, 2, 3}, int64_t{1} << 40), (std::vector<int>{0, 0, 0}));
}

}  // namespace
}  // namespace tandem::runtime
