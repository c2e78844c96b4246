// The pp x tp x dp mesh (parallel/mesh.h).
#include "pipetrain/parallel/mesh.h"

#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"

namespace pipetrain::parallel {
namespace {

// The sizes given, as flags ("--tp 2 x --dp 1"); a size not given (0) is left out.
std::string triple(int pp, int tp, int dp) {
  std::string text;
  for (const auto& [flag, value] : {std::pair{"--pp ", pp}, {"--tp ", tp}, {"--dp ", dp}}) {
    if (value != 0) text += (text.empty() ? "" : " x ") + std::string(flag) + std::to_string(value);
  }
  return text;
}

// Divisors of n, ascending.
std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

std::string joined(const std::vector<int>& values) {
  std::string text;
  for (int v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
  return text;
}

}  // namespace

Mesh Mesh::for_world(int world, int pp, int tp, int dp) {
  PIPETRAIN_CHECK_INPUT(world >= 1, "a world of ", world, " processes");
  PIPETRAIN_CHECK_INPUT(tp >= 1 && pp >= 0 && dp >= 0, "--pp, --tp and --dp must be >= 1 (got ",
                        triple(pp, tp, dp), ")");
  if (pp == 0 && dp == 0) dp = 1;
  // The one size not given is what the world leaves.
  const int given = tp * (pp > 0 ? pp : 1) * (dp > 0 ? dp : 1);
  PIPETRAIN_CHECK_INPUT(
      world % given == 0, triple(pp, tp, dp), " does not divide the world of ", world,
      " processes (tensor-parallel sizes that divide it: ", joined(divisors(world)), ")");
  Mesh mesh;
  mesh.tp = tp;
  mesh.pp = pp > 0 ? pp : world / given;
  mesh.dp = dp > 0 ? dp : world / given;
  PIPETRAIN_CHECK_INPUT(mesh.world_size() == world, triple(mesh.pp, mesh.tp, mesh.dp), " = ",
                        mesh.world_size(), " processes, but the world has ", world,
                        "; the product of the three must be the world");
  return mesh;
}

MeshCoordinates Mesh::coordinates_of(int rank) const {
  PIPETRAIN_CHECK_INPUT(rank >= 0 && rank < world_size(), "rank ", rank, " is outside ", describe(),
                        " (", world_size(), " processes)");
  MeshCoordinates c;
  c.tp_rank = rank % tp;
  c.pipeline_rank = (rank / tp) % pp;
  c.replica = rank / (tp * pp);
  return c;
}

std::vector<int> Mesh::tensor_parallel_ranks(int replica, int pipeline_rank) const {
  std::vector<int> ranks;
  for (int t = 0; t < tp; ++t) ranks.push_back(rank_of({replica, pipeline_rank, t}));
  return ranks;
}

std::vector<int> Mesh::pipeline_ranks(int replica, int tp_rank) const {
  std::vector<int> ranks;
  for (int p = 0; p < pp; ++p) ranks.push_back(rank_of({replica, p, tp_rank}));
  return ranks;
}

std::vector<int> Mesh::data_parallel_ranks(int pipeline_rank, int tp_rank) const {
  std::vector<int> ranks;
  for (int d = 0; d < dp; ++d) ranks.push_back(rank_of({d, pipeline_rank, tp_rank}));
  return ranks;
}

std::string Mesh::describe() const {
  return std::to_string(pp) + " pipeline x " + std::to_string(tp) + " tensor x " +
         std::to_string(dp) + " data";
}

}  // namespace pipetrain::parallel
