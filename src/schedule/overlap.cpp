// Forward/backward pairs (pipetrain/schedule/overlap.h).
#include "pipetrain/schedule/overlap.h"

#include "pipetrain/base/error.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

bool is_forward(Op op) {
  return op == Op::kForward;
}
bool is_backward(Op op) {
  return op == Op::kBackward || op == Op::kBackwardInput;
}
bool is_receive(Op op) {
  return op == Op::kRecvActivation || op == Op::kRecvGradient;
}

}  // namespace

ForwardBackwardPairs pair_forwards_with_backwards(const Schedule& lowered) {
  if (!is_lowered(lowered) && lowered.num_stages > 1) {
    throw BadInput("pair_forwards_with_backwards needs a lowered schedule (lower.h)");
  }
  const CheckResult valid = check(lowered);
  if (!valid) throw BadInput("pair_forwards_with_backwards: " + valid.message);
  ForwardBackwardPairs out;
  out.schedule = lowered;
  out.starts.resize(lowered.actions.size());
  for (size_t r = 0; r < lowered.actions.size(); ++r) {
    out.starts[r].assign(lowered.actions[r].size(), 0);
  }
  for (size_t r = 0; r < out.schedule.actions.size(); ++r) {
    size_t p = 0;  // the first compute action not yet looked at
    for (;;) {
      std::vector<Action>& list = out.schedule.actions[r];
      while (p < list.size() && !is_compute(list[p].op)) ++p;
      size_t q = p + 1;
      while (q < list.size() && !is_compute(list[q].op)) ++q;
      if (q >= list.size()) break;
      const Action& x = list[p];
      const Action& y = list[q];
      const bool candidate =
          x.microbatch != y.microbatch &&
          ((is_forward(x.op) && is_backward(y.op)) || (is_backward(x.op) && is_forward(y.op)));
      if (!candidate) {
        p = q;
        continue;
      }
      // [receives between] x y [sends between]
      std::vector<Action> reordered(list.begin(), list.begin() + static_cast<long>(p));
      for (size_t a = p + 1; a < q; ++a) {
        if (is_receive(list[a].op)) reordered.push_back(list[a]);
      }
      const size_t at = reordered.size();
      reordered.push_back(x);
      reordered.push_back(y);
      for (size_t a = p + 1; a < q; ++a) {
        if (!is_receive(list[a].op)) reordered.push_back(list[a]);
      }
      reordered.insert(reordered.end(), list.begin() + static_cast<long>(q) + 1, list.end());
      std::vector<Action> kept = std::move(list);
      list = std::move(reordered);
      if (check(out.schedule)) {
        // Earlier pairs lie before p, which did not move; the list keeps its length.
        out.starts[r][at] = 1;
        ++out.pairs;
        p = at + 2;
      } else {
        list = std::move(kept);
        p = q;
      }
    }
  }
  return out;
}

}  // namespace pipetrain::schedule
