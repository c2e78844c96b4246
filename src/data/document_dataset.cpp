// Documents and their loss mask (data/document_dataset.h).
#include "pipetrain/data/document_dataset.h"

#include <algorithm>
#include <optional>

#include "pipetrain/base/error.h"

namespace pipetrain::data {

DocumentDataset::DocumentDataset(const std::string& prefix, const std::string& loss_mask_prefix)
    : tokens_(prefix) {
  if (tokens_.documents() < 1) {
    throw BadInput("indexed dataset '" + prefix + "' holds no document: nothing to train on");
  }
  lengths_.reserve(static_cast<size_t>(tokens_.documents()));
  for (int64_t d = 0; d < tokens_.documents(); ++d) lengths_.push_back(tokens_.document_length(d));
  if (loss_mask_prefix.empty()) return;
  mask_ = std::make_unique<io::IndexedDataset>(loss_mask_prefix);
  if (mask_->documents() != tokens_.documents()) {
    throw BadInput("loss mask '" + loss_mask_prefix + "' holds " +
                   std::to_string(mask_->documents()) + " documents but its dataset '" + prefix +
                   "' holds " + std::to_string(tokens_.documents()) +
                   "; a mask has one document per document (scripts/prepare-data writes both)");
  }
  for (int64_t d = 0; d < tokens_.documents(); ++d) {
    const int64_t mask_length = mask_->document_length(d);
    if (mask_length != lengths_[static_cast<size_t>(d)]) {
      throw BadInput("loss mask '" + loss_mask_prefix + "': document " + std::to_string(d) +
                     " has " + std::to_string(mask_length) + " values but its tokens in '" +
                     prefix + "' number " + std::to_string(lengths_[static_cast<size_t>(d)]) +
                     "; the mask must have the shape of the tokens");
    }
  }
  check_mask_values();
}

// A mask read as ids would learn every token whose "mask" is not 0: a token dataset given as the
// mask trained without a word. Only uint8 holding 0 and 1 is a mask.
void DocumentDataset::check_mask_values() const {
  const std::string& mask = mask_->prefix();
  const std::optional<io::IndexedElement> bad = mask_->first_outside(0, 1);
  auto where = [&] {
    return std::to_string(bad->value) + " at position " + std::to_string(bad->offset) +
           " of document " + std::to_string(bad->document);
  };
  const std::string what_a_mask_is =
      "a loss mask is uint8 holding 0 (not learned) or 1 (learned) per token";
  if (mask_->dtype() != io::IndexedDtype::kUint8) {
    throw BadInput("loss mask '" + mask + "' (" + mask + ".idx) holds " +
                   io::to_string(mask_->dtype()) + " values, but " + what_a_mask_is +
                   (bad ? "; its first value other than 0 or 1 is " + where() +
                              " (was a token dataset given as the mask? scripts/prepare-data "
                              "writes the mask of PREFIX as PREFIX_loss_mask)"
                        : "; its values are all 0 or 1: write it as uint8"));
  }
  if (bad) {
    throw BadInput("loss mask '" + mask + "' (" + mask_->bin_path() + ") holds " + where() +
                   ", but " + what_a_mask_is);
  }
}

const std::string& DocumentDataset::loss_mask_prefix() const {
  static const std::string none;
  return mask_ ? mask_->prefix() : none;
}

void DocumentDataset::read(const Piece& piece, int64_t* ids, int64_t* mask) const {
  tokens_.read_document(piece.document, piece.offset, piece.length, ids);
  if (mask == nullptr) return;
  if (mask_) {
    mask_->read_document(piece.document, piece.offset, piece.length, mask);
  } else {
    std::fill(mask, mask + piece.length, int64_t{1});
  }
}

}  // namespace pipetrain::data
