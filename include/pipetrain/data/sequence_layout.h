// SequenceLayout: how the token rows of one batch (or micro-batch) are laid out -- which
// positions of each row belong to which document, and which are padding -- so that a model's
// attention and rotary positions follow the documents instead of the rows.
//
//   row r, width W:   | segment 0 | segment 1 | ... | segment n-1 | padding |
//                       a document's tokens in this row, in order; lengths segments(r), padding
//                       W - their sum
//   positions(r, t):  t minus the start of t's segment (RoPE restarts at every document and at the
//                     row's start); 0 on padding
//   by_document:      true: a token attends only to earlier tokens of its own segment
//                     (models/document_attention.h); false: to every earlier token of its row
//                     (--cross-document-attention), positions then 0..W-1 along the row
//
// The layout is a property of a micro-batch, not of the runtime: every rank computes the batch of
// a step itself (train/batch_source.h), so every stage of a micro-batch reads the same layout
// without it crossing a boundary. The interpreter installs micro-batch i's layout around each of
// i's actions (its forward, the recompute of a checkpointed forward, inference), a sequential
// runner around its forward; a layer reads it with current_layout(). Outside (profiling,
// generation, a plain `sequential->forward(x)`) there is none, and a model treats every row as one
// document.
//
// Ownership: immutable once made, shared (std::shared_ptr) by the micro-batches cut from it.
// Thread-safety: const methods are safe concurrently (positions and segment ids are cached per
// device under a mutex); current_layout() and LayoutScope act on the calling thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/types.h>

namespace pipetrain::data {

class SequenceLayout {
 public:
  // REQUIRES every row's segments sum to at most `width`, each >= 1. Throws BadInput otherwise.
  SequenceLayout(std::vector<std::vector<int64_t>> segments, int64_t width,
                 bool by_document = true);

  int64_t rows() const { return static_cast<int64_t>(segments_.size()); }
  int64_t width() const { return width_; }
  bool by_document() const { return by_document_; }
  const std::vector<int64_t>& segments(int64_t r) const {
    return segments_.at(static_cast<size_t>(r));
  }
  // Tokens of row r that are not padding.
  int64_t used(int64_t r) const { return used_.at(static_cast<size_t>(r)); }
  // The most tokens any row uses.
  int64_t longest() const;
  // Whether every row is a single segment (then attention by document is attention by row).
  bool one_segment_per_row() const;

  // int64 [rows, width] (above) on `device`, made once per device.
  torch::Tensor positions(const torch::Device& device) const;
  // int64 [rows, width] on `device`, made once per device: each token's segment, numbered from 0
  // along its row; -1 on padding. What attention split over context-parallel ranks masks by (two
  // tokens attend only when their ids are equal and not -1).
  torch::Tensor segment_ids(const torch::Device& device = torch::kCPU) const;

  // Rows [first, first + count) at `width` columns. REQUIRES the rows fit (width >= their
  // longest); BadInput otherwise.
  std::shared_ptr<const SequenceLayout> slice(int64_t first, int64_t count, int64_t width) const;

  // "4 rows x 128, 9 segments, 37 padding" (errors, logs).
  std::string describe() const;

 private:
  std::vector<std::vector<int64_t>> segments_;
  std::vector<int64_t> used_;
  int64_t width_;
  bool by_document_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, torch::Tensor> positions_;    // by device; guarded by mutex_
  mutable std::map<std::string, torch::Tensor> segment_ids_;  // the same
  torch::Tensor cached(std::map<std::string, torch::Tensor>& cache, const torch::Device& device,
                       int64_t initial, const std::function<void(size_t, int64_t*)>& fill) const;
};

// The layout of the micro-batch the calling thread computes now; null when none is installed.
const SequenceLayout* current_layout();

// Installs `layout` (null: none) as the calling thread's until destroyed, then restores the one
// before.
class LayoutScope {
 public:
  explicit LayoutScope(const SequenceLayout* layout);
  ~LayoutScope();
  LayoutScope(const LayoutScope&) = delete;
  LayoutScope& operator=(const LayoutScope&) = delete;

 private:
  const SequenceLayout* previous_;
};

}  // namespace pipetrain::data
