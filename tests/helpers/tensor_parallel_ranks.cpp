// Test support: the ranks of tests/parallel's multi-process tests. `pipetrain_tp_helper SCENARIO`
// runs under run_ranks (tests/helpers/multiprocess.h) as one tensor-parallel group of the whole
// world (the data-parallel group of a one-stage pipeline), checks what the scenario claims against
// the unsplit computation every rank repeats on its own, and prints "OK SCENARIO" or throws.
//
//   layers   column -> row parallel MLP, a gathered column layer, the vocabulary-parallel
//            embedding (with a padding id) and cross-entropy: outputs, loss and every gradient
//            equal the whole layers' (the slices of them this rank holds)
#include <cstdlib>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include "pipetrain/parallel/tensor_parallel.h"
#include "pipetrain/runtime/distributed.h"

namespace pipetrain {
namespace {

#define CHECK_OR_THROW(cond, ...) TORCH_CHECK(cond, "check failed: " #cond ": ", __VA_ARGS__)

using parallel::Slice;
using parallel::TensorParallel;

std::chrono::milliseconds test_timeout() {
  const char* value = std::getenv("PIPETRAIN_TEST_TIMEOUT_MS");
  return std::chrono::milliseconds(value ? std::atoi(value) : 10000);
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  CHECK_OR_THROW(got.sizes() == want.sizes(), what, ": shape ", got.sizes(), " vs ", want.sizes());
  const double scale = want.abs().max().item<double>() + 1e-12;
  const double error = (got - want).abs().max().item<double>() / scale;
  CHECK_OR_THROW(error < 1e-5, what, ": relative error ", error);
}

void scenario_layers(Distributed& d) {
  const std::shared_ptr<C10dGroup> group = d.data_parallel_group();
  CHECK_OR_THROW(group != nullptr, "no group");
  const TensorParallel tp{group};
  const int r = tp.rank(), n = tp.size();
  torch::manual_seed(7);  // the same whole tensors on every rank
  const int64_t in = 6, hidden = 12, out = 5, vocab = 12;
  const torch::Tensor w1 = torch::randn({hidden, in}), b1 = torch::randn({hidden});
  const torch::Tensor w2 = torch::randn({out, hidden}), b2 = torch::randn({out});
  const torch::Tensor table = torch::randn({vocab, in});
  const torch::Tensor ids = torch::randint(vocab, {3, 4}, torch::kInt64);
  const torch::Tensor targets = torch::randint(vocab, {12}, torch::kInt64);
  const torch::Tensor head = torch::randn({vocab, out});
  const int64_t pad = ids[0][1].item<int64_t>();

  // The whole model: embedding -> column -> gelu -> row -> head logits -> cross-entropy.
  auto whole = [&](std::vector<torch::Tensor> p) {
    torch::Tensor x = at::embedding(p[0], ids, pad);
    x = torch::gelu(torch::nn::functional::linear(x, p[1], p[2]));
    x = torch::nn::functional::linear(x, p[3], p[4]);
    const torch::Tensor logits = torch::nn::functional::linear(x, p[5]).reshape({-1, vocab});
    return std::make_pair(
        x, torch::nn::functional::cross_entropy(
               logits, targets,
               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone)));
  };
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& t : {table, w1, b1, w2, b2, head}) {
    params.push_back(t.clone().requires_grad_());
  }
  auto [want_hidden, want_loss] = whole(params);
  want_loss.sum().backward();

  parallel::VocabParallelEmbedding embedding(vocab, in, tp, pad);
  parallel::ColumnParallelLinear column(in, hidden, true, tp);
  parallel::RowParallelLinear row(hidden, out, true, tp);
  parallel::ColumnParallelLinear logits_layer(out, vocab, false, tp);
  const Slice v = embedding->vocab_rows(), h = column->rows();
  torch::NoGradGuard no_grad;
  embedding->weight.copy_(table.narrow(0, v.start, v.length));
  column->weight.copy_(w1.narrow(0, h.start, h.length));
  column->bias.copy_(b1.narrow(0, h.start, h.length));
  row->weight.copy_(w2.narrow(1, h.start, h.length));
  row->bias.copy_(b2);
  logits_layer->weight.copy_(head.narrow(0, v.start, v.length));
  {
    at::AutoGradMode grad(true);
    const torch::Tensor x = row(torch::gelu(column(embedding(ids))));
    const torch::Tensor local_logits = logits_layer(x).reshape({-1, v.length});
    const torch::Tensor loss =
        parallel::vocab_parallel_cross_entropy(local_logits, targets, v.start, tp);
    expect_close(x, want_hidden, "row-parallel output");
    expect_close(loss, want_loss, "per-token loss");
    loss.sum().backward();
  }
  auto grad = [&](int i) { return params[i].grad(); };
  expect_close(embedding->weight.grad(), grad(0).narrow(0, v.start, v.length), "embedding grad");
  CHECK_OR_THROW(pad < v.start || pad >= v.start + v.length ||
                     embedding->weight.grad()[pad - v.start].abs().sum().item<double>() == 0,
                 "the padding row received a gradient");
  expect_close(column->weight.grad(), grad(1).narrow(0, h.start, h.length), "column weight grad");
  expect_close(column->bias.grad(), grad(2).narrow(0, h.start, h.length), "column bias grad");
  expect_close(row->weight.grad(), grad(3).narrow(1, h.start, h.length), "row weight grad");
  expect_close(row->bias.grad(), grad(4), "row bias grad (replicated)");
  expect_close(logits_layer->weight.grad(), grad(5).narrow(0, v.start, v.length), "head grad");

  // gather_output: the whole output on every rank, and the slice's gradient back.
  parallel::ColumnParallelLinear gathered(in, hidden, false, tp, /*gather_output=*/true);
  gathered->weight.copy_(w1.narrow(0, h.start, h.length));
  const torch::Tensor x = torch::randn({2, in});
  at::AutoGradMode grad_mode(true);
  const torch::Tensor y = gathered(x);
  expect_close(y, torch::nn::functional::linear(x, w1), "gathered column output");
  (y * y).sum().backward();
  const torch::Tensor want = 2 * torch::nn::functional::linear(x, w1).t().mm(x);
  expect_close(gathered->weight.grad(), want.narrow(0, h.start, h.length), "gathered grad");
  std::cout << "OK layers rank " << r << " of " << n << std::endl;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  using namespace pipetrain;
  if (argc < 2) {
    std::cerr << "usage: pipetrain_tp_helper SCENARIO" << std::endl;
    return 2;
  }
  const std::string scenario = argv[1];
  torch::set_num_threads(1);
  return run_distributed(DistributedOptions().timeout(test_timeout()).pipeline_ranks(1),
                         [&](Distributed& d) {
                           if (scenario == "layers") return scenario_layers(d);
                           TORCH_CHECK(false, "unknown scenario ", scenario);
                         });
}
