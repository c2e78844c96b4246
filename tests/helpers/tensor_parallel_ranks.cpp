// Test support: the ranks of tests/parallel's multi-process tests. `pipetrain_tp_helper SCENARIO`
// runs under run_ranks (tests/helpers/multiprocess.h) as one tensor-parallel group of the whole
// world (the data-parallel group of a one-stage pipeline), checks what the scenario claims against
// the unsplit computation every rank repeats on its own, and prints "OK SCENARIO" or throws.
//
//   layers   column -> row parallel MLP, a gathered column layer, the vocabulary-parallel
//            embedding (with a padding id) and cross-entropy, sequence parallelism's gather and
//            reduce-scatter and its column-parallel linears of a sequence slice (whole backward
//            and split into I and W): outputs, loss and every gradient equal the whole layers'
//            (the slices of them this rank holds)
//   llama [variant]   the Llama model's tensor-parallel form (models/llama.h) against the whole
//            model on every rank: its random init and its load from a Hugging Face checkpoint
//            are slices of the whole, and logits, loss and every gradient are the whole's slices.
//            variant "tied": tied head, q/k/v, o_proj and MLP biases, a padding id
//   ring     parallel::ring_attention over the world: each rank's zigzag chunks of causal
//            attention, and its chunks' gradients of q, k and v, equal the whole sequence's
//   ulysses  parallel::ulysses_attention the same, each rank holding a contiguous chunk
//   llama_cp METHOD   the Llama model built with context parallelism (ring or ulysses) on this
//            rank's tokens of each sequence: its logits are the whole model's at those tokens,
//            and its parameters' gradients, summed over the group, the whole model's
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <string>

#include <torch/torch.h>

#include "pipetrain/io/safetensors.h"
#include "pipetrain/models/document_attention.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/parallel/ring_attention.h"
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

  // Sequence parallelism's pair along dimension 1: gather of the slices is the whole; the
  // reduce-scatter of per-rank parts is the slice of their sum; each backward is the other.
  const torch::Tensor whole_seq = torch::randn({2, 6, 3});
  const torch::Tensor weights = torch::randn({2, 6, 3});
  const torch::Tensor mine = whole_seq.narrow(1, r * (6 / n), 6 / n).clone().requires_grad_();
  const torch::Tensor gathered_seq = parallel::gather_sequence(mine, 1, tp);
  expect_close(gathered_seq, whole_seq, "gather_sequence");
  (gathered_seq * weights).sum().backward();  // every rank's loss: the sum over ranks is n x
  expect_close(mine.grad(), (weights * n).narrow(1, r * (6 / n), 6 / n), "gather backward");
  const torch::Tensor part = (whole_seq * (r + 1)).requires_grad_();
  const torch::Tensor scattered = parallel::reduce_scatter_sequence(part, 1, tp);
  expect_close(scattered, (whole_seq * (n * (n + 1) / 2)).narrow(1, r * (6 / n), 6 / n),
               "reduce_scatter_sequence");
  (scattered * weights.narrow(1, r * (6 / n), 6 / n)).sum().backward();
  expect_close(part.grad(), weights, "reduce-scatter backward");

  // sequence_parallel_linears: two column-parallel linears (one with a bias) of this rank's
  // sequence slice are the whole linears' column slices; the input's gradient is its slice of
  // the whole one, the weights' are their slices. Then the split backward's halves: the input's
  // gradient alone (I), and the weights' alone (W, which gathers the sequence again), the same.
  const TensorParallel sp{group, true};
  const torch::Tensor wb = torch::randn({6, in});
  const torch::Tensor ga = torch::randn({2, 6, hidden}), gb = torch::randn({2, 6, 6});
  const torch::Tensor x_whole = torch::randn({2, 6, in}).requires_grad_();
  const torch::Tensor w1_whole = w1.clone().requires_grad_(),
                      b1_whole = b1.clone().requires_grad_();
  const torch::Tensor wb_whole = wb.clone().requires_grad_();
  ((torch::nn::functional::linear(x_whole, w1_whole, b1_whole) * ga).sum() +
   (torch::nn::functional::linear(x_whole, wb_whole) * gb).sum())
      .backward();
  const Slice rb = parallel::even_slice(6, n, r, "rows");
  const torch::Tensor x_mine = x_whole.detach().narrow(1, r * (6 / n), 6 / n).clone();
  const torch::Tensor wa_mine = w1.narrow(0, h.start, h.length).clone();
  const torch::Tensor ba_mine = b1.narrow(0, h.start, h.length).clone();
  const torch::Tensor wb_mine = wb.narrow(0, rb.start, rb.length).clone();
  for (bool split : {false, true}) {
    const std::string how = split ? " (split I/W)" : "";
    std::vector<torch::Tensor> leaves;
    for (const torch::Tensor& t : {x_mine, wa_mine, ba_mine, wb_mine}) {
      leaves.push_back(t.clone().requires_grad_());
    }
    const std::vector<torch::Tensor> outs = parallel::sequence_parallel_linears(
        leaves[0], {leaves[1], leaves[3]}, {leaves[2], torch::Tensor()}, sp);
    expect_close(outs[0],
                 torch::nn::functional::linear(x_whole, w1, b1).narrow(2, h.start, h.length),
                 "sequence-parallel linear a" + how);
    expect_close(outs[1], torch::nn::functional::linear(x_whole, wb).narrow(2, rb.start, rb.length),
                 "sequence-parallel linear b" + how);
    const torch::Tensor loss = (outs[0] * ga.narrow(2, h.start, h.length)).sum() +
                               (outs[1] * gb.narrow(2, rb.start, rb.length)).sum();
    std::vector<torch::Tensor> got(4);
    if (split) {
      got[0] = torch::autograd::grad({loss}, {leaves[0]}, {}, /*retain_graph=*/true)[0];
      const auto weights_grad = torch::autograd::grad({loss}, {leaves[1], leaves[2], leaves[3]});
      for (int i = 0; i < 3; ++i)
        got[static_cast<size_t>(i) + 1] = weights_grad[static_cast<size_t>(i)];
    } else {
      loss.backward();
      for (int i = 0; i < 4; ++i)
        got[static_cast<size_t>(i)] = leaves[static_cast<size_t>(i)].grad();
    }
    expect_close(got[0], x_whole.grad().narrow(1, r * (6 / n), 6 / n), "sequence slice grad" + how);
    expect_close(got[1], w1_whole.grad().narrow(0, h.start, h.length),
                 "linear a weight grad" + how);
    expect_close(got[2], b1_whole.grad().narrow(0, h.start, h.length), "linear a bias grad" + how);
    expect_close(got[3], wb_whole.grad().narrow(0, rb.start, rb.length),
                 "linear b weight grad" + how);
  }
  std::cout << "OK layers rank " << r << " of " << n << std::endl;
}

// Every parameter of `part` (a tensor-parallel model) against its slice of `whole`'s, and the
// same for their gradients when `grads`.
void expect_slices(const models::LlamaModel& part, const models::LlamaModel& whole, bool grads,
                   const std::string& what) {
  const auto whole_params = whole.sequential->named_parameters();
  const parallel::TensorParallel& tp = part.tensor_parallel;
  for (const auto& item : part.sequential->named_parameters()) {
    torch::Tensor want = whole_params[item.key()];
    torch::Tensor got = item.value();
    if (grads) {
      want = want.grad();
      got = got.grad();
      CHECK_OR_THROW(got.defined(), what, ": ", item.key(), " has no gradient");
    }
    const auto split = models::tensor_parallel_split(item.key(), *whole.config, tp.size());
    if (split) {
      want = want.narrow(split->dim, split->part_of(tp.rank()) * got.size(split->dim),
                         got.size(split->dim));
    }
    expect_close(got, want, what + " " + item.key());
  }
}

void scenario_llama(Distributed& d, const std::string& variant) {
  const TensorParallel tp{d.data_parallel_group()};
  models::LlamaConfig c = models::llama_config(24, 16, 24, 2, 4, 2);
  if (variant == "tied") {
    c.tie_word_embeddings = true;
    c.qkv_bias = c.output_bias = c.mlp_bias = true;
    c.pad_token_id = 3;
  }
  models::LlamaModel whole = models::make_llama(c);
  models::init_llama_random(whole, 5);
  {
    torch::NoGradGuard no_grad;  // biases start at zero: make them count (the same on every rank)
    torch::manual_seed(5);
    for (auto& p : whole.sequential->parameters()) p.add_(torch::randn(p.sizes()) * 0.01);
  }
  models::LlamaModel part = models::make_llama(c, models::LlamaBuildOptions().tensor_parallel(tp));
  models::init_llama_random(part, 5);
  // The random init: tp 1's values, sliced (before the perturbation above, so compare to a fresh
  // whole model).
  models::LlamaModel fresh = models::make_llama(c);
  models::init_llama_random(fresh, 5);
  expect_slices(part, fresh, false, "random init");

  // Loading a Hugging Face checkpoint of the whole model reads each rank's slices.
  const std::string dir =
      std::filesystem::temp_directory_path().string() + "/pipetrain_tp_" + std::to_string(getpid());
  std::map<std::string, torch::Tensor> named;
  for (const auto& item : whole.sequential->named_parameters()) named[item.key()] = item.value();
  models::save_llama_hf(dir, c, named);
  models::load_llama_weights(part, io::SafetensorsCheckpoint::open(dir));
  std::filesystem::remove_all(dir);
  expect_slices(part, whole, false, "loaded");

  torch::manual_seed(11);
  const torch::Tensor tokens = torch::randint(c.vocab_size, {2, 6}, torch::kInt64);
  const torch::Tensor targets = torch::randint(c.vocab_size, {2, 6}, torch::kInt64);
  const torch::Tensor whole_logits = whole.sequential->forward(tokens);
  const torch::Tensor whole_loss = models::causal_lm_loss(whole_logits, targets);
  whole_loss.backward();
  const torch::Tensor logits = part.sequential->forward(tokens);
  const int64_t width = c.vocab_size / tp.size();
  expect_close(logits, whole_logits.narrow(2, tp.rank() * width, width), "logits slice");
  const torch::Tensor loss = models::vocab_parallel_causal_lm_loss(logits, targets, tp);
  expect_close(loss, whole_loss, "loss");
  loss.backward();
  expect_slices(part, whole, true, "gradient");
  std::cout << "OK llama " << variant << " rank " << tp.rank() << std::endl;
}

// A context-parallel attention (`attend`: this rank's q, k, v chunks and, with documents, the
// whole rows' layout -> its output chunks) over the world against the whole sequence's attention,
// which every rank computes: this rank's chunks (`local`) of the output and of the three
// gradients. Twice: causal over whole rows (sdpa), then by document over packed rows with padding
// (models::document_causal_attention). Prints "OK NAME rank r".
void check_context_attention(
    Distributed& d, const std::string& name, int64_t length, int64_t heads,
    const std::function<torch::Tensor(const torch::Tensor&, int, int)>& local,
    const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&,
                                      const torch::Tensor&, C10dGroup&,
                                      const data::SequenceLayout*)>& attend) {
  const std::shared_ptr<C10dGroup> group = d.data_parallel_group();
  CHECK_OR_THROW(group != nullptr, "no group");
  const int r = group->rank(), n = group->size();
  // Row 0: documents of 5 and length - 7 tokens, then 2 of padding; row 1: 2, 3, length - 5.
  const data::SequenceLayout documents({{5, length - 7}, {2, 3, length - 5}}, length);
  for (const data::SequenceLayout* layout :
       {static_cast<const data::SequenceLayout*>(nullptr), &documents}) {
    const std::string what = layout ? " by document" : "";
    torch::manual_seed(11);  // the same whole tensors on every rank
    const torch::Tensor q = torch::randn({2, heads, length, 8}, torch::requires_grad());
    const torch::Tensor k = torch::randn({2, heads, length, 8}, torch::requires_grad());
    const torch::Tensor v = torch::randn({2, heads, length, 8}, torch::requires_grad());
    const torch::Tensor g = torch::randn({2, heads, length, 8});
    const torch::Tensor whole =
        layout ? models::document_causal_attention(q, k, v, *layout, 1.0 / std::sqrt(8.0))
               : torch::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
    const auto grads = torch::autograd::grad({whole}, {q, k, v}, {g});
    auto mine = [&](const torch::Tensor& x) { return local(x.detach(), r, n); };
    const torch::Tensor ql = mine(q).requires_grad_(), kl = mine(k).requires_grad_(),
                        vl = mine(v).requires_grad_();
    const torch::Tensor out = attend(ql, kl, vl, *group, layout);
    expect_close(out, mine(whole), "output" + what);
    const auto got = torch::autograd::grad({out}, {ql, kl, vl}, {mine(g)});
    expect_close(got[0], mine(grads[0]), "dq" + what);
    expect_close(got[1], mine(grads[1]), "dk" + what);
    expect_close(got[2], mine(grads[2]), "dv" + what);
  }
  std::cout << "OK " << name << " rank " << r << std::endl;
}

void scenario_ring(Distributed& d, bool overlap) {
  const int n = d.data_parallel_group()->size();
  // 2n chunks of 3; rank r holds chunks r and 2n - 1 - r (the zigzag split).
  check_context_attention(
      d, overlap ? "ring" : "ring-serial", 2 * n * 3, 2,
      [](const torch::Tensor& x, int r, int n) {
        const auto chunks = x.chunk(2 * n, 2);
        const std::vector<int64_t> held = parallel::zigzag_chunks(r, n);
        return torch::cat(
            {chunks[static_cast<size_t>(held[0])], chunks[static_cast<size_t>(held[1])]}, 2);
      },
      [overlap](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                C10dGroup& group, const data::SequenceLayout* layout) {
        return parallel::ring_attention(q, k, v, group,
                                        layout ? layout->segment_ids() : torch::Tensor(), overlap);
      });
}

void scenario_ulysses(Distributed& d) {
  const int n = d.data_parallel_group()->size();
  // n contiguous chunks of 5; 6 heads, which 2 and 3 members divide.
  check_context_attention(
      d, "ulysses", n * 5, 6,
      [](const torch::Tensor& x, int r, int) { return x.narrow(2, r * 5, 5).contiguous(); },
      [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, C10dGroup& group,
         const data::SequenceLayout* layout) {
        if (!layout) return parallel::ulysses_attention(q, k, v, group);
        return parallel::ulysses_attention(
            q, k, v, group,
            [layout](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
              return models::document_causal_attention(a, b, c, *layout,
                                                       1.0 / std::sqrt(static_cast<double>(8)));
            });
      });
}

// transformers' own checkpoints (`fixtures`: tests/helpers/hf_models.h's directory) split over the
// context-parallel group: each rank's logits of the fixtures' [2, 16] prompt, at its tokens, equal
// transformers' logits there (rel 1e-5).
void check_hf_logits_cp(const parallel::ContextParallel& cp, const std::string& fixtures) {
  const torch::Tensor prompt = io::SafetensorsCheckpoint::open(fixtures + "/prompt.safetensors")
                                   .load("tokens", torch::kInt64);
  const torch::Tensor at = cp.positions(prompt.size(1) / cp.size());
  for (const std::string arch : {"llama", "qwen2"}) {
    const std::string dir = fixtures + "/" + arch;
    models::LlamaModel model = models::make_llama(models::read_llama_config(dir),
                                                  models::LlamaBuildOptions().context_parallel(cp));
    models::load_llama_weights(model, io::SafetensorsCheckpoint::open(dir));
    model.sequential->eval();
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = model.sequential->forward(prompt.index_select(1, at));
    const torch::Tensor expected =
        io::SafetensorsCheckpoint::open(fixtures + "/" + arch + "_logits.safetensors")
            .load("logits", torch::kFloat32)
            .index_select(1, at);
    const double error = ((logits - expected).abs().max() / expected.abs().max()).item<double>();
    CHECK_OR_THROW(error < 1e-5,
                   arch + " logits differ from transformers' by " + std::to_string(error));
    std::cout << "OK hf " << arch << " rank " << cp.rank() << " " << error << std::endl;
  }
}

void scenario_llama_cp(Distributed& d, const std::string& method, const char* fixtures) {
  const std::shared_ptr<C10dGroup> group = d.data_parallel_group();
  CHECK_OR_THROW(group != nullptr, "no group");
  const parallel::ContextParallel cp{group, method == "ulysses"};
  const int r = cp.rank(), n = cp.size();
  // 4 query heads over 2 key/value heads (repeated for the attention), 8 tokens a rank.
  const models::LlamaConfig c = models::llama_config(40, 16, 24, 2, 4, 2);
  models::LlamaModel whole = models::make_llama(c);
  models::init_llama_random(whole, 5);
  models::LlamaModel part = models::make_llama(c, models::LlamaBuildOptions().context_parallel(cp));
  models::init_llama_random(part, 5);
  torch::manual_seed(13);
  const int64_t length = 8 * n;
  const torch::Tensor tokens = torch::randint(c.vocab_size, {2, length}, torch::kInt64);
  const torch::Tensor weights = torch::randn({2, length, c.vocab_size});
  const torch::Tensor at = cp.positions(8);
  const torch::Tensor whole_logits = whole.sequential->forward(tokens);
  (whole_logits * weights).sum().backward();
  const torch::Tensor logits = part.sequential->forward(tokens.index_select(1, at));
  expect_close(logits, whole_logits.detach().index_select(1, at), "logits");
  (logits * weights.index_select(1, at)).sum().backward();
  const auto whole_params = whole.sequential->named_parameters();
  for (const auto& item : part.sequential->named_parameters()) {
    std::vector<torch::Tensor> grad{item.value().grad().clone()};
    group->allreduce_sum(grad);
    expect_close(grad[0], whole_params[item.key()].grad(), "gradient of " + item.key());
  }
  if (fixtures != nullptr) check_hf_logits_cp(cp, fixtures);
  std::cout << "OK llama_cp " << method << " rank " << r << std::endl;
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
                           if (scenario == "ring") {
                             scenario_ring(d, false);  // each pass waited for at once
                             return scenario_ring(d, true);
                           }
                           if (scenario == "ulysses") return scenario_ulysses(d);
                           if (scenario == "llama_cp") {
                             return scenario_llama_cp(d, argv[2], argc > 3 ? argv[3] : nullptr);
                           }
                           if (scenario == "llama") {
                             return scenario_llama(d, argc > 2 ? argv[2] : "plain");
                           }
                           TORCH_CHECK(false, "unknown scenario ", scenario);
                         });
}
