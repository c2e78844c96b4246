// Mini-batches of packed documents (train/document_batches.h).
#include "pipetrain/train/document_batches.h"

#include <cmath>
#include <sstream>

#include <torch/torch.h>

#include "pipetrain/base/error.h"
#include "pipetrain/base/shuffle.h"

namespace pipetrain::train {
namespace {

std::vector<double> weights_of(const std::vector<DocumentSource>& sources) {
  std::vector<double> weights;
  for (size_t d = 0; d < sources.size(); ++d) {
    if (!sources[d].dataset) throw BadInput("blend dataset " + std::to_string(d) + " is missing");
    if (!std::isfinite(sources[d].weight) || sources[d].weight <= 0) {
      throw BadInput("blend dataset " + std::to_string(d) + " ('" + sources[d].dataset->prefix() +
                     "') has weight " + std::to_string(sources[d].weight) +
                     "; weights must be > 0");
    }
    weights.push_back(sources[d].weight);
  }
  if (weights.empty()) throw BadInput("document batches need at least one dataset");
  return weights;
}

// HF's length-grouped sampler sorts windows of 50 mini-batches.
constexpr int64_t kGroupWindowBatches = 50;

}  // namespace

DocumentBatches::DocumentBatches(std::vector<DocumentSource> sources, DocumentBatchOptions options)
    : sources_(std::move(sources)), options_(options), walk_(weights_of(sources_)) {
  if (options_.batch_size() < 1) {
    throw BadInput("batch size must be at least 1, got " + std::to_string(options_.batch_size()));
  }
  for (size_t d = 0; d < sources_.size(); ++d) {
    data::PackingOptions packing;
    packing.packing = options_.packing();
    packing.seq_len = options_.seq_len();
    packing.shuffle = options_.shuffle();
    packing.seed = sources_.size() == 1 ? options_.seed() : mix_seed(options_.seed(), d);
    packing.group_by_length = options_.group_by_length();
    packing.group_window = kGroupWindowBatches * options_.batch_size();
    try {
      packers_.push_back(
          std::make_unique<data::DocumentPacker>(sources_[d].dataset->lengths(), packing));
    } catch (const BadInput& error) {
      throw BadInput("indexed dataset '" + sources_[d].dataset->prefix() + "': " + error.message());
    }
  }
  row_options_.seq_len = options_.seq_len();
  row_options_.fixed_width = options_.packing() != data::Packing::kNone;
  row_options_.by_document = options_.by_document();
  row_options_.pad_multiple = options_.pad_multiple();
  row_options_.pad_id = options_.pad_id();
}

int64_t DocumentBatches::per_epoch() const {
  int64_t rows = 0;
  for (const auto& packer : packers_) rows += packer->rows();
  return (rows + options_.batch_size() - 1) / options_.batch_size();
}

int64_t DocumentBatches::split_documents() const {
  int64_t split = 0;
  for (const auto& packer : packers_) split += packer->split_documents();
  return split;
}

data::Batch DocumentBatches::batch(int64_t k) const {
  const int64_t n = options_.batch_size();
  std::vector<data::SourcedRow> rows;
  rows.reserve(static_cast<size_t>(n));
  if (sources_.size() == 1) {
    // As a token file's batches: batch b of epoch e holds rows (b*N + n) mod R of e's order.
    const data::DocumentPacker& packer = *packers_[0];
    const int64_t e = epoch_of(k), b = k % per_epoch();
    for (int64_t r = 0; r < n; ++r) {
      rows.push_back({sources_[0].dataset.get(), packer.row(e, (b * n + r) % packer.rows())});
    }
  } else {
    for (int64_t r = 0; r < n; ++r) {
      const auto [d, count] = walk_.source_of(k * n + r);
      const data::DocumentPacker& packer = *packers_[d];
      rows.push_back(
          {sources_[d].dataset.get(), packer.row(count / packer.rows(), count % packer.rows())});
    }
  }
  data::Batch batch = data::make_token_batch(rows, row_options_);
  if (batch.total_weight() <= 0) {
    std::ostringstream problem;
    problem << "step " << k << ": its mini-batch of " << n
            << " rows has no counted target (every target is padding, a document's end or "
               "masked out by the loss mask): rows";
    for (const data::SourcedRow& row : rows) {
      problem << " [";
      for (const data::Piece& piece : row.row) {
        problem << " document " << piece.document << " ids " << piece.offset << ".."
                << piece.offset + piece.length - 1;
      }
      problem << " ]";
    }
    throw BadInput(problem.str());
  }
  return batch;
}

std::pair<torch::Tensor, torch::Tensor> DocumentBatches::at(int64_t k) const {
  data::Batch b = batch(k);
  return {b.inputs[0], b.targets};
}

std::pair<torch::Tensor, torch::Tensor> DocumentBatches::largest() const {
  auto [inputs, targets] = at(0);
  const int64_t width = data::padded_width(options_.seq_len(), options_.pad_multiple(), INT64_MAX);
  if (inputs.size(1) == width) return {inputs, targets};
  torch::Tensor wide_inputs =
      torch::full({inputs.size(0), width}, options_.pad_id(), torch::kInt64);
  torch::Tensor wide_targets =
      torch::full({inputs.size(0), width}, data::kIgnoredTarget, torch::kInt64);
  wide_inputs.narrow(1, 0, inputs.size(1)).copy_(inputs);
  wide_targets.narrow(1, 0, inputs.size(1)).copy_(targets);
  return {wide_inputs, wide_targets};
}

std::string DocumentBatches::describe() const {
  int64_t rows = 0;
  for (const auto& packer : packers_) rows += packer->rows();
  const std::string cut =
      options_.packing() == data::Packing::kSplit
          ? "laid end to end"
          : std::to_string(split_documents()) + " documents longer than a row cut into pieces";
  return std::string("--pack ") + data::to_string(options_.packing()) + ", " +
         std::to_string(rows) + " rows of " + std::to_string(options_.seq_len()) +
         " inputs at most an epoch (" + cut + "), attention " +
         (options_.by_document() ? "within each document" : "across documents");
}

data::Batch DocumentBatches::rows_of(size_t d, int64_t first, int64_t count) const {
  std::vector<data::SourcedRow> rows;
  for (int64_t r = first; r < first + count; ++r) {
    rows.push_back({sources_.at(d).dataset.get(), packers_.at(d)->row(0, r)});
  }
  return data::make_token_batch(rows, row_options_);
}

DocumentEvaluation evaluate_documents(
    const std::function<torch::Tensor(const data::Batch&)>& forward, const DocumentBatches& batches,
    int64_t rows_per_call) {
  DocumentEvaluation result;
  const int64_t total = batches.rows(0);
  const int64_t step = std::max<int64_t>(1, rows_per_call);
  double loss_sum = 0;
  bool seen = false;
  for (int64_t first = 0; first < total; first += step) {
    const int64_t count = std::min(step, total - first);
    const data::Batch batch = batches.rows_of(0, first, count);
    const torch::Tensor logits = forward(batch);
    result.rows += count;
    result.counted_targets += static_cast<int64_t>(std::llround(batch.total_weight()));
    if (!logits.defined()) continue;
    seen = true;
    const torch::Tensor flat = batch.targets.reshape({-1}).to(logits.device());
    loss_sum += torch::nn::functional::cross_entropy(
                    logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}), flat,
                    torch::nn::functional::CrossEntropyFuncOptions()
                        .reduction(torch::kSum)
                        .ignore_index(data::kIgnoredTarget))
                    .item<double>();
  }
  if (seen && result.counted_targets > 0) {
    result.loss = loss_sum / static_cast<double>(result.counted_targets);
    result.perplexity = std::exp(result.loss);
  }
  return result;
}

}  // namespace pipetrain::train
