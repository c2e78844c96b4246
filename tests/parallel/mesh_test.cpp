// parallel/mesh.h: Megatron's rank order, the groups of each dimension, and worlds refused by name.
#include <gtest/gtest.h>

#include <string>

#include "pipetrain/base/error.h"
#include "pipetrain/parallel/mesh.h"

namespace pipetrain::parallel {
namespace {

TEST(Mesh, TensorParallelRanksAreAdjacentThenPipelineThenReplicas) {
  const Mesh mesh = Mesh::for_world(8, 2, 2, 2);
  EXPECT_EQ(mesh.describe(), "2 pipeline x 2 tensor x 2 data");
  EXPECT_EQ(mesh.tensor_parallel_ranks(1, 0), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh.pipeline_ranks(0, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(mesh.data_parallel_ranks(1, 0), (std::vector<int>{2, 6}));
  for (int rank = 0; rank < 8; ++rank) {
    const MeshCoordinates c = mesh.coordinates_of(rank);
    EXPECT_EQ(mesh.rank_of(c), rank);
    EXPECT_EQ(rank, ((c.replica * 2) + c.pipeline_rank) * 2 + c.tp_rank);
  }
  EXPECT_THROW(mesh.coordinates_of(8), BadInput);
}

TEST(Mesh, WithOneTensorRankItIsThePipelineTimesDataLayout) {
  const Mesh mesh = Mesh::for_world(6, 3, 1, 0);
  EXPECT_EQ(mesh.dp, 2);
  for (int rank = 0; rank < 6; ++rank) {
    const MeshCoordinates c = mesh.coordinates_of(rank);
    EXPECT_EQ(rank, c.replica * 3 + c.pipeline_rank);  // runtime/distributed.h's order
  }
}

TEST(Mesh, TheSizeNotGivenIsWhatTheWorldLeaves) {
  EXPECT_EQ(Mesh::for_world(8, 0, 2, 2).pp, 2);
  EXPECT_EQ(Mesh::for_world(8, 0, 2, 0).pp, 4);
  EXPECT_EQ(Mesh::for_world(8, 2, 2, 0).dp, 2);
  EXPECT_EQ(Mesh::for_world(2, 0, 2, 0).pp, 1);
}

TEST(Mesh, AWorldThatIsNotTheProductIsRefusedNamingTheNumbers) {
  auto message = [](int world, int pp, int tp, int dp) {
    try {
      Mesh::for_world(world, pp, tp, dp);
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(8, 2, 3, 0)
                .find("--pp 2 x --tp 3 does not divide the world of 8 "
                      "processes (tensor-parallel sizes that divide it: 1, 2, 4, 8)"),
            std::string::npos)
      << message(8, 2, 3, 0);
  EXPECT_NE(message(8, 2, 2, 1).find("--pp 2 x --tp 2 x --dp 1 = 4 processes, but the world has 8"),
            std::string::npos)
      << message(8, 2, 2, 1);
  EXPECT_NE(message(4, 1, 0, 1).find("must be >= 1"), std::string::npos);
}

}  // namespace
}  // namespace pipetrain::parallel
