// Fuzzes the plan JSON reader (partition::parse_plan_json: the auto plan every rank receives, a
// saved plan): any text is a checked plan or BadInput, and a plan it accepts writes and reads back
// to the same shape.
#include <cstdint>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "fuzz_check.h"
#include "pipetrain/partition/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  fuzz::expect_only_pipetrain_errors([&] {
    const partition::Plan plan = partition::parse_plan_json(fuzz::as_text(data, size));
    const partition::Plan again = partition::parse_plan_json(nlohmann::json(plan).dump());
    if (again.balance != plan.balance || again.schedule != plan.schedule ||
        again.ranks != plan.ranks || again.microbatches != plan.microbatches) {
      std::abort();
    }
  });
  return 0;
}
