// make_schedule(): the name -> generator table, and the helpers every generator shares.
#include "pipetrain/schedule/generators.h"
#include "pipetrain/base/error.h"

#include <algorithm>
#include <stdexcept>

#include "generator_util.h"

namespace pipetrain::schedule {
namespace detail {

void require_positive(const std::string& schedule, const char* what, int value) {
  if (value < 1) {
    throw BadInput(schedule + ": " + what + " must be >= 1 (got " + std::to_string(value) + ")");
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
  static const std::vector<std::string> names = {
      "gpipe",  "1f1b",  "interleaved-1f1b", "zb-h1",      "zb-h2",     "zb-v",
      "v-half", "v-min", "interleaved-zb",   "looped-bfs", "dualpipev", "zb-auto"};
  return names;
}

bool is_v_shaped(const std::string& name) {
  return name == "zb-v" || name == "v-half" || name == "v-min" || name == "dualpipev";
}

int default_virtual_stages(const std::string& name) {
  return is_v_shaped(name) || name == "interleaved-zb" || name == "looped-bfs" ? 2 : 1;
}

std::string shape_error(const std::string& name, int ranks, int microbatches, int virtual_stages) {
  const auto& names = schedule_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) return "";  // make_schedule says
  const bool chunked =
      name == "interleaved-1f1b" || name == "interleaved-zb" || name == "looped-bfs";
  if (is_v_shaped(name) && virtual_stages != 2) {
    return name + " places two chunks per rank in a V (got virtual_stages=" +
           std::to_string(virtual_stages) +
           "); set virtual_stages to 2, i.e. twice as many stages as ranks";
  }
  if (!chunked && !is_v_shaped(name) && virtual_stages != 1) {
    return name + " has no virtual stages (got virtual_stages=" + std::to_string(virtual_stages) +
           "); use interleaved-1f1b, interleaved-zb or looped-bfs for V > 1";
  }
  if (name != "dualpipev" || ranks < 1 || microbatches < 1) return "";
  if (ranks % 2 != 0) {
    return "dualpipev needs an even number of ranks (got " + std::to_string(ranks) + "); use " +
           std::to_string(ranks + 1) + " ranks, or zb-v, which takes any number";
  }
  if (microbatches < 2 * ranks) {
    return "dualpipev needs at least 2K = " + std::to_string(2 * ranks) + " micro-batches for " +
           std::to_string(ranks) + " ranks (got " + std::to_string(microbatches) +
           "); set the micro-batches (chunks) to " + std::to_string(2 * ranks) + " or more";
  }
  return "";
}

Schedule make_schedule(const std::string& name, int ranks, int microbatches, int virtual_stages) {
  if (const std::string why = shape_error(name, ranks, microbatches, virtual_stages);
      !why.empty()) {
    throw BadInput(why);
  }
  if (name == "gpipe") return gpipe(ranks, microbatches);
  if (name == "1f1b") return one_f_one_b(ranks, microbatches);
  if (name == "interleaved-1f1b")
    return interleaved_one_f_one_b(ranks, microbatches, virtual_stages);
  if (name == "zb-h1") return zero_bubble_h1(ranks, microbatches);
  if (name == "zb-h2") return zero_bubble_h2(ranks, microbatches);
  if (name == "zb-auto") return zero_bubble_auto(ranks, microbatches);
  if (name == "zb-v") return zero_bubble_v(ranks, microbatches);
  if (name == "v-half") return v_half(ranks, microbatches);
  if (name == "v-min") return v_min(ranks, microbatches);
  if (name == "dualpipev") return dualpipe_v(ranks, microbatches);
  if (name == "interleaved-zb") return interleaved_zero_bubble(ranks, microbatches, virtual_stages);
  if (name == "looped-bfs") return looped_bfs(ranks, microbatches, virtual_stages);
  std::string valid;
  for (const auto& known : schedule_names()) valid += (valid.empty() ? "" : ", ") + known;
  throw BadInput("unknown schedule '" + name + "'; valid names: " + valid);
}

Schedule forward_only(const Schedule& placement, int microbatches) {
  Schedule s;
  s.name = "forward";
  s.num_ranks = placement.num_ranks;
  s.num_stages = placement.num_stages;
  s.num_microbatches = microbatches;
  s.stage_rank = placement.stage_rank;
  s.actions.resize(static_cast<size_t>(s.num_ranks));
  for (int r = 0; r < s.num_ranks; ++r) {
    for (int i = 0; i < microbatches; ++i) {
      for (int j : s.stages_of_rank(r)) {
        s.actions[static_cast<size_t>(r)].push_back({j, Op::kForward, i});
      }
    }
  }
  return s;
}

}  // namespace pipetrain::schedule
