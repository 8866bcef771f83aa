// `tandem cluster simulate` end to end: text and JSON figures, the SVG, exit codes and
// messages for bad input.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/command.h"

namespace {

using tandem::testing::Outcome;

// `tandem ARGS`: exit status and output.
Outcome Tandem(const std::string& args) {
  return tandem::testing::RunCommand(std::string(TANDEM_BIN) + " " + args);
}

std::string Data(const std::string& name) {
  return std::string(TANDEM_TEST_DATA_DIR) + "/cluster/" + name;
}

std::string Temp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(ClusterCommand, JsonFiguresOfAPolluxWorkload) {
  const Outcome run = Tandem("cluster simulate --workload " +
                                Data("pollux/workloads/workload-3.csv") +
                                " --policy tiresias --format json");
  ASSERT_EQ(run.exit_status, 0) << run.output;
  const nlohmann::json j = nlohmann::json::parse(run.output);
  // Published (Pollux artifact): 3876.3 s.
  EXPECT_NEAR(j["avg_jct_seconds"].get<double>() / 3876.3, 1.0, 0.05);
  EXPECT_EQ(j["jcts"].size(), 160u);
  for (const char* key : {"median_jct_seconds", "p99_jct_seconds", "makespan_seconds",
                          "utilisation", "avg_ftf", "max_ftf"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_GT(j["utilisation"].get<double>(), 0.0);
  EXPECT_LE(j["utilisation"].get<double>(), 1.0);
  EXPECT_LE(j["median_jct_seconds"].get<double>(), j["p99_jct_seconds"].get<double>());
}

TEST(ClusterCommand, TextAndSvgForATiresiasTrace) {
  const std::string svg = Temp("cluster.svg");
  std::remove(svg.c_str());
  const Outcome run = Tandem("cluster simulate --workload " + Data("tiresias/60_job.csv") +
                                " --policy fifo --cluster-spec " + Data("tiresias/n32g4.csv") +
                                " --svg " + svg);
  ASSERT_EQ(run.exit_status, 0) << run.output;
  EXPECT_NE(run.output.find("average JCT"), std::string::npos);
  EXPECT_NE(run.output.find("utilisation"), std::string::npos);
  EXPECT_NE(run.output.find("finish-time fairness"), std::string::npos);
  std::ifstream in(svg);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("<svg"), std::string::npos);
  EXPECT_NE(text.str().find("<rect"), std::string::npos);
}

TEST(ClusterCommand, BadInputExitsTwoWithOneLine) {
  struct Case {
    std::string args;
    std::string message;
  };
  const std::string bad_row = Temp("bad_workload.csv");
  std::ofstream(bad_row) << "name,time,application,num_replicas,batch_size\na,x,cifar10,1,128\n";
  const std::string wide = Temp("wide_workload.csv");
  std::ofstream(wide) << "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                         "0,128,0,10,vgg,100,1\n";
  const std::vector<Case> cases = {
      {"cluster simulate --policy fifo", "missing --workload"},
      {"cluster simulate --workload " + Data("tiresias/60_job.csv"), "missing --policy"},
      {"cluster simulate --workload " + Data("tiresias/60_job.csv") + " --policy nope",
       "unknown policy 'nope'"},
      {"cluster simulate --workload " + bad_row + " --policy fifo", "bad_workload.csv:2"},
      {"cluster simulate --workload " + wide + " --policy fifo", "asks for 128 GPUs"},
      {"cluster simulate --workload " + Data("tiresias/60_job.csv") +
           " --policy fifo --gpus 10 --gpus-per-node 4",
       "multiple of --gpus-per-node"},
      {"cluster simulate --workload /nonexistent/w.csv --policy fifo", "/nonexistent/w.csv"},
      {"cluster bogus", "unknown subcommand"},
  };
  for (const Case& c : cases) {
    const Outcome run = Tandem(c.args);
    EXPECT_EQ(run.exit_status, 2) << c.args << "\n" << run.output;
    EXPECT_NE(run.output.find("tandem cluster: error: "), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(c.message), std::string::npos) << c.args << "\n" << run.output;
  }
}

TEST(ClusterCommand, GavelOnAHeterogeneousCluster) {
  const Outcome run = Tandem("cluster simulate --workload " +
                                Data("pollux/workloads/workload-2.csv") +
                                " --policy gavel --cluster " + Data("gavel/v100-p100-k80.json") +
                                " --format json");
  ASSERT_EQ(run.exit_status, 0) << run.output;
  const nlohmann::json j = nlohmann::json::parse(run.output);
  EXPECT_EQ(j["jcts"].size(), 160u);
  EXPECT_GT(j["utilisation"].get<double>(), 0.0);
  EXPECT_LE(j["utilisation"].get<double>(), 1.0);
}

TEST(ClusterCommand, BadClusterFilesExitTwo) {
  struct Case {
    std::string json;
    std::string message;
  };
  const std::string workload = Data("tiresias/60_job.csv");
  const std::vector<Case> cases = {
      {"{\"device_types\": [{\"name\": \"v100\", \"nodes\": 0, \"gpus_per_node\": 4}]}",
       "'nodes' must be a whole number in [1, 1000000]"},
      {"{\"device_types\": [{\"name\": \"v100\", \"nodes\": 2, \"gpus_per_node\": 4, "
       "\"speed\": 0}]}",
       "speed must be a number in [0.001, 1000]"},
      {"{\"device_types\": []}", "'device_types' must be a non-empty list"},
      {"not json", "not valid JSON"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = Temp("bad_cluster_" + std::to_string(i) + ".json");
    std::ofstream(path) << cases[i].json;
    const Outcome run =
        Tandem("cluster simulate --workload " + workload + " --policy gavel --cluster " + path);
    EXPECT_EQ(run.exit_status, 2) << cases[i].json << "\n" << run.output;
    EXPECT_NE(run.output.find(path), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(cases[i].message), std::string::npos) << run.output;
  }
  // A gang wider than every device type: Gavel cannot place it.
  const std::string small = Temp("small_types.json");
  std::ofstream(small) << "{\"device_types\": [{\"name\": \"a\", \"nodes\": 1, "
                          "\"gpus_per_node\": 4}, {\"name\": \"b\", \"nodes\": 1, "
                          "\"gpus_per_node\": 4}]}";
  const std::string wide = Temp("six_gpu_job.csv");
  std::ofstream(wide) << "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                         "0,6,0,10,vgg,100,1\n";
  const Outcome run =
      Tandem("cluster simulate --workload " + wide + " --policy gavel --cluster " + small);
  EXPECT_EQ(run.exit_status, 2) << run.output;
  EXPECT_NE(run.output.find("no type has that many"), std::string::npos) << run.output;
  const Outcome both = Tandem("cluster simulate --workload " + workload +
                                 " --policy fifo --cluster " + small + " --cluster-spec " +
                                 Data("tiresias/n32g4.csv"));
  EXPECT_EQ(both.exit_status, 2) << both.output;
  EXPECT_NE(both.output.find("not both"), std::string::npos) << both.output;
  // --gpus beside a cluster file would be ignored: refused, naming both.
  const Outcome gpus =
      Tandem("cluster simulate --workload " + workload + " --policy fifo --cluster-spec " +
             Data("tiresias/n32g4.csv") + " --gpus 8");
  EXPECT_EQ(gpus.exit_status, 2) << gpus.output;
  EXPECT_NE(gpus.output.find("--gpus and --cluster-spec "), std::string::npos) << gpus.output;
  EXPECT_NE(gpus.output.find("both give the cluster's GPUs"), std::string::npos) << gpus.output;
}

TEST(ClusterCommand, HelpListsTheFlags) {
  const Outcome run = Tandem("cluster --help");
  EXPECT_EQ(run.exit_status, 0) << run.output;
  for (const char* flag : {"--workload", "--policy", "--gpus", "--gpus-per-node", "--cluster",
                           "--interval", "--format", "--svg"}) {
    EXPECT_NE(run.output.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
