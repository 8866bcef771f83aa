// Round trips and bad input for the plan (plan.json) and profile (profile.json) formats.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "pipeline/plan.h"
#include "pipeline/profile.h"

namespace tandem::pipeline {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

Profile SmallProfile() {
  Profile profile;
  profile.model = "toy";
  profile.microbatch_size = 4;
  profile.device = "cpu";
  for (int i = 0; i < 4; ++i) {
    LayerProfile layer;
    layer.name = "layer" + std::to_string(i);
    layer.forward_seconds = 0.001 * (i + 1);
    layer.backward_seconds = 0.002 * (i + 1);
    layer.output_activation_bytes = 1024.0 * (i + 1);
    layer.stashed_activation_bytes = 4096.0;
    layer.parameter_bytes = 1e6;
    layer.optimizer_state_bytes = 2e6;
    layer.recompute_seconds = layer.forward_seconds;
    layer.recompute_stashed_bytes = 1024;
    profile.layers.push_back(layer);
  }
  profile.layers[2].inputs = {0, 1};  // a DAG edge skipping a layer
  profile.layers[3].backward_input_seconds = 0.005;
  profile.layers[3].backward_weight_seconds = 0.003;
  TensorParallelVariant variant;
  variant.degree = 2;
  variant.forward_seconds = 0.0006;
  variant.backward_seconds = 0.0012;
  variant.stashed_activation_bytes = 2048;
  variant.parameter_bytes = 5e5;
  variant.communication_seconds = 1e-4;
  profile.layers[1].tensor_parallel.push_back(variant);
  variant.degree = 4;  // a sequence-parallel variant round-trips too
  variant.sequence_parallel = true;
  profile.layers[1].tensor_parallel.push_back(variant);
  variant.expert_parallel = 2;  // and one with the experts on 2 parts of the group
  profile.layers[1].tensor_parallel.push_back(variant);
  return profile;
}

TEST(ProfileFormat, RoundTripsThroughJsonAndFile) {
  const Profile profile = SmallProfile();
  ASSERT_TRUE(ValidateProfile(profile).ok());
  auto parsed = ProfileFromJson(ToJson(profile));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, profile);
  const std::string path = TempPath("roundtrip_profile.json");
  ASSERT_TRUE(WriteProfileFile(profile, path).ok());
  auto read = ReadProfileFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, profile);
  EXPECT_DOUBLE_EQ(read->TotalForwardSeconds(), 0.010);
  EXPECT_DOUBLE_EQ(read->TotalParameterBytes(), 4e6);
}

TEST(ProfileFormat, InputsMayNameLayers) {
  nlohmann::json j = ToJson(SmallProfile());
  j["layers"][3]["inputs"] = {"layer0", "layer2"};
  auto parsed = ProfileFromJson(j, "model.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->layers[3].inputs, (std::vector<int>{0, 2}));
}

// Each bad input gives InvalidArgument naming the file and the field.
struct BadProfileCase {
  std::string description;
  std::function<void(nlohmann::json&)> corrupt;
  std::string expected_text;
};

TEST(ProfileFormat, BadInputNamesFileAndField) {
  const std::vector<BadProfileCase> cases = {
      {"missing forward", [](nlohmann::json& j) { j["layers"][1].erase("forward_seconds"); },
       "model.json: layers[1].forward_seconds: missing field"},
      {"mistyped backward", [](nlohmann::json& j) { j["layers"][0]["backward_seconds"] = "x"; },
       "layers[0].backward_seconds: expected a number"},
      {"negative time", [](nlohmann::json& j) { j["layers"][2]["forward_seconds"] = -1.0; },
       "layers[2].forward_seconds: must not be negative"},
      {"unknown layer name", [](nlohmann::json& j) { j["layers"][2]["inputs"] = {"nope"}; },
       "layers[2].inputs[0]: unknown layer name 'nope'"},
      {"cycle", [](nlohmann::json& j) { j["layers"][1]["inputs"] = {"layer3"}; },
       "layers[1].inputs[0]: refers to layers[3]"},
      {"self loop", [](nlohmann::json& j) { j["layers"][1]["inputs"] = {1}; }, "no cycles"},
      {"missing microbatch size", [](nlohmann::json& j) { j.erase("microbatch_size"); },
       "model.json: profile.microbatch_size: missing field"},
      {"no layers", [](nlohmann::json& j) { j["layers"] = nlohmann::json::array(); },
       "the model has no layers"},
      {"duplicate names", [](nlohmann::json& j) { j["layers"][2]["name"] = "layer0"; },
       "layers[2].name: 'layer0' repeats layers[0]"},
      {"bad split", [](nlohmann::json& j) { j["layers"][3]["backward_weight_seconds"] = 1.0; },
       "differs from backward_seconds"},
      {"bad degree", [](nlohmann::json& j) { j["layers"][1]["tensor_parallel"][0]["degree"] = 1; },
       "layers[1].tensor_parallel[0].degree"},
      {"bad sequence_parallel",
       [](nlohmann::json& j) { j["layers"][1]["tensor_parallel"][1]["sequence_parallel"] = 1; },
       "layers[1].tensor_parallel[1].sequence_parallel: must be true or false"},
      {"repeated variant",
       [](nlohmann::json& j) {
         j["layers"][1]["tensor_parallel"][1]["degree"] = 2;
         j["layers"][1]["tensor_parallel"][1]["sequence_parallel"] = false;
       },
       "layers[1].tensor_parallel[1].degree: degree 2 without sequence parallelism repeats"},
      {"repeated experts' variant",
       [](nlohmann::json& j) { j["layers"][1]["tensor_parallel"][1]["expert_parallel"] = 2; },
       "layers[1].tensor_parallel[2].degree: degree 4 with sequence parallelism and experts on 2 "
       "parts repeats"},
      {"experts on parts that do not divide the degree",
       [](nlohmann::json& j) { j["layers"][1]["tensor_parallel"][2]["expert_parallel"] = 3; },
       "layers[1].tensor_parallel[2].expert_parallel: must divide the degree 4 (got 3)"},
      {"experts on no parts",
       [](nlohmann::json& j) { j["layers"][1]["tensor_parallel"][2]["expert_parallel"] = 0; },
       "layers[1].tensor_parallel[2].expert_parallel: must divide the degree 4 (got 0)"},
      {"experts' parts not a number",
       [](nlohmann::json& j) { j["layers"][1]["tensor_parallel"][2]["expert_parallel"] = "two"; },
       "layers[1].tensor_parallel[2].expert_parallel"},
  };
  for (const BadProfileCase& c : cases) {
    nlohmann::json j = ToJson(SmallProfile());
    c.corrupt(j);
    auto parsed = ProfileFromJson(j, "model.json");
    ASSERT_FALSE(parsed.ok()) << c.description;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.description;
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), c.expected_text))
        << c.description << ": " << parsed.status().message();
  }
}

// A degree may be listed twice, once with sequence parallelism: the planner weighs both.
TEST(ProfileFormat, ADegreeMayComeWithAndWithoutSequenceParallelism) {
  nlohmann::json j = ToJson(SmallProfile());
  j["layers"][1]["tensor_parallel"][1]["degree"] = 2;
  auto parsed = ProfileFromJson(j, "model.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->layers[1].tensor_parallel.size(), 3u);
  EXPECT_FALSE(parsed->layers[1].tensor_parallel[0].sequence_parallel);
  EXPECT_TRUE(parsed->layers[1].tensor_parallel[1].sequence_parallel);
}

TEST(ProfileFormat, WriteRefusesInvalidProfileAndLeavesNoFile) {
  Profile profile = SmallProfile();
  profile.layers[0].forward_seconds = -1;
  const std::string path = TempPath("invalid_profile.json");
  std::remove(path.c_str());
  EXPECT_FALSE(WriteProfileFile(profile, path).ok());
  EXPECT_FALSE(std::ifstream(path).good());
}

TEST(PlanFormat, UniformPlanSplitsLayersAndRanks) {
  ScheduleSpec spec;
  spec.kind = ScheduleKind::k1F1B;
  spec.num_ranks = 3;
  spec.num_microbatches = 6;
  auto plan = MakeUniformPlan(/*num_layers=*/8, spec, /*data_parallel=*/2, /*microbatch_size=*/4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 3u);
  EXPECT_EQ(plan->stages[0].end_layer - plan->stages[0].first_layer, 3);
  EXPECT_EQ(plan->stages[1].end_layer - plan->stages[1].first_layer, 3);
  EXPECT_EQ(plan->stages[2].end_layer - plan->stages[2].first_layer, 2);
  EXPECT_EQ(plan->stages[1].ranks, (std::vector<int>{1, 4}));
  EXPECT_EQ(plan->world_size, 6);
  EXPECT_EQ(plan->GlobalBatchSize(), 4 * 6 * 2);
  EXPECT_EQ(plan->RankOf(/*data_parallel_index=*/1, /*replica=*/0, /*stage=*/2), 5);
  EXPECT_TRUE(ValidatePlan(*plan, /*expected_world_size=*/6, /*expected_num_layers=*/8).ok());
  auto wrong_world = ValidatePlan(*plan, /*expected_world_size=*/4);
  EXPECT_TRUE(absl::StrContains(wrong_world.message(), "6 ranks but this run has 4"))
      << wrong_world;
}

TEST(PlanFormat, ChimeraStagesHaveTwoCopies) {
  ScheduleSpec spec;
  spec.kind = ScheduleKind::kChimera;
  spec.num_ranks = 4;
  spec.num_microbatches = 4;
  auto plan = MakeUniformPlan(/*num_layers=*/8, spec, /*data_parallel=*/1, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Stage 0 runs on rank 0 (replica 0) and rank 3 (replica 1).
  EXPECT_EQ(plan->stages[0].ranks, (std::vector<int>{0, 3}));
  EXPECT_EQ(plan->RankOf(0, /*replica=*/1, /*stage=*/1), 2);
}

// Each pipeline position's load under `plan`: the costs of the stages it holds, a replica's
// stages weighted by its share of the micro-batches (computed here from the plan's ranks).
std::vector<double> Loads(const Plan& plan, const std::vector<double>& costs) {
  std::vector<double> loads(plan.pipeline_parallel, 0.0);
  for (const PlanStage& stage : plan.stages) {
    double cost = 0;
    for (int l = stage.first_layer; l < stage.end_layer; ++l) cost += costs[l];
    for (int rank : stage.ranks) loads[rank] += cost / stage.ranks.size();
  }
  return loads;
}

double MaxLoad(const Plan& plan, const std::vector<double>& costs) {
  const std::vector<double> loads = Loads(plan, costs);
  return *std::max_element(loads.begin(), loads.end());
}

// The least busiest-position load over every split of the layers into the plan's stages.
double BruteForceBest(const Plan& plan, const std::vector<double>& costs) {
  const int stages = static_cast<int>(plan.stages.size());
  const int n = static_cast<int>(costs.size());
  Plan trial = plan;
  double best = 1e300;
  std::function<void(int, int)> place = [&](int s, int first) {
    trial.stages[s].first_layer = first;
    if (s == stages - 1) {
      trial.stages[s].end_layer = n;
      best = std::min(best, MaxLoad(trial, costs));
      return;
    }
    for (int end = first + 1; end <= n - (stages - 1 - s); ++end) {
      trial.stages[s].end_layer = end;
      place(s + 1, end);
    }
  };
  place(0, 0);
  return best;
}

TEST(PlanFormat, BalancedPlanEvensOutThePositionsOfAWave) {
  // A GPT: a cheap embedding, 8 equal blocks, a head a tenth of a block.
  std::vector<double> costs(10, 1.0);
  costs[0] = 0.01;
  costs[9] = 0.1;
  ScheduleSpec spec;
  spec.kind = ScheduleKind::kZBV;
  spec.num_ranks = 2;
  spec.num_microbatches = 8;
  auto even = MakeUniformPlan(10, spec, 1, 4);
  auto balanced = MakeBalancedPlan(costs, spec, 1, 4);
  ASSERT_TRUE(even.ok() && balanced.ok()) << balanced.status();
  EXPECT_TRUE(ValidatePlan(*balanced, 2, 10).ok());
  EXPECT_EQ(balanced->algorithm, "balanced");
  // Position 0 holds the first and the last stage: by count it gets 3 blocks, position 1 5.
  EXPECT_DOUBLE_EQ(MaxLoad(*even, costs), 5.0);
  EXPECT_DOUBLE_EQ(MaxLoad(*balanced, costs), 4.11);
  // And 1F1B on 4 positions: by count [e,b,b] [b,b,b] [b,b] [b,h].
  spec.kind = ScheduleKind::k1F1B;
  spec.num_ranks = 4;
  even = MakeUniformPlan(10, spec, 1, 4);
  balanced = MakeBalancedPlan(costs, spec, 1, 4);
  ASSERT_TRUE(even.ok() && balanced.ok()) << balanced.status();
  EXPECT_DOUBLE_EQ(MaxLoad(*even, costs), 3.0);
  EXPECT_DOUBLE_EQ(MaxLoad(*balanced, costs), 2.1);
}

TEST(PlanFormat, BalancedPlanIsNearTheExhaustiveOptimum) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> cost(0.1, 3.0);
  struct Shape {
    ScheduleKind kind;
    int ranks, chunks, waves;
  };
  const Shape shapes[] = {{ScheduleKind::k1F1B, 3, 1, 1},
                          {ScheduleKind::kZBV, 2, 1, 1},
                          {ScheduleKind::kZBV, 3, 1, 1},
                          {ScheduleKind::kChimera, 4, 1, 1},
                          {ScheduleKind::kInterleaved, 2, 2, 1},
                          {ScheduleKind::kHanayo, 2, 1, 2}};
  int optimal = 0, cases = 0;
  double worst = 1;
  for (const Shape& shape : shapes) {
    for (int trial = 0; trial < 20; ++trial) {
      ScheduleSpec spec;
      spec.kind = shape.kind;
      spec.num_ranks = shape.ranks;
      spec.chunks = shape.chunks;
      spec.waves = shape.waves;
      spec.num_microbatches = 2 * shape.ranks;
      std::vector<double> costs(12);
      for (double& c : costs) c = cost(random);
      auto plan = MakeBalancedPlan(costs, spec, 1, 1);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_TRUE(ValidatePlan(*plan, shape.ranks, 12).ok());
      const double best = BruteForceBest(*plan, costs);
      const double got = MaxLoad(*plan, costs);
      // Within one layer of the exhaustive optimum, never worse than the even split.
      const double largest = *std::max_element(costs.begin(), costs.end());
      EXPECT_LE(got, best + largest) << ScheduleKindName(shape.kind) << " trial " << trial;
      auto even = MakeUniformPlan(12, spec, 1, 1);
      ASSERT_TRUE(even.ok());
      EXPECT_LE(got, MaxLoad(*even, costs) + 1e-9) << ScheduleKindName(shape.kind);
      worst = std::max(worst, got / best);
      optimal += got <= best + 1e-9;
      ++cases;
    }
  }
  std::cout << optimal << " of " << cases << " splits optimal, the worst " << worst
            << "x the optimum\n";
  EXPECT_GE(optimal, cases / 2);
}

TEST(PlanFormat, BalancedPlanRefusesBadCosts) {
  ScheduleSpec spec;
  spec.kind = ScheduleKind::k1F1B;
  spec.num_ranks = 2;
  spec.num_microbatches = 2;
  EXPECT_FALSE(MakeBalancedPlan({1.0, -1.0, 1.0}, spec, 1, 1).ok());
  EXPECT_FALSE(MakeBalancedPlan({1.0, std::nan(""), 1.0}, spec, 1, 1).ok());
  EXPECT_FALSE(MakeBalancedPlan({1.0}, spec, 1, 1).ok());  // fewer layers than stages
  auto zero = MakeBalancedPlan({0.0, 0.0, 0.0}, spec, 1, 1);  // nothing to balance
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->stages[0].end_layer, 2);
}

TEST(PlanFormat, InterleavedPlanRoundTripsThroughFile) {
  ScheduleSpec spec;
  spec.kind = ScheduleKind::kInterleaved;
  spec.num_ranks = 2;
  spec.chunks = 2;
  spec.num_microbatches = 4;
  auto plan = MakeUniformPlan(/*num_layers=*/9, spec, /*data_parallel=*/2, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  plan->stages[0].recompute_layers = {1};
  plan->predicted_iteration_seconds = 1.25;
  plan->predicted_peak_memory_bytes = {1e9, 2e9, 3e9, 4e9};
  plan->algorithm = "test";
  plan->inputs = {{"devices", 4}};
  const std::string path = TempPath("roundtrip_plan.json");
  ASSERT_TRUE(WritePlanFile(*plan, path).ok());
  auto read = ReadPlanFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, *plan);
}

TEST(PlanFormat, NonUniformPlanValidates) {
  Plan plan;
  plan.num_layers = 5;
  plan.world_size = 4;
  plan.pipeline_parallel = 2;
  plan.schedule.num_ranks = 2;
  plan.schedule.num_microbatches = 4;
  plan.stages.resize(2);
  plan.stages[0] = {0, 3, {0, 1, 2}, 1, {}, 0, 0};
  plan.stages[1] = {3, 5, {3}, 1, {}, 0, 0};
  EXPECT_FALSE(plan.IsUniform());
  ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  EXPECT_EQ(plan.RankOf(2, 0, 0), 2);
  auto parsed = PlanFromJson(ToJson(plan));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, plan);
  plan.stages[1].ranks = {2};  // rank 2 twice, rank 3 unused
  EXPECT_TRUE(absl::StrContains(ValidatePlan(plan).message(), "rank 2 is used twice"));
}

// A plan's stages index its layer_order when it has one; without one (every chain model's
// plan) nothing is written, so such plans read and write as before.
TEST(PlanFormat, LayerOrderRoundTripsAndIsWrittenOnlyWhenNeeded) {
  Plan plan;
  plan.num_layers = 4;
  plan.world_size = 2;
  plan.pipeline_parallel = 2;
  plan.schedule.num_ranks = 2;
  plan.schedule.num_microbatches = 2;
  plan.stages.resize(2);
  plan.stages[0] = {0, 2, {0}, 1, {}, 0, 0};
  plan.stages[1] = {2, 4, {1}, 1, {}, 0, 0};
  const nlohmann::json chain = ToJson(plan);
  EXPECT_FALSE(chain.contains("layer_order"));
  EXPECT_EQ(plan.LayerAt(2), 2);
  plan.layer_order = {0, 2, 1, 3};  // stage 0 runs layers 0 and 2, stage 1 layers 1 and 3
  ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  EXPECT_EQ(plan.LayerAt(1), 2);
  EXPECT_EQ(plan.LayerAt(2), 1);
  const nlohmann::json ordered = ToJson(plan);
  EXPECT_EQ(ordered["layer_order"], nlohmann::json({0, 2, 1, 3}));
  auto parsed = PlanFromJson(ordered);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, plan);
  nlohmann::json without = ordered;
  without.erase("layer_order");
  EXPECT_EQ(without, chain);
}

// Sequence parallelism is the plan's when the planner chose it: written only then (plans
// without it read and write as before), read back, and refused without tensor parallelism.
TEST(PlanFormat, SequenceParallelRoundTripsAndNeedsTensorParallelism) {
  ScheduleSpec spec;
  spec.num_ranks = 2;
  spec.num_microbatches = 2;
  auto plain = MakeUniformPlan(4, spec, 1, 1);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(ToJson(*plain).contains("sequence_parallel"));
  auto plan = WithTensorParallel(*plain, 2);
  ASSERT_TRUE(plan.ok());
  plan->sequence_parallel = true;
  const nlohmann::json j = ToJson(*plan);
  EXPECT_EQ(j["sequence_parallel"], true);
  auto parsed = PlanFromJson(j);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->sequence_parallel);
  EXPECT_EQ(*parsed, *plan);
  nlohmann::json bad = ToJson(*plain);
  bad["sequence_parallel"] = true;
  EXPECT_TRUE(absl::StrContains(PlanFromJson(bad, "p.json").status().message(),
                                "plan.sequence_parallel: splits the sequence over "
                                "tensor-parallel groups: it needs tensor_parallel 2 or more"))
      << PlanFromJson(bad, "p.json").status();
  bad["sequence_parallel"] = "yes";
  EXPECT_TRUE(
      absl::StrContains(PlanFromJson(bad, "p.json").status().message(), "plan.sequence_parallel"))
      << PlanFromJson(bad, "p.json").status();
}

// The experts' parts are the plan's when the planner chose more than one: written only then,
// read back, and refused where they do not divide the tensor-parallel degree.
TEST(PlanFormat, ExpertParallelRoundTripsAndDividesTheDegree) {
  ScheduleSpec spec;
  spec.num_ranks = 2;
  spec.num_microbatches = 2;
  auto plain = MakeUniformPlan(4, spec, 1, 1);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(ToJson(*plain).contains("expert_parallel"));
  auto plan = WithTensorParallel(*plain, 4);
  ASSERT_TRUE(plan.ok());
  plan->expert_parallel = 2;
  const nlohmann::json j = ToJson(*plan);
  EXPECT_EQ(j["expert_parallel"], 2);
  auto parsed = PlanFromJson(j);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->expert_parallel, 2);
  EXPECT_EQ(*parsed, *plan);
  nlohmann::json bad = j;
  bad["expert_parallel"] = 3;
  EXPECT_TRUE(absl::StrContains(PlanFromJson(bad, "p.json").status().message(),
                                "p.json: plan.expert_parallel: places the experts on parts of "
                                "tensor-parallel groups: it must divide every group's degree "
                                "(tensor_parallel 4), got 3"))
      << PlanFromJson(bad, "p.json").status();
  bad = ToJson(*plain);
  bad["expert_parallel"] = 2;  // no group to place them on
  EXPECT_TRUE(
      absl::StrContains(PlanFromJson(bad, "p.json").status().message(), "plan.expert_parallel"))
      << PlanFromJson(bad, "p.json").status();
  bad["expert_parallel"] = 0;
  EXPECT_TRUE(
      absl::StrContains(PlanFromJson(bad, "p.json").status().message(), "plan.expert_parallel"))
      << PlanFromJson(bad, "p.json").status();
}

TEST(PlanFormat, BadPlansNameTheField) {
  ScheduleSpec spec;
  spec.num_ranks = 2;
  spec.num_microbatches = 2;
  auto plan = MakeUniformPlan(4, spec, 1, 1);
  ASSERT_TRUE(plan.ok());
  nlohmann::json good = ToJson(*plan);
  struct Case {
    std::function<void(nlohmann::json&)> corrupt;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& j) { j.erase("stages"); }, "p.json: plan.stages: missing field"},
      {[](nlohmann::json& j) { j["stages"][1]["first_layer"] = 3; },
       "plan.stages[1].first_layer: expected 2"},
      {[](nlohmann::json& j) { j["stages"][1]["end_layer"] = 5; }, "model has 4 layers"},
      {[](nlohmann::json& j) { j["mesh"][0][1] = 0; }, "appears twice in the mesh"},
      {[](nlohmann::json& j) { j["schedule"]["name"] = "zigzag"; }, "plan.schedule.name"},
      {[](nlohmann::json& j) { j["world_size"] = "two"; }, "plan.world_size: expected an integer"},
      {[](nlohmann::json& j) { j["stages"][0]["ranks"] = {1}; }, "plan.stages[0].ranks"},
      {[](nlohmann::json& j) { j["stages"][0]["recompute_layers"] = {3}; },
       "outside the stage's [0, 2)"},
      {[](nlohmann::json& j) { j["layer_order"] = {0, 2, 1}; },
       "plan.layer_order: lists 3 layers but the model has 4"},
      {[](nlohmann::json& j) { j["layer_order"] = {0, 2, 2, 1}; }, "layer 2 is listed twice"},
      {[](nlohmann::json& j) { j["layer_order"] = {0, 4, 2, 1}; },
       "plan.layer_order: layer 4 is outside [0, 4)"},
      {[](nlohmann::json& j) { j["layer_order"] = "0123"; }, "plan.layer_order"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.corrupt(j);
    auto parsed = PlanFromJson(j, "p.json");
    ASSERT_FALSE(parsed.ok()) << c.expected;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), c.expected))
        << c.expected << " vs " << parsed.status().message();
  }
}

TEST(PlanFormat, MakeUniformPlanRejectsTooFewLayers) {
  ScheduleSpec spec;
  spec.num_ranks = 4;
  spec.num_microbatches = 4;
  auto plan = MakeUniformPlan(3, spec, 1, 1);
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "needs at least 4 layers"));
}

}  // namespace
}  // namespace tandem::pipeline
