// Action: one step of one rank in a pipeline schedule, and its stable text form ("2F0").
//
// Index letters, fixed project-wide:
//   i  micro-batch        (0 .. M-1, M = number of micro-batches)
//   j  stage              (0 .. S-1; with V virtual stages per rank, S = K * V)
//   k  step / clock tick  (position in a rank's action list, or a time slot)
//   r  rank               (0 .. K-1, one process or worker thread each)
//
// Text form: <stage><op><microbatch>, e.g. "2F0" = stage 2 runs the forward of micro-batch 0.
//   F  forward                      B  full backward (input and weight gradients)
//   I  input-gradient backward      W  weight-gradient backward (after its I)
//   SF send activation j -> j+1     RF receive activation j-1 -> j
//   SB send gradient   j -> j-1     RB receive gradient   j+1 -> j
// The stage of a communication action is the stage that runs it: "1SF3" is stage 1 sending the
// activation of micro-batch 3 to stage 2, and "2RF3" is stage 2 receiving it.
//
// Thread-safety: plain values; safe to copy and share.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace pipetrain::schedule {

enum class Op : std::uint8_t {
  kForward,         // F
  kBackward,        // B
  kBackwardInput,   // I
  kBackwardWeight,  // W
  kSendActivation,  // SF
  kRecvActivation,  // RF
  kSendGradient,    // SB
  kRecvGradient,    // RB
};

// "F", "B", "I", "W", "SF", "RF", "SB", "RB".
std::string_view op_name(Op op);

// True for F, B, I, W: the actions a generator emits. Lowering adds the others.
bool is_compute(Op op);
bool is_communication(Op op);

struct Action {
  int stage = 0;  // j
  Op op = Op::kForward;
  int microbatch = 0;  // i

  friend bool operator==(const Action& a, const Action& b) {
    return a.stage == b.stage && a.op == b.op && a.microbatch == b.microbatch;
  }
  friend bool operator!=(const Action& a, const Action& b) { return !(a == b); }
};

std::string to_string(const Action& action);
std::ostream& operator<<(std::ostream& out, const Action& action);

// Parses the text form; surrounding whitespace is ignored.
// Throws pipetrain::BadInput naming the text and the valid ops on anything else.
Action parse_action(std::string_view text);

}  // namespace pipetrain::schedule

template <>
struct std::hash<pipetrain::schedule::Action> {
  std::size_t operator()(const pipetrain::schedule::Action& a) const noexcept {
    return (static_cast<std::size_t>(a.stage) * 1000003u + static_cast<std::size_t>(a.op)) *
               1000033u +
           static_cast<std::size_t>(a.microbatch);
  }
};
