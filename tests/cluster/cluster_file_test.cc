// Heterogeneous cluster descriptions: parsing, node layout, speeds per application, errors that
// name the field.
#include "cluster/cluster_file.h"

#include "gtest/gtest.h"
#include "test_util.h"

namespace tandem::cluster {
namespace {

TEST(ClusterFile, LayoutAndSpeeds) {
  auto cluster = ParseClusterDescription(R"({
    "device_types": [
      {"name": "fast", "nodes": 2, "gpus_per_node": 4},
      {"name": "slow", "nodes": 1, "gpus_per_node": 2, "speed": 0.25}
    ],
    "application_speeds": {"ncf": {"slow": 1.5}}
  })", "inline");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const ClusterView view = cluster->View();
  ASSERT_EQ(view.nodes.size(), 3u);
  EXPECT_EQ(view.total_gpus(), 10);
  EXPECT_EQ(view.nodes[0].device_type, "fast");
  EXPECT_EQ(view.nodes[2].device_type, "slow");
  EXPECT_EQ(view.nodes[2].gpus, 2);
  EXPECT_DOUBLE_EQ(cluster->Speed("cifar10", "slow"), 0.25);
  EXPECT_DOUBLE_EQ(cluster->Speed("ncf", "slow"), 1.5);
  EXPECT_DOUBLE_EQ(cluster->Speed("ncf", "fast"), 1.0);

  Workload workload;
  workload.jobs.push_back({"a", 0, "ncf", 1, 128});
  workload.jobs.push_back({"b", 0, "", 1, 0, 100});
  workload.jobs[1].device_throughput["slow"] = 0.5;  // a job's own figure wins
  ApplyDeviceSpeeds(*cluster, &workload);
  EXPECT_DOUBLE_EQ(workload.jobs[0].device_throughput.at("slow"), 1.5);
  EXPECT_DOUBLE_EQ(workload.jobs[0].device_throughput.at("fast"), 1.0);
  EXPECT_DOUBLE_EQ(workload.jobs[1].device_throughput.at("slow"), 0.5);
}

TEST(ClusterFile, ShippedGavelClusterLoads) {
  auto cluster = ReadClusterDescription(testing::DataPath("gavel/v100-p100-k80.json"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(cluster->View().total_gpus(), 80);
  // Gavel's measurements: the recommendation model runs faster on K80 than on V100.
  EXPECT_GT(cluster->Speed("ncf", "k80"), 1.0);
  EXPECT_LT(cluster->Speed("cifar10", "k80"), 0.2);
}

TEST(ClusterFile, BadDescriptionsNameTheProblem) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"{", "not valid JSON"},
      {"[]", "expected a JSON object"},
      {"{}", "'device_types' must be a non-empty list"},
      {R"({"device_types": [], "x": 1})", "unknown field 'x'"},
      {R"({"device_types": [{"name": "a", "nodes": 1}]})", "missing 'gpus_per_node'"},
      {R"({"device_types": [{"name": "a", "nodes": 0, "gpus_per_node": 4}]})",
       "'nodes' must be a whole number in [1, 1000000]"},
      {R"({"device_types": [{"name": "a", "nodes": 1.5, "gpus_per_node": 4}]})",
       "'nodes' must be a whole number"},
      {R"({"device_types": [{"name": "a", "nodes": 1, "gpus_per_node": 4, "speed": -1}]})",
       "speed must be a number in [0.001, 1000]"},
      // A speed that would make the simulation run for ever, and counts past the limits.
      {R"({"device_types": [{"name": "a", "nodes": 1, "gpus_per_node": 4, "speed": 1e-320}]})",
       "speed must be a number in [0.001, 1000] (relative to the reference device), got"},
      {R"({"device_types": [{"name": "a", "nodes": 2000000, "gpus_per_node": 1}]})",
       "'nodes' must be a whole number in [1, 1000000], got 2000000"},
      {R"({"device_types": [{"name": "a", "nodes": 1000, "gpus_per_node": 1000},
                            {"name": "b", "nodes": 1, "gpus_per_node": 1}]})",
       "1000001 GPUs (nodes x gpus_per_node over every device type); at most 1000000"},
      {R"({"device_types": [{"name": "a", "nodes": 1, "gpus_per_node": 4, "sped": 1}]})",
       "device_types[0]: unknown field 'sped'"},
      {R"({"device_types": [{"name": "a", "nodes": 1, "gpus_per_node": 4},
                            {"name": "a", "nodes": 1, "gpus_per_node": 4}]})",
       "device type 'a' given twice"},
      {R"({"device_types": [{"nodes": 1, "gpus_per_node": 4}]})", "'name' must be"},
      {R"({"device_types": [{"name": "a", "nodes": 1, "gpus_per_node": 4}],
           "application_speeds": {"ncf": {"b": 2}}})",
       "application_speeds.ncf: unknown device type 'b'"},
      {R"({"device_types": [{"name": "a", "nodes": 1, "gpus_per_node": 4}],
           "application_speeds": {"ncf": {"a": 0}}})",
       "speed must be a number in [0.001, 1000]"},
  };
  for (const Case& c : cases) {
    auto cluster = ParseClusterDescription(c.text, "bad.json");
    ASSERT_FALSE(cluster.ok()) << c.text;
    EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(cluster.status().message().find("bad.json: "), std::string::npos)
        << cluster.status();
    EXPECT_NE(cluster.status().message().find(c.message), std::string::npos)
        << c.text << " -> " << cluster.status();
  }
  EXPECT_FALSE(ReadClusterDescription("/nonexistent/cluster.json").ok());
}

}  // namespace
}  // namespace tandem::cluster
