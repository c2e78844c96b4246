// Test support: waiting for an event another process or thread causes that offers nothing to
// block on (a file appearing, a process reaped by its parent, a thread blocking in a receive):
// look again every 2 ms until it holds or the bound runs out. The caller states the bound and
// fails loudly when it runs out; a test never sleeps a fixed time and hopes the event came.
#pragma once

#include <chrono>
#include <thread>

namespace pipetrain::testing {

// True as soon as `holds()` is; false when it still does not after `bound`.
template <typename Predicate>
bool wait_until(Predicate&& holds, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!holds()) {
    if (std::chrono::steady_clock::now() >= deadline) return holds();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // between two looks at the event
  }
  return true;
}

}  // namespace pipetrain::testing
