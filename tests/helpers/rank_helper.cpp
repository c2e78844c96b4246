// pipetrain_rank_helper: one rank of a multi-process test, started by launch_local from
// tests/transport/c10d_test.cpp, tests/runtime/{distributed,launcher}_test.cpp and
// tests/train/{zero_offload,cuda_zero_offload,sharded_optimizer_collectives}_test.cpp.
//
//   pipetrain_rank_helper SCENARIO [ARGS...]
//
// Every check failure throws (the rank exits non-zero with the message); success prints
// "OK <scenario>" on stdout. PIPETRAIN_TEST_TIMEOUT_MS sets the transport/rendezvous timeout;
// PIPETRAIN_TEST_DEVICE (default cpu) the device of the "train" scenario's stages and
// PIPETRAIN_TEST_BACKEND (default auto) the process-group backend.
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/data/document_dataset.h"
#include "pipetrain/io/indexed_dataset.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/parallel/all_to_all.h"
#include "pipetrain/runtime/distributed.h"
#include "pipetrain/runtime/distributed_pipe.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/stage/allocation_counter.h"
#include "pipetrain/stage/device.h"
#include "pipetrain/stage/skip_layers.h"
#include "pipetrain/train/checkpoint.h"
#include "pipetrain/train/document_batches.h"
#include "pipetrain/train/sharded_optimizer.h"
#include "pipetrain/train/step_runner.h"
#include "pipetrain/train/trainer.h"
#include "pipetrain/transport/c10d.h"
#include "tied.h"
#include "wait_until.h"

using namespace pipetrain;

namespace {

#define CHECK_OR_THROW(cond, ...) TORCH_CHECK(cond, "check failed: " #cond ": ", __VA_ARGS__)

std::chrono::milliseconds test_timeout() {
  const char* value = std::getenv("PIPETRAIN_TEST_TIMEOUT_MS");
  return std::chrono::milliseconds(value ? std::atoi(value) : 10000);
}

// "cuda" alone means this rank's own GPU, cuda:LOCAL_RANK.
torch::Device test_device() {
  const char* value = std::getenv("PIPETRAIN_TEST_DEVICE");
  const std::string device = value && *value ? value : "cpu";
  if (device == "cuda") {
    const char* local_rank = std::getenv("LOCAL_RANK");
    return torch::Device(torch::kCUDA,
                         static_cast<c10::DeviceIndex>(local_rank ? std::atoi(local_rank) : 0));
  }
  return torch::Device(device);
}

DistributedOptions options_with(int pipeline_ranks) {
  const char* backend = std::getenv("PIPETRAIN_TEST_BACKEND");
  return DistributedOptions()
      .timeout(test_timeout())
      .pipeline_ranks(pipeline_ranks)
      .device(test_device())
      .backend(backend && *backend ? backend : "auto");
}

// Deterministic contents both sides can compute: value depends on (seed, index).
torch::Tensor pattern(std::vector<int64_t> sizes, torch::ScalarType dtype, int seed) {
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  auto values = torch::arange(n, torch::kDouble).add(seed * 1000).remainder(97).sub(40);
  if (dtype == torch::kBool) return values.gt(0).reshape(sizes);
  return values.to(dtype).reshape(sizes);
}

void expect_equal(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  CHECK_OR_THROW(got.defined() == want.defined(), what, ": defined ", got.defined(), " vs ",
                 want.defined());
  if (!want.defined()) return;
  CHECK_OR_THROW(got.scalar_type() == want.scalar_type(), what, ": dtype ", got.scalar_type(),
                 " vs ", want.scalar_type());
  CHECK_OR_THROW(got.sizes() == want.sizes(), what, ": shape ", got.sizes(), " vs ", want.sizes());
  CHECK_OR_THROW(torch::equal(got, want), what, ": values differ");
}

// The bundles rank 0 sends to rank 1 as activations of micro-batches 0..N-1.
std::vector<Bundle> activation_bundles() {
  std::vector<Bundle> bundles;
  bundles.push_back({{pattern({4, 3}, torch::kFloat, 0)}, {}});
  // A shape change on the same boundary, and a second tensor of another dtype.
  bundles.push_back({{pattern({7, 2}, torch::kFloat, 1), pattern({5}, torch::kLong, 1)}, {}});
  // Skip tensors with long names: the metadata overflows the inline header.
  bundles.push_back({{pattern({2, 2, 2}, torch::kDouble, 2), pattern({3}, torch::kFloat, 2),
                      pattern({1, 6}, torch::kFloat, 2)},
                     {"encoder.block1.residual_with_a_rather_long_name",
                      "encoder.block2.another_quite_long_skip_connection_name"}});
  // Mixed dtypes, a 0-d tensor, an empty tensor.
  bundles.push_back({{pattern({3}, torch::kBool, 3), pattern({}, torch::kFloat, 3),
                      torch::empty({0, 4}), pattern({2, 3}, torch::kHalf, 3)},
                     {"s"}});
  // Back to the first shape.
  bundles.push_back({{pattern({4, 3}, torch::kFloat, 4)}, {}});
  return bundles;
}

// The gradient bundle rank 1 sends back for micro-batch i: undefined where "no gradient".
Bundle gradient_bundle(int i) {
  Bundle bundle;
  const Bundle activation = activation_bundles()[static_cast<std::size_t>(i)];
  for (std::size_t t = 0; t < activation.tensors.size(); ++t) {
    const auto& a = activation.tensors[t];
    const bool no_gradient = !a.is_floating_point() || a.scalar_type() == torch::kHalf || t == 1;
    bundle.tensors.push_back(no_gradient ? torch::Tensor()
                                         : pattern(a.sizes().vec(), a.scalar_type(), 50 + i));
  }
  bundle.skip_names = activation.skip_names;
  return bundle;
}

void scenario_bundles(Distributed& d) {
  auto transport = d.make_transport({0, 1});
  const auto bundles = activation_bundles();
  const int n = static_cast<int>(bundles.size());
  if (d.rank() == 0) {
    for (int i = 0; i < n; ++i) {
      transport->send({0, 1, i, Payload::kActivation}, bundles[static_cast<std::size_t>(i)]);
    }
    for (int i = n - 1; i >= 0; --i) {  // gradients taken in reverse order of sending
      Bundle got = transport->recv({1, 0, i, Payload::kGradient});
      Bundle want = gradient_bundle(i);
      CHECK_OR_THROW(got.tensors.size() == want.tensors.size(), "gradient ", i);
      for (std::size_t t = 0; t < want.tensors.size(); ++t) {
        expect_equal(got.tensors[t], want.tensors[t], "gradient " + std::to_string(i));
      }
      CHECK_OR_THROW(got.skip_names == want.skip_names, "gradient skip names ", i);
    }
  } else {
    // Out of order: micro-batch 2 first, then the rest; shapes still match their own message.
    std::vector<int> order{2, 0, 1, 3, 4};
    for (int i : order) {
      Bundle got = transport->recv({0, 1, i, Payload::kActivation});
      const auto& want = bundles[static_cast<std::size_t>(i)];
      CHECK_OR_THROW(got.tensors.size() == want.tensors.size(), "activation ", i, ": ",
                     got.tensors.size(), " tensors");
      for (std::size_t t = 0; t < want.tensors.size(); ++t) {
        expect_equal(got.tensors[t], want.tensors[t], "activation " + std::to_string(i));
      }
      CHECK_OR_THROW(got.skip_names == want.skip_names, "skip names of ", i);
      transport->send({1, 0, i, Payload::kGradient}, gradient_bundle(i));
    }
    transport->flush();
  }
  std::cout << "OK bundles" << std::endl;
}

// Rows of micro-batch i in round r of scenario_rounds (0: an undefined tensor, no data bytes).
// Rounds repeat a size (the posted-ahead fast path), grow, shrink, carry nothing, and come back.
int64_t round_rows(int r, int i) {
  static const int64_t base[] = {4, 4, 6, 2, 0, 4};
  return base[r] == 0 ? 0 : base[r] + i;
}
constexpr int kRounds = 6;
constexpr int kRoundMicrobatches = 3;

Bundle round_bundle(int r, int i, int seed_offset) {
  const int64_t rows = round_rows(r, i);
  if (rows == 0) return {{torch::Tensor()}, {}};
  return {{pattern({rows, 16}, torch::kFloat, seed_offset + 10 * r + i)}, {}};  // 64 B a row
}

// Steps of a pipeline on one channel set: every round, rank 1 announces its receives with
// expect() before taking them out of order; sizes change between rounds (the agreed-size
// protocol of c10d_transport.cpp). Prints the transport's counters for the test to check.
void scenario_rounds(Distributed& d) {
  auto transport = d.make_transport({0, 1});
  for (int r = 0; r < kRounds; ++r) {
    if (d.rank() == 0) {
      for (int i = 0; i < kRoundMicrobatches; ++i) transport->expect({1, 0, i, Payload::kGradient});
      for (int i = 0; i < kRoundMicrobatches; ++i) {
        transport->send({0, 1, i, Payload::kActivation}, round_bundle(r, i, 0));
      }
      for (int i = 0; i < kRoundMicrobatches; ++i) {
        Bundle got = transport->recv({1, 0, i, Payload::kGradient});
        expect_equal(got.tensors.at(0), round_bundle(r, i, 500).tensors[0],
                     "gradient " + std::to_string(i) + " of round " + std::to_string(r));
      }
    } else {
      for (int i = 0; i < kRoundMicrobatches; ++i) {
        transport->expect({0, 1, i, Payload::kActivation});
      }
      for (int i : {2, 0, 1}) {
        Bundle got = transport->recv({0, 1, i, Payload::kActivation});
        expect_equal(got.tensors.at(0), round_bundle(r, i, 0).tensors[0],
                     "activation " + std::to_string(i) + " of round " + std::to_string(r));
        transport->send({1, 0, i, Payload::kGradient}, round_bundle(r, i, 500));
      }
    }
  }
  transport->flush();
  d.barrier();
  const auto stats = transport->stats();
  std::cout << "STATS sent " << stats.bundles_sent << " resized " << stats.resized_sent
            << " received " << stats.bundles_received << " expected " << stats.received_expected
            << std::endl;
  std::cout << "OK rounds" << std::endl;
}

// Sent buffers between begin_sends() and end_sends() (transport.h, "Sent buffers"): rank 0 sends
// three bundles of one message each (256-byte header + 64 floats); rank 1 takes them all before a
// barrier, so all three sends are complete, yet rank 0 holds them until release_sends() says so.
// A fourth, not yet received, cannot be released: Timeout after the 1 s receive timeout, naming
// it. Prints "HELD <bytes after the barrier> <after release 2> <after end_sends and flush>".
void scenario_held_sends(Distributed& d) {
  auto transport = d.make_transport({0, 1}, torch::kCPU, std::chrono::milliseconds(1000));
  auto bundle = [](int i) { return Bundle{{pattern({64}, torch::kFloat, i)}, {}}; };
  if (d.rank() == 0) {
    transport->begin_sends();
    for (int i = 0; i < 3; ++i) transport->send({0, 1, i, Payload::kActivation}, bundle(i));
    d.barrier();  // rank 1 has all three
    const int64_t after_barrier = transport->stats().send_buffer_bytes;
    transport->release_sends(2);
    const int64_t after_release = transport->stats().send_buffer_bytes;
    bool refused = false;
    try {
      transport->release_sends(5);
    } catch (const BadInput& e) {
      refused = std::string(e.what()).find("only 3 bundles") != std::string::npos;
    }
    CHECK_OR_THROW(refused, "release_sends(5) after 3 sends was not refused");
    transport->send({0, 1, 3, Payload::kActivation}, bundle(3));
    bool timed_out = false;
    try {
      transport->release_sends(4);  // the fourth is not received until after the next barrier
    } catch (const Error& e) {
      timed_out = e.kind() == ErrorKind::Timeout &&
                  std::string(e.what()).find("micro-batch 3") != std::string::npos;
      std::cout << "release of an unreceived send: " << e.what() << std::endl;
    }
    CHECK_OR_THROW(timed_out, "releasing a send not received did not time out naming it");
    d.barrier();
    transport->end_sends();
    transport->flush();
    std::cout << "HELD " << after_barrier << " " << after_release << " "
              << transport->stats().send_buffer_bytes << std::endl;
  } else {
    for (int i = 0; i < 3; ++i) {
      Bundle got = transport->recv({0, 1, i, Payload::kActivation});
      expect_equal(got.tensors.at(0), bundle(i).tensors[0], "activation " + std::to_string(i));
    }
    d.barrier();
    d.barrier();  // rank 0's release of the fourth has timed out
    transport->recv({0, 1, 3, Payload::kActivation});
  }
  std::cout << "OK held" << std::endl;
}

// 4 stages on world ranks 0..3 (or 2 stages per rank: interleaved, ranks 0,1,0,1): each stage adds
// its index; the last turns the activation into a gradient.
void scenario_chain(Distributed& d, bool interleaved) {
  const int stages = 4;
  std::vector<int> placement;
  for (int j = 0; j < stages; ++j) placement.push_back(interleaved ? j % 2 : j);
  auto transport = d.make_transport(placement);
  const int microbatches = 3;
  for (int i = 0; i < microbatches; ++i) {
    for (int j = 0; j < stages; ++j) {
      if (placement[static_cast<std::size_t>(j)] != d.pipeline_rank()) continue;
      torch::Tensor x = j == 0 ? torch::full({2, 2}, static_cast<float>(i))
                               : transport->recv({j - 1, j, i, Payload::kActivation}).tensors[0];
      x = x + j;
      if (j + 1 < stages) transport->send({j, j + 1, i, Payload::kActivation}, {{x}, {}});
      if (j + 1 == stages) {
        CHECK_OR_THROW(torch::allclose(x, torch::full({2, 2}, i + 6.0f)), "micro-batch ", i);
      }
    }
  }
  transport->flush();
  std::cout << "OK chain" << std::endl;
}

void scenario_dp(Distributed& d) {
  // K = 2, R = 2. Each rank: two float params and a double one; one without a gradient.
  auto a = torch::zeros({3, 2}, torch::requires_grad());
  auto b = torch::zeros({5}, torch::requires_grad());
  auto c = torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).requires_grad(true));
  a.mutable_grad() = torch::full({3, 2}, static_cast<float>(d.rank() + 1));
  c.mutable_grad() = torch::full({2}, 10.0 * (d.rank() + 1), torch::kDouble);
  d.allreduce_gradients({a, b, c});
  float want = 0;
  for (int r : d.layout().data_parallel_ranks(d.pipeline_rank())) want += static_cast<float>(r + 1);
  CHECK_OR_THROW(torch::allclose(a.grad(), torch::full({3, 2}, want)), "a: ", a.grad());
  CHECK_OR_THROW(b.grad().defined() && b.grad().abs().sum().item<float>() == 0, "b");
  CHECK_OR_THROW(torch::allclose(c.grad(), torch::full({2}, 10.0 * want, torch::kDouble)), "c");
  std::cout << "OK dp" << std::endl;
}

// ZeRO's collectives over the data-parallel group (K = 1, R = world): member g's flat vector holds
// (g + 1) * (e + 1) at element e, so element e of the sum is (e + 1) * R(R + 1) / 2; reduce_scatter
// gives member g elements [g n, (g + 1) n) of it, and all_gather puts them back end to end; the
// same for a vector large enough to go in chunks. A flat tensor of the wrong size is an error
// naming both sizes.
void scenario_shards(Distributed& d) {
  const auto& group = d.data_parallel_group();
  CHECK_OR_THROW(group != nullptr, "no data-parallel group");
  const int R = group->size();
  const int g = group->rank();
  const int64_t n = 3;
  const torch::Tensor index = torch::arange(R * n, torch::kFloat) + 1;
  const torch::Tensor flat = index * static_cast<float>(g + 1);
  torch::Tensor shard = torch::empty({n});
  group->reduce_scatter_sum(flat, shard);
  const torch::Tensor sum = index * static_cast<float>(R * (R + 1) / 2);
  CHECK_OR_THROW(torch::equal(shard, sum.narrow(0, g * n, n)), "member ", g, " shard ", shard);
  torch::Tensor gathered = torch::empty({R * n});
  group->all_gather(shard, gathered);
  CHECK_OR_THROW(torch::equal(gathered, sum), "all_gather ", gathered);
  // What this member sent of the two, within its host and between hosts (C10dGroup::traffic).
  const C10dGroup::Traffic rs = group->traffic(C10dGroup::Collective::kReduceScatter);
  const C10dGroup::Traffic ag = group->traffic(C10dGroup::Collective::kAllGather);
  std::cout << "TRAFFIC " << g << " " << rs.within_host << " " << rs.between_hosts << " "
            << ag.within_host << " " << ag.between_hosts << std::endl;
  // all_to_all: member g's slice h (values 100 g + h) goes to member h, which receives member
  // g's at its slice g; what each member sent to the others, under a TrafficLabel too.
  {
    TrafficLabel label("test all-to-all");
    const torch::Tensor out =
        (torch::arange(R, torch::kFloat) + 100.0f * static_cast<float>(g)).repeat_interleave(n);
    torch::Tensor in = torch::empty({R * n});
    group->all_to_all(out, in);
    const torch::Tensor want =
        (torch::arange(R, torch::kFloat) * 100.0f + static_cast<float>(g)).repeat_interleave(n);
    CHECK_OR_THROW(torch::equal(in, want), "all_to_all ", in);
  }
  const C10dGroup::Traffic a2a = group->traffic(C10dGroup::Collective::kAllToAll);
  const CollectiveTraffic labelled = d.world()->labelled_traffic()["test all-to-all"];
  std::cout << "ALLTOALL " << g << " " << a2a.within_host << " " << a2a.between_hosts << " "
            << labelled.within_host << " " << labelled.between_hosts << std::endl;
  // all_to_all_rows (parallel/all_to_all.h): member g sends member h 2g + h + 1 rows of width 2
  // (not what h sends g, so a backward that swapped the counts would not line up)
  // holding 100 g + 10 h + row; the backward of sum(y * c), c = y + 1 held constant, routes each
  // row's gradient c back to the row it came from: x + 1.
  {
    std::vector<int64_t> send;
    for (int h = 0; h < R; ++h) send.push_back(2 * g + h + 1);
    const std::vector<int64_t> receive = parallel::exchange_counts(send, *group);
    for (int h = 0; h < R; ++h) {
      CHECK_OR_THROW(receive[static_cast<size_t>(h)] == 2 * h + g + 1, "exchange_counts from ", h);
    }
    std::vector<float> values;
    for (int h = 0; h < R; ++h) {
      for (int row = 0; row < 2 * g + h + 1; ++row) {
        values.push_back(100.0f * g + 10.0f * h + row);
        values.push_back(-(100.0f * g + 10.0f * h + row));
      }
    }
    const torch::Tensor x = torch::tensor(values).view({-1, 2}).requires_grad_();
    const torch::Tensor y = parallel::all_to_all_rows(x, send, receive, *group);
    std::vector<float> want;
    for (int h = 0; h < R; ++h) {
      for (int row = 0; row < 2 * h + g + 1; ++row) {
        want.push_back(100.0f * h + 10.0f * g + row);
        want.push_back(-(100.0f * h + 10.0f * g + row));
      }
    }
    CHECK_OR_THROW(torch::equal(y.detach(), torch::tensor(want).view({-1, 2})), "all_to_all_rows ",
                   y);
    (y * (y.detach() + 1)).sum().backward();
    CHECK_OR_THROW(torch::equal(x.grad(), x.detach() + 1), "all_to_all_rows backward ", x.grad());
  }
  try {
    torch::Tensor short_flat = torch::empty({R * n - 1});
    group->all_gather(shard, short_flat);
    CHECK_OR_THROW(false, "a flat tensor one element short was accepted");
  } catch (const BadInput& e) {
    CHECK_OR_THROW(
        std::string(e.what()).find("flat " + std::to_string(R * n - 1)) != std::string::npos,
        e.what());
  }
  // A flat vector over 16 MiB goes through in chunks (src/transport/c10d_group.cpp), the last
  // one short: whole numbers, so every sum is exact and each element must be its own.
  const int64_t big = 1500001;
  const torch::Tensor values = torch::remainder(torch::arange(R * big, torch::kFloat), 1000) + 1;
  torch::Tensor big_shard = torch::empty({big});
  group->reduce_scatter_sum(values * static_cast<float>(g + 1), big_shard);
  const torch::Tensor big_sum = values * static_cast<float>(R * (R + 1) / 2);
  CHECK_OR_THROW(torch::equal(big_shard, big_sum.narrow(0, g * big, big)), "member ", g,
                 " chunked shard");
  torch::Tensor big_gathered = torch::empty({R * big});
  group->all_gather(big_shard, big_gathered);
  CHECK_OR_THROW(torch::equal(big_gathered, big_sum), "chunked all_gather");
  std::cout << "OK shards" << std::endl;
}

// Under TORCH_DISTRIBUTED_DEBUG=DETAIL (K = 1: every rank in the dp group): collectives posted in
// one order carry their values; a collective that differs between the members (group rank 0
// all-reduces 3 floats, the others all-gather 2) throws on every member, naming both, before
// anything is posted; the group goes on working after it.
void scenario_checked_collectives(Distributed& d) {
  const auto& group = d.data_parallel_group();
  CHECK_OR_THROW(group != nullptr, "no data-parallel group");
  const int R = group->size();
  const int g = group->rank();
  torch::Tensor flat = torch::arange(2 * R, torch::kFloat) * static_cast<float>(g + 1);
  torch::Tensor shard = torch::empty({2});
  group->reduce_scatter_sum(flat, shard);
  torch::Tensor gathered = torch::empty({2 * R});
  group->all_gather(shard, gathered);
  const float members = static_cast<float>(R * (R + 1) / 2);
  CHECK_OR_THROW(torch::equal(gathered, torch::arange(2 * R, torch::kFloat) * members), "gathered ",
                 gathered);
  std::vector<torch::Tensor> sums = {torch::ones({4}), torch::ones({1}, torch::kDouble)};
  group->allreduce_sum(sums);
  CHECK_OR_THROW(sums[0][0].item<float>() == R && sums[1][0].item<double>() == R, "sums");
  std::vector<torch::Tensor> text = {torch::full({3}, static_cast<float>(g))};
  group->broadcast(text, 1);
  CHECK_OR_THROW(text[0][2].item<float>() == 1, "broadcast from group rank 1 gave ", text[0]);
  group->barrier();
  const auto blobs = group->gather_bytes({static_cast<char>('a' + g)});
  CHECK_OR_THROW(blobs.size() == (g == 0 ? static_cast<size_t>(R) : 0u), "gathered ", blobs.size());
  for (size_t m = 0; m < blobs.size(); ++m) {
    CHECK_OR_THROW(blobs[m] == std::vector<char>{static_cast<char>('a' + m)}, "blob ", m);
  }
  try {
    if (g == 0) {
      std::vector<torch::Tensor> three = {torch::ones({3})};
      group->allreduce_sum(three);
    } else {
      torch::Tensor whole = torch::empty({2 * R});
      group->all_gather(torch::ones({2}), whole);
    }
    CHECK_OR_THROW(false, "the mismatched collectives were posted");
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part :
         {std::string("collective mismatch over group '"),
          std::string("posts all-reduce of 3 Float "), std::string("posts all-gather of 2 Float "),
          std::string("as its collective 7"), std::string("TORCH_DISTRIBUTED_DEBUG=DETAIL")}) {
      CHECK_OR_THROW(message.find(part) != std::string::npos, "'", part, "' not in: ", message);
    }
    CHECK_OR_THROW(e.kind() == ErrorKind::Runtime, "kind ", to_string(e.kind()));
    if (g == 0) std::cout << "mismatch: " << message << std::endl;
  }
  // gather_bytes is checked too (its kind and root; the blobs' sizes may differ): group rank 0
  // gathers where the others are at a barrier.
  try {
    if (g == 0) {
      group->gather_bytes({'x'});
    } else {
      group->barrier();
    }
    CHECK_OR_THROW(false, "the mismatched gather was posted");
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part :
         {std::string("posts gather of bytes to group rank 0 as its collective 8"),
          std::string("posts barrier as its collective 8")}) {
      CHECK_OR_THROW(message.find(part) != std::string::npos, "'", part, "' not in: ", message);
    }
    if (g == 0) std::cout << "gather mismatch: " << message << std::endl;
  }
  std::vector<torch::Tensor> after = {torch::ones({2})};
  group->allreduce_sum(after);
  CHECK_OR_THROW(after[0][1].item<float>() == R, "after the mismatch: ", after[0]);
  std::cout << "OK checked_collectives" << std::endl;
}

// ZeRO-Offload against the plain sharded optimizer at every stage, blocking and overlapped, over
// the dp group (K = 1, R = world): three parameters on PIPETRAIN_TEST_DEVICE, gradients that depend
// on the rank, the step and the weights (so every step's result feeds the next), clipped by the
// global norm, 3 AdamW steps; then the weights and the captured optimizer state. On the CPU they
// must be equal bit for bit (the same kernels on the same values, only copies apart); on a GPU the
// plain shard steps on the device and the offloaded one on the host: within 1e-5. The optimizer
// state in a file (nvme, stepped by sub-groups of 1024 elements that cut the parameters' slices,
// through 3 buffers, too few to keep every transfer in flight) equals the offload's in host
// memory bit for bit on either device: both step on the host; at stage 3 so does the state with
// the shard's values in the file too (--offload-params nvme: every gather reads its piece there),
// and on the CPU its gradient (each reduced piece added to the file's range as it lands; the norm
// and the clipping's factor read from there), through 4 buffers.
void scenario_zero_offload(Distributed& d) {
  const torch::Device device = test_device();
  const bool exact = device.is_cpu();
  const std::string dir = std::filesystem::temp_directory_path().string();
  // `overlap`: two segments (stages 0 and 1, as --overlap-grad-reduce lays them out), each
  // reduce-scattered as soon as its gradients are final (start_reduce, the later stage first).
  for (const auto& [stage, overlap] : std::vector<std::pair<int, bool>>{
           {1, false}, {2, false}, {3, false}, {1, true}, {2, true}, {3, true}}) {
    std::vector<torch::Tensor> weights[4];
    std::map<std::string, std::map<std::string, torch::Tensor>> state[4];
    // In memory, offloaded to host memory, the state to a file, and (stage 3) the values too.
    for (int variant : {0, 1, 2, 3}) {
      if (variant == 3 && stage != 3) continue;
      torch::manual_seed(1);
      std::vector<torch::Tensor> params = {torch::randn({50, 41}), torch::randn({1500}),
                                           torch::randn({33, 40})};
      for (auto& p : params) p = p.to(device).requires_grad_(true);
      const std::vector<std::vector<torch::Tensor>> segments =
          overlap ? std::vector<std::vector<torch::Tensor>>{{params[0], params[1]}, {params[2]}}
                  : std::vector<std::vector<torch::Tensor>>{};
      const train::ZeroOptions zero =
          train::ZeroOptions()
              .stage(stage)
              .offload(variant > 0)
              .offload_to_nvme(variant >= 2)
              .offload_params_to_nvme(variant == 3)
              .nvme(train::default_nvme_options().dir(dir).buffer_bytes(4096).buffer_count(
                  variant == 3 ? 4 : 3));
      train::ShardedOptimizer sharded(
          &d, params, params, "adamw", train::OptimizerOptions().lr(0.05).weight_decay(0.1), zero,
          segments, overlap ? std::vector<int>{0, 1} : std::vector<int>{});
      CHECK_OR_THROW((sharded.state_file() != nullptr) == (variant >= 2), "state file ", variant);
      for (int step = 0; step < 3; ++step) {
        sharded.zero_grad();
        sharded.wait_gathered(0);  // stage 3: stage 0's segment (or the one every stage uses)
        sharded.wait_gathered(1);
        for (auto& p : params) {
          p.mutable_grad() = (p.detach() * static_cast<float>(d.rank() + 1) + step).sin();
        }
        if (overlap) {
          sharded.start_reduce(1);
          sharded.start_reduce(0);
        }
        sharded.reduce_gradients();
        std::vector<torch::Tensor> norm = {
            torch::tensor({sharded.local_grad_norm_squared()}, torch::kFloat64)};
        d.world()->world_group()->allreduce_sum(norm);
        sharded.scale_gradients(std::min(1.0, 0.5 / std::sqrt(norm[0].item<double>())));
        sharded.step();
      }
      if (variant >= 2) {
        // The state's two fields; at stage 3 the values, and on the CPU the gradient (read by the
        // step, not written back).
        const bool grads = variant == 3 && exact;
        const int64_t fields = variant == 3 ? 3 : 2;
        CHECK_OR_THROW(
            static_cast<int64_t>(sharded.state_file()->fields().size()) == fields + (grads ? 1 : 0),
            "fields ", sharded.state_file()->fields().size());
        const auto& last = sharded.state_file()->last_step();
        const int64_t groups = (sharded.shard_elements() + 1023) / 1024;
        CHECK_OR_THROW(last.sub_groups == groups && groups > 1, "stepped ", last.sub_groups,
                       " sub-groups of a shard of ", sharded.shard_elements());
        CHECK_OR_THROW(
            last.bytes_read == (fields + (grads ? 1 : 0)) * sharded.shard_elements() * 4 &&
                last.bytes_written == fields * sharded.shard_elements() * 4,
            "moved ", last.bytes_read, " and ", last.bytes_written, " bytes");
        // Host memory: the shard's gradient unless it is in the file, its values unless they are,
        // the pool.
        const int64_t held = (variant == 3 ? (grads ? 0 : 1) : 2) * sharded.shard_elements() * 4 +
                             sharded.state_file()->host_bytes();
        CHECK_OR_THROW(sharded.host_bytes() == held, "host ", sharded.host_bytes(), " vs ", held);
        CHECK_OR_THROW(sharded.state_bytes() == 0 && sharded.file_bytes() >= last.bytes_read,
                       "state in memory ", sharded.state_bytes(), ", in the file ",
                       sharded.file_bytes());
      }
      sharded.gather_all();
      for (const auto& p : params) weights[variant].push_back(p.detach().cpu().clone());
      train::Checkpoint part;
      train::NamedTensors named;
      for (size_t q = 0; q < params.size(); ++q) named.insert("p" + std::to_string(q), params[q]);
      sharded.capture(part, named);
      state[variant] = part.optimizer_state;
    }
    const std::string where = "stage " + std::to_string(stage) + (overlap ? " overlapped" : "") +
                              ", rank " + std::to_string(d.rank());
    for (int variant : {1, 2, 3}) {
      if (variant == 3 && stage != 3) continue;
      // The files' against the host memory's: always exact; the host's against the plain one.
      const int base = variant == 1 ? 0 : 1;
      const bool bits = exact || variant >= 2;
      const std::string what = where + (variant == 3   ? ", params nvme vs cpu"
                                        : variant == 2 ? ", nvme vs cpu"
                                                       : ", cpu vs none");
      for (size_t q = 0; q < weights[base].size(); ++q) {
        const bool same = bits ? torch::equal(weights[variant][q], weights[base][q])
                               : torch::allclose(weights[variant][q], weights[base][q], 1e-5, 1e-7);
        CHECK_OR_THROW(same, what, ": parameter ", q, " differs");
      }
      CHECK_OR_THROW(state[base].size() == state[variant].size(), what, ": state of ",
                     state[variant].size(), " parameters vs ", state[base].size());
      CHECK_OR_THROW(d.replica() != 0 || state[base].size() == 3, what, ": ", state[base].size(),
                     " parameters' state captured");
      for (const auto& [name, fields] : state[base]) {
        for (const auto& [field, tensor] : fields) {
          const torch::Tensor& other = state[variant].at(name).at(field);
          const bool same = bits ? torch::equal(other, tensor)
                                 : torch::allclose(other.to(torch::kDouble),
                                                   tensor.to(torch::kDouble), 1e-5, 1e-9);
          CHECK_OR_THROW(same, what, ": state ", name, ".", field, " differs");
        }
      }
    }
  }
  std::cout << "OK zero_offload" << std::endl;
}

// What each ZeRO stage holds between steps, measured: 16 parameters of 2^16 elements on
// PIPETRAIN_TEST_DEVICE (a segment each, so buffers stay a segment or two), gradients set, 2 AdamW
// steps over the world's replicas, then the bytes this process holds for them: on a GPU the
// caching allocator's allocated bytes, on the CPU this thread's allocations counted
// (stage/allocation_counter.h). Prints "held STAGE BYTES_PER_PARAMETER"; the test compares them
// with the paper's 16, 4 + 4 + 8/N, 4 + 12/N, 16/N.
void scenario_zero_held(Distributed& d) {
  const torch::Device device = test_device();
  const int64_t count = 16, elements = int64_t{1} << 16;
  for (int stage = 0; stage <= 3; ++stage) {
    const int64_t before = device_allocated_bytes(device);
    AllocationCounter counter;
    double held = 0;
    {
      CountAllocations counting(counter);
      torch::manual_seed(1);
      std::vector<torch::Tensor> params;
      std::vector<std::vector<torch::Tensor>> segments;
      for (int64_t q = 0; q < count; ++q) {
        params.push_back(
            torch::randn({elements}, torch::TensorOptions().device(device)).requires_grad_(true));
        segments.push_back({params.back()});
      }
      const auto set_gradients = [&](int step) {
        torch::NoGradGuard no_grad;
        for (auto& p : params) {
          p.mutable_grad() = (p.detach() * static_cast<float>(d.rank() + 1) + step).sin();
        }
      };
      std::unique_ptr<train::ShardedOptimizer> sharded;
      std::unique_ptr<torch::optim::AdamW> plain;
      if (stage == 0) {
        plain = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01));
      } else {
        sharded = std::make_unique<train::ShardedOptimizer>(
            &d, params, params, "adamw", train::OptimizerOptions().lr(0.01),
            train::ZeroOptions()
                .stage(stage)
                .unit(train::ZeroUnit::kStage)
                .gradients(train::ZeroGradients::kAccumulate),
            segments, std::vector<int>(static_cast<size_t>(count), 0));
      }
      for (int step = 0; step < 2; ++step) {
        if (plain) {
          plain->zero_grad();
          set_gradients(step);
          std::vector<torch::Tensor> grads;
          for (auto& p : params) grads.push_back(p.grad());
          d.world()->world_group()->allreduce_sum(grads);
          plain->step();
        } else {
          sharded->zero_grad();
          sharded->wait_gathered(0);
          set_gradients(step);
          sharded->reduce_gradients();
          sharded->step();
          if (stage == 3) sharded->release_all();  // between steps: the shard alone
        }
      }
      const int64_t bytes =
          device.is_cuda() ? device_allocated_bytes(device) - before : counter.live_bytes();
      held = static_cast<double>(bytes) / static_cast<double>(count * elements);
    }
    std::cout << "held " << stage << " " << held << std::endl;
  }
  std::cout << "OK zero_held" << std::endl;
}

// A runner whose step leaves its gradient's reduce-scatter to the sharded optimizer's
// communication thread (one segment of 4M elements: packing it takes milliseconds) and whose
// batch-norm sum is an all-reduce over the same replicas' group. Replica 1 waits for its thread
// to post the reduce-scatter (post_started_collectives) before its step returns, so it posts that
// all-reduce second; replica 0 returns at once and would post the all-reduce first unless the
// trainer waits for the thread too. Posted in two orders, the collectives mismatch.
class CollectiveOrderRunner : public train::StepRunner {
 public:
  CollectiveOrderRunner(Distributed& d, torch::nn::Sequential model)
      : d_(d), model_(std::move(model)) {}
  double step(const data::Batch&) override {
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : parameters()) {
      p.mutable_grad() = torch::full_like(p, static_cast<float>(d_.replica() + 1));
    }
    sharded_->start_reduce(0);
    if (d_.replica() == 1) sharded_->post_started_collectives();
    return 0.0;
  }
  void sum_batch_norm_statistics() override {
    std::vector<torch::Tensor> value = {torch::tensor({d_.replica() + 1.0}, torch::kDouble)};
    d_.data_parallel_group()->allreduce_sum(value);
    sums_.push_back(value[0].item<double>());
  }
  std::vector<torch::Tensor> parameters() override { return model_->parameters(); }
  train::NamedTensors named_parameters() override { return model_->named_parameters(); }
  train::NamedTensors named_buffers() override { return train::NamedTensors(); }
  double grad_norm_squared() override { return 0; }
  std::vector<ActionEvent> last_events() override { return {}; }
  int trace_rows() const override { return 1; }
  std::string description() const override { return "collective order"; }
  std::unique_ptr<train::ShardedOptimizer> make_sharded_optimizer(
      const std::string& optimizer, const train::OptimizerOptions& options,
      const train::ZeroOptions& zero) override {
    auto sharded = std::make_unique<train::ShardedOptimizer>(
        &d_, parameters(), parameters(), optimizer, options, zero,
        std::vector<std::vector<torch::Tensor>>{parameters()}, std::vector<int>{0});
    sharded_ = sharded.get();
    return sharded;
  }
  const std::vector<double>& sums() const { return sums_; }

 private:
  Distributed& d_;
  torch::nn::Sequential model_;
  train::ShardedOptimizer* sharded_ = nullptr;
  std::vector<double> sums_;
};

// Two replicas train 3 SGD steps at ZeRO 2 through the Trainer with CollectiveOrderRunner: the
// runs end (no mismatch), every batch-norm sum is 1 + 2, and the weights moved by lr x 3 a step.
void scenario_zero_collective_order(Distributed& d) {
  torch::manual_seed(4);
  torch::nn::Sequential model(torch::nn::Linear(torch::nn::LinearOptions(2048, 2048).bias(false)));
  const torch::Tensor before = model->parameters()[0].detach().clone();
  CollectiveOrderRunner runner(d, model);
  const train::TensorBatches batches(torch::zeros({4, 1}), torch::zeros({4, 1}), 4);
  train::Trainer trainer(model, runner, batches,
                         train::TrainerOptions(3).optimizer("sgd").lr(0.125).momentum(0).zero(2));
  trainer.fit();
  CHECK_OR_THROW(runner.sums() == std::vector<double>(3, 3.0), "batch-norm sums ",
                 runner.sums().size(), " of them, the first ",
                 runner.sums().empty() ? 0.0 : runner.sums().front());
  const torch::Tensor moved = before - model->parameters()[0].detach();
  CHECK_OR_THROW(torch::allclose(moved, torch::full_like(moved, 3 * 0.125 * 3), 0, 1e-5),
                 "weights moved by ", moved.min().item<double>(), " to ",
                 moved.max().item<double>(), ", not ", 3 * 0.125 * 3);
  std::cout << "OK zero_collective_order" << std::endl;
}

void scenario_tie(Distributed& d) {
  // Pipeline ranks 0 and 1 hold tie "embedding"; rank 1 holds two copies of it.
  const std::string tie = d.declare_tie("embedding", {0, 1});
  std::vector<torch::Tensor> copies;
  const int n_copies = d.pipeline_rank() == 1 ? 2 : 1;
  for (int k = 0; k < n_copies; ++k) {
    auto w = torch::zeros({4}, torch::requires_grad());
    w.mutable_grad() = torch::full({4}, static_cast<float>(d.pipeline_rank() * 10 + k + 1));
    copies.push_back(w);
  }
  d.allreduce_tie(tie, copies);
  // Copies: rank 0 -> 1; rank 1 -> 11 and 12. Sum 24.
  for (const auto& w : copies) {
    CHECK_OR_THROW(torch::allclose(w.grad(), torch::full({4}, 24.0f)), "tie grad ", w.grad());
  }
  // One copy a rank: summed in place in its gradient (no second tensor), and its zeros are those
  // of a sum that starts from zeros (-0 on both holders sums to +0, as with several copies).
  const std::string zeros = d.declare_tie("zeros", {0, 1});
  auto w = torch::zeros({4}, torch::requires_grad());
  w.mutable_grad() = torch::full({4}, -0.0f);
  w.mutable_grad()[0] = static_cast<float>(d.pipeline_rank() + 1);
  const void* storage = w.grad().data_ptr();
  d.allreduce_tie(zeros, {w});
  CHECK_OR_THROW(w.grad().data_ptr() == storage, "a single copy's tie sum was not made in place");
  CHECK_OR_THROW(w.grad()[0].item<float>() == 3.0f, "tie grad ", w.grad());
  CHECK_OR_THROW(!torch::signbit(w.grad()).any().item<bool>(), "-0 kept its sign: ", w.grad());
  std::cout << "OK tie" << std::endl;
}

void scenario_loss(Distributed& d) {
  const bool last = d.pipeline_rank() == d.layout().pipeline_ranks - 1;
  const double total =
      d.broadcast_loss(last ? std::optional<double>(0.25 * (d.replica() + 1)) : std::nullopt);
  double want = 0;
  for (int r = 0; r < d.layout().replicas; ++r) want += 0.25 * (r + 1);
  CHECK_OR_THROW(std::abs(total - want) < 1e-12, "loss ", total, " want ", want);
  std::cout << "OK loss " << total << std::endl;
}

// DistributedPipe::forward: every replica's last-stage ranks get the sequential model's output for
// their share of the rows; the other ranks get an undefined tensor.
void scenario_forward(Distributed& d) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8),
                              torch::nn::Tanh(), torch::nn::Linear(8, 2));
  torch::nn::Sequential reference =
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
  const torch::Tensor x = torch::randn({10, 6});
  DistributedPipe pipe(d, model, PipeOptions().stages(d.layout().pipeline_ranks).chunks(3));
  const torch::Tensor out = pipe.forward(x);
  const bool last = d.pipeline_rank() == d.layout().pipeline_ranks - 1;
  CHECK_OR_THROW(out.defined() == last, "rank ", d.rank(), ": output defined ", out.defined());
  if (last) {
    const torch::Tensor want = reference->forward(x).narrow(0, d.replica() * 5, 5);
    CHECK_OR_THROW(out.sizes() == want.sizes() && torch::allclose(out, want, 1e-6, 1e-6), "rank ",
                   d.rank(), ": forward differs from the sequential model's");
  }
  std::cout << "OK forward" << std::endl;
}

// DistributedPipe takes Pipe's options per rank: devices (one per pipeline rank; another count is
// an error naming it) and threads_per_stage (the intra-op threads during the step, the caller's
// count restored after it).
void scenario_pipe_options(Distributed& d) {
  const int K = d.layout().pipeline_ranks;
  auto make = [] {
    torch::manual_seed(3);
    return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(),
                                 torch::nn::Linear(8, 2));
  };
  try {
    DistributedPipe wrong(d, make(),
                          PipeOptions().stages(K).devices(std::vector<torch::Device>(
                              static_cast<size_t>(K + 1), torch::Device(torch::kCPU))));
    CHECK_OR_THROW(false, "a devices list of K + 1 entries was accepted");
  } catch (const BadInput& e) {
    const std::string want =
        std::to_string(K + 1) + " devices but the job has " + std::to_string(K) + " pipeline ranks";
    CHECK_OR_THROW(std::string(e.what()).find(want) != std::string::npos, e.what());
  }
  DistributedPipe pipe(
      d, make(),
      PipeOptions()
          .stages(K)
          .chunks(2)
          .devices(std::vector<torch::Device>(static_cast<size_t>(K), torch::Device(torch::kCPU)))
          .threads_per_stage(1));
  at::set_num_threads(2);
  int threads_in_loss = -1;
  const LossFn loss = [&](const torch::Tensor& out, const torch::Tensor& y) {
    threads_in_loss = at::get_num_threads();
    return torch::mse_loss(out, y);
  };
  pipe.train_step(torch::randn({4, 6}), torch::randn({4, 2}), loss);
  CHECK_OR_THROW(at::get_num_threads() == 2, "the caller's thread count became ",
                 at::get_num_threads());
  if (d.pipeline_rank() == K - 1) {
    CHECK_OR_THROW(threads_in_loss == 1, "the step ran with ", threads_in_loss, " threads");
  }
  std::cout << "OK pipe_options" << std::endl;
}

// PipeOptions::timeout_seconds bounds a receive: the last rank starts its step 4 s late, and the
// first rank's wait for a gradient fails after 1 s (the job's timeout is longer).
void scenario_pipe_timeout(Distributed& d) {
  const int K = d.layout().pipeline_ranks;
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
  DistributedPipe pipe(d, model, PipeOptions().stages(K).chunks(2).timeout_seconds(1.0));
  // The late start is what is tested: no event ends it, the first rank's timeout must fire first.
  if (d.pipeline_rank() == K - 1) std::this_thread::sleep_for(std::chrono::seconds(4));
  pipe.train_step(
      torch::randn({4, 6}), torch::randn({4, 2}),
      [](const torch::Tensor& out, const torch::Tensor& y) { return torch::mse_loss(out, y); });
  std::cout << "OK pipe_timeout (not expected)" << std::endl;
}

// Every rank is the root once: what each rank returns is the root's text (long, short or empty),
// never its own; a root outside the world is an error naming it.
void scenario_broadcast_text(Distributed& d) {
  for (int root = 0; root < d.world_size(); ++root) {
    const std::string sent =
        root == 1 ? std::string()
                  : "from rank " + std::to_string(root) + std::string(root * 5000, 'x');
    const std::string mine =
        d.rank() == root ? sent : "rank " + std::to_string(d.rank()) + "'s own";
    const std::string got = d.broadcast_text(mine, root);
    CHECK_OR_THROW(got == sent, "root ", root, ": got ", got.size(), " bytes, want ", sent.size());
  }
  bool rejected = false;
  try {
    d.broadcast_text("x", d.world_size());
  } catch (const BadInput& error) {
    rejected = std::string(error.what()).find("root " + std::to_string(d.world_size())) !=
               std::string::npos;
  }
  CHECK_OR_THROW(rejected, "a root outside the world was not rejected by name");
  std::cout << "OK broadcast_text" << std::endl;
}

void scenario_gather(Distributed& d) {
  std::vector<std::pair<std::string, torch::Tensor>> mine{
      {"stage" + std::to_string(d.pipeline_rank()) + ".weight",
       torch::full({2, 2}, static_cast<float>(d.rank()))},
      {"tied.weight", torch::ones({3})}};
  auto all = d.gather_named_parameters(mine);
  if (d.rank() == 0) {
    CHECK_OR_THROW(static_cast<int>(all.size()) == d.layout().pipeline_ranks + 1, "names ",
                   all.size());
    for (int p = 0; p < d.layout().pipeline_ranks; ++p) {
      const auto& t = all.at("stage" + std::to_string(p) + ".weight");
      CHECK_OR_THROW(torch::allclose(t, torch::full({2, 2}, static_cast<float>(p))), "stage ", p);
    }
  } else {
    CHECK_OR_THROW(all.empty(), "non-zero rank got parameters");
  }
  std::cout << "OK gather" << std::endl;
}

// Fault scenarios: rank `victim` fails while rank 0 waits on it. Rank 0 broadcasts (a send only,
// for the root) just before its receive or barrier, and the victim fails once that broadcast has
// reached it. Where rank 0 is slower still and the failure comes before its receive is posted,
// the receive reports it the same way (transport/c10d_transport.cpp, post_recv).
void scenario_fault(Distributed& d, const std::string& how) {
  auto transport = d.make_transport({0, 1});
  const int victim = 1;
  d.broadcast_text("", 0);
  if (d.rank() == victim) {
    if (how == "throw") TORCH_CHECK(false, "injected failure in stage 1, micro-batch 0");
    if (how == "sigkill") raise(SIGKILL);
    if (how == "exit") std::_Exit(3);
    if (how == "stop") raise(SIGSTOP);  // hangs: alive, connections open, no heartbeat
  }
  if (how == "collective" && d.rank() == 0) {
    d.barrier();  // rank 1 never joins: it throws below
  }
  if (how == "collective") {
    TORCH_CHECK(false, "injected failure before the barrier");
  }
  try {
    transport->recv({1, 0, 0, Payload::kGradient});
  } catch (const Error& error) {
    // The kind, for the test to check: "KIND timeout", "KIND peer failed", ...
    std::cout << "KIND " << to_string(error.kind()) << std::endl;
    throw;
  }
  std::cout << "UNEXPECTED: received" << std::endl;
}

// 9 layers: a residual from layer 1 to layer 5 and layer 6 tied to layer 2's weight.
torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  torch::nn::Linear shared(8, 8);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), SkipStash("a"), shared, torch::nn::Tanh(),
                               torch::nn::Linear(8, 8), SkipPopAdd("a"),
                               testing::TiedLinear(shared->weight), torch::nn::Tanh(),
                               torch::nn::Linear(8, 2));
}

torch::optim::SGD make_sgd(const std::vector<torch::Tensor>& params) {
  return torch::optim::SGD(testing::unique_parameters(params),
                           torch::optim::SGDOptions(0.1).momentum(0.9));
}

// Trains 3 steps with DistributedPipe for each schedule and compares with sequential training.
void scenario_train(Distributed& d, const std::vector<std::string>& schedules) {
  auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::mse_loss(out, target);
  };
  const int K = d.layout().pipeline_ranks;
  for (const auto& spec : schedules) {
    // "NAME" or "NAME:MODE" with MODE a checkpoint mode (always, except_last, never).
    const auto colon = spec.find(':');
    const std::string name = spec.substr(0, colon);
    const Checkpoint checkpoint = colon == std::string::npos
                                      ? PipeOptions().checkpoint()
                                      : parse_checkpoint(spec.substr(colon + 1));
    const int virtual_stages =
        name == "interleaved-1f1b" ? 2 : schedule::default_virtual_stages(name);
    const int chunks = name == "dualpipev" ? 2 * K : 3;  // DualPipeV needs M >= 2K
    torch::manual_seed(7);
    std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
    for (int k = 0; k < 3; ++k) batches.emplace_back(torch::randn({13, 6}), torch::randn({13, 2}));

    auto model = make_model();
    DistributedPipe pipe(d, model,
                         PipeOptions()
                             .stages(K * virtual_stages)
                             .chunks(chunks)
                             .checkpoint(checkpoint)
                             .schedule(name)
                             .virtual_stages(virtual_stages),
                         test_device());
    auto sgd = make_sgd(pipe.parameters());
    std::vector<double> losses;
    for (const auto& [x, y] : batches) {
      sgd.zero_grad();
      losses.push_back(pipe.train_step(x, y, mse).item<double>());
      sgd.step();
    }
    auto gathered = pipe.gather_parameters();
    if (d.rank() != 0) continue;

    auto reference = make_model();
    auto reference_sgd = make_sgd(reference->parameters());
    std::vector<double> reference_losses;
    for (const auto& [x, y] : batches) {
      reference_sgd.zero_grad();
      auto loss = mse(reference->forward(x), y);
      loss.backward();
      reference_losses.push_back(loss.item<double>());
      reference_sgd.step();
    }
    double worst = 0;
    for (const auto& entry : reference->named_parameters()) {
      auto found = gathered.find(entry.key());
      CHECK_OR_THROW(found != gathered.end(), spec, ": parameter ", entry.key(), " not gathered");
      const auto want = entry.value().detach();
      const double relative = (found->second - want).abs().max().item<double>() /
                              (want.abs().max().item<double>() + 1e-12);
      worst = std::max(worst, relative);
    }
    // The CPU reference and CUDA stages use different kernels: 1e-4 there, 1e-5 on the CPU.
    const double tolerance = test_device().is_cuda() ? 1e-4 : 1e-5;
    CHECK_OR_THROW(worst < tolerance, spec, ": parameters differ from sequential training by ",
                   worst, " (relative)");
    for (std::size_t k = 0; k < losses.size(); ++k) {
      CHECK_OR_THROW(std::abs(losses[k] - reference_losses[k]) <
                         tolerance * std::abs(reference_losses[k]) + 1e-7,
                     spec, ": loss of step ", k, " is ", losses[k], ", sequential ",
                     reference_losses[k]);
    }
    std::cout << "OK train " << spec << " max_relative_difference " << worst << std::endl;
  }
}

// A tiny Llama (6 layers, 9 entries: room for 8 stages) trained on documents of 5 to 200 tokens,
// one per row and one row per micro-batch (--pack none): the micro-batches of a step differ in
// width from 4 to 200 tokens, on every stage and boundary. Each schedule's weights after 2 SGD
// steps must equal sequential training's on the same batches.
models::LlamaModel documents_model() {
  models::LlamaConfig config =
      models::llama_config(48, 16, 24, /*layers=*/6, /*heads=*/4, /*kv_heads=*/2);
  models::LlamaModel model = models::make_llama(config);
  models::init_llama_random(model, 11);
  return model;
}

void scenario_documents(Distributed& d, const std::vector<std::string>& schedules) {
  const int K = d.layout().pipeline_ranks;
  // Every rank writes the same documents to a file of its own.
  const std::string prefix = "/tmp/pipetrain_documents_" + std::to_string(::getpid());
  std::vector<std::vector<int64_t>> documents;
  const std::vector<int64_t> lengths = {6, 201, 40,  13, 120, 8,   77, 160,
                                        5, 33,  190, 64, 9,   150, 21, 101};
  for (size_t k = 0; k < lengths.size(); ++k) {
    documents.emplace_back();
    for (int64_t i = 0; i < lengths[k]; ++i) {
      documents.back().push_back((static_cast<int64_t>(k) * 7 + i * 13) % 48);
    }
  }
  io::write_indexed_dataset(prefix, documents);
  const auto dataset = std::make_shared<const data::DocumentDataset>(prefix);
  std::remove((prefix + ".idx").c_str());  // mapped: readable until the process ends
  std::remove((prefix + ".bin").c_str());
  const train::DocumentBatches batches(
      {{1.0, dataset}}, train::DocumentBatchOptions(200, 8).packing(data::Packing::kNone));
  const LossFn loss = models::causal_lm_loss;
  for (const std::string& name : schedules) {
    const int virtual_stages =
        name == "interleaved-1f1b" ? 2 : schedule::default_virtual_stages(name);
    models::LlamaModel model = documents_model();
    DistributedPipe pipe(d, model.sequential,
                         PipeOptions()
                             .stages(K * virtual_stages)
                             .chunks(8)
                             .schedule(name)
                             .virtual_stages(virtual_stages),
                         test_device());
    torch::optim::SGD sgd(pipe.parameters(), torch::optim::SGDOptions(0.1));
    std::vector<double> losses;
    for (int64_t k = 0; k < 2; ++k) {
      sgd.zero_grad();
      losses.push_back(pipe.train_step(batches.batch(k), loss).item<double>());
      sgd.step();
    }
    auto gathered = pipe.gather_parameters();
    if (d.rank() != 0) continue;
    models::LlamaModel reference = documents_model();
    auto runner = train::make_sequential_runner(reference.sequential, loss);
    torch::optim::SGD reference_sgd(reference.sequential->parameters(),
                                    torch::optim::SGDOptions(0.1));
    for (int64_t k = 0; k < 2; ++k) {
      reference_sgd.zero_grad();
      const double expected = runner->step(batches.batch(k));
      CHECK_OR_THROW(std::abs(losses[static_cast<size_t>(k)] - expected) < 1e-5 * expected, name,
                     ": loss of step ", k, " is ", losses[static_cast<size_t>(k)], ", sequential ",
                     expected);
      reference_sgd.step();
    }
    double worst = 0;
    for (const auto& entry : reference.sequential->named_parameters()) {
      auto found = gathered.find(entry.key());
      CHECK_OR_THROW(found != gathered.end(), name, ": parameter ", entry.key(), " not gathered");
      const auto want = entry.value().detach();
      worst = std::max(worst, (found->second - want).abs().max().item<double>() /
                                  (want.abs().max().item<double>() + 1e-12));
    }
    CHECK_OR_THROW(worst < 1e-5, name, ": parameters differ from sequential training by ", worst,
                   " (relative)");
    std::cout << "OK documents " << name << " max_relative_difference " << worst << std::endl;
  }
}

// DistributedPipe::stage_accounting equals the in-process Pipe's for the same model, schedule and
// checkpoint mode, stage by stage (each rank checks its own stages). Model: per stage 2 x
// (Linear(16) + ReLU); M = 6 micro-batches of 4 rows. A kept micro-batch on stage 0 holds its
// input and 2 ReLU results: 3 * 4 rows * 16 * 4 bytes, so gpipe without checkpoints peaks at 6x.
void scenario_accounting(Distributed& d) {
  auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::mse_loss(out, target);
  };
  const int K = d.layout().pipeline_ranks;
  const int64_t width = 16;
  const int m = 6;
  const int64_t rows = 4 * m;
  auto make = [&] {
    torch::manual_seed(3);
    torch::nn::Sequential model;
    for (int l = 0; l < 2 * K; ++l) {
      model->push_back(torch::nn::Linear(width, width));
      model->push_back(torch::nn::ReLU());
    }
    return model;
  };
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({rows, width});
  const torch::Tensor y = torch::randn({rows, width});
  for (const std::string name : {"gpipe", "1f1b"}) {
    for (const std::string checkpoint : {"never", "except_last"}) {
      const PipeOptions options =
          PipeOptions().stages(K).chunks(m).schedule(name).checkpoint(parse_checkpoint(checkpoint));
      DistributedPipe pipe(d, make(), options);
      pipe.train_step(x, y, mse);
      Pipe reference(make(), options);
      reference->train_step(x, y, mse);
      const std::vector<StageAccounting> want = reference->stage_accounting();
      const std::map<int, StageAccounting> got = pipe.stage_accounting();
      CHECK_OR_THROW(got.size() == pipe.local_stages().size(), "accounting of ", got.size(),
                     " stages for ", pipe.local_stages().size(), " local stages");
      for (const auto& [j, accounting] : got) {
        const StageAccounting& w = want.at(static_cast<size_t>(j));
        const std::string what = name + " " + checkpoint + " stage " + std::to_string(j);
        CHECK_OR_THROW(accounting.peak_stashed_bytes == w.peak_stashed_bytes, what,
                       ": peak stashed bytes ", accounting.peak_stashed_bytes, ", Pipe's ",
                       w.peak_stashed_bytes);
        CHECK_OR_THROW(accounting.peak_stashed_microbatches == w.peak_stashed_microbatches, what,
                       ": peak stashed micro-batches ", accounting.peak_stashed_microbatches,
                       ", Pipe's ", w.peak_stashed_microbatches);
        CHECK_OR_THROW(accounting.microbatches == m, what, ": ", accounting.microbatches,
                       " forwards");
        if (j == 0 && name == "gpipe" && checkpoint == "never") {
          const int64_t expected = m * 3 * (rows / m) * width * 4;
          CHECK_OR_THROW(accounting.peak_stashed_bytes == expected, what, ": peak ",
                         accounting.peak_stashed_bytes, ", from the shapes ", expected);
        }
        std::cout << "OK accounting " << what << " peak_stashed_bytes "
                  << accounting.peak_stashed_bytes << std::endl;
      }
    }
  }
}

int run_launcher_child(const std::string& scenario, int argc, char** argv) {
  const int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "-1");
  if (scenario == "echo") {
    // argv: exit code per rank ("0,0,3")
    std::cout << "hello from " << rank << " of " << std::getenv("WORLD_SIZE") << " port "
              << std::getenv("MASTER_PORT") << std::endl;
    std::cerr << "note from " << rank << std::endl;
    std::cout << "partial line without newline";
    std::cout.flush();
    std::string codes = argc > 2 ? argv[2] : "0";
    int code = 0;
    for (int r = 0, at = 0; r <= rank; ++r) {
      code = std::atoi(codes.c_str() + at);
      auto comma = codes.find(',', static_cast<std::size_t>(at));
      if (comma == std::string::npos) break;
      at = static_cast<int>(comma) + 1;
    }
    return code;
  }
  if (scenario == "sleep_unless_rank0_fails") {
    // argv: [MODE DIR]. MODE ignore_term: every other rank ignores SIGTERM, so the launcher must
    // escalate to SIGKILL; rank 0 fails once each of them has said so (a file DIR/ready-r).
    // MODE die_of_sigpipe: every other rank dies of a signal the launcher did not send, saying
    // nothing (as a write to a dead peer did), once the launcher has reaped rank 0 and so seen
    // the first failure (rank 0's pid is in DIR/rank0.pid).
    const std::string mode = argc > 2 ? argv[2] : "";
    const std::string dir = argc > 3 ? argv[3] : "";
    const int world_size = std::atoi(std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "1");
    const auto bound = std::chrono::seconds(30);
    if (rank == 0) {
      if (mode == "ignore_term") {
        auto all_ready = [&] {
          for (int r = 1; r < world_size; ++r) {
            if (!std::filesystem::exists(dir + "/ready-" + std::to_string(r))) return false;
          }
          return true;
        };
        if (!testing::wait_until(all_ready, bound)) {
          std::cerr << "rank 0: the other ranks did not say they ignore SIGTERM within 30 s"
                    << std::endl;
          return 9;
        }
      }
      if (mode == "die_of_sigpipe") {
        std::ofstream(dir + "/rank0.pid.tmp") << getpid() << std::endl;
        std::filesystem::rename(dir + "/rank0.pid.tmp", dir + "/rank0.pid");
      }
      std::cerr << "rank 0 gives up" << std::endl;
      return 7;
    }
    if (mode == "ignore_term") {
      signal(SIGTERM, SIG_IGN);
      std::ofstream(dir + "/ready-" + std::to_string(rank)) << "ignoring SIGTERM" << std::endl;
    }
    if (mode == "die_of_sigpipe") {
      if (!testing::wait_until([&] { return std::filesystem::exists(dir + "/rank0.pid"); },
                               bound)) {
        std::cerr << "rank " << rank << ": no " << dir << "/rank0.pid within 30 s" << std::endl;
        return 9;
      }
      pid_t rank0 = -1;
      std::ifstream(dir + "/rank0.pid") >> rank0;
      // Alive or a zombie, rank 0 can still be signalled; once reaped it cannot (ESRCH). A pidfd
      // names that process and no later one that reuses its pid.
      const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, rank0, 0));
      const bool reaped =
          pidfd < 0 ||
          testing::wait_until(
              [&] { return syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) != 0; }, bound);
      if (pidfd >= 0) close(pidfd);
      if (!reaped) {
        std::cerr << "rank " << rank << ": rank 0 (pid " << rank0
                  << ") was not reaped by the launcher within 30 s" << std::endl;
        return 9;
      }
      signal(SIGPIPE, SIG_DFL);
      raise(SIGPIPE);
    }
    // Hanging is what is tested: only the launcher's SIGTERM (or SIGKILL) ends this rank.
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (scenario == "launch_waiters") {
    // A launcher of 2 "wait_signal" ranks in a process of its own, for a test to SIGKILL.
    LaunchOptions options;
    options.program = self_executable();
    options.args = {"wait_signal"};
    options.nproc = 2;
    return launch_local(options).exit_code;
  }
  if (scenario == "wait_signal") {
    std::cout << "waiting" << std::endl;
    // Hanging is what is tested: only a signal (or its launcher's death) ends this rank.
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  std::cerr << "unknown scenario " << scenario << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: pipetrain_rank_helper SCENARIO" << std::endl;
    return 2;
  }
  const std::string scenario = argv[1];
  torch::set_num_threads(1);
  if (scenario == "echo" || scenario == "sleep_unless_rank0_fails" || scenario == "wait_signal" ||
      scenario == "launch_waiters") {
    return run_launcher_child(scenario, argc, argv);
  }
  const int pipeline_ranks = argc > 2 ? std::atoi(argv[2]) : 0;
  return run_distributed(options_with(pipeline_ranks), [&](Distributed& d) {
    if (scenario == "bundles") return scenario_bundles(d);
    if (scenario == "rounds") return scenario_rounds(d);
    if (scenario == "held_sends") return scenario_held_sends(d);
    if (scenario == "chain") return scenario_chain(d, false);
    if (scenario == "chain_interleaved") return scenario_chain(d, true);
    if (scenario == "dp") return scenario_dp(d);
    if (scenario == "shards") return scenario_shards(d);
    if (scenario == "checked_collectives") return scenario_checked_collectives(d);
    if (scenario == "zero_offload") return scenario_zero_offload(d);
    if (scenario == "zero_held") return scenario_zero_held(d);
    if (scenario == "zero_collective_order") return scenario_zero_collective_order(d);
    if (scenario == "tie") return scenario_tie(d);
    if (scenario == "loss") return scenario_loss(d);
    if (scenario == "forward") return scenario_forward(d);
    if (scenario == "pipe_options") return scenario_pipe_options(d);
    if (scenario == "pipe_timeout") return scenario_pipe_timeout(d);
    if (scenario == "gather") return scenario_gather(d);
    if (scenario == "broadcast_text") return scenario_broadcast_text(d);
    if (scenario == "accounting") return scenario_accounting(d);
    if (scenario == "documents") {
      return scenario_documents(d, std::vector<std::string>(argv + 3, argv + argc));
    }
    if (scenario == "train") {
      std::vector<std::string> schedules;
      for (int a = 3; a < argc; ++a) schedules.push_back(argv[a]);
      return scenario_train(d, schedules);
    }
    if (scenario == "rendezvous") {
      std::cout << "OK rendezvous" << std::endl;
      // PIPETRAIN_TEST_LINGER_UNTIL: stay until that file exists (rank 0 keeps the store up for a
      // late process; the test creates it once that process has ended), 25 s at most.
      if (const char* until = std::getenv("PIPETRAIN_TEST_LINGER_UNTIL")) {
        CHECK_OR_THROW(testing::wait_until([&] { return std::filesystem::exists(until); },
                                           std::chrono::seconds(25)),
                       until, " was not created within 25 s");
      }
      return;
    }
    if (scenario == "throw" || scenario == "sigkill" || scenario == "exit" || scenario == "stop" ||
        scenario == "collective") {
      return scenario_fault(d, scenario);
    }
    TORCH_CHECK(false, "unknown scenario ", scenario);
  });
}
