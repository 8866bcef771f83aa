// `tandem plan` end to end: reference figures through the command line, plan files, exit codes
// and messages for bad input, nothing written on failure.
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pipeline/plan.h"
#include "tests/planner/test_util.h"
#include "tests/support/command.h"

namespace tandem::planner {
namespace {

using tandem::testing::Outcome;

// `tandem ARGS`: exit status and output.
Outcome Tandem(const std::string& args) {
  return tandem::testing::RunCommand(std::string(TANDEM_BIN) + " " + args);
}

std::string Data(const std::string& name) { return testing::DataPath(name); }

std::string Temp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(PlanCommand, PipeDreamReferenceAsJson) {
  const Outcome run = Tandem("plan --profile " + Data("pipedream/vgg16.graph.txt") +
                         " --profile-format pipedream --algorithm pipedream --devices 8 "
                         "--bandwidth 1e9 --format json");
  ASSERT_EQ(run.exit_status, 0) << run.output;
  const nlohmann::json j = nlohmann::json::parse(run.output);
  EXPECT_NEAR(j["bottleneck_seconds"].get<double>(), 0.09351323, 1e-8);
  EXPECT_EQ(j["algorithm"], "pipedream");
  EXPECT_FALSE(j["stages"].empty());
}

// ResNet-50 on 8 machines: PipeDream's optimum (0.056315324 s per stage), its stages
// contiguous in the plan's layer_order; with the state limit below ResNet-50's states, the
// best over the profile's order (1.0379x) and a line saying so.
TEST(PlanCommand, PipeDreamOnABranchingModelWritesItsLayerOrder) {
  const std::string path = Temp("resnet50_plan.json");
  std::remove(path.c_str());
  const std::string args = "plan --profile " + Data("pipedream/resnet50.graph.txt") +
                           " --profile-format pipedream --algorithm pipedream --devices 8 "
                           "--bandwidth 1e9 -o " + path;
  const Outcome run = Tandem(args);
  ASSERT_EQ(run.exit_status, 0) << run.output;
  EXPECT_TRUE(absl::StrContains(run.output, "contiguous in the plan's layer_order")) << run.output;
  auto plan = pipeline::ReadPlanFile(path);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->bottleneck_seconds, 0.056315324, 1e-9 * 0.056315324);
  EXPECT_EQ(static_cast<int>(plan->layer_order.size()), plan->num_layers);

  const Outcome limited = Tandem(args + " --max-antichain-states 10");
  ASSERT_EQ(limited.exit_status, 0) << limited.output;
  EXPECT_TRUE(absl::StrContains(limited.output, "more than 10 states")) << limited.output;
  EXPECT_TRUE(absl::StrContains(limited.output, "not PipeDream's optimum")) << limited.output;
  plan = pipeline::ReadPlanFile(path);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->layer_order.empty());
  EXPECT_GT(plan->bottleneck_seconds, 1.03 * 0.056315324);
}

// Small inputs that once meant unbounded work end quickly: a 100,000-layer chain as a PipeDream
// graph (quadratic search; ran past 30 s) and a million devices in one node with
// --use-fewer-machines (40+ s) are refused with exit 2 naming the limit; Piper on that
// cluster plans 65,536 micro-batches by default (4 per device made 4,000,000, which took 27 s
// to plan and was then refused). The bound on time is generous: each takes about a second.
TEST(PlanCommand, SmallInputsDemandingUnboundedWorkEndQuickly) {
  const std::string chain = Temp("chain100k.graph.txt");
  {
    std::ofstream out(chain);
    for (int v = 0; v < 100000; ++v) {
      out << "node" << v << " -- Linear -- forward_compute_time=1.0, backward_compute_time=2.0, "
          << "activation_size=1000.0, parameter_size=100.0\n";
    }
    for (int v = 0; v + 1 < 100000; ++v) out << "\tnode" << v << " -- node" << v + 1 << "\n";
  }
  const std::string cluster = Temp("million.json");
  WriteText(cluster, R"({"nodes": 1, "devices_per_node": 1000000, "device_memory": "8GB",
                         "levels": [{"bandwidth": 1e11}]})");
  const std::string output = Temp("unbounded_plan.json");
  const struct {
    std::string args;
    int exit_status;
    std::string message;
  } cases[] = {
      {"plan --profile " + chain + " --profile-format pipedream --algorithm pipedream "
       "--devices 4",
       2, "over 100000 layers on 4 machines is too large"},
      {"plan --profile " + Data("pipedream/vgg16.graph.txt") + " --profile-format pipedream "
       "--algorithm pipedream --cluster " + cluster + " --use-fewer-machines",
       2, "on 1000000 machines is too large"},
      {"plan --profile " + Data("pipedream/vgg16.graph.txt") + " --profile-format pipedream "
       "--algorithm piper --cluster " + cluster,
       0, "32768 micro-batches"},
  };
  for (const auto& c : cases) {
    std::remove(output.c_str());
    const auto start = std::chrono::steady_clock::now();
    const Outcome run = Tandem(c.args + " -o " + output);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(run.exit_status, c.exit_status) << c.args << "\n" << run.output;
    EXPECT_TRUE(absl::StrContains(run.output, c.message)) << c.args << "\n" << run.output;
    EXPECT_LT(seconds, 20) << c.args;
    EXPECT_EQ(std::ifstream(output).good(), c.exit_status == 0) << c.args;
  }
}

TEST(PlanCommand, PiperReferenceWritesAPlanFile) {
  const std::string path = Temp("bert_plan.json");
  std::remove(path.c_str());
  const Outcome run = Tandem("plan --profile " + Data("piper/bert32a100.json") +
                         " --profile-format piper --algorithm piper --devices 512 --memory 8GiB "
                         "--microbatches 1920 --bandwidth 25GiB/s -o " + path);
  ASSERT_EQ(run.exit_status, 0) << run.output;
  EXPECT_TRUE(absl::StrContains(run.output, "maximum load (time per sample) 0.002561"));
  auto plan = pipeline::ReadPlanFile(path);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->time_per_sample, 0.00256113, 0.00256113 * 1e-3);
  EXPECT_EQ(plan->world_size, 510);
  EXPECT_EQ(plan->algorithm, "piper");
}

TEST(PlanCommand, AdaPipeOnGpt3WithScheduleSearch) {
  const Outcome run = Tandem(
      "plan --profile gpt3-175b --profile-format builtin --algorithm adapipe --devices 256 "
      "--devices-per-node 8 --bandwidth 300GB/s --bandwidth 25GB/s --memory 80GB "
      "--microbatches 256 --schedule auto --format json");
  ASSERT_EQ(run.exit_status, 0) << run.output;
  const nlohmann::json j = nlohmann::json::parse(run.output);
  auto plan = pipeline::PlanFromJson(j);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->IsUniform());
  EXPECT_EQ(plan->world_size, 256);
  for (double bytes : plan->predicted_peak_memory_bytes) EXPECT_LE(bytes, 80e9);
}

// --baseline writes Megatron-LM's default for the shape AdaPipe chose (every layer recomputed,
// a uniform split), slower than AdaPipe's plan by the factor both summaries print; it is for
// AdaPipe's 1F1B plans only.
TEST(PlanCommand, AdaPipeBaselineIsMegatronsDefaultForTheSameShape) {
  const std::string common =
      "plan --profile gpt3-175b --profile-format builtin --algorithm adapipe --devices 64 "
      "--devices-per-node 8 --bandwidth 300GB/s --bandwidth 25GB/s --memory 80GB "
      "--microbatches 64 --tensor-parallel 8 --stages 8";
  const Outcome adaptive = Tandem(common + " --format json");
  const Outcome baseline = Tandem(common + " --baseline --format json");
  ASSERT_EQ(adaptive.exit_status, 0) << adaptive.output;
  ASSERT_EQ(baseline.exit_status, 0) << baseline.output;
  auto a = pipeline::PlanFromJson(nlohmann::json::parse(adaptive.output));
  auto b = pipeline::PlanFromJson(nlohmann::json::parse(baseline.output));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->algorithm, "adapipe-baseline");
  EXPECT_EQ(b->mesh, a->mesh);
  EXPECT_EQ(b->schedule, a->schedule);
  int recomputed = 0;
  for (const pipeline::PlanStage& stage : b->stages) {
    EXPECT_EQ(static_cast<int>(stage.recompute_layers.size()), stage.end_layer - stage.first_layer);
    recomputed += static_cast<int>(stage.recompute_layers.size());
  }
  EXPECT_EQ(recomputed, b->num_layers);
  EXPECT_GT(b->predicted_iteration_seconds, a->predicted_iteration_seconds);
  const Outcome text = Tandem(common + " --baseline");
  EXPECT_TRUE(absl::StrContains(text.output, "AdaPipe's plan: iteration")) << text.output;

  const Outcome refused = Tandem(common + " --baseline --schedule auto");
  EXPECT_EQ(refused.exit_status, 2) << refused.output;
  EXPECT_TRUE(absl::StrContains(refused.output, "drop --schedule")) << refused.output;
  const Outcome not_adapipe = Tandem("plan --profile " + Data("pipedream/vgg16.graph.txt") +
                                     " --profile-format pipedream --algorithm pipedream "
                                     "--devices 8 --baseline");
  EXPECT_EQ(not_adapipe.exit_status, 2) << not_adapipe.output;
  EXPECT_TRUE(absl::StrContains(not_adapipe.output, "--baseline applies to --algorithm adapipe"))
      << not_adapipe.output;
}

// Sequence parallelism frees activation memory: on 1,024 A100s of 40 GB with t = 8 the plan
// for the sequence-parallel GPT-3 profile predicts a shorter iteration than the plain one's,
// and the plan file says it is to run with sequence parallelism (the plain one's does not).
TEST(PlanCommand, SequenceParallelGpt3PlansAShorterIteration) {
  auto predicted = [](const std::string& profile, bool sequence_parallel) {
    const Outcome run = Tandem(absl::StrCat(
        "plan --profile ", profile, " --profile-format builtin --algorithm adapipe "
        "--devices 1024 --devices-per-node 8 --memory 40e9 --microbatches 128 "
        "--tensor-parallel 8 --format json"));
    EXPECT_EQ(run.exit_status, 0) << run.output;
    const nlohmann::json j = nlohmann::json::parse(run.output);
    EXPECT_EQ(j.contains("sequence_parallel"), sequence_parallel) << profile;
    auto plan = pipeline::PlanFromJson(j);
    EXPECT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->sequence_parallel, sequence_parallel) << profile;
    for (double bytes : plan->predicted_peak_memory_bytes) EXPECT_LE(bytes, 40e9);
    return plan->predicted_iteration_seconds;
  };
  const double plain = predicted("gpt3-175b", false);
  const double split = predicted("gpt3-175b-sp", true);
  EXPECT_GT(plain, 0);
  EXPECT_LT(split, 0.9 * plain);
}

// A profile whose layers were measured with a mixture's experts split over a pair of ranks
// and placed whole on each (`expert_parallel: 2`): `tandem plan` writes the faster way into
// the plan, and --expert-parallel fixes it.
TEST(PlanCommand, ExpertParallelVariantsAreWeighed) {
  const std::string profile = Temp("experts.json");
  std::string layers;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&layers, i > 0 ? "," : "", R"({"name": "l)", i, R"(", "forward_seconds": 1,
        "backward_seconds": 2, "output_activation_bytes": 1, "stashed_activation_bytes": 10,
        "parameter_bytes": 10, "tensor_parallel": [
          {"degree": 2, "forward_seconds": 0.6, "backward_seconds": 1.2,
           "stashed_activation_bytes": 5, "parameter_bytes": 5},
          {"degree": 2, "expert_parallel": 2, "forward_seconds": 0.5, "backward_seconds": 1.0,
           "stashed_activation_bytes": 5, "parameter_bytes": 5}]})");
  }
  WriteText(profile,
            absl::StrCat(R"({"model": "moe", "microbatch_size": 1, "layers": [)", layers, "]}"));
  const std::string common = absl::StrCat("plan --profile ", profile,
                                          " --algorithm adapipe --devices 2 --devices-per-node 2 "
                                          "--tensor-parallel 2 --microbatches 4");
  const Outcome chosen = Tandem(common + " --format json");
  ASSERT_EQ(chosen.exit_status, 0) << chosen.output;
  EXPECT_EQ(nlohmann::json::parse(chosen.output)["expert_parallel"], 2) << chosen.output;
  const Outcome text = Tandem(common);
  EXPECT_TRUE(absl::StrContains(text.output, "2 tensor parallel (experts on 2 parts)"))
      << text.output;
  const Outcome fixed = Tandem(common + " --expert-parallel 1 --format json");
  ASSERT_EQ(fixed.exit_status, 0) << fixed.output;
  EXPECT_FALSE(nlohmann::json::parse(fixed.output).contains("expert_parallel")) << fixed.output;
  const Outcome missing = Tandem(common + " --expert-parallel 4");
  EXPECT_EQ(missing.exit_status, 2) << missing.output;
  EXPECT_TRUE(absl::StrContains(missing.output, "with the experts on 4 parts")) << missing.output;
  const Outcome piper = Tandem(absl::StrCat("plan --profile ", profile,
                                            " --algorithm piper --devices 2 --expert-parallel 2"));
  EXPECT_EQ(piper.exit_status, 2) << piper.output;
  EXPECT_TRUE(absl::StrContains(piper.output, "--expert-parallel applies to --algorithm adapipe"))
      << piper.output;
  std::filesystem::remove(profile);
}

// A profile as `tandem profile --tensor-parallel 2` writes it, each layer's degree listed
// without and with sequence parallelism: Piper plans with the variant without (its plans carry
// no sequence parallelism), and AdaPipe may take either.
TEST(PlanCommand, PiperTakesTheVariantWithoutSequenceParallelism) {
  const std::string profile = Temp("measured_shards.json");
  std::string layers;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&layers, i > 0 ? "," : "", R"({"name": "l)", i, R"(", "forward_seconds": 1,
        "backward_seconds": 2, "output_activation_bytes": 1, "stashed_activation_bytes": 10,
        "parameter_bytes": 10, "recompute_seconds": 1, "recompute_stashed_bytes": 1,
        "tensor_parallel": [
          {"degree": 2, "forward_seconds": 0.25, "backward_seconds": 0.5,
           "stashed_activation_bytes": 5, "parameter_bytes": 5},
          {"degree": 2, "sequence_parallel": true, "forward_seconds": 0.5,
           "backward_seconds": 1.0, "stashed_activation_bytes": 4, "parameter_bytes": 5}]})");
  }
  WriteText(profile,
            absl::StrCat(R"({"model": "shards", "microbatch_size": 1, "layers": [)", layers, "]}"));
  const Outcome piper = Tandem(absl::StrCat("plan --profile ", profile,
                                            " --algorithm piper --devices 2 --microbatches 4"
                                            " --format json"));
  ASSERT_EQ(piper.exit_status, 0) << piper.output;
  const nlohmann::json plan = nlohmann::json::parse(piper.output);
  EXPECT_FALSE(plan.contains("sequence_parallel")) << piper.output;
  // One stage of the pair, every layer at 0.75 s a sample: the variant without sequence
  // parallelism (the other's would be 1.5 s).
  const Outcome text = Tandem(
      absl::StrCat("plan --profile ", profile, " --algorithm piper --devices 2 --microbatches 4"));
  ASSERT_EQ(text.exit_status, 0) << text.output;
  EXPECT_TRUE(absl::StrContains(text.output, "maximum load (time per sample) 3 s")) << text.output;
  std::filesystem::remove(profile);
}

struct BadCase {
  std::string args;
  std::string message;
};

TEST(PlanCommand, BadInputExitsTwoWithAClearMessageAndWritesNothing) {
  const std::string negative = Temp("negative.json");
  WriteText(negative, R"({"microbatch_size": 1, "layers": [
      {"name": "a", "forward_seconds": 1, "backward_seconds": 2, "output_activation_bytes": 1,
       "stashed_activation_bytes": 1, "parameter_bytes": 1},
      {"name": "b", "forward_seconds": -1, "backward_seconds": 2, "output_activation_bytes": 1,
       "stashed_activation_bytes": 1, "parameter_bytes": 1}]})");
  const std::string unknown = Temp("unknown_input.json");
  WriteText(unknown, R"({"microbatch_size": 1, "layers": [
      {"name": "a", "forward_seconds": 1, "backward_seconds": 2, "output_activation_bytes": 1,
       "stashed_activation_bytes": 1, "parameter_bytes": 1},
      {"name": "b", "forward_seconds": 1, "backward_seconds": 2, "output_activation_bytes": 1,
       "stashed_activation_bytes": 1, "parameter_bytes": 1, "inputs": ["c"]}]})");
  const std::string missing_field = Temp("missing_field.json");
  WriteText(missing_field, R"({"microbatch_size": 1, "layers": [
      {"name": "a", "backward_seconds": 2, "output_activation_bytes": 1,
       "stashed_activation_bytes": 1, "parameter_bytes": 1}]})");
  const std::string cycle = Temp("cycle.graph.txt");
  WriteText(cycle,
            "node1 -- Conv -- forward_compute_time=1.0, backward_compute_time=1.0, "
            "activation_size=10.0, parameter_size=5.0\n"
            "node2 -- Conv -- forward_compute_time=1.0, backward_compute_time=1.0, "
            "activation_size=10.0, parameter_size=5.0\n"
            "\tnode1 -- node2\n\tnode2 -- node1\n");
  // Costs a double holds whose sums do not: the plan's predictions would be written as null.
  const std::string overflow = Temp("overflow.piper.json");
  const std::string overflowing_layer =
      R"({"id": "vanilla", "timePerSample": 1e308, "parameterSize": 0, "memoryUsageA": 0,
          "memoryUsageB": 0, "syncTimeFw": {}, "syncTimeBw": {}})";
  WriteText(overflow, R"({"maxDevices": 2, "maxMemoryPerDevice": 8e10, "bandwidth": 2.5e10,
      "mbsInBatch": 4, "nodes": [{"id": 0, "name": "a", "TMPCs": {"1": [)" +
                          overflowing_layer + R"(]}}, {"id": 1, "name": "b", "TMPCs": {"1": [)" +
                          overflowing_layer + R"(]}}],
      "edges": [{"sourceId": 0, "destId": 1, "communicationCost": 0}]})");
  const std::string vgg = Data("pipedream/vgg16.graph.txt");
  const std::string bert = Data("piper/bert32a100.json");
  const std::vector<BadCase> cases = {
      {"plan --profile " + overflow + " --profile-format piper --algorithm piper --devices 2",
       "must be a finite number >= 0, got inf (do the profile's costs overflow?)"},
      {"plan --algorithm pipedream --devices 2", "missing --profile"},
      {"plan --profile " + vgg + " --profile-format pipedream --devices 2", "missing --algorithm"},
      {"plan --profile " + vgg + " --profile-format pipedream --algorithm zigzag --devices 2",
       "unknown algorithm 'zigzag'"},
      {"plan --profile /nonexistent/p.json --algorithm pipedream --devices 2", "no such file"},
      {"plan --profile " + negative + " --algorithm pipedream --devices 2",
       "negative.json: layers[1].forward_seconds: must not be negative"},
      {"plan --profile " + unknown + " --algorithm pipedream --devices 2",
       "layers[1].inputs[0]: unknown layer name 'c'"},
      {"plan --profile " + missing_field + " --algorithm pipedream --devices 1",
       "layers[0].forward_seconds: missing field"},
      {"plan --profile " + cycle + " --profile-format pipedream --algorithm pipedream "
       "--devices 2",
       "cycle"},
      {"plan --profile " + vgg + " --profile-format pipedream --algorithm pipedream "
       "--devices 0",
       "--devices must be at least 1"},
      {"plan --profile " + vgg + " --profile-format pipedream --algorithm pipedream "
       "--devices 2 --memory lots",
       "--memory"},
      {"plan --profile " + bert + " --profile-format piper --algorithm piper --devices 4 "
       "--memory 1GiB",
       "the smallest memory per device that fits on 4 devices is about"},
      {"plan --profile " + vgg + " --profile-format pipedream --algorithm pipedream "
       "--devices 64 --straight",
       "needs at least 64 layers"},
      {"plan --profile " + vgg + " --profile-format yaml --algorithm pipedream --devices 2",
       "unknown profile format 'yaml'"},
      // A graph.txt without its format: not only "malformed JSON", but what to add.
      {"plan --profile " + vgg + " --algorithm pipedream --devices 2",
       "(this looks like PipeDream's graph.txt: add --profile-format pipedream)"},
      {"plan --profile " + missing_field + " --algorithm pipedream --devices 1",
       "(read as tandem's profile.json; --profile-format pipedream, piper, metis or builtin "
       "reads the others)"},
      {"plan --profile " + vgg + " --profile-format pipedream --algorithm pipedream "
       "--devices 2 --max-antichain-states 0",
       "--max-antichain-states must be at least 1"},
  };
  const std::string output = Temp("must_not_exist.json");
  for (const BadCase& c : cases) {
    std::remove(output.c_str());
    const Outcome run = Tandem(c.args + " -o " + output);
    EXPECT_EQ(run.exit_status, 2) << c.args << "\n" << run.output;
    EXPECT_TRUE(absl::StrContains(run.output, c.message)) << c.args << "\n" << run.output;
    EXPECT_TRUE(absl::StrContains(run.output, "tandem plan: error: ")) << run.output;
    EXPECT_FALSE(std::ifstream(output).good()) << c.args;
  }
}

}  // namespace
}  // namespace tandem::planner
