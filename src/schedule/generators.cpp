// make_schedule(): the name -> generator table, and the helpers every generator shares.
#include "pipetrain/schedule/generators.h"

#include <stdexcept>

#include "generator_util.h"

namespace pipetrain::schedule {
namespace detail {

void require_positive(const std::string& schedule, const char* what, int value) {
  if (value < 1) {
    throw std::invalid_argument(schedule + ": " + what + " must be >= 1 (got " +
                                std::to_string(value) + ")");
  }
}

Schedule empty_schedule(const std::string& name, int ranks, int microbatches, int virtual_stages) {
  require_positive(name, "ranks", ranks);
  require_positive(name, "microbatches", microbatches);
  require_positive(name, "virtual stages", virtual_stages);
  Schedule schedule;
  schedule.name = name;
  schedule.num_ranks = ranks;
  schedule.num_stages = ranks * virtual_stages;
  schedule.num_microbatches = microbatches;
  schedule.stage_rank.resize(schedule.num_stages);
  for (int j = 0; j < schedule.num_stages; ++j) schedule.stage_rank[j] = j % ranks;
  schedule.actions.resize(ranks);
  return schedule;
}

}  // namespace detail

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"};
  return names;
}

Schedule make_schedule(const std::string& name, int ranks, int microbatches, int virtual_stages) {
  auto no_virtual = [&] {
    if (virtual_stages != 1) {
      throw std::invalid_argument(
          name + " has no virtual stages (got virtual_stages=" + std::to_string(virtual_stages) +
          "); use interleaved-1f1b for V > 1");
    }
  };
  if (name == "gpipe") {
    no_virtual();
    return gpipe(ranks, microbatches);
  }
  if (name == "1f1b") {
    no_virtual();
    return one_f_one_b(ranks, microbatches);
  }
  if (name == "interleaved-1f1b")
    return interleaved_one_f_one_b(ranks, microbatches, virtual_stages);
  if (name == "zb-h1") {
    no_virtual();
    return zero_bubble_h1(ranks, microbatches);
  }
  std::string valid;
  for (const auto& known : schedule_names()) valid += (valid.empty() ? "" : ", ") + known;
  throw std::invalid_argument("unknown schedule '" + name + "'; valid names: " + valid);
}

}  // namespace pipetrain::schedule
