// Importers and the layer chain: PipeDream's graph.txt (chains and DAGs), Piper's JSON, Metis'
// samples, conversions, cut costs, cluster descriptions.
#include "planner/importers.h"

#include <cstdio>
#include <fstream>

#include <unistd.h>

#include "absl/strings/match.h"
#include "common/json_util.h"
#include "gtest/gtest.h"
#include "planner/cluster.h"
#include "planner/layer_chain.h"
#include "tests/planner/test_util.h"

namespace tandem::planner {
namespace {

TEST(PipeDreamImport, Vgg16HasAWorkFreeInputAndOneDiamond) {
  auto profile = ReadPipeDreamGraphFile(testing::DataPath("pipedream/vgg16.graph.txt"));
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->layers.size(), 41u);
  EXPECT_EQ(profile->layers[0].name, "node1");  // the Input node, zeroed as PipeDream does
  EXPECT_EQ(profile->layers[0].forward_seconds, 0);
  EXPECT_NEAR(profile->TotalForwardSeconds() + profile->TotalBackwardSeconds(), 0.672535, 1e-9);
  // A chain except for View, which reads both the pooled tensor and its Size.
  int dag_layers = 0;
  for (const auto& layer : profile->layers) {
    if (layer.inputs.empty()) continue;
    ++dag_layers;
    EXPECT_EQ(layer.name, "node34");
    EXPECT_EQ(layer.inputs.size(), 2u);
  }
  EXPECT_EQ(dag_layers, 1);
}

TEST(PipeDreamImport, GnmtDagKeepsEveryEdgeAndCountsCrossingTensors) {
  auto profile = ReadPipeDreamGraphFile(testing::DataPath("pipedream/gnmt.graph.txt"));
  ASSERT_TRUE(profile.ok()) << profile.status();
  int with_inputs = 0;
  for (size_t i = 0; i < profile->layers.size(); ++i) {
    for (int u : profile->layers[i].inputs) EXPECT_LT(u, static_cast<int>(i));
    with_inputs += profile->layers[i].inputs.empty() ? 0 : 1;
  }
  EXPECT_GT(with_inputs, 0);  // GNMT has skip connections
  for (const auto& layer : profile->layers) {
    EXPECT_FALSE(absl::StartsWith(layer.name, "__getitem__")) << layer.name;
  }
  auto chain = LayerChain::FromProfile(*profile);
  ASSERT_TRUE(chain.ok());
  // Every cut's bytes are the outputs of earlier layers read at or after the cut.
  const int n = chain->num_layers();
  for (int cut = 1; cut < n; ++cut) {
    double expected = 0;
    for (int u = 0; u < cut; ++u) {
      bool read_later = false;
      for (int v = cut; v < n && !read_later; ++v) {
        const auto& in = profile->layers[v].inputs;
        read_later = in.empty() ? v - 1 == u : std::count(in.begin(), in.end(), u) > 0;
      }
      if (read_later) expected += profile->layers[u].output_activation_bytes;
    }
    EXPECT_NEAR(chain->CutBytes(cut), expected, 1e-6) << "cut " << cut;
  }
}

TEST(PipeDreamImport, BadGraphsNameTheLine) {
  const std::string node =
      "node1 -- A -- forward_compute_time=1.0, backward_compute_time=1.0, "
      "activation_size=[1.0; 2.0], parameter_size=5.0\n";
  auto ok = ImportPipeDreamGraph(node, "g.txt");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->layers[0].output_activation_bytes, 3.0);  // "[a; b]" summed
  struct Case {
    std::string text, message;
  };
  for (const Case& c : std::vector<Case>{
           {"node1 -- A -- forward_compute_time=1.0, backward_compute_time=1.0, "
            "activation_size=1.0\n",
            "g.txt:1: node1.parameter_size: missing field"},
           {"node1 -- A -- forward_compute_time=-1.0, backward_compute_time=1.0, "
            "activation_size=1.0, parameter_size=1.0\n",
            "node1.forward_compute_time: must not be negative"},
           {node + "\tnode1 -- node9\n", "g.txt:2: edge refers to unknown node 'node9'"},
           {node + node, "g.txt:2: node 'node1' is defined twice"},
           {"garbage\n", "g.txt:1: expected 'nodeN -- description"},
       }) {
    auto result = ImportPipeDreamGraph(c.text, "g.txt");
    ASSERT_FALSE(result.ok()) << c.text;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(result.status().message(), c.message))
        << result.status().message();
  }
}

std::string WriteTemp(const std::string& text) {
  char path[] = "/tmp/tandem_piper_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(PiperImport, BertPlacesTheMaskRightBeforeTheFirstTransformer) {
  auto instance = ReadPiperFile(testing::DataPath("piper/bert32a100.json"));
  ASSERT_TRUE(instance.ok()) << instance.status();
  ASSERT_EQ(instance->nodes.size(), 37u);
  for (const PiperEdge& e : instance->edges) EXPECT_LT(e.source, e.destination);
  // The mask tensor feeds all 32 transformer layers; as late as possible is right before the
  // first of them.
  int mask = -1;
  for (size_t v = 0; v < instance->nodes.size(); ++v) {
    int out = 0;
    for (const PiperEdge& e : instance->edges) out += e.source == static_cast<int>(v) ? 1 : 0;
    if (out == 32) mask = static_cast<int>(v);
  }
  ASSERT_GE(mask, 0);
  EXPECT_EQ(instance->nodes[mask + 1].name, "ParallelTransformerLayer");
  EXPECT_NE(instance->nodes[mask - 1].name, "ParallelTransformerLayer");
  // As a tandem profile: unique names, recomputation figures from the second configuration.
  auto profile = ProfileFromPiper(*instance, "bert32");
  ASSERT_TRUE(profile.ok()) << profile.status();
  const auto& transformer = profile->layers[mask + 1];
  EXPECT_GT(transformer.recompute_seconds, 0);
  EXPECT_LT(transformer.recompute_stashed_bytes, transformer.stashed_activation_bytes);
  EXPECT_EQ(transformer.tensor_parallel.size(), 3u);  // degrees 2, 4, 8
}

TEST(PiperImport, BadInputNamesTheField) {
  const nlohmann::json good = {
      {"maxDevices", 2}, {"maxMemoryPerDevice", 1e9}, {"bandwidth", 1e9}, {"mbsInBatch", 4},
      {"nodes",
       {{{"id", 7},
         {"name", "a"},
         {"TMPCs",
          {{"1",
            {{{"id", "vanilla"}, {"timePerSample", 1.0}, {"parameterSize", 1.0},
              {"memoryUsageA", 1.0}, {"memoryUsageB", 1.0}, {"syncTimeFw", nlohmann::json::object()},
              {"syncTimeBw", nlohmann::json::object()}}}}}}},
        {{"id", 8},
         {"name", "b"},
         {"TMPCs",
          {{"1",
            {{{"id", "vanilla"}, {"timePerSample", 1.0}, {"parameterSize", 1.0},
              {"memoryUsageA", 1.0}, {"memoryUsageB", 1.0}, {"syncTimeFw", {{"7", 0.0}}},
              {"syncTimeBw", nlohmann::json::object()}}}}}}}}},
      {"edges", {{{"sourceId", 7}, {"destId", 8}, {"communicationCost", 10.0}}}}};
  ASSERT_TRUE(ImportPiperJson(good, "p.json").ok());
  struct Case {
    std::function<void(nlohmann::json&)> corrupt;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {[](nlohmann::json& j) { j.erase("mbsInBatch"); }, "p.json: piper.mbsInBatch"},
           {[](nlohmann::json& j) { j["nodes"][1]["TMPCs"]["1"][0]["timePerSample"] = -1.0; },
            "nodes[1].TMPCs.1[0].timePerSample: must not be negative"},
           {[](nlohmann::json& j) { j["edges"][0]["destId"] = 99; }, "unknown node id 99"},
           {[](nlohmann::json& j) {
              j["edges"].push_back({{"sourceId", 8}, {"destId", 7}, {"communicationCost", 1.0}});
            },
            "cycle"},
           {[](nlohmann::json& j) { j["nodes"][0]["TMPCs"]["x"] = nlohmann::json::array(); },
            "tensor-parallel degree"},
       }) {
    nlohmann::json j = good;
    c.corrupt(j);
    auto result = ImportPiperJson(j, "p.json");
    ASSERT_FALSE(result.ok()) << c.message;
    EXPECT_TRUE(absl::StrContains(result.status().message(), c.message))
        << result.status().message();
    // The same file read from disk (direct reader or document) says the same.
    const std::string path = WriteTemp(j.dump());
    auto from_file = ReadPiperFile(path);
    ASSERT_FALSE(from_file.ok()) << c.message;
    EXPECT_EQ(from_file.status().message(), ImportPiperJson(j, path).status().message());
    std::remove(path.c_str());
  }
}

void ExpectSameInstance(const PiperInstance& a, const PiperInstance& b) {
  EXPECT_EQ(a.max_devices, b.max_devices);
  EXPECT_EQ(a.memory_per_device_bytes, b.memory_per_device_bytes);
  EXPECT_EQ(a.bandwidth_bytes_per_second, b.bandwidth_bytes_per_second);
  EXPECT_EQ(a.microbatches_per_batch, b.microbatches_per_batch);
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  for (size_t v = 0; v < a.nodes.size(); ++v) {
    EXPECT_EQ(a.nodes[v].name, b.nodes[v].name);
    ASSERT_EQ(a.nodes[v].configs.size(), b.nodes[v].configs.size()) << v;
    for (const auto& [degree, configs] : a.nodes[v].configs) {
      const std::vector<PiperConfig>& other = b.nodes[v].configs.at(degree);
      ASSERT_EQ(configs.size(), other.size());
      for (size_t l = 0; l < configs.size(); ++l) {
        EXPECT_EQ(configs[l].id, other[l].id);
        EXPECT_EQ(configs[l].time_per_sample, other[l].time_per_sample);
        EXPECT_EQ(configs[l].parameter_bytes, other[l].parameter_bytes);
        EXPECT_EQ(configs[l].memory_per_microbatch_bytes, other[l].memory_per_microbatch_bytes);
        EXPECT_EQ(configs[l].memory_fixed_bytes, other[l].memory_fixed_bytes);
        EXPECT_EQ(configs[l].sync_forward_bytes, other[l].sync_forward_bytes);
        EXPECT_EQ(configs[l].sync_backward_bytes, other[l].sync_backward_bytes);
      }
    }
  }
  ASSERT_EQ(a.edges.size(), b.edges.size());
  for (size_t e = 0; e < a.edges.size(); ++e) {
    EXPECT_EQ(a.edges[e].source, b.edges[e].source);
    EXPECT_EQ(a.edges[e].destination, b.edges[e].destination);
    EXPECT_EQ(a.edges[e].bytes, b.edges[e].bytes);
  }
}

// ReadPiperFile reads well-formed files directly; the result is the JSON document's.
TEST(PiperImport, FileReaderMatchesTheDocument) {
  const std::string bert = testing::DataPath("piper/bert32a100.json");
  auto direct = ReadPiperFile(bert);
  ASSERT_TRUE(direct.ok()) << direct.status();
  auto document = ReadJsonFile(bert);
  ASSERT_TRUE(document.ok());
  auto imported = ImportPiperJson(*document, bert);
  ASSERT_TRUE(imported.ok());
  ExpectSameInstance(*direct, *imported);
  // What the direct reader leaves to the document: escapes, extra fields, integral floats.
  nlohmann::json j = *document;
  j["nodes"][0]["name"] = "quoted \"name\"";
  j["comment"] = {{"list", {1, true, nullptr, "x"}}};
  j["maxDevices"] = 16.0;
  const std::string path = WriteTemp(j.dump(1));
  auto odd = ReadPiperFile(path);
  ASSERT_TRUE(odd.ok()) << odd.status();
  ExpectSameInstance(*odd, *ImportPiperJson(j, path));
  std::remove(path.c_str());
}

TEST(MetisImport, Gpt3SampleBecomesTenLayers) {
  auto profile = ReadProfileAs(testing::DataPath("metis/gpt3_a100_tp1_bs1.json"), "metis");
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->layers.size(), 10u);
  // Transformer groups: 29.508 ms forward + backward, 202383360 parameter bytes.
  EXPECT_NEAR(profile->layers[1].forward_seconds + profile->layers[1].backward_seconds,
              0.029508, 1e-6);
  EXPECT_EQ(profile->layers[1].parameter_bytes, 202383360);
  EXPECT_GT(profile->layers[1].stashed_activation_bytes, 0);
}

TEST(Conversions, ProfileToPiperAndBackKeepsCosts) {
  auto vgg = ReadPipeDreamGraphFile(testing::DataPath("pipedream/vgg16.graph.txt"));
  ASSERT_TRUE(vgg.ok());
  PiperInstance instance = PiperFromProfile(*vgg, {4, 16e9, 1e9, 8});
  ASSERT_EQ(instance.nodes.size(), vgg->layers.size());
  EXPECT_EQ(instance.edges.size(), vgg->layers.size());  // a chain and one extra edge
  const PiperConfig& c = instance.nodes[5].configs.at(1)[0];
  EXPECT_DOUBLE_EQ(c.time_per_sample,
                   vgg->layers[5].forward_seconds + vgg->layers[5].backward_seconds);
  EXPECT_DOUBLE_EQ(c.memory_per_microbatch_bytes, vgg->layers[5].stashed_activation_bytes);
}

TEST(Cluster, JsonRoundTripAndErrors) {
  auto cluster = ClusterFromJson(nlohmann::json::parse(R"({
      "nodes": 4, "devices_per_node": 8, "device_memory": "80GiB",
      "levels": [{"bandwidth": "300GB/s", "latency": 5e-6}, {"bandwidth": 25e9}]})"),
                                 "c.json");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(cluster->NumDevices(), 32);
  EXPECT_EQ(cluster->device_memory_bytes, 80.0 * (1 << 30));
  EXPECT_EQ(cluster->levels[0].bandwidth_bytes_per_second, 300e9);
  EXPECT_EQ(cluster->LevelForGroup(16).bandwidth_bytes_per_second, 25e9);
  auto again = ClusterFromJson(ToJson(*cluster), "again");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *cluster);
  auto bad = ClusterFromJson(nlohmann::json::parse(
                                 R"({"nodes": 1, "devices_per_node": 2, "levels": [{"bandwidth": 0}]})"),
                             "c.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "c.json: levels[0].bandwidth"))
      << bad.status().message();
  auto speeds = ClusterFromJson(nlohmann::json::parse(R"({"nodes": 1, "devices_per_node": 2,
      "levels": [{"bandwidth": 1e9}], "device_speeds": [1.0]})"), "c.json");
  ASSERT_FALSE(speeds.ok());
  EXPECT_TRUE(absl::StrContains(speeds.status().message(), "one speed per device"));
}

}  // namespace
}  // namespace tandem::planner
