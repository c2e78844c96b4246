// Tensor files shared with Python: read what `torch.save(tensor, f)` wrote, and write a name ->
// tensor dict that `torch.load(f)` reads back as a Python dict (e.g. a model's parameters by their
// named_parameters() names, ready for `model.load_state_dict(d, strict=False)`).
//
// Format: PyTorch's zip-based pickle archive (torch::pickle_load / pickle_for_python), which
// LibTorch and Python (torch.load, weights_only=True as by default) read alike.
//
// Thread-safety: free functions without shared state; two writers of the same path race only in
// the final rename (the last one wins, neither leaves a partial file).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/types.h>

namespace pipetrain {

// The tensor in the file at `path`, on the device it was saved from.
// Throws pipetrain::FileError naming `path` when the file is missing or unreadable, and
// pipetrain::BadInput when it is not a PyTorch archive or holds something other than one tensor
// (saying what it holds).
torch::Tensor load_tensor(const std::string& path);

// What torch::pickle_load(bytes) returns, read through a reader that hands out only the bytes
// there are. torch::pickle_load's own reader copies whatever the zip directory asks for: a
// corrupt file made it read past the end of its buffer (AddressSanitizer, fuzz_checkpoint).
// Throws what pickle_load throws for a file that is not a PyTorch archive (c10::Error).
torch::IValue load_pickle(const std::vector<char>& bytes);

// The bytes of `value` as torch.save writes them (PyTorch's zip archive), without the type tags
// torch::pickle_save adds to dicts and lists: Python's torch.load reads them with its default
// weights_only=True (it refuses the tags), and torch::pickle_load reads them too.
std::vector<char> pickle_for_python(const torch::IValue& value);

// Writes {name: tensor} as a c10::Dict<std::string, at::Tensor>, keeping the order given. Tensors
// are detached and copied to the CPU first (a file Python can read without a GPU).
// Atomic: the bytes go to a temporary file in the same directory, which is fsync'ed and renamed
// over `path`, so a reader never sees a partial file.
// REQUIRES: names are unique (else pipetrain::BadInput). Throws pipetrain::FileError naming the
// path (and errno text) when it cannot be written.
void save_named_tensors(const std::string& path,
                        const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

}  // namespace pipetrain
