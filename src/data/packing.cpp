// Packing documents into rows (data/packing.h).
#include "pipetrain/data/packing.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "pipetrain/base/error.h"
#include "pipetrain/base/shuffle.h"

namespace pipetrain::data {
namespace {

// The counter of the one document order whole packing uses with shuffle (epochs use 0, 1, ...).
constexpr uint64_t kWholeOrderCounter = 0x7061636b696e67ULL;  // "packing"

}  // namespace

const char* to_string(Packing packing) {
  switch (packing) {
    case Packing::kSplit:
      return "split";
    case Packing::kWhole:
      return "whole";
    case Packing::kNone:
      return "none";
  }
  return "?";
}

Packing parse_packing(const std::string& name, const std::string& flag) {
  for (Packing p : {Packing::kSplit, Packing::kWhole, Packing::kNone}) {
    if (name == to_string(p)) return p;
  }
  throw BadInput(flag + " " + name + " is not a packing; use split, whole or none");
}

int64_t row_ids(const Row& row) {
  int64_t ids = 0;
  for (const Piece& piece : row) ids += piece.length;
  return ids;
}

DocumentPacker::DocumentPacker(std::vector<int64_t> lengths, PackingOptions options)
    : lengths_(std::move(lengths)), options_(options) {
  const int64_t t = options_.seq_len;
  if (t < 1) throw BadInput("the sequence length must be >= 1 (got " + std::to_string(t) + ")");
  if (options_.group_by_length && options_.packing != Packing::kNone) {
    throw BadInput(std::string("--group-by-length orders rows of one document by length: it "
                               "needs --pack none (got --pack ") +
                   to_string(options_.packing) + ")");
  }
  if (options_.group_window < 1) {
    throw BadInput("the length-grouping window must be >= 1 row (got " +
                   std::to_string(options_.group_window) + ")");
  }
  for (size_t d = 0; d < lengths_.size(); ++d) {
    if (lengths_[d] < 0) {
      throw BadInput("document " + std::to_string(d) + " has length " +
                     std::to_string(lengths_[d]));
    }
  }
  if (options_.packing == Packing::kSplit) {
    const int64_t ids = std::accumulate(lengths_.begin(), lengths_.end(), int64_t{0});
    rows_ = ids > 0 ? (ids - 1) / t : 0;
    if (rows_ < 1) {
      throw BadInput("the documents hold " + std::to_string(ids) +
                     " ids, fewer than one row of --seq-len " + std::to_string(t) + " needs (" +
                     std::to_string(t + 1) + ")");
    }
    return;
  }
  cut_pieces();
  if (pieces_.empty()) {
    throw BadInput(
        "no document holds 2 ids or more (an input and its target): nothing to train on");
  }
  if (options_.packing == Packing::kWhole) {
    pack_whole();
  } else {
    rows_ = static_cast<int64_t>(pieces_.size());
  }
}

void DocumentPacker::cut_pieces() {
  const int64_t t = options_.seq_len;
  std::vector<int64_t> order(lengths_.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options_.packing == Packing::kWhole && options_.shuffle) {
    order =
        shuffled_order(static_cast<int64_t>(lengths_.size()), options_.seed, kWholeOrderCounter);
  }
  for (int64_t d : order) {
    const int64_t length = lengths_[static_cast<size_t>(d)];
    if (length < 2) continue;  // no target
    if (length > t + 1) ++split_documents_;
    // Pieces of T + 1 ids, each sharing its first id with the previous one's last, so that every
    // target of the document is some piece's.
    for (int64_t offset = 0; offset + 1 < length; offset += t) {
      pieces_.push_back({d, offset, std::min(t + 1, length - offset)});
    }
  }
}

void DocumentPacker::pack_whole() {
  const int64_t room = options_.seq_len + 1;
  std::vector<std::vector<Piece>> rows;
  std::multimap<int64_t, int64_t> open;  // free ids -> row
  for (const Piece& piece : pieces_) {
    auto fit = open.lower_bound(piece.length);  // the least room that holds it
    int64_t r;
    int64_t free;
    if (fit == open.end()) {
      r = static_cast<int64_t>(rows.size());
      rows.emplace_back();
      free = room;
    } else {
      r = fit->second;
      free = fit->first;
      open.erase(fit);
    }
    rows[static_cast<size_t>(r)].push_back(piece);
    free -= piece.length;
    if (free >= 2) open.emplace(free, r);  // a piece needs 2 ids for a target
  }
  row_begin_.reserve(rows.size() + 1);
  for (const auto& row : rows) {
    row_begin_.push_back(static_cast<int64_t>(row_pieces_.size()));
    row_pieces_.insert(row_pieces_.end(), row.begin(), row.end());
  }
  row_begin_.push_back(static_cast<int64_t>(row_pieces_.size()));
  rows_ = static_cast<int64_t>(rows.size());
}

Row DocumentPacker::row(int64_t epoch, int64_t r) const {
  if (r < 0 || r >= rows_) {
    throw BadInput("row " + std::to_string(r) + " of " + std::to_string(rows_) + " rows");
  }
  if (options_.packing == Packing::kSplit) return split_row(epoch, r);
  const int64_t at = none_piece(epoch, r);
  if (options_.packing == Packing::kNone) return {pieces_[static_cast<size_t>(at)]};
  return Row(row_pieces_.begin() + row_begin_[static_cast<size_t>(at)],
             row_pieces_.begin() + row_begin_[static_cast<size_t>(at) + 1]);
}

Row DocumentPacker::split_row(int64_t epoch, int64_t r) const {
  const int64_t e = options_.shuffle ? epoch : 0;
  std::lock_guard<std::mutex> lock(mutex_);
  if (cached_epoch_ != e) {
    const auto n = static_cast<int64_t>(lengths_.size());
    cached_order_ = options_.shuffle ? shuffled_order(n, options_.seed, static_cast<uint64_t>(e))
                                     : std::vector<int64_t>(static_cast<size_t>(n));
    if (!options_.shuffle) std::iota(cached_order_.begin(), cached_order_.end(), int64_t{0});
    cached_starts_.assign(cached_order_.size(), 0);
    int64_t start = 0;
    for (size_t k = 0; k < cached_order_.size(); ++k) {
      cached_starts_[k] = start;
      start += lengths_[static_cast<size_t>(cached_order_[k])];
    }
    cached_epoch_ = e;
  }
  int64_t begin = r * options_.seq_len;
  int64_t remaining = options_.seq_len + 1;
  // The last ordered document starting at or before `begin` (empty ones start where the next
  // does, and are stepped over).
  auto k =
      static_cast<size_t>(std::upper_bound(cached_starts_.begin(), cached_starts_.end(), begin) -
                          cached_starts_.begin() - 1);
  Row row;
  for (; remaining > 0 && k < cached_order_.size(); ++k) {
    const int64_t d = cached_order_[k];
    const int64_t within = begin - cached_starts_[k];
    const int64_t take = std::min(lengths_[static_cast<size_t>(d)] - within, remaining);
    if (take <= 0) continue;
    row.push_back({d, within, take});
    begin += take;
    remaining -= take;
  }
  return row;
}

int64_t DocumentPacker::none_piece(int64_t epoch, int64_t r) const {
  if (!options_.shuffle && !options_.group_by_length) return r;
  const int64_t e = options_.shuffle ? epoch : 0;
  std::lock_guard<std::mutex> lock(mutex_);
  if (cached_epoch_ != e) {
    if (options_.shuffle) {
      cached_order_ = shuffled_order(rows_, options_.seed, static_cast<uint64_t>(e));
    } else {
      cached_order_.resize(static_cast<size_t>(rows_));
      std::iota(cached_order_.begin(), cached_order_.end(), int64_t{0});
    }
    if (options_.group_by_length) {
      const auto window = static_cast<size_t>(options_.group_window);
      for (size_t first = 0; first < cached_order_.size(); first += window) {
        const size_t last = std::min(cached_order_.size(), first + window);
        std::stable_sort(cached_order_.begin() + static_cast<std::ptrdiff_t>(first),
                         cached_order_.begin() + static_cast<std::ptrdiff_t>(last),
                         [&](int64_t a, int64_t b) {
                           return pieces_[static_cast<size_t>(a)].length >
                                  pieces_[static_cast<size_t>(b)].length;
                         });
      }
    }
    cached_epoch_ = e;
  }
  return cached_order_[static_cast<size_t>(r)];
}

}  // namespace pipetrain::data
