// Fuzzes the schedule text reader (schedule/text_format.h, `--schedule-file x.txt`): parse, then
// what the CLI does with a parsed schedule -- check it, and simulate it when it is valid; a valid
// schedule's text form must parse back to the same schedule.
#include <cstdint>
#include <cstdlib>

#include "fuzz_check.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/text_format.h"
#include "pipetrain/schedule/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  fuzz::expect_only_pipetrain_errors([&] {
    const schedule::Schedule parsed = schedule::parse_schedule(fuzz::as_text(data, size));
    if (!schedule::check(parsed)) return;
    schedule::simulate(parsed, schedule::Costs{});
    const schedule::Schedule again = schedule::parse_schedule(schedule::format_schedule(parsed));
    if (schedule::format_schedule(again) != schedule::format_schedule(parsed)) std::abort();
  });
  return 0;
}
