// read_load_average() (pipetrain/base/load_average.h).
#include "pipetrain/base/load_average.h"

#include <cstdio>

namespace pipetrain {

std::string LoadAverage::to_string() const {
  if (!known) return "unknown";
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %.2f %.2f", one_minute, five_minutes, fifteen_minutes);
  return text;
}

LoadAverage read_load_average() {
  LoadAverage load;
  if (FILE* file = std::fopen("/proc/loadavg", "r")) {
    load.known = std::fscanf(file, "%lf %lf %lf", &load.one_minute, &load.five_minutes,
                             &load.fifteen_minutes) == 3;
    std::fclose(file);
    if (!load.known) load = LoadAverage{};
  }
  return load;
}

}  // namespace pipetrain
