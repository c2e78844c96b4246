// TensorSplit: how one rank of a tensor-parallel group holds a parameter of a split layer
// (parallel/tensor_parallel.h). Torch-free, so that checkpoints and runners can name it.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>

namespace pipetrain::parallel {

// How a tensor-parallel rank holds one parameter of a split layer: a slice along `dim` of the
// whole tensor, the same slice on `replicas` consecutive ranks. replicas = 1: every rank its own
// slice (tp of them); more: fewer slices than ranks, as for key/value heads fewer than the ranks,
// which Megatron replicates (tp / heads ranks share each head).
struct TensorSplit {
  int64_t dim = 0;
  int replicas = 1;

  int parts(int tp_size) const { return tp_size / replicas; }  // distinct slices in the group
  int part_of(int tp_rank) const { return tp_rank / replicas; }
  bool operator==(const TensorSplit& other) const {
    return dim == other.dim && replicas == other.replicas;
  }
};

}  // namespace pipetrain::parallel
