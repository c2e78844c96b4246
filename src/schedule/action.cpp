// Action text form: op names, to_string and parse.
#include "pipetrain/schedule/action.h"
#include "pipetrain/base/error.h"

#include <array>
#include <cctype>
#include <stdexcept>

namespace pipetrain::schedule {
namespace {
constexpr std::array<std::string_view, 8> kOpNames = {"F", "B", "I", "W", "SF", "RF", "SB", "RB"};
}  // namespace

std::string_view op_name(Op op) {
  return kOpNames[static_cast<std::size_t>(op)];
}

bool is_compute(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
         op == Op::kBackwardWeight;
}

bool is_communication(Op op) {
  return !is_compute(op);
}

std::string to_string(const Action& action) {
  std::string text = std::to_string(action.stage);
  text += op_name(action.op);
  text += std::to_string(action.microbatch);
  return text;
}

std::ostream& operator<<(std::ostream& out, const Action& action) {
  return out << to_string(action);
}

Action parse_action(std::string_view text) {
  auto fail = [&] {
    throw BadInput("cannot parse action '" + std::string(text) +
                   "': expected <stage><op><microbatch> such as 2F0, with op one of "
                   "F, B, I, W, SF, RF, SB, RB");
  };
  std::size_t begin = 0;
  std::size_t end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  std::size_t pos = begin;
  auto read_number = [&]() -> int {
    std::size_t start = pos;
    long value = 0;
    while (pos < end && std::isdigit(static_cast<unsigned char>(text[pos]))) {
      value = value * 10 + (text[pos] - '0');
      if (value > 1'000'000'000L) fail();
      ++pos;
    }
    if (pos == start) fail();
    return static_cast<int>(value);
  };
  Action action;
  action.stage = read_number();
  std::size_t op_start = pos;
  while (pos < end && std::isalpha(static_cast<unsigned char>(text[pos]))) ++pos;
  std::string_view op = text.substr(op_start, pos - op_start);
  bool found = false;
  for (std::size_t n = 0; n < kOpNames.size(); ++n) {
    if (op == kOpNames[n]) {
      action.op = static_cast<Op>(n);
      found = true;
    }
  }
  if (!found) fail();
  action.microbatch = read_number();
  if (pos != end) fail();
  return action;
}

}  // namespace pipetrain::schedule
