// The torch-free schedule engine alone (pipetrain::schedule): builds zb-v for 4 ranks and 8
// micro-batches, validates it and prints its simulated makespan and bubble time.
#include <cstdio>

#include <pipetrain/schedule/generators.h>
#include <pipetrain/schedule/simulate.h>
#include <pipetrain/schedule/validate.h>

int main() {
  const pipetrain::schedule::Schedule s = pipetrain::schedule::make_schedule("zb-v", 4, 8, 2);
  pipetrain::schedule::validate(s);  // throws with a rank x step grid when it is not runnable
  const pipetrain::schedule::SimulationResult r = pipetrain::schedule::simulate(s);
  std::printf("%s: makespan %.1f, bubble time %.1f\n", s.name.c_str(), r.makespan, r.bubble_time);
  return r.bubble_time == 0 ? 0 : 1;
}
