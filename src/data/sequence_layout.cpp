// The layout of a batch's token rows (data/sequence_layout.h).
#include "pipetrain/data/sequence_layout.h"

#include <algorithm>
#include <sstream>

#include <torch/torch.h>

#include "pipetrain/base/error.h"

namespace pipetrain::data {
namespace {

thread_local const SequenceLayout* current = nullptr;

}  // namespace

SequenceLayout::SequenceLayout(std::vector<std::vector<int64_t>> segments, int64_t width,
                               bool by_document)
    : segments_(std::move(segments)), width_(width), by_document_(by_document) {
  if (width_ < 1)
    throw BadInput("a sequence layout needs a width >= 1, got " + std::to_string(width_));
  used_.reserve(segments_.size());
  for (size_t r = 0; r < segments_.size(); ++r) {
    int64_t used = 0;
    for (int64_t length : segments_[r]) {
      if (length < 1) {
        throw BadInput("row " + std::to_string(r) + " of a sequence layout has a segment of " +
                       std::to_string(length) + " tokens");
      }
      used += length;
    }
    if (used > width_) {
      throw BadInput("row " + std::to_string(r) + " of a sequence layout holds " +
                     std::to_string(used) + " tokens, more than its width " +
                     std::to_string(width_));
    }
    used_.push_back(used);
  }
}

int64_t SequenceLayout::longest() const {
  return used_.empty() ? 0 : *std::max_element(used_.begin(), used_.end());
}

bool SequenceLayout::one_segment_per_row() const {
  return std::all_of(segments_.begin(), segments_.end(),
                     [](const std::vector<int64_t>& s) { return s.size() <= 1; });
}

// Made on the CPU row by row once per device: `fill` writes row r.
torch::Tensor SequenceLayout::cached(std::map<std::string, torch::Tensor>& cache,
                                     const torch::Device& device, int64_t initial,
                                     const std::function<void(size_t, int64_t*)>& fill) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string key = device.str();
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  torch::Tensor cpu = torch::full({rows(), width_}, initial, torch::kInt64);
  auto* p = cpu.data_ptr<int64_t>();
  for (size_t r = 0; r < segments_.size(); ++r) fill(r, p + static_cast<int64_t>(r) * width_);
  torch::Tensor placed = cpu.to(device);
  cache.emplace(key, placed);
  return placed;
}

torch::Tensor SequenceLayout::positions(const torch::Device& device) const {
  return cached(positions_, device, 0, [this](size_t r, int64_t* row) {
    if (!by_document_) {
      for (int64_t t = 0; t < width_; ++t) row[t] = t;
      return;
    }
    int64_t t = 0;
    for (int64_t length : segments_[r]) {
      for (int64_t k = 0; k < length; ++k) row[t++] = k;
    }
  });
}

torch::Tensor SequenceLayout::segment_ids(const torch::Device& device) const {
  return cached(segment_ids_, device, -1, [this](size_t r, int64_t* row) {
    int64_t t = 0;
    for (size_t s = 0; s < segments_[r].size(); ++s) {
      for (int64_t k = 0; k < segments_[r][s]; ++k) row[t++] = static_cast<int64_t>(s);
    }
  });
}

std::shared_ptr<const SequenceLayout> SequenceLayout::slice(int64_t first, int64_t count,
                                                            int64_t width) const {
  if (first < 0 || count < 0 || first + count > rows()) {
    throw BadInput("rows " + std::to_string(first) + ".." + std::to_string(first + count - 1) +
                   " of a sequence layout of " + std::to_string(rows()) + " rows");
  }
  std::vector<std::vector<int64_t>> part(segments_.begin() + first,
                                         segments_.begin() + first + count);
  return std::make_shared<const SequenceLayout>(std::move(part), width, by_document_);
}

std::string SequenceLayout::describe() const {
  int64_t segments = 0, padding = 0;
  for (size_t r = 0; r < segments_.size(); ++r) {
    segments += static_cast<int64_t>(segments_[r].size());
    padding += width_ - used_[r];
  }
  std::ostringstream text;
  text << rows() << " rows x " << width_ << ", " << segments << " segments, " << padding
       << " padding";
  return text.str();
}

const SequenceLayout* current_layout() {
  return current;
}

LayoutScope::LayoutScope(const SequenceLayout* layout) : previous_(current) {
  current = layout;
}

LayoutScope::~LayoutScope() {
  current = previous_;
}

}  // namespace pipetrain::data
