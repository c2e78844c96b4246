#include "pipetrain/offload/streaming.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <string>

#include "pipetrain/base/error.h"

namespace pipetrain::offload {
namespace {

// One slice in flight: its buffer, its transfer, and where its bytes go in memory (reads).
struct Slice {
  BufferLease buffer;
  IoTicket ticket;
  char* destination = nullptr;
  int64_t bytes = 0;
};

// A free buffer for the next slice: one the pool lends at once, else the oldest slice's, once
// it is done (`finish` handles what it carried), else (no slice of ours in flight) whichever the
// pool lends next.
template <typename Finish>
BufferLease next_buffer(AlignedBuffers& buffers, std::deque<Slice>& in_flight, int most,
                        const Finish& finish) {
  if (static_cast<int>(in_flight.size()) < most) {
    if (std::optional<BufferLease> free = buffers.try_acquire()) return std::move(*free);
  }
  if (in_flight.empty()) return buffers.acquire();
  Slice oldest = std::move(in_flight.front());
  in_flight.pop_front();
  oldest.ticket.wait();
  finish(oldest);
  return std::move(oldest.buffer);
}

// After a failure: the transfers still in flight write into (or read from) their buffers, which
// must not go back to the pool before they are done.
void drain_quietly(std::deque<Slice>& in_flight) {
  for (const Slice& s : in_flight) {
    try {
      s.ticket.wait();
    } catch (const Error&) {  // the first failure is the one thrown
    }
  }
  in_flight.clear();
}

void check_most(int most_in_flight) {
  if (most_in_flight < 1) {
    throw BadInput("offload slices in flight " + std::to_string(most_in_flight) +
                   " must be at least 1");
  }
}

}  // namespace

void stream_to_file(SwapFile& file, int64_t offset, const void* source, int64_t bytes,
                    AlignedBuffers& buffers, int most_in_flight) {
  check_most(most_in_flight);
  const auto* from = static_cast<const char*>(source);
  const int64_t step = buffers.buffer_bytes();
  std::deque<Slice> in_flight;
  const auto nothing = [](const Slice&) {};
  try {
    for (int64_t done = 0; done < bytes; done += step) {
      Slice s;
      s.buffer = next_buffer(buffers, in_flight, most_in_flight, nothing);
      s.bytes = std::min(step, bytes - done);
      std::memcpy(s.buffer.data(), from + done, static_cast<size_t>(s.bytes));
      s.ticket = file.write(offset + done, s.buffer.data(), s.bytes);
      in_flight.push_back(std::move(s));
    }
    while (!in_flight.empty()) {
      in_flight.front().ticket.wait();
      in_flight.pop_front();
    }
  } catch (...) {
    drain_quietly(in_flight);
    throw;
  }
}

void stream_from_file(SwapFile& file, int64_t offset, void* destination, int64_t bytes,
                      AlignedBuffers& buffers, int most_in_flight) {
  check_most(most_in_flight);
  auto* to = static_cast<char*>(destination);
  const int64_t step = buffers.buffer_bytes();
  std::deque<Slice> in_flight;
  const auto deliver = [](const Slice& s) {
    std::memcpy(s.destination, s.buffer.data(), static_cast<size_t>(s.bytes));
  };
  try {
    for (int64_t done = 0; done < bytes; done += step) {
      Slice s;
      s.buffer = next_buffer(buffers, in_flight, most_in_flight, deliver);
      s.bytes = std::min(step, bytes - done);
      s.destination = to + done;
      s.ticket = file.read(offset + done, s.buffer.data(), s.bytes);
      in_flight.push_back(std::move(s));
    }
    while (!in_flight.empty()) {
      in_flight.front().ticket.wait();
      deliver(in_flight.front());
      in_flight.pop_front();
    }
  } catch (...) {
    drain_quietly(in_flight);
    throw;
  }
}

}  // namespace pipetrain::offload
