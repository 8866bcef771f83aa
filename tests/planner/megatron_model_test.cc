// Megatron-LM's weak-scaling table (SC'21 Table 1) reproduced by the cost model and simulator:
// every row within 10% of the published teraFLOP/s per GPU, the FLOPs and parameter formulas
// against counts by hand, and the configuration search against the rows' own configurations.
#include "planner/megatron_model.h"

#include <cmath>

#include "gtest/gtest.h"
#include "planner/adapipe.h"
#include "planner/planner.h"

namespace tandem::planner {
namespace {

TEST(MegatronModel, ReproducesEveryRowOfTheTableWithinTenPercent) {
  const A100Cluster cluster = SeleneA100();
  const std::vector<MegatronTableRow> rows = MegatronTable1();
  ASSERT_EQ(rows.size(), 10u);
  for (const MegatronTableRow& row : rows) {
    auto predicted = PredictMegatron(row.model, row.config, cluster);
    ASSERT_TRUE(predicted.ok()) << predicted.status();
    EXPECT_NEAR(predicted->tflops_per_gpu / row.published_tflops_per_gpu, 1.0, 0.10)
        << row.parameters_billions << "B: predicted " << predicted->tflops_per_gpu
        << " TFLOP/s per GPU, published " << row.published_tflops_per_gpu;
    EXPECT_LT(predicted->memory_bytes, cluster.memory_bytes) << row.parameters_billions << "B";
  }
}

TEST(MegatronModel, IterationFlopsMatchACountByHandForTheTrillionParameterRow) {
  // Per sample and layer: forward GEMMs 24 s h^2 + 4 s^2 h, run four times (forward,
  // recomputed forward, backward twice); logits 2 s h V run three times (no recomputation).
  const double batch = 3072, s = 2048, l = 128, h = 25600, vocabulary = 51200;
  const double by_hand =
      batch * (l * 4 * (24 * s * h * h + 4 * s * s * h) + 3 * 2 * s * h * vocabulary);
  MegatronGpt model;  // 1T: 128 layers, h = 25600, 160 heads
  EXPECT_NEAR(MegatronIterationFlops(model, 3072) / by_hand, 1.0, 1e-12);
  EXPECT_NEAR(MegatronIterationFlops(model, 3072), 5.139051e19, 1e13);
  // At the published 163 TFLOP/s on 3,072 GPUs an iteration takes about 103 s.
  EXPECT_NEAR(MegatronIterationFlops(model, 3072) / (3072 * 163e12), 102.6, 0.1);
}

TEST(MegatronModel, ParametersMatchThePublishedSizes) {
  for (const MegatronTableRow& row : MegatronTable1()) {
    // The paper rounds to one decimal (1.65B is listed as 1.7B).
    EXPECT_NEAR(row.model.Parameters() / 1e9, row.parameters_billions, 0.051)
        << row.parameters_billions << "B";
  }
}

TEST(MegatronModel, RejectsConfigurationsThatDoNotDivide) {
  MegatronGpt model;
  MegatronConfig config;
  config.interleave_chunks = 3;  // 2 layers per rank
  EXPECT_EQ(PredictMegatron(model, config, SeleneA100()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = MegatronConfig{};
  config.tensor_parallel = 16;  // larger than a node
  config.pipeline_parallel = 32;
  EXPECT_EQ(PredictMegatron(model, config, SeleneA100()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MegatronModel, SearchIsAtLeastAsFastAsTheHandPickedConfigurationAndFits) {
  const A100Cluster cluster = SeleneA100();
  for (const MegatronTableRow& row : MegatronTable1()) {
    if (row.config.Gpus() > 512) continue;  // the larger rows run in the bench
    auto hand = PredictMegatron(row.model, row.config, cluster);
    ASSERT_TRUE(hand.ok());
    auto best = SearchMegatronConfig(row.model, row.config.Gpus(), row.config.global_batch,
                                     cluster);
    ASSERT_TRUE(best.ok()) << best.status();
    EXPECT_GE(best->prediction.tflops_per_gpu, hand->tflops_per_gpu * (1 - 1e-9));
    EXPECT_LE(best->prediction.memory_bytes, cluster.memory_bytes);
    EXPECT_EQ(best->config.Gpus(), row.config.Gpus());
  }
}

TEST(MegatronModel, SearchReportsTheSmallestMemoryWhenNothingFits) {
  A100Cluster cluster = SeleneA100();
  cluster.memory_bytes = 1e9;
  MegatronGpt model;
  auto best = SearchMegatronConfig(model, 64, 64, cluster);
  EXPECT_EQ(best.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(MegatronModel, AdaPipePlansTheProfileOfTheCostModel) {
  const A100Cluster figures = SeleneA100();
  const MegatronTableRow row = MegatronTable1()[4];  // 39.1B on 512 GPUs
  PlanRequest request;
  request.algorithm = Algorithm::kAdaPipe;
  request.profile = MegatronProfile(row.model, /*microbatch_size=*/1, figures);
  ASSERT_TRUE(pipeline::ValidateProfile(request.profile).ok());
  ASSERT_EQ(request.profile.layers.size(), size_t(row.model.layers) + 2);
  // Forward time of a layer at t = 8 equals the model's (compute + 2 all-reduces).
  auto hand = PredictMegatron(row.model, row.config, figures);
  ASSERT_TRUE(hand.ok());
  auto at_eight = ProfileAtTensorParallel(request.profile, 8);
  ASSERT_TRUE(at_eight.ok());
  EXPECT_NEAR(at_eight->layers[1].forward_seconds / hand->layer_forward_seconds, 1.0, 1e-9);
  request.cluster.nodes = row.config.Gpus() / 8;
  request.cluster.devices_per_node = 8;
  request.cluster.device_memory_bytes = figures.memory_bytes;
  request.cluster.levels = {{figures.nvlink_bytes_per_second, figures.latency_seconds},
                            {figures.infiniband_bytes_per_second_per_gpu, figures.latency_seconds}};
  request.microbatches = static_cast<int>(row.config.global_batch);
  request.schedule = "auto";
  auto outcome = MakePlan(request);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_LE(outcome->plan.tensor_parallel, 8);
  EXPECT_EQ(outcome->plan.world_size, row.config.Gpus());
  // Same costs, recomputation chosen per layer: no slower than Megatron-LM's configuration.
  EXPECT_LT(outcome->plan.predicted_iteration_seconds, hand->iteration_seconds);
}

}  // namespace
}  // namespace tandem::planner
