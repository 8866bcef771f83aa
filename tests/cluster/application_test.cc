// Application traces: constants, measured and interpolated throughput, gradient statistics,
// progress and iterations against figures read off the CSV files.
#include "cluster/application.h"

#include "gtest/gtest.h"
#include "tests/cluster/test_util.h"

namespace tandem::cluster {
namespace {

using testing::PolluxApps;

TEST(Application, PolluxConstants) {
  const ApplicationCatalog& apps = PolluxApps();
  ASSERT_EQ(apps.size(), 6u);
  const Application& cifar = *apps.at("cifar10");
  EXPECT_EQ(cifar.max_epochs(), 100);
  EXPECT_EQ(cifar.init_batch_size(), 128);
  EXPECT_EQ(cifar.max_batch_size(), 4096);
  const Application& yolo = *apps.at("yolov3");
  EXPECT_EQ(yolo.max_local_bsz(), 8);
  EXPECT_EQ(yolo.init_batch_size(), 8);
  EXPECT_EQ(yolo.max_epochs(), 50);
  EXPECT_EQ(apps.at("bert")->max_epochs(), 2);
  EXPECT_EQ(apps.at("ncf")->max_epochs(), 10);
  EXPECT_EQ(apps.at("imagenet")->max_epochs(), 90);
  EXPECT_EQ(apps.at("deepspeech2")->max_epochs(), 80);
  EXPECT_EQ(apps.at("bert")->init_batch_size(), 12);
  EXPECT_EQ(apps.at("bert")->max_batch_size(), 384);
  EXPECT_EQ(apps.at("bert")->min_local_bsz(), 4);
}

TEST(Application, NormalisePlacementTakesSmallestRotation) {
  EXPECT_EQ(NormalisePlacement({4, 1}), (std::vector<int>{1, 4}));
  EXPECT_EQ(NormalisePlacement({2, 1, 3}), (std::vector<int>{1, 3, 2}));
  EXPECT_EQ(NormalisePlacement({0, 3, 0, 3}), (std::vector<int>{3, 3}));
}

TEST(Application, MeasuredPlacementIsExactAtMeasuredBatch) {
  const Application& bert = *PolluxApps().at("bert");
  // placements.csv: "1,4,0.45532354712486267,0.013738612174987792".
  const StepTimes times = bert.Throughput({1}, 4);
  EXPECT_DOUBLE_EQ(times.step_seconds, 0.45532354712486267);
  EXPECT_DOUBLE_EQ(times.sync_seconds, 0.013738612174987792);
  // Between 4 and 6 it is linear: halfway gives the mean.
  const StepTimes six = bert.Throughput({1}, 6);
  const StepTimes five = bert.Throughput({1}, 5);
  EXPECT_NEAR(five.step_seconds, (times.step_seconds + six.step_seconds) / 2, 1e-12);
  // A rotation of a measured placement is the same placement.
  EXPECT_TRUE(bert.IsMeasured({4, 1}));
  EXPECT_DOUBLE_EQ(bert.Throughput({4, 1}, 8).step_seconds, bert.Throughput({1, 4}, 8).step_seconds);
}

TEST(Application, GridInterpolationHitsScalabilityRows) {
  const Application& cifar = *PolluxApps().at("cifar10");
  // scalability.csv: "6,6,32,0.14090566635131835,0.09941204528808593".
  EXPECT_FALSE(cifar.IsMeasured({1, 1, 1, 1, 1, 1}));
  const StepTimes times = cifar.Throughput({1, 1, 1, 1, 1, 1}, 32);
  EXPECT_NEAR(times.step_seconds, 0.14090566635131835, 1e-12);
  EXPECT_NEAR(times.sync_seconds, 0.09941204528808593, 1e-12);
  // Five nodes lies halfway between four (the mean of the measured 4-node placements with 8
  // GPUs) and six nodes (scalability.csv), at the same GPUs per node.
  double low = 1e9, high = 0;
  for (int a = 1; a <= 4; ++a) {
    for (int b = 1; b <= 4; ++b) {
      for (int c = 1; c <= 4; ++c) {
        const int d = 8 - a - b - c;
        if (d < 1 || d > 4) continue;
        ASSERT_TRUE(cifar.IsMeasured({a, b, c, d}));
        const double t = cifar.Throughput({a, b, c, d}, 64).step_seconds;
        low = std::min(low, t);
        high = std::max(high, t);
      }
    }
  }
  const double six = cifar.Throughput({2, 2, 2, 2, 2, 2}, 64).step_seconds;
  const double five = cifar.Throughput({2, 2, 2, 2, 2}, 64).step_seconds;
  EXPECT_GE(five, (low + six) / 2 - 1e-12);
  EXPECT_LE(five, (high + six) / 2 + 1e-12);
  // More than 16 nodes are treated as 16, as Pollux does.
  std::vector<int> seventeen(17, 1), sixteen(16, 1);
  EXPECT_GT(cifar.Throughput(seventeen, 64).step_seconds, 0);
}

TEST(Application, GradStatsAndIterationsInterpolateBetweenValidatedBatchSizes) {
  const Application& bert = *PolluxApps().at("bert");
  // validation-12.csv row 0: grad_sqr 195590723287826.75; validation-24.csv row 0:
  // 82891973134775.4; iteration 7387 and 3725.
  const GradientStats at12 = bert.GradStats(12, 0);
  EXPECT_DOUBLE_EQ(at12.sqr, 195590723287826.75);
  const GradientStats at18 = bert.GradStats(18, 0);
  EXPECT_NEAR(at18.sqr, (195590723287826.75 + 82891973134775.4) / 2, 1e3);
  EXPECT_DOUBLE_EQ(bert.Iteration(12, 0), 7387);
  EXPECT_NEAR(bert.Iteration(18, 0), (7387 + 3725) / 2.0, 1e-9);
  // Progress of epoch 1: the least over the tables' first rows (7387 at batch 12).
  EXPECT_DOUBLE_EQ(bert.Progress(0), 0.0);
  EXPECT_DOUBLE_EQ(bert.Progress(1), 7387.0);
  EXPECT_EQ(bert.CompletionEpoch(96), 1);
}

TEST(Application, MissingDirectoryIsInvalidArgument) {
  auto app = Application::Load(testing::DataPath("pollux/apps/nosuchapp"));
  EXPECT_EQ(app.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(app.status().message().find("nosuchapp"), std::string::npos);
}

}  // namespace
}  // namespace tandem::cluster
