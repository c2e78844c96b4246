// Thread-local skip contexts behind stash/pop/is_recomputing (include/pipetrain/stage/skip.h).
#include "pipetrain/stage/skip.h"

#include <c10/util/Exception.h>

#include "pipetrain/base/check.h"

namespace pipetrain {
namespace {
thread_local SkipContext default_context;
thread_local SkipContext* current_context = nullptr;

SkipContext& current() {
  return current_context ? *current_context : default_context;
}
}  // namespace

void stash(const std::string& name, torch::Tensor tensor) {
  auto& pending = current().pending;
  PIPETRAIN_CHECK_INPUT(pending.count(name) == 0, "skip '", name,
                        "' is stashed twice in one micro-batch; pop it before stashing it again");
  pending.emplace(name, std::move(tensor));
}

torch::Tensor pop(const std::string& name) {
  auto& pending = current().pending;
  auto found = pending.find(name);
  if (found == pending.end()) {
    std::string available;
    for (const auto& entry : pending) available += (available.empty() ? "" : ", ") + entry.first;
    throw BadInput(c10::str("skip '", name, "' was popped but never stashed in this micro-batch ",
                            "(stashed and not yet popped: ", available.empty() ? "none" : available,
                            ")"));
  }
  torch::Tensor tensor = std::move(found->second);
  pending.erase(found);
  return tensor;
}

bool is_recomputing() {
  return current().recomputing;
}

SkipContextGuard::SkipContextGuard(SkipContext* context) : previous_(current_context) {
  current_context = context;
}

SkipContextGuard::~SkipContextGuard() {
  current_context = previous_;
}

}  // namespace pipetrain
