// Seeded, resumable mini-batches (data_loader.h).
#include "pipetrain/examples/data_loader.h"

#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

namespace pipetrain::examples {

DataLoader::DataLoader(torch::Tensor inputs, torch::Tensor targets, DataLoaderOptions options)
    : inputs_(std::move(inputs)), targets_(std::move(targets)), options_(options) {
  TORCH_CHECK(inputs_.defined() && targets_.defined() && inputs_.dim() > 0 && targets_.dim() > 0,
              "DataLoader needs defined input and target tensors with a sample dimension");
  TORCH_CHECK(inputs_.size(0) == targets_.size(0), "DataLoader: ", inputs_.size(0), " inputs but ",
              targets_.size(0), " targets; give one target per input row");
  TORCH_CHECK(inputs_.size(0) > 0, "DataLoader: the data set is empty");
  TORCH_CHECK(options_.batch_size() > 0, "DataLoader: batch size must be positive, got ",
              options_.batch_size());
  TORCH_CHECK(batches_per_epoch() > 0, "DataLoader: drop_last with batch size ",
              options_.batch_size(), " leaves no batch of the ", inputs_.size(0),
              " samples; lower the batch size");
}

int64_t DataLoader::batches_per_epoch() const {
  int64_t n = num_samples();
  int64_t b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

std::vector<int64_t> DataLoader::order(int64_t epoch) const {
  TORCH_CHECK(epoch >= 0, "DataLoader: epoch must be >= 0, got ", epoch);
  if (options_.shuffle()) {
    return shuffled_order(num_samples(), options_.seed(), static_cast<uint64_t>(epoch));
  }
  std::vector<int64_t> result(static_cast<size_t>(num_samples()));
  std::iota(result.begin(), result.end(), int64_t{0});
  return result;
}

const std::vector<int64_t>& DataLoader::cached_order(int64_t epoch) const {
  if (epoch != cached_epoch_) {
    cached_order_ = order(epoch);
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

Batch DataLoader::batch(int64_t epoch, int64_t index) const {
  TORCH_CHECK(index >= 0 && index < batches_per_epoch(), "DataLoader: batch index ", index,
              " is outside 0..", batches_per_epoch() - 1, " for epoch ", epoch);
  int64_t begin = index * options_.batch_size();
  int64_t end = std::min(begin + options_.batch_size(), num_samples());
  torch::Tensor rows;
  if (options_.shuffle()) {
    const std::vector<int64_t>& all = cached_order(epoch);
    rows =
        torch::tensor(std::vector<int64_t>(all.begin() + begin, all.begin() + end), torch::kInt64);
  } else {
    rows = torch::arange(begin, end, torch::kInt64);
  }
  return {inputs_.index_select(0, rows), targets_.index_select(0, rows), epoch, index};
}

Batch DataLoader::next() {
  if (position_.batch >= batches_per_epoch()) position_ = {position_.epoch + 1, 0};
  Batch result = batch(position_.epoch, position_.batch);
  ++position_.batch;
  if (position_.batch >= batches_per_epoch()) position_ = {position_.epoch + 1, 0};
  return result;
}

void DataLoader::seek(LoaderPosition position) {
  TORCH_CHECK(position.epoch >= 0 && position.batch >= 0 && position.batch <= batches_per_epoch(),
              "DataLoader: cannot resume at epoch ", position.epoch, " batch ", position.batch,
              "; an epoch has ", batches_per_epoch(), " batches (was the batch size changed?)");
  position_ = position;
  if (position_.batch == batches_per_epoch()) position_ = {position_.epoch + 1, 0};
}

std::string DataLoader::state() const {
  nlohmann::json state = {{"seed", options_.seed()},       {"batch_size", options_.batch_size()},
                          {"shuffle", options_.shuffle()}, {"drop_last", options_.drop_last()},
                          {"samples", num_samples()},      {"epoch", position_.epoch},
                          {"batch", position_.batch}};
  return state.dump();
}

void DataLoader::restore_state(const std::string& text) {
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text);
    auto expect = [&](const char* field, const nlohmann::json& mine) {
      TORCH_CHECK(state.at(field) == mine, "DataLoader: cannot resume: the saved ", field, " is ",
                  state.at(field).dump(), " but this run's is ", mine.dump(),
                  "; resume with the same data and loader settings");
    };
    expect("seed", options_.seed());
    expect("batch_size", options_.batch_size());
    expect("shuffle", options_.shuffle());
    expect("drop_last", options_.drop_last());
    expect("samples", num_samples());
    seek({state.at("epoch").get<int64_t>(), state.at("batch").get<int64_t>()});
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "DataLoader: saved loader state is malformed (", e.what(), "): ", text);
  }
}

}  // namespace pipetrain::examples
