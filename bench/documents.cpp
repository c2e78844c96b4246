// bench_documents: what packing documents buys, measured in one run on this machine.
//
//   data      documents of lognormal lengths (median 200 ids, sigma 1, at most 2048; seeded),
//             written as a Megatron indexed dataset and read back as training reads it
//   model     a small Llama (4 layers of 128, 4 heads, 2 key/value heads, vocabulary 1024),
//             2 stages in one process (1f1b), 2 micro-batches of 2 rows (then of 4), rows of
//             T = 2048
//   [1] packing   counted targets per second training with --pack whole (best fit, attention by
//                 document) against --pack none (one document per row, each micro-batch padded to
//                 its own longest; no grouping), and whole rows attending across documents: a
//                 step's time includes the optimizer (SGD)
//   [2] attention one row of 2048 tokens packed with 16 documents of 128: attention by document
//                 (models/document_attention.h) against the unmasked causal row, forward and
//                 backward; the documents' own cost would be 16 x 128^2 / 2048^2 = 1/16
//   [3] loader    DocumentBatches::batch(k) (packing, reading the ids, the tensors and layout)
//                 as a share of the whole-packing step
//
// [1] trains whole for `steps` steps and none for as many steps as take the same documents.
// Rounds alternate [1]'s runs, so that a slow minute of the machine falls on both; the figures
// are medians over rounds. Run: bench_documents [rounds (3)] [steps per run (4)].
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pipetrain/base/median.h"
#include "pipetrain/data/document_dataset.h"
#include "pipetrain/io/indexed_dataset.h"
#include "pipetrain/models/document_attention.h"
#include "pipetrain/models/llama.h"
#include "pipetrain/runtime/pipe.h"
#include "pipetrain/train/document_batches.h"

using namespace pipetrain;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kSeqLen = 2048;
constexpr int64_t kDocuments = 600;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string write_documents() {
  std::mt19937_64 engine(5);
  std::lognormal_distribution<double> length(std::log(200.0), 1.0);
  std::uniform_int_distribution<int64_t> id(0, 1023);
  std::vector<std::vector<int64_t>> documents;
  for (int64_t d = 0; d < kDocuments; ++d) {
    const auto n = std::clamp<int64_t>(std::llround(length(engine)), 2, kSeqLen);
    documents.emplace_back();
    for (int64_t i = 0; i < n; ++i) documents.back().push_back(id(engine));
  }
  const std::string prefix = "/tmp/bench_documents_" + std::to_string(::getpid());
  io::write_indexed_dataset(prefix, documents);
  return prefix;
}

models::LlamaModel bench_model() {
  models::LlamaConfig config =
      models::llama_config(1024, 128, 384, /*layers=*/4, /*heads=*/4, /*kv_heads=*/2);
  config.max_position_embeddings = kSeqLen;
  models::LlamaModel model = models::make_llama(config);
  models::init_llama_random(model, 1);
  return model;
}

struct Run {
  double seconds = 0;         // training steps, optimizer included
  double loader_seconds = 0;  // making the same steps' batches
  int64_t counted_targets = 0;
  int64_t tokens = 0;    // not padding
  int64_t computed = 0;  // every position of every micro-batch, padding included
};

Run train_run(const train::DocumentBatches& batches, int64_t first_step, int64_t steps) {
  const int64_t rows = batches.options().batch_size();
  models::LlamaModel model = bench_model();
  Pipe pipe(model.sequential, PipeOptions().stages(2).chunks(2).schedule("1f1b"));
  torch::optim::SGD sgd(pipe->parameters(), torch::optim::SGDOptions(0.01));
  const LossFn loss = models::causal_lm_loss;
  Run run;
  for (int64_t k = first_step; k < first_step + steps; ++k) {
    const auto load_start = Clock::now();
    const data::Batch batch = batches.batch(k);
    run.loader_seconds += seconds_since(load_start);
    const auto start = Clock::now();
    sgd.zero_grad();
    pipe->train_step(batch, loss);
    sgd.step();
    run.seconds += seconds_since(start);
    const data::BatchTokens counts = data::batch_tokens(batch);
    run.counted_targets += counts.counted_targets;
    run.tokens += counts.tokens;
    for (const data::Microbatch& part : data::split_batch(batch, {rows / 2, rows / 2})) {
      run.computed += part.inputs[0].numel();
    }
  }
  return run;
}

// Forward and backward of attention over q [rows, 4, width, 32], k, v [rows, 2, width, 32]: by
// document, or causal over each row.
double attention_seconds(const data::SequenceLayout* layout, int repeats, int64_t rows = 1,
                         int64_t width = kSeqLen) {
  torch::manual_seed(2);
  const torch::Tensor q = torch::randn({rows, 4, width, 32}).requires_grad_();
  const torch::Tensor k = torch::randn({rows, 2, width, 32}).requires_grad_();
  const torch::Tensor v = torch::randn({rows, 2, width, 32}).requires_grad_();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    const torch::Tensor out =
        layout
            ? models::document_causal_attention(q, k, v, *layout, 1.0 / std::sqrt(32.0))
            : at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, 1.0 / std::sqrt(32.0), true);
    out.sum().backward();
    times.push_back(seconds_since(start));
  }
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 4;
  torch::set_num_threads(1);  // one intra-op thread per stage's worker
  const std::string prefix = write_documents();
  const auto dataset = std::make_shared<const data::DocumentDataset>(prefix);
  std::remove((prefix + ".idx").c_str());  // mapped: readable until the process ends
  std::remove((prefix + ".bin").c_str());
  int64_t ids = 0;
  for (int64_t length : dataset->lengths()) ids += length;
  std::printf(
      "bench_documents: %lld documents, %lld ids (lognormal, median 200, at most %lld), "
      "rows of %lld\n",
      static_cast<long long>(kDocuments), static_cast<long long>(ids),
      static_cast<long long>(kSeqLen), static_cast<long long>(kSeqLen));

  // [1] and [3], at micro-batches of 2 rows and of 4 (2 micro-batches a step).
  std::vector<double> loader_share;
  for (const int64_t batch_rows : {int64_t{4}, int64_t{8}}) {
    auto options = [&](data::Packing packing) {
      return train::DocumentBatchOptions(kSeqLen, batch_rows).packing(packing);
    };
    const train::DocumentBatches whole({{1.0, dataset}}, options(data::Packing::kWhole));
    const train::DocumentBatches none({{1.0, dataset}}, options(data::Packing::kNone));
    const train::DocumentBatches across({{1.0, dataset}},
                                        options(data::Packing::kWhole).by_document(false));
    std::vector<double> whole_rate, none_rate, across_rate, ratio;
    Run last_whole, last_none;
    train_run(whole, 0, 1);  // warm-up: allocator, thread pools
    for (int r = 0; r < rounds; ++r) {
      // Different steps each round; the same documents both ways (none takes rows(none) /
      // rows(whole) times the steps).
      const int64_t none_steps = steps * none.rows() / whole.rows();
      last_whole = train_run(whole, r * steps, steps);
      last_none = train_run(none, r * none_steps, none_steps);
      const Run last_across = train_run(across, r * steps, steps);
      whole_rate.push_back(static_cast<double>(last_whole.counted_targets) / last_whole.seconds);
      none_rate.push_back(static_cast<double>(last_none.counted_targets) / last_none.seconds);
      across_rate.push_back(static_cast<double>(last_across.counted_targets) / last_across.seconds);
      ratio.push_back(whole_rate.back() / none_rate.back());
      loader_share.push_back(last_whole.loader_seconds /
                             (last_whole.seconds + last_whole.loader_seconds));
      std::printf(
          "  micro-batches of %lld rows, round %d: whole %.0f targets/s (%.2f s), none %.0f "
          "(%.2f s), whole across documents %.0f; ratio %.2f; loader %.3f%% of a whole step\n",
          static_cast<long long>(batch_rows / 2), r + 1, whole_rate.back(), last_whole.seconds,
          none_rate.back(), last_none.seconds, across_rate.back(), ratio.back(),
          100.0 * loader_share.back());
    }
    std::printf(
        "[1] micro-batches of %lld rows: counted targets/s, whole / none = %.2f (median of %d "
        "rounds; whole %.0f, none %.0f, whole across documents %.0f); positions computed that "
        "are not padding: whole %.1f%%, none %.1f%%\n",
        static_cast<long long>(batch_rows / 2), median(ratio), rounds, median(whole_rate),
        median(none_rate), median(across_rate),
        100.0 * static_cast<double>(last_whole.tokens) / static_cast<double>(last_whole.computed),
        100.0 * static_cast<double>(last_none.tokens) / static_cast<double>(last_none.computed));
  }

  // [2]
  const data::SequenceLayout sixteen({std::vector<int64_t>(16, 128)}, kSeqLen);
  const double full = attention_seconds(nullptr, 7);
  const double by_document = attention_seconds(&sixteen, 7);
  const double alone = attention_seconds(nullptr, 7, 16, 128);  // the 16 as a batch of their own
  std::printf(
      "[2] attention, 16 documents of 128 in a row of 2048, forward + backward: by document "
      "%.2f ms, whole row %.2f ms, ratio %.3f; the 16 documents as a batch of 16 rows %.2f ms, "
      "ratio %.3f (flops: %.3f)\n",
      1e3 * by_document, 1e3 * full, by_document / full, 1e3 * alone, alone / full, 1.0 / 16);
  std::printf("[3] loader: %.2f%% of a whole-packing step (median of %d rounds)\n",
              100.0 * median(loader_share), rounds);
  return 0;
}
