// Process groups from hand-built meshes: rank lists (pure) for 1F1B, interleaved and Chimera
// placements.
#include <vector>

#include "runtime/groups.h"
#include "gtest/gtest.h"
#include "pipeline/schedule.h"

namespace tandem::runtime {
namespace {


// D x p mesh with rank = d * p + q.
std::vector<std::vector<int>> RowMajorMesh(int data_parallel, int pipeline_parallel) {
  std::vector<std::vector<int>> mesh(data_parallel, std::vector<int>(pipeline_parallel));
  for (int d = 0; d < data_parallel; ++d) {
    for (int q = 0; q < pipeline_parallel; ++q) mesh[d][q] = d * pipeline_parallel + q;
  }
  return mesh;
}

TEST(GroupsTest, LinearPipelineGradientGroupsSpanDataParallelReplicas) {
  MeshLayout layout{RowMajorMesh(/*data_parallel=*/3, /*pipeline_parallel=*/4),
                    pipeline::Placement::Linear(4)};
  ASSERT_TRUE(ValidateMeshLayout(layout).ok());
  EXPECT_EQ(GradientGroupRanks(layout, 0), (std::vector<int>{0, 4, 8}));
  EXPECT_EQ(GradientGroupRanks(layout, 3), (std::vector<int>{3, 7, 11}));
  EXPECT_EQ(PipelineGroupRanks(layout, 1), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(NeighboursOf(layout, 0, 0).previous, -1);
  EXPECT_EQ(NeighboursOf(layout, 0, 0).next, 1);
  EXPECT_EQ(NeighboursOf(layout, 0, 3).previous, 2);
  EXPECT_EQ(NeighboursOf(layout, 0, 3).next, -1);
  auto position = PositionOf(layout, 6);
  ASSERT_TRUE(position.ok());
  EXPECT_EQ(position->data_parallel_index, 1);
  EXPECT_EQ(position->pipeline_index, 2);
  EXPECT_EQ(ReplicaPairRanks(layout, 2, 1), (std::vector<int>{9}));
}

TEST(GroupsTest, PermutedMeshIsFollowed) {
  // Replica 1 runs its pipeline on ranks in a different order.
  MeshLayout layout{{{0, 1, 2}, {5, 3, 4}}, pipeline::Placement::Linear(3)};
  ASSERT_TRUE(ValidateMeshLayout(layout).ok());
  EXPECT_EQ(GradientGroupRanks(layout, 0), (std::vector<int>{0, 5}));
  EXPECT_EQ(GradientGroupRanks(layout, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(GradientGroupRanks(layout, 2), (std::vector<int>{2, 4}));
}

TEST(GroupsTest, InterleavedStagesShareRanks) {
  MeshLayout layout{RowMajorMesh(2, 2), pipeline::Placement::Looped(2, /*chunks=*/2)};
  ASSERT_TRUE(ValidateMeshLayout(layout).ok());
  // Stages 0 and 2 both live on position 0.
  EXPECT_EQ(GradientGroupRanks(layout, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(GradientGroupRanks(layout, 2), (std::vector<int>{0, 2}));
  EXPECT_EQ(NeighboursOf(layout, 0, 1).next, 0);  // stage 2 back on position 0
}

TEST(GroupsTest, ChimeraGradientGroupsContainBothReplicaCopies) {
  MeshLayout layout{RowMajorMesh(2, 4), pipeline::Placement::Bidirectional(4)};
  ASSERT_TRUE(ValidateMeshLayout(layout).ok());
  // Stage 0: replica 0 on position 0, replica 1 on position 3, in both data-parallel replicas.
  EXPECT_EQ(GradientGroupRanks(layout, 0), (std::vector<int>{0, 3, 4, 7}));
  EXPECT_EQ(GradientGroupRanks(layout, 1), (std::vector<int>{1, 2, 5, 6}));
  EXPECT_EQ(ReplicaPairRanks(layout, 1, 0), (std::vector<int>{4, 7}));
  EXPECT_EQ(NeighboursOf(layout, 1, 0).next, 2);  // replica 1 runs upwards
}

TEST(GroupsTest, InvalidMeshesAreNamed) {
  MeshLayout duplicate{{{0, 1}, {1, 3}}, pipeline::Placement::Linear(2)};
  absl::Status status = ValidateMeshLayout(duplicate);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("mesh[1][0]"), std::string::npos) << status;
  MeshLayout ragged{{{0, 1}, {2}}, pipeline::Placement::Linear(2)};
  EXPECT_EQ(ValidateMeshLayout(ragged).code(), absl::StatusCode::kInvalidArgument);
  MeshLayout wrong_placement{RowMajorMesh(1, 2), pipeline::Placement::Linear(3)};
  status = ValidateMeshLayout(wrong_placement);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("placement"), std::string::npos) << status;
  EXPECT_EQ(PositionOf(MeshLayout{RowMajorMesh(1, 2), pipeline::Placement::Linear(2)}, 5)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::runtime
