#include "pipetrain/train/optimizer_state_file.h"

#include <unistd.h>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>

#include <torch/torch.h>

#include "pipetrain/base/check.h"
#include "pipetrain/base/error.h"
#include "pipetrain/offload/streaming.h"

namespace pipetrain::train {
namespace {

constexpr int64_t kAlignment = 4096;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t sub_group_of(const NvmeOptions& o, int64_t element_size) {
  check_nvme_options(o);
  const int64_t per_buffer = offload::align_up(o.buffer_bytes(), kAlignment) / element_size;
  const int64_t wanted = o.sub_group_size() > 0 ? o.sub_group_size() : per_buffer;
  PIPETRAIN_CHECK_INPUT(wanted <= per_buffer, "--sub-group-size ", o.sub_group_size(),
                        " elements of ", element_size,
                        " bytes do not fit one offload buffer: --offload-buffer-bytes ",
                        o.buffer_bytes(), " holds ", per_buffer);
  const int64_t block = kAlignment / element_size;
  PIPETRAIN_CHECK_INPUT(wanted >= block, "--sub-group-size ", o.sub_group_size(),
                        " is less than one 4096-byte block of the offload files (", block,
                        " elements)");
  return wanted / block * block;
}

}  // namespace

OptimizerStateFile::OptimizerStateFile(const NvmeOptions& options, std::vector<std::string> fields,
                                       int64_t elements, torch::ScalarType dtype,
                                       const std::string& name)
    : fields_(std::move(fields)),
      elements_(elements),
      dtype_(dtype),
      element_size_(static_cast<int64_t>(c10::elementSize(dtype))),
      sub_group_(sub_group_of(options, element_size_)),
      buffers_(options.buffer_bytes(), options.buffer_count(), kAlignment),
      file_(
          options.dir(), name + "-" + std::to_string(::getpid()),
          std::shared_ptr<offload::FileIo>(offload::make_file_io(options.io(), options.io_depth())),
          kAlignment) {
  PIPETRAIN_CHECK_INPUT(!fields_.empty(), "an optimizer state file needs at least one field");
  PIPETRAIN_CHECK_INPUT(options.buffer_count() >= static_cast<int>(fields_.size()),
                        "--offload-buffer-count ", options.buffer_count(),
                        " is fewer than the buffers one sub-group of the optimizer state takes (",
                        fields_.size(), ", one per field; ", 3 * fields_.size(),
                        " keep its reads and writes in flight while it steps)");
  for (size_t f = 0; f < fields_.size(); ++f) {
    regions_.push_back(file_.reserve(std::max<int64_t>(elements_, 1) * element_size_));
  }
  written_.assign(fields_.size(), 0);
  read_only_.assign(fields_.size(), 0);
}

void OptimizerStateFile::read_only_in_step(size_t field) {
  read_only_.at(field) = 1;
}

OptimizerStateFile::~OptimizerStateFile() = default;

void OptimizerStateFile::step(const SubGroupStep& step) {
  const auto start = std::chrono::steady_clock::now();
  Stats stats;
  const size_t F = fields_.size();
  struct Window {
    int64_t first = 0, length = 0;
    std::vector<offload::BufferLease> buffers;
    std::vector<offload::IoTicket> tickets;
  };
  std::deque<Window> writes;
  std::optional<Window> current, next;
  auto wait = [&](Window& w) {
    const auto waited = std::chrono::steady_clock::now();
    for (const offload::IoTicket& t : w.tickets) t.wait();
    w.tickets.clear();
    stats.io_wait_seconds += seconds_since(waited);
  };
  // F buffers: free ones, else those of the oldest write once it ends; none (must == false):
  // nothing, the caller goes on without.
  auto take = [&](bool must) -> std::vector<offload::BufferLease> {
    std::vector<offload::BufferLease> got;
    while (got.size() < F) {
      if (std::optional<offload::BufferLease> free = buffers_.try_acquire()) {
        got.push_back(std::move(*free));
      } else if (!writes.empty()) {
        wait(writes.front());
        writes.pop_front();
      } else if (!must) {
        return {};
      } else {
        got.push_back(buffers_.acquire());  // unreachable with F or more buffers
      }
    }
    return got;
  };
  auto start_read = [&](int64_t first, std::vector<offload::BufferLease> buffers) {
    Window w;
    w.first = first;
    w.length = std::min(sub_group_, elements_ - first);
    w.buffers = std::move(buffers);
    const int64_t bytes = w.length * element_size_;
    for (size_t f = 0; f < F; ++f) {
      if (written_[f]) {
        w.tickets.push_back(
            file_.read(regions_[f] + first * element_size_, w.buffers[f].data(), bytes));
        stats.bytes_read += bytes;
      } else {
        std::memset(w.buffers[f].data(), 0, static_cast<size_t>(bytes));
      }
    }
    return w;
  };
  auto drain = [&] {  // after a failure: no buffer goes back while a transfer uses it
    auto quietly = [](Window& w) {
      for (const offload::IoTicket& t : w.tickets) {
        try {
          t.wait();
        } catch (const Error&) {
        }
      }
    };
    if (current) quietly(*current);
    if (next) quietly(*next);
    for (Window& w : writes) quietly(w);
  };
  try {
    if (elements_ > 0) next = start_read(0, take(true));
    for (int64_t first = 0; first < elements_; first += sub_group_) {
      current = std::move(next);
      next.reset();
      const int64_t following = first + sub_group_;
      if (following < elements_) {
        std::vector<offload::BufferLease> buffers = take(false);
        if (!buffers.empty()) next = start_read(following, std::move(buffers));
      }
      wait(*current);
      std::vector<torch::Tensor> windows;
      for (size_t f = 0; f < F; ++f) {
        windows.push_back(torch::from_blob(current->buffers[f].data(), {current->length},
                                           torch::TensorOptions().dtype(dtype_)));
      }
      step(current->first, current->length, windows);
      for (size_t f = 0; f < F; ++f) {
        if (read_only_[f]) continue;
        const int64_t bytes = current->length * element_size_;
        current->tickets.push_back(file_.write(regions_[f] + current->first * element_size_,
                                               current->buffers[f].data(), bytes));
        stats.bytes_written += bytes;
      }
      writes.push_back(std::move(*current));
      current.reset();
      ++stats.sub_groups;
      if (!next && following < elements_) next = start_read(following, take(true));
    }
    while (!writes.empty()) {
      wait(writes.front());
      writes.pop_front();
    }
  } catch (...) {
    drain();
    throw;
  }
  for (size_t f = 0; f < F; ++f) {
    if (!read_only_[f]) written_[f] = 1;
  }
  stats.seconds = seconds_since(start);
  last_ = stats;
}

void OptimizerStateFile::read(size_t field, torch::Tensor& out) {
  TORCH_INTERNAL_ASSERT(out.is_contiguous() && out.numel() == elements_ &&
                        out.scalar_type() == dtype_ && out.device().is_cpu());
  if (!written_.at(field)) {
    out.zero_();
    return;
  }
  offload::stream_from_file(file_, regions_.at(field), out.data_ptr(), elements_ * element_size_,
                            buffers_);
}

void OptimizerStateFile::write(size_t field, const torch::Tensor& in) {
  TORCH_INTERNAL_ASSERT(in.is_contiguous() && in.numel() == elements_ &&
                        in.scalar_type() == dtype_ && in.device().is_cpu());
  offload::stream_to_file(file_, regions_.at(field), in.data_ptr(), elements_ * element_size_,
                          buffers_);
  written_.at(field) = 1;
}

void OptimizerStateFile::read_range(size_t field, int64_t first, int64_t length, void* out) {
  TORCH_INTERNAL_ASSERT(first >= 0 && length >= 0 && first + length <= elements_);
  auto* to = static_cast<char*>(out);
  if (!written_.at(field)) {
    std::memset(to, 0, static_cast<size_t>(length * element_size_));
    return;
  }
  // The aligned blocks around the range, a buffer's worth at a time, as many in flight as the
  // pool lends (one at least); the range's part of each copied out as it lands.
  const int64_t begin = regions_.at(field) + first * element_size_;
  const int64_t end = begin + length * element_size_;
  const int64_t step = buffers_.buffer_bytes();
  struct Chunk {
    offload::BufferLease buffer;
    offload::IoTicket ticket;
    int64_t at = 0, bytes = 0;
  };
  std::deque<Chunk> in_flight;
  auto land = [&](Chunk& c) {
    c.ticket.wait();
    const int64_t from = std::max(c.at, begin), until = std::min(c.at + c.bytes, end);
    std::memcpy(to + (from - begin), c.buffer.data() + (from - c.at),
                static_cast<size_t>(until - from));
  };
  try {
    for (int64_t at = begin / kAlignment * kAlignment; at < end; at += step) {
      Chunk c;
      if (std::optional<offload::BufferLease> free = buffers_.try_acquire()) {
        c.buffer = std::move(*free);
      } else if (!in_flight.empty()) {
        land(in_flight.front());
        c.buffer = std::move(in_flight.front().buffer);
        in_flight.pop_front();
      } else {
        c.buffer = buffers_.acquire();
      }
      c.at = at;
      c.bytes = std::min(step, offload::align_up(end, kAlignment) - at);
      c.ticket = file_.read(at, c.buffer.data(), c.bytes);
      in_flight.push_back(std::move(c));
    }
    while (!in_flight.empty()) {
      land(in_flight.front());
      in_flight.pop_front();
    }
  } catch (...) {
    for (Chunk& c : in_flight) {  // no buffer goes back while a read fills it
      try {
        c.ticket.wait();
      } catch (const Error&) {
      }
    }
    throw;
  }
}

void OptimizerStateFile::update_range(size_t field, int64_t first, int64_t length,
                                      const torch::Tensor& in, RangeUpdate how) {
  TORCH_INTERNAL_ASSERT(first >= 0 && length >= 0 && first + length <= elements_);
  TORCH_INTERNAL_ASSERT(in.is_contiguous() && in.numel() == length && in.scalar_type() == dtype_ &&
                        in.device().is_cpu());
  const auto* from = static_cast<const char*>(in.data_ptr());
  const int64_t begin = regions_.at(field) + first * element_size_;
  const int64_t end = begin + length * element_size_;
  const int64_t step = buffers_.buffer_bytes();
  const torch::TensorOptions options = torch::TensorOptions().dtype(dtype_);
  offload::BufferLease buffer = buffers_.acquire();
  for (int64_t at = begin / kAlignment * kAlignment; at < end; at += step) {
    const int64_t bytes = std::min(step, offload::align_up(end, kAlignment) - at);
    const int64_t lo = std::max(at, begin), hi = std::min(at + bytes, end);
    // Read unless every byte of the blocks is the range's and its old values do not count.
    if (how == RangeUpdate::kAdd || lo != at || hi != at + bytes) {
      if (written_.at(field)) {
        file_.read(at, buffer.data(), bytes).wait();
      } else {
        std::memset(buffer.data(), 0, static_cast<size_t>(bytes));
      }
    }
    const int64_t n = (hi - lo) / element_size_;
    torch::Tensor to = torch::from_blob(buffer.data() + (lo - at), {n}, options);
    const torch::Tensor add =
        torch::from_blob(const_cast<char*>(from) + (lo - begin), {n}, options);  // read only
    if (how == RangeUpdate::kCopy) {
      to.copy_(add);
    } else {
      if (how == RangeUpdate::kAddOntoZeros) to.zero_();
      to.add_(add);
    }
    file_.write(at, buffer.data(), bytes).wait();
  }
  written_.at(field) = 1;
}

void OptimizerStateFile::fill(size_t field, const Fill& fill) {
  offload::BufferLease buffer = buffers_.acquire();
  for (int64_t first = 0; first < elements_; first += sub_group_) {
    const int64_t length = std::min(sub_group_, elements_ - first);
    fill(first, length,
         torch::from_blob(buffer.data(), {length}, torch::TensorOptions().dtype(dtype_)));
    file_.write(regions_.at(field) + first * element_size_, buffer.data(), length * element_size_)
        .wait();
  }
  written_.at(field) = 1;
}

}  // namespace pipetrain::train
