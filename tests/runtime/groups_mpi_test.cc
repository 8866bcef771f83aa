// Process groups split from a plan's mesh (runtime/groups.h), under mpirun with 2-4 ranks.
#include <algorithm>
#include <memory>
#include <vector>

#include "comm/backend.h"
#include "comm/buffer.h"
#include "gtest/gtest.h"
#include "runtime/groups.h"

namespace tandem::runtime {
namespace {

using comm::Communicator;
using comm::CpuBuffer;

Communicator& World() {
  static std::unique_ptr<Communicator> world = [] {
    comm::CommOptions options;
    options.timeout = absl::Seconds(30);
    auto created = comm::CreateWorldCommunicator(comm::BackendKind::kMpi, options);
    if (!created.ok()) {
      ADD_FAILURE() << created.status();
      std::abort();
    }
    return std::move(created).value();
  }();
  return *world;
}

void CheckGroups(Communicator& world, const MeshLayout& layout) {
  auto built = BuildProcessGroups(world, layout);
  ASSERT_TRUE(built.ok()) << built.status();
  ProcessGroups& groups = *built;
  ASSERT_NE(groups.pipeline, nullptr);
  EXPECT_EQ(groups.pipeline->size(), layout.pipeline_parallel());
  EXPECT_EQ(groups.pipeline->rank(), groups.position.pipeline_index);
  EXPECT_EQ(groups.pipeline->world_ranks(),
            PipelineGroupRanks(layout, groups.position.data_parallel_index));
  int held = 0;
  for (int stage = 0; stage < layout.num_stages(); ++stage) {
    const std::vector<int> ranks = GradientGroupRanks(layout, stage);
    const bool member = std::find(ranks.begin(), ranks.end(), world.rank()) != ranks.end();
    ASSERT_EQ(groups.gradient.count(stage), member ? 1u : 0u) << "stage " << stage;
    if (!member) continue;
    ++held;
    Communicator& group = *groups.gradient[stage];
    EXPECT_EQ(group.world_ranks(), ranks);
    // A reduction inside the group sees exactly its members.
    int64_t sum = world.rank();
    ASSERT_TRUE(group.AllReduce(CpuBuffer(&sum, 1))->Wait().ok());
    int64_t expected = 0;
    for (int r : ranks) expected += r;
    EXPECT_EQ(sum, expected) << "stage " << stage;
  }
  EXPECT_GT(held, 0);
  for (auto& [stage, pair] : groups.replica_pair) {
    EXPECT_EQ(pair->world_ranks(),
              ReplicaPairRanks(layout, groups.position.data_parallel_index, stage));
    EXPECT_EQ(pair->size(), 2);
  }
}

TEST(ProcessGroupsTest, DataParallelOnly) {
  Communicator& world = World();
  std::vector<std::vector<int>> mesh;
  for (int r = 0; r < world.size(); ++r) mesh.push_back({r});
  CheckGroups(world, MeshLayout{mesh, pipeline::Placement::Linear(1)});
}

TEST(ProcessGroupsTest, PipelineOnlyWithChimeraReplicas) {
  Communicator& world = World();
  std::vector<int> row(world.size());
  // Reversed mesh order: pipeline position q is global rank size-1-q.
  for (int q = 0; q < world.size(); ++q) row[q] = world.size() - 1 - q;
  const MeshLayout layout{{row}, pipeline::Placement::Bidirectional(world.size())};
  CheckGroups(world, layout);
}

TEST(ProcessGroupsTest, TwoByTwoMeshWithInterleavedStages) {
  Communicator& world = World();
  if (world.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  CheckGroups(world, MeshLayout{{{0, 1}, {2, 3}}, pipeline::Placement::Looped(2, 2)});
  CheckGroups(world, MeshLayout{{{3, 1}, {0, 2}}, pipeline::Placement::Bidirectional(2)});
}

TEST(ProcessGroupsTest, WrongWorldSizeIsRefused) {
  Communicator& world = World();
  auto built = BuildProcessGroups(
      world, MeshLayout{{{0}, {1}, {2}, {3}, {4}}, pipeline::Placement::Linear(1)});
  EXPECT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::runtime
