// `tandem cluster run` end to end: real `mpirun --enable-recovery tandem train --elastic` jobs
// on 4 slots under Optimus. A wide job starts alone on every slot; two narrow jobs arrive, so
// it is shrunk live (ranks SIGKILLed, the elastic layer re-forms it); when they finish it grows
// back, live (SIGUSR2: the job starts its new ranks itself) or, with
// --grow-through-checkpoint, through a checkpoint and a resume. Checked from the jobs' own
// logs: every job finished, each iteration logged exactly once across a job's launches, a
// recovery event after the kill, growth events or a launch that resumed where the stopped
// one's checkpoint ends; the slots never oversubscribed in the controller's accounting; the
// JCT table beside the simulator's prediction. Also bad input: exit 2 with the reason.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/command.h"

namespace {

namespace fs = std::filesystem;

using tandem::testing::Outcome;

// `tandem ARGS`: exit status and output.
Outcome Tandem(const std::string& args) {
  return tandem::testing::RunCommand(std::string(TANDEM_BIN) + " " + args);
}

std::string Temp(const std::string& name) {
  return (fs::temp_directory_path() /
          ("tandem_cluster_live_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = Temp(name);
  std::ofstream(path) << text;
  return path;
}

std::vector<nlohmann::json> JsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

constexpr char kHeader[] =
    "name,submission_seconds,steps,global_batch,min_ranks,max_ranks,train_flags\n";
constexpr char kModel[] =
    "--model gpt --layers 2 --hidden 64 --heads 4 --seq-len 32 --optimizer adamw --lr 3e-3 "
    "--microbatch-size 2 --heartbeat-timeout 1";

class ClusterRun : public ::testing::TestWithParam<bool> {};  // grow live?

TEST_P(ClusterRun, ShrinksAndGrowsAndRecordsTheJcts) {
  if (!TANDEM_HAVE_MPI || !TANDEM_HAVE_TORCH) GTEST_SKIP() << "needs MPI and LibTorch";
  const bool live_grow = GetParam();
  const std::string jobs =
      Write("jobs.csv", std::string(kHeader) + "# a wide job, then two narrow ones\n" +
                            "wide,0,1200,16,1,4," + kModel + "\n" +  //
                            "narrow1,5,20,16,1,1," + kModel + "\n" + "narrow2,7,20,16,1,1," +
                            kModel + "\n");
  const std::string work = Temp(live_grow ? "work_live" : "work_checkpoint");
  const std::string log = Temp(live_grow ? "run_live.json" : "run_checkpoint.json");
  tandem::RemoveAll(work).IgnoreError();
  const Outcome run = Tandem("cluster run --jobs " + jobs +
                                " --slots 4 --policy optimus --interval 1 --deadline 240"
                                " --work-dir " +
                                work + " --log-json " + log +
                                (live_grow ? "" : " --grow-through-checkpoint"));
  ASSERT_EQ(run.exit_status, 0) << run.output;
  std::cout << run.output;  // the events and the JCT table, real beside simulated
  EXPECT_NE(run.output.find("JCT real"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("JCT sim"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("never oversubscribed"), std::string::npos) << run.output;

  std::ifstream in(log);
  const nlohmann::json result = nlohmann::json::parse(in);
  EXPECT_EQ(result["oversubscribed_steps"], 0);
  EXPECT_LE(result["max_slots_used"].get<int>(), 4);
  ASSERT_EQ(result["jobs"].size(), 3u);
  const std::map<std::string, int> steps = {{"wide", 1200}, {"narrow1", 20}, {"narrow2", 20}};
  for (const nlohmann::json& job : result["jobs"]) {
    const std::string name = job["name"];
    EXPECT_TRUE(job["finished"].get<bool>()) << name;
    EXPECT_GT(job["jct_seconds"].get<double>(), 0) << name;
    EXPECT_GT(job["predicted_jct_seconds"].get<double>(), 0) << name;
    EXPECT_EQ(job["duplicate_iterations"], 0) << name;
    EXPECT_EQ(job["missing_iterations"], 0) << name;

    // From the job's own logs: each iteration once across its launches; a stopped launch's
    // last iteration is the next launch's resume point.
    std::map<int, int> seen;
    int recoveries = 0, resumes = 0, finished = 0, growths = 0;
    const int launches = job["launches"];
    int next_expected = 1;  // the logs count iterations from 1
    for (int k = 0; k < launches; ++k) {
      const std::string path = work + "/" + name + "/launch-" + std::to_string(k) + ".jsonl";
      bool first = true;
      for (const nlohmann::json& line : JsonLines(path)) {
        if (line.contains("event")) {
          if (line["event"] == "recovery") ++recoveries;
          if (line["event"] == "growth") ++growths;
          if (line["event"] == "finished" && !line.value("stopped", false)) ++finished;
          continue;
        }
        const int it = line["iteration"];
        if (first) {
          EXPECT_EQ(it, next_expected) << path;
          if (k > 0) ++resumes;
          first = false;
        }
        ++seen[it];
        next_expected = it + 1;
      }
    }
    EXPECT_EQ(finished, 1) << name;
    ASSERT_EQ(seen.size(), static_cast<size_t>(steps.at(name))) << name;
    for (const auto& [it, n] : seen) EXPECT_EQ(n, 1) << name << " iteration " << it;
    if (name == "wide") {
      // Shrunk live when the narrow jobs came, grown back when they finished: live (growth
      // events, one launch) or resumed on more ranks.
      EXPECT_GE(recoveries, 1) << run.output;
      EXPECT_GE(job["live_shrinks"].get<int>(), 1) << run.output;
      if (live_grow) {
        EXPECT_GE(growths, 1) << run.output;
        EXPECT_GE(job["live_grows"].get<int>(), 1) << run.output;
        EXPECT_EQ(job["launches"].get<int>(), 1) << run.output;
      } else {
        EXPECT_GE(resumes, 1) << run.output;
        EXPECT_GE(job["grows"].get<int>(), 1) << run.output;
        EXPECT_EQ(growths, 0) << run.output;
      }
    }
  }
  tandem::RemoveAll(work).IgnoreError();
}

INSTANTIATE_TEST_SUITE_P(Grow, ClusterRun, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Live" : "ThroughACheckpoint");
                         });

// The scheduler killed outright (SIGKILL: no handler runs) while a job trains: the job's
// mpirun and ranks end within seconds instead of training on, orphaned.
TEST(ClusterRunKilled, AKilledSchedulerLeavesNoJobRunning) {
  if (!TANDEM_HAVE_MPI || !TANDEM_HAVE_TORCH) GTEST_SKIP() << "needs MPI and LibTorch";
  const std::string jobs =
      Write("long.csv", std::string(kHeader) + "orphan,0,100000,16,1,2," + kModel + "\n");
  const std::string work = Temp("work_killed");
  tandem::RemoveAll(work).IgnoreError();
  const std::string script = absl::StrCat(
      TANDEM_BIN, " cluster run --jobs ", jobs, " --slots 2 --interval 1 --work-dir ", work,
      " > ", work, ".out 2>&1 & S=$!; "
      "for i in $(seq 1 900); do grep -qs '\"iteration\"' ", work,
      "/orphan/launch-0.jsonl && break; sleep 0.1; done; "
      "grep -qs '\"iteration\"' ", work, "/orphan/launch-0.jsonl && echo training; "
      "kill -9 $S; "
      "for i in $(seq 1 150); do n=$(grep -lsa 'TANDEM_CLUSTER_LAUNCH=orphan[.]' "
      "/proc/[0-9]*/environ | wc -l); [ $n = 0 ] && break; sleep 0.1; done; echo left $n");
  const Outcome o = tandem::testing::RunCommand(script);
  EXPECT_NE(o.output.find("training"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("left 0"), std::string::npos) << o.output;
  tandem::RemoveAll(work).IgnoreError();
}

// A job whose ranks refuse its flags at start: the scheduler's failure line carries the ranks'
// own reason, not only the launch's output file.
TEST(ClusterRunKilled, AJobFailingAtStartSaysWhy) {
  if (!TANDEM_HAVE_MPI || !TANDEM_HAVE_TORCH) GTEST_SKIP() << "needs MPI and LibTorch";
  const std::string jobs = Write(
      "bad_model.csv", std::string(kHeader) + "bad,0,10,16,1,1,--model nosuch --microbatch-size 2\n");
  const std::string work = Temp("work_bad_model");
  tandem::RemoveAll(work).IgnoreError();
  const Outcome o =
      Tandem("cluster run --jobs " + jobs + " --slots 2 --interval 1 --work-dir " + work);
  EXPECT_NE(o.exit_status, 0) << o.output;
  EXPECT_NE(o.output.find("unknown model 'nosuch'"), std::string::npos) << o.output;
  tandem::RemoveAll(work).IgnoreError();
}

TEST(ClusterRunInput, BadInputIsRefusedWithTheReason) {
  const std::string ok = std::string(kHeader) + "a,0,10,16,1,2," + kModel + "\n";
  struct Case {
    std::string file;
    std::string flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {ok, "--slots 0", "--slots must be at least 1"},
      {std::string(kHeader) + "a,0,10,16,1,8," + kModel + "\n", "--slots 4",
       "asks for up to 8 ranks but the cluster has 4 slot(s)"},
      {std::string(kHeader) + "a,0,10,16,1\n", "--slots 4", ":2: expected 7 fields"},
      {std::string(kHeader) + "a,zero,10,16,1,2," + kModel + "\n", "--slots 4", ":2:"},
      {std::string(kHeader) + "a,0,10,16,3,2," + kModel + "\n", "--slots 4",
       "need 1 <= min_ranks <= max_ranks"},
      {std::string(kHeader) + "a,0,0,16,1,2," + kModel + "\n", "--slots 4",
       "steps and global_batch must be at least 1"},
      {ok + "a,1,10,16,1,2," + kModel + "\n", "--slots 4", "appears twice"},
      {std::string(kHeader) + "a,0,10,16,1,2,--steps 5\n", "--slots 4",
       "train_flags may not set --steps"},
      {"name,steps\na,1\n", "--slots 4", "submission_seconds"},
      {std::string(kHeader) + "a,1e300,10,16,1,2," + kModel + "\n", "--slots 4",
       "more than 30 days"},
      {ok, "--slots 4 --policy nothing", "unknown policy 'nothing'"},
      {ok, "--slots 4 --interval 0", "--interval must be positive"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string jobs = Write("bad" + std::to_string(i) + ".csv", cases[i].file);
    const Outcome run = Tandem("cluster run --jobs " + jobs + " " + cases[i].flags);
    EXPECT_EQ(run.exit_status, 2) << i << ": " << run.output;
    EXPECT_NE(run.output.find(cases[i].message), std::string::npos) << i << ": " << run.output;
  }
  const Outcome missing = Tandem("cluster run --slots 4");
  EXPECT_EQ(missing.exit_status, 2) << missing.output;
  EXPECT_NE(missing.output.find("missing --jobs"), std::string::npos) << missing.output;
  const Outcome nofile = Tandem("cluster run --slots 4 --jobs " + Temp("absent.csv"));
  EXPECT_EQ(nofile.exit_status, 2) << nofile.output;
  const std::string hosts = Write("hosts", "nodeA slots=2\nnodeB slots=two\n");
  const Outcome badhosts =
      Tandem("cluster run --hosts " + hosts + " --jobs " + Write("okjobs.csv", ok));
  EXPECT_EQ(badhosts.exit_status, 2) << badhosts.output;
  EXPECT_NE(badhosts.output.find(":2: expected 'HOST slots=N'"), std::string::npos) << badhosts.output;
  // A file of binary bytes is not a list of hosts, and none of its bytes reach the terminal.
  const std::string binary =
      Write("binary_hosts", "\x8f\x1b[2J\x01\xfe slots=1\n");
  const Outcome garbage =
      Tandem("cluster run --hosts " + binary + " --jobs " + Write("okjobs.csv", ok));
  EXPECT_EQ(garbage.exit_status, 2) << garbage.output;
  EXPECT_NE(garbage.output.find(":1: '\\x8f\\x1b[2J\\x01\\xfe' is not a host name"),
            std::string::npos)
      << garbage.output;
  const std::string binary_jobs = Write("binary_jobs.csv", "\x1b]0;x\x07,\xff\n");
  const Outcome garbage_jobs = Tandem("cluster run --slots 2 --jobs " + binary_jobs);
  EXPECT_EQ(garbage_jobs.exit_status, 2) << garbage_jobs.output;
  for (char c : garbage.output + garbage_jobs.output) {
    const auto byte = static_cast<unsigned char>(c);
    EXPECT_TRUE(byte == '\n' || (byte >= 0x20 && byte < 0x7f)) << "byte " << int{byte};
  }
  // Outputs are checked before any job starts.
  const Outcome no_log = Tandem("cluster run --slots 2 --jobs " + Write("okjobs.csv", ok) +
                                " --log-json " + Temp("missing/folder/log.json"));
  EXPECT_EQ(no_log.exit_status, 2) << no_log.output;
  EXPECT_NE(no_log.output.find("--log-json"), std::string::npos) << no_log.output;
  EXPECT_EQ(no_log.output.find("tandem cluster run:"), std::string::npos)
      << "no job may start: " << no_log.output;
  const Outcome file_as_dir = Tandem("cluster run --slots 2 --jobs " + Write("okjobs.csv", ok) +
                                     " --work-dir " + Write("a_file", "x") + "/sub");
  EXPECT_EQ(file_as_dir.exit_status, 2) << file_as_dir.output;
  EXPECT_NE(file_as_dir.output.find("--work-dir"), std::string::npos) << file_as_dir.output;
}

}  // namespace
