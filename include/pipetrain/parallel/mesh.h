// The 3-D mesh of a multi-process job: world = pp pipeline ranks x tp tensor-parallel ranks x dp
// data-parallel replicas, in Megatron-LM's order (tensor-parallel ranks adjacent, so that one
// tensor-parallel group sits on one node; then pipeline ranks; replicas outermost):
//
//   rank = ((replica * pp) + pipeline_rank) * tp + tp_rank
//
//   pp 2 x tp 2 x dp 2:         pipeline rank 0   pipeline rank 1
//     replica 0   tp ranks         0   1             2   3
//     replica 1                    4   5             6   7
//
//   tensor-parallel group of (replica 1, pipeline rank 0): {4, 5}
//   pipeline of (replica 0, tp rank 1): {1, 3}   (one transport per tp rank: stage j's tp rank t
//                                                  sends to stage j+1's tp rank t)
//   data-parallel group of (pipeline rank 1, tp rank 0): {2, 6}
//
// With tp = 1 this is the pipeline x data layout of runtime/distributed.h (rank = replica * pp +
// pipeline_rank). Torch-free: plain arithmetic on the three sizes.
#pragma once

#include <string>
#include <vector>

namespace pipetrain::parallel {

struct MeshCoordinates {
  int replica = 0;
  int pipeline_rank = 0;
  int tp_rank = 0;
};

struct Mesh {
  int pp = 1;
  int tp = 1;
  int dp = 1;

  // The mesh of `world` processes from what was given: pp and dp may be 0 (not given: pp is
  // what is left of world / (tp x dp), dp is 1). Throws BadInput naming the three numbers and the
  // world, and what would work, when pp x tp x dp is not the world or a size is below 1.
  static Mesh for_world(int world, int pp, int tp, int dp);

  int world_size() const { return pp * tp * dp; }
  int rank_of(const MeshCoordinates& c) const {
    return ((c.replica * pp) + c.pipeline_rank) * tp + c.tp_rank;
  }
  MeshCoordinates coordinates_of(int rank) const;

  // The world ranks of each group, ascending (group rank g is the g-th).
  std::vector<int> tensor_parallel_ranks(int replica, int pipeline_rank) const;
  std::vector<int> pipeline_ranks(int replica, int tp_rank) const;  // indexed by pipeline rank
  std::vector<int> data_parallel_ranks(int pipeline_rank, int tp_rank) const;  // by replica

  std::string describe() const;  // "2 pipeline x 2 tensor x 2 data"
};

}  // namespace pipetrain::parallel
