// Workload readers on the real traces and on bad input: every error names the file (and line).
#include "cluster/workload.h"

#include <fstream>

#include "gtest/gtest.h"
#include "tests/cluster/test_util.h"

namespace tandem::cluster {
namespace {

using testing::DataPath;
using testing::PolluxApps;

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Workload, ReadsPolluxWorkload) {
  auto workload = ReadWorkload(DataPath("pollux/workloads/workload-1.csv"));
  ASSERT_TRUE(workload.ok()) << workload.status();
  ASSERT_EQ(workload->jobs.size(), 160u);
  EXPECT_TRUE(NeedsApplications(*workload));
  for (size_t i = 1; i < workload->jobs.size(); ++i) {
    EXPECT_LE(workload->jobs[i - 1].submission_seconds, workload->jobs[i].submission_seconds);
  }
  EXPECT_TRUE(ValidateWorkload(*workload, PolluxApps(), ClusterView::Homogeneous(16, 4)).ok());
}

TEST(Workload, ReadsPhillyAsFixedDurationJobs) {
  PhillyOptions options;
  options.max_jobs = 100;
  auto workload = ReadWorkload(DataPath("pollux/philly.csv"), options);
  ASSERT_TRUE(workload.ok()) << workload.status();
  ASSERT_EQ(workload->jobs.size(), 100u);
  EXPECT_FALSE(NeedsApplications(*workload));
  EXPECT_DOUBLE_EQ(workload->jobs.front().submission_seconds, 0.0);
  for (const WorkloadJob& job : workload->jobs) {
    EXPECT_GE(job.duration_seconds, 60.0);
    EXPECT_GE(job.num_replicas, 1);
    EXPECT_TRUE(job.application.empty());
  }
}

TEST(Workload, ReadsTiresiasTraceAndClusterSpec) {
  auto workload = ReadWorkload(DataPath("tiresias/60_job.csv"));
  ASSERT_TRUE(workload.ok()) << workload.status();
  ASSERT_EQ(workload->jobs.size(), 60u);
  // "1,8,30,133,vgg11,147,23"
  const auto& jobs = workload->jobs;
  auto found = std::find_if(jobs.begin(), jobs.end(),
                            [](const WorkloadJob& j) { return j.name == "vgg11-1"; });
  ASSERT_NE(found, jobs.end());
  EXPECT_EQ(found->num_replicas, 8);
  EXPECT_DOUBLE_EQ(found->submission_seconds, 30);
  EXPECT_DOUBLE_EQ(found->duration_seconds, 147);
  auto cluster = ReadTiresiasClusterSpec(DataPath("tiresias/n32g4.csv"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(cluster->nodes.size(), 32u);
  EXPECT_EQ(cluster->total_gpus(), 128);
}

TEST(Workload, MalformedRowNamesFileAndLine) {
  const std::string path = Write("bad_row.csv",
                                 "name,time,application,num_replicas,batch_size\n"
                                 "a,0,cifar10,1,128\n"
                                 "b,zero,cifar10,1,128\n");
  auto workload = ReadWorkload(path);
  ASSERT_EQ(workload.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(workload.status().message().find("bad_row.csv:3"), std::string::npos)
      << workload.status();
  const std::string short_row = Write("short_row.csv",
                                      "name,time,application,num_replicas,batch_size\n"
                                      "a,0,cifar10\n");
  auto second = ReadWorkload(short_row);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(second.status().message().find("short_row.csv:2"), std::string::npos);
}

TEST(Workload, ZeroGpusIsInvalid) {
  auto workload = ReadWorkload(Write("zero.csv",
                                     "name,time,application,num_replicas,batch_size\n"
                                     "a,0,cifar10,0,128\n"));
  ASSERT_EQ(workload.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(workload.status().message().find("zero.csv:2"), std::string::npos);
  EXPECT_NE(workload.status().message().find("GPU"), std::string::npos);
}

TEST(Workload, UnknownApplicationWideJobAndBadBatchAreInvalid) {
  const ClusterView cluster = ClusterView::Homogeneous(2, 4);
  auto unknown = ReadWorkload(Write("unknown.csv",
                                    "name,time,application,num_replicas,batch_size\n"
                                    "a,0,resnet9000,1,128\n"));
  ASSERT_TRUE(unknown.ok());
  absl::Status status = ValidateWorkload(*unknown, PolluxApps(), cluster);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("resnet9000"), std::string::npos);
  EXPECT_NE(status.message().find("cifar10"), std::string::npos);  // lists the known ones

  auto wide = ReadWorkload(Write("wide.csv",
                                 "name,time,application,num_replicas,batch_size\n"
                                 "a,0,cifar10,9,1024\n"));
  ASSERT_TRUE(wide.ok());
  status = ValidateWorkload(*wide, PolluxApps(), cluster);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("9 GPUs"), std::string::npos) << status;

  auto batch = ReadWorkload(Write("batch.csv",
                                  "name,time,application,num_replicas,batch_size\n"
                                  "a,0,cifar10,1,100000\n"));
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(ValidateWorkload(*batch, PolluxApps(), cluster).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Workload, UnknownFormatAndMissingFile) {
  auto unknown = ReadWorkload(Write("format.csv", "a,b,c\n1,2,3\n"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unknown workload format"), std::string::npos);
  auto missing = ReadWorkload(::testing::TempDir() + "/no_such_workload.csv");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no_such_workload.csv"), std::string::npos);
}

}  // namespace
}  // namespace tandem::cluster
