#include "runtime/emulated_stage.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

EmulatedStageOptions Options(int stage, int num_stages, FakeClock* clock) {
  EmulatedStageOptions o;
  o.stage = stage;
  o.num_stages = num_stages;
  o.num_microbatches = 4;
  o.forward_seconds = 0.010;
  o.backward_seconds = 0.020;
  o.activation_elements = 6;
  o.parameter_elements = 3;
  o.clock = clock;
  return o;
}

// Two stages wired by hand: the first's output is the second's input, the second's input
// gradient flows back.
TEST(EmulatedStageTest, TwoStagesPassChecksummedTensorsAndTakeTheirTime) {
  FakeClock clock;
  EmulatedStage first(Options(0, 2, &clock));
  EmulatedStage last(Options(1, 2, &clock));
  ASSERT_TRUE(first.BeginIteration(3).ok());
  ASSERT_TRUE(last.BeginIteration(3).ok());

  auto act = first.Forward(1, {});
  ASSERT_TRUE(act.ok()) << act.status();
  ASSERT_EQ(act->size(), 1u);
  EXPECT_EQ((*act)[0].buffer.count, 6);
  EXPECT_DOUBLE_EQ(clock.NowSeconds(), 0.010);

  auto none = last.Forward(1, *act);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  // Loss of micro-batch 1 scaled by 1 / (4 micro-batches * 1 replica).
  EXPECT_DOUBLE_EQ(last.IterationLoss(), EmulatedStage::LossValue(3, 0, 1) / 4);

  auto grad = last.Backward(1, {});
  ASSERT_TRUE(grad.ok()) << grad.status();
  ASSERT_EQ(grad->size(), 1u);
  auto back = first.Backward(1, *grad);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->empty());
  EXPECT_DOUBLE_EQ(clock.NowSeconds(), 0.010 * 2 + 0.020 * 2);
  EXPECT_EQ(first.stashed_microbatches(), 0);
  EXPECT_FLOAT_EQ(first.gradients()[0], EmulatedStage::WeightGradientValue(3, 0, 0, 1));
  EXPECT_FLOAT_EQ(last.gradients()[2], EmulatedStage::WeightGradientValue(3, 0, 1, 1));
}

TEST(EmulatedStageTest, WrongMicrobatchIsDetected) {
  FakeClock clock;
  EmulatedStage first(Options(0, 2, &clock));
  EmulatedStage last(Options(1, 2, &clock));
  ASSERT_TRUE(first.BeginIteration(0).ok());
  ASSERT_TRUE(last.BeginIteration(0).ok());
  auto act = first.Forward(0, {});
  ASSERT_TRUE(act.ok());
  auto wrong = last.Forward(2, *act);  // micro-batch 0's activation fed as micro-batch 2
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(wrong.status().message().find("micro-batch 2"), std::string::npos)
      << wrong.status();
}

TEST(EmulatedStageTest, WrongIterationAndStageAreDetected) {
  FakeClock clock;
  EmulatedStage first(Options(0, 3, &clock));
  EmulatedStage third(Options(2, 3, &clock));
  ASSERT_TRUE(first.BeginIteration(1).ok());
  ASSERT_TRUE(third.BeginIteration(1).ok());
  auto act = first.Forward(0, {});
  ASSERT_TRUE(act.ok());
  // Stage 0's output skipped stage 1.
  EXPECT_EQ(third.Forward(0, *act).status().code(), absl::StatusCode::kDataLoss);

  EmulatedStage second(Options(1, 3, &clock));
  ASSERT_TRUE(second.BeginIteration(2).ok());  // a different iteration
  EXPECT_EQ(second.Forward(0, *act).status().code(), absl::StatusCode::kDataLoss);
}

TEST(EmulatedStageTest, SplitBackwardOrderIsEnforcedAndFreesTheStash) {
  FakeClock clock;
  EmulatedStageOptions o = Options(0, 1, &clock);
  o.weight_seconds = 0.005;
  EmulatedStage stage(o);
  ASSERT_TRUE(stage.BeginIteration(0).ok());
  EXPECT_EQ(stage.BackwardWeight(0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(stage.Forward(0, {}).ok());
  ASSERT_TRUE(stage.Forward(1, {}).ok());
  EXPECT_EQ(stage.peak_stashed_microbatches(), 2);
  EXPECT_EQ(stage.BackwardWeight(0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(stage.BackwardInput(0, {}).ok());
  EXPECT_FLOAT_EQ(stage.gradients()[0], 0.0f);  // weight gradient not yet computed
  EXPECT_EQ(stage.stashed_microbatches(), 2);
  ASSERT_TRUE(stage.BackwardWeight(0).ok());
  EXPECT_EQ(stage.stashed_microbatches(), 1);
  EXPECT_FLOAT_EQ(stage.gradients()[0], EmulatedStage::WeightGradientValue(0, 0, 0, 0));
  // 2 forwards + input half + weight half.
  EXPECT_DOUBLE_EQ(clock.NowSeconds(), 2 * 0.010 + 0.020 + 0.005);
  // A new iteration with a stashed micro-batch is an error.
  EXPECT_EQ(stage.BeginIteration(1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EmulatedStageTest, BackwardWithoutForwardFails) {
  FakeClock clock;
  EmulatedStage stage(Options(0, 1, &clock));
  ASSERT_TRUE(stage.BeginIteration(0).ok());
  EXPECT_EQ(stage.Backward(0, {}).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EmulatedStageTest, ParametersExposeStableBuffers) {
  FakeClock clock;
  EmulatedStage stage(Options(0, 1, &clock));
  auto params = stage.Parameters();
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].value.count, 3);
  EXPECT_EQ(params[0].value.data, stage.parameters().data());
  EXPECT_EQ(params[0].grad.data, stage.gradients().data());
  EXPECT_FLOAT_EQ(stage.parameters()[1], 1.0f);
}

TEST(EmulatedStageTest, ChecksumValuesDifferAcrossEveryCoordinate) {
  const float base = EmulatedStage::ActivationValue(1, 1, 1, 1, 1, 1);
  EXPECT_NE(base, EmulatedStage::ActivationValue(2, 1, 1, 1, 1, 1));
  EXPECT_NE(base, EmulatedStage::ActivationValue(1, 2, 1, 1, 1, 1));
  EXPECT_NE(base, EmulatedStage::ActivationValue(1, 1, 0, 1, 1, 1));
  EXPECT_NE(base, EmulatedStage::ActivationValue(1, 1, 1, 2, 1, 1));
  EXPECT_NE(base, EmulatedStage::ActivationValue(1, 1, 1, 1, 2, 1));
  EXPECT_NE(base, EmulatedStage::ActivationValue(1, 1, 1, 1, 1, 2));
  EXPECT_NE(base, EmulatedStage::GradientValue(1, 1, 1, 1, 1, 1));
}

}  // namespace
}  // namespace tandem::runtime
